"""DeadLetterRecorder's decision table on the in-memory store: the message is always kept, and the
job it names is created failed, failed, cancelled or left as it is.

The same behaviours as tests/integration/test_dead_letters.py, without moto.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from engine.core import ErrorCode, Job, JobErrorInfo, JobStatus, Released, Succeeded
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.intake import sha256_hex
from engine.observability import metrics
from engine.testing import InMemoryJobStore
from handlers.dead_letter import dead_letter_handler
from tests.support.events import InvocationContext, job_message, new_job_for, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS

T0 = 1_800_000_000_000  # epoch ms, a whole second
# maxReceiveCount was reached: the jobs queue moved the message here after that many receives.
RECEIVES = 11
REASON = f"reached the dead-letter queue after {RECEIVES} receives"
ATTRIBUTES = {"ApproximateReceiveCount": str(RECEIVES), "SentTimestamp": "1799999990000"}
UNAVAILABLE = JobErrorInfo(ErrorCode.PROVIDER_UNAVAILABLE, "provider unavailable (HTTP 503)", retryable=True)


@pytest.fixture
def store() -> InMemoryJobStore:
    return InMemoryJobStore()


def recorder_at(store: InMemoryJobStore, at_ms: int = T0) -> DeadLetterRecorder:
    """A recorder whose clock reads `at_ms` (a whole second, so that it reads back exactly)."""
    assert at_ms % 1000 == 0
    return DeadLetterRecorder(store, JobRegistry(), clock=lambda: float(at_ms // 1000))


@pytest.fixture
def recorder(store: InMemoryJobStore) -> DeadLetterRecorder:
    return recorder_at(store)


def body_of(message: Any) -> str:
    return message if isinstance(message, str) else json.dumps(message)


def released_after_a_503(store: InMemoryJobStore, message: dict[str, Any]) -> Job:
    """A message-carried job put back in the queue after a 503: queued, its input only in its message."""
    claimed = store.claim_job(message["job_id"], "worker", 60_000, T0, new_job_for(message))
    store.finish_job(claimed, Released(UNAVAILABLE), T0)
    job = job_of(store, message["job_id"])
    assert (job.status, job.input_stored, job.lease_owner) == (JobStatus.QUEUED, False, None)
    return job


def job_of(store: InMemoryJobStore, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None, f"job {job_id} does not exist"
    return job


def failed_with(job: Job) -> tuple[JobStatus, ErrorCode, str, bool]:
    assert job.error is not None, f"job {job.job_id} has no error"
    return job.status, job.error.code, job.error.message, job.error.retryable


# --- the job a dead letter names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"job_id": "ghost-1"}, "ghost-1"),  # a reference
        (job_message("classify", "job-1"), "job-1"),  # a full request
        ({"job_id": "job-2", "job_type": "classify"}, "job-2"),  # a bad message with a usable id
        ({"job_type": "classify"}, "m-1"),  # no job_id: the message id is the job's, as the worker has it
        ({"job_id": "not an id!"}, None),  # an unusable id names no job
        ([1, 2], None),
        ("not json", None),
    ],
)
def test_a_dead_letter_names_the_job_its_body_names_whether_recorded_or_kept(
    store: InMemoryJobStore, body: Any, named: str | None
) -> None:
    # Given a body, When the dead-letter function records it and the worker keeps a copy
    recorder_at(store).record("m-1", body_of(body), ATTRIBUTES, RECEIVES)
    recorder_at(store).keep("m-2", body_of(body), ATTRIBUTES, 1, "kept by the worker")

    # Then both name the job the body names (the message id for a body without a job_id)
    recorded, kept = store.dead_letter("m-1"), store.dead_letter("m-2")
    assert recorded is not None
    assert kept is not None
    assert recorded.job_id == named
    assert kept.job_id == (named if named != "m-1" else "m-2")


# --- messages that name no job ------------------------------------------------------------------


def test_a_garbage_message_is_kept_whole_with_its_attributes_and_receive_count(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a body that is not even JSON, When it is recorded
    outcome = recorder.record("m-garbage", "not json", ATTRIBUTES, RECEIVES)

    # Then it is kept with its body, its hash, attributes, receive count, reason and time
    assert outcome == "recorded"
    dead = store.dead_letter("m-garbage")
    assert dead is not None
    assert (dead.message_id, dead.body, dead.body_key) == ("m-garbage", "not json", None)
    assert (dead.body_bytes, dead.body_sha256) == (8, hashlib.sha256(b"not json").hexdigest())
    assert (dead.attributes, dead.receive_count) == (ATTRIBUTES, RECEIVES)
    assert (dead.reason, dead.recorded_at) == (REASON, T0)


def test_a_reference_to_a_job_that_does_not_exist_is_only_kept(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a reference to no job, When it is recorded
    outcome = recorder.record("m-ghost", body_of({"job_id": "ghost-1"}), ATTRIBUTES, RECEIVES)

    # Then it is kept, and no job is created (there is nothing to create it from)
    assert outcome == "recorded"
    assert store.dead_letter("m-ghost") is not None
    assert store.get_job("ghost-1") is None


# --- full requests whose job was never created --------------------------------------------------


def test_an_unclaimed_full_request_becomes_a_failed_job_with_its_input_that_can_be_retried(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a full job request that reached the dead-letter queue with no worker ever claiming it
    message = job_message("classify", "unclaimed-1")

    # When it is recorded
    outcome = recorder.record("m-unclaimed", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the message is kept, and its job exists: failed with dead_lettered, its input stored
    assert outcome == "failed"
    assert store.dead_letter("m-unclaimed") is not None
    job = job_of(store, "unclaimed-1")
    assert failed_with(job) == (JobStatus.FAILED, ErrorCode.DEAD_LETTERED, REASON, False)
    assert (job.job_type, job.user_id, job.attempt_count, job.finished_at) == ("classify", "user-1", 0, T0)
    assert job.request_hash == new_job_for(message).request_hash
    assert (job.input_stored, store.get_input("unclaimed-1")) == (True, message["input"])

    # And a retry puts it back in the queue with a fresh deadline
    requeued = store.requeue_failed_job("unclaimed-1", T0 + 60_000)
    assert (requeued.status, requeued.error, requeued.attempt_count) == (JobStatus.QUEUED, None, 0)
    assert requeued.deadline_at == T0 + 60_000 + 86_400_000


def test_a_second_dead_letter_of_an_unclaimed_request_leaves_its_job_as_it_is(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given an unclaimed request already recorded as a failed job
    message = job_message("classify", "twice-1")
    assert recorder.record("m-1", body_of(message), ATTRIBUTES, RECEIVES) == "failed"
    failed = job_of(store, "twice-1")

    # When a duplicate of it is recorded, Then it is kept, and the job is unchanged
    assert recorder_at(store, T0 + 5_000).record("m-2", body_of(message), ATTRIBUTES, RECEIVES) == "recorded"
    assert store.dead_letter("m-2") is not None
    assert job_of(store, "twice-1") == failed


def test_a_bad_message_with_a_job_id_fails_that_job_with_its_own_error(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a message naming a job type no worker knows
    message = job_message("classify", "bad-1") | {"job_type": "no_such_type"}
    body = body_of(message)

    # When it is recorded
    outcome = recorder.record("m-bad", body, ATTRIBUTES, RECEIVES)

    # Then its job is recorded failed with the message's own error, not dead_lettered, and no input
    assert outcome == "failed"
    job = job_of(store, "bad-1")
    assert job.error is not None
    assert (job.status, job.error.code, job.error.retryable) == (JobStatus.FAILED, ErrorCode.UNKNOWN_JOB_TYPE, False)
    assert (job.job_type, job.user_id, job.request_hash) == ("no_such_type", "user-1", sha256_hex(body))
    assert (job.input_stored, store.get_input("bad-1")) == (False, None)


# --- jobs that exist ----------------------------------------------------------------------------


def test_a_queued_job_no_worker_holds_fails_with_the_input_its_message_carried(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a message-carried job put back in the queue after a 503
    message = job_message("classify", "queued-1")
    released_after_a_503(store, message)

    # When its message reaches the dead-letter queue
    outcome = recorder.record("m-queued", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the message is kept, and the job fails with dead_lettered
    assert outcome == "failed"
    assert store.dead_letter("m-queued") is not None
    job = job_of(store, "queued-1")
    assert failed_with(job) == (JobStatus.FAILED, ErrorCode.DEAD_LETTERED, REASON, False)
    assert (job.finished_at, job.lease_owner) == (T0, None)
    # And the input its message carried is stored, so that a retry can run it
    assert (job.input_stored, store.get_input("queued-1")) == (True, message["input"])
    assert store.requeue_failed_job("queued-1", T0 + 1_000).status is JobStatus.QUEUED


def test_a_job_whose_worker_died_fails_once_its_lease_expired(store: InMemoryJobStore) -> None:
    # Given a message-carried job claimed by a worker that died (a 60 s lease), and a recorder 2 min later
    message = job_message("summarize", "orphan-1")
    store.claim_job("orphan-1", "dead-worker", 60_000, T0, new_job_for(message))

    # When its message reaches the dead-letter queue
    outcome = recorder_at(store, T0 + 120_000).record("m-orphan", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the job fails with dead_lettered, its lease let go and its input stored
    assert outcome == "failed"
    job = job_of(store, "orphan-1")
    assert failed_with(job) == (JobStatus.FAILED, ErrorCode.DEAD_LETTERED, REASON, False)
    assert (job.lease_owner, job.finished_at) == (None, T0 + 120_000)
    assert store.get_input("orphan-1") == message["input"]


def test_a_job_held_with_a_live_lease_is_left_to_its_worker(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a job a worker holds for another five minutes
    message = job_message("classify", "held-1")
    store.claim_job("held-1", "live-worker", 300_000, T0, new_job_for(message))
    held = job_of(store, "held-1")

    # When a copy of its message reaches the dead-letter queue
    outcome = recorder.record("m-held", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the message is kept but the job is not failed under its worker
    assert outcome == "held"
    assert store.dead_letter("m-held") is not None
    assert job_of(store, "held-1") == held


def test_a_finished_job_stays_as_it_was(store: InMemoryJobStore, recorder: DeadLetterRecorder) -> None:
    # Given a job that succeeded
    message = job_message("classify", "done-1")
    claimed = store.claim_job("done-1", "worker", 60_000, T0, new_job_for(message))
    store.finish_job(claimed, Succeeded(VALID_OUTPUTS["classify"], "hash"), T0)
    done = job_of(store, "done-1")

    # When a duplicate of its message reaches the dead-letter queue
    outcome = recorder.record("m-done", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the duplicate is kept, and the job is unchanged
    assert outcome == "recorded"
    assert store.dead_letter("m-done") is not None
    assert job_of(store, "done-1") == done


def test_a_message_that_conflicts_with_its_job_neither_fails_it_nor_gives_it_its_input(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a message-carried job put back in the queue (its own message will come back)
    released = released_after_a_503(store, job_message("classify", "conflict-1"))

    # When another message with the same job id but another input reaches the dead-letter queue
    other = job_message("classify", "conflict-1", input={"text": "Lunch at noon?", "labels": ["spam", "ham"]})
    outcome = recorder.record("m-conflict", body_of(other), ATTRIBUTES, RECEIVES)

    # Then it is kept, but the job it does not belong to is left as it was, without the other input
    assert outcome == "recorded"
    assert store.dead_letter("m-conflict") is not None
    assert job_of(store, "conflict-1") == released
    assert store.get_input("conflict-1") is None


def test_a_cancel_requested_job_no_worker_holds_ends_cancelled(store: InMemoryJobStore) -> None:
    # Given a job whose worker died (a 60 s lease), whose cancel was then requested
    message = job_message("classify", "cancel-1")
    store.claim_job("cancel-1", "dead-worker", 60_000, T0, new_job_for(message))
    store.request_cancel("cancel-1", T0)

    # When its message reaches the dead-letter queue after the lease expired
    outcome = recorder_at(store, T0 + 120_000).record("m-cancel", body_of(message), ATTRIBUTES, RECEIVES)

    # Then the cancel wins: the job ends cancelled, without an error or a stored input
    assert outcome == "cancelled"
    assert store.dead_letter("m-cancel") is not None
    job = job_of(store, "cancel-1")
    assert (job.status, job.cancel_requested, job.error, job.lease_owner) == (JobStatus.CANCELLED, True, None, None)
    assert store.get_input("cancel-1") is None


# --- the code a job ends with -------------------------------------------------------------------


GIVEN_UP = "internal error (RuntimeError) on receive 3; given up"


def test_a_message_given_up_on_fails_its_job_with_the_code_and_reason_passed(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a queued job, and a worker that gives up on its message with internal_error
    message = job_message("classify", "internal-1")
    released_after_a_503(store, message)

    # When the message is recorded with that code and reason
    outcome = recorder.record("m-internal", body_of(message), ATTRIBUTES, 3, GIVEN_UP, ErrorCode.INTERNAL_ERROR)

    # Then the job fails with internal_error and the reason, and the message is kept with that reason
    assert outcome == "failed"
    assert failed_with(job_of(store, "internal-1")) == (JobStatus.FAILED, ErrorCode.INTERNAL_ERROR, GIVEN_UP, False)
    dead = store.dead_letter("m-internal")
    assert dead is not None
    assert (dead.reason, dead.receive_count) == (GIVEN_UP, 3)


def test_an_unclaimed_request_given_up_on_is_created_failed_with_the_code_passed(
    store: InMemoryJobStore, recorder: DeadLetterRecorder
) -> None:
    # Given a full request whose job does not exist, When it is given up on with internal_error
    message = job_message("summarize", "internal-2")
    outcome = recorder.record("m-internal", body_of(message), ATTRIBUTES, 3, GIVEN_UP, ErrorCode.INTERNAL_ERROR)

    # Then its job is created failed with internal_error, its input stored
    assert outcome == "failed"
    assert failed_with(job_of(store, "internal-2")) == (JobStatus.FAILED, ErrorCode.INTERNAL_ERROR, GIVEN_UP, False)
    assert store.get_input("internal-2") == message["input"]


# --- dead letters the table does not take ---------------------------------------------------------


class Refused(Exception):
    """A write the table refuses; `transient` says whether it may pass by itself."""

    def __init__(self, transient: bool) -> None:
        super().__init__("refused")
        self.transient = transient


class RefusingStore(InMemoryJobStore):
    """A store whose table refuses every dead letter."""

    def __init__(self, transient: bool) -> None:
        super().__init__()
        self.transient = transient

    def record_dead_letter(self, *_: Any, **__: Any) -> None:
        raise Refused(self.transient)


def handle_one(recorder: DeadLetterRecorder, message_id: str, body: str) -> dict[str, Any]:
    record = sqs_record(body, message_id=message_id, receive_count=RECEIVES)
    return dead_letter_handler(recorder)(sqs_event(record), InvocationContext(function_name="aijobs-dead-letters"))


def is_refused_transiently(exc: Exception) -> bool:
    return isinstance(exc, Refused) and exc.transient


@pytest.mark.parametrize("transient", [False, True])
def test_a_dead_letter_the_table_refuses_is_counted_and_kept_in_the_bucket_unless_the_refusal_may_pass(
    transient: bool,
) -> None:
    store = RefusingStore(transient)
    recorder = DeadLetterRecorder(store, JobRegistry(), clock=lambda: T0 / 1000, is_transient=is_refused_transiently)
    metrics.clear_metrics()

    response = handle_one(recorder, "m-refused", body_of({"job_id": "refused-1"}))

    # Either way the failure is counted, and nothing is recorded as dead-lettered
    assert metrics.metric_set["DeadLetters_unrecorded"]["Value"] == [1.0]
    assert "Jobs_dead_lettered" not in metrics.metric_set
    metrics.clear_metrics()
    if transient:
        # A refusal that may pass: the message stays on the queue for a later receive, and is not copied
        assert response == {"batchItemFailures": [{"itemIdentifier": "m-refused"}]}
        assert store.unrecorded == {}
        return
    # A refusal for good: kept whole in the bucket, with why, and acknowledged
    assert response == {"batchItemFailures": []}
    kept = json.loads(store.unrecorded["dead-letters/unrecorded/m-refused.json"])
    assert kept["body"] == body_of({"job_id": "refused-1"})
    assert (kept["receive_count"], kept["reason"], kept["kept_at"]) == (RECEIVES, REASON, T0)
    assert kept["not_recorded_because"] == "Refused: no error code"
    assert store.get_job("refused-1") is None


def test_without_a_way_to_tell_every_refusal_is_taken_as_one_that_may_pass() -> None:
    store = RefusingStore(transient=False)

    response = handle_one(DeadLetterRecorder(store, JobRegistry()), "m-unsure", "not json")

    assert response == {"batchItemFailures": [{"itemIdentifier": "m-unsure"}]}
    assert store.unrecorded == {}
    metrics.clear_metrics()
