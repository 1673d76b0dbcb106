"""The dead-letter queue: every message is kept durably, its job ends `failed` (dead_lettered) unless
it is finished or held; a message the table refuses for good is kept in the payload bucket and
acknowledged, and one that could not be kept anywhere, or that the table may take later, stays on
the queue."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import handlers.dead_letter
from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.aws_errors import is_transient
from engine.core import ErrorCode, JobStatus, NewJob
from engine.core.errors import ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.store import DynamoJobStore
from engine.wiring import entry_point
from handlers.dead_letter import dead_letter_handler
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import ACKNOWLEDGED, Enqueue, TableReader, now_ms, open_job_ids, queued_bodies
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider

Handler = Callable[[dict[str, Any]], dict[str, Any]]
# maxReceiveCount was reached: the jobs queue moved the message here after that many receives.
RECEIVES = 11
REASON = f"reached the dead-letter queue after {RECEIVES} receives"


@pytest.fixture
def handler(lambda_environment: None) -> Handler:
    """The entry point of handlers.dead_letter, configured from the stack's environment."""
    lambda_handler = entry_point(handlers.dead_letter.build)
    return lambda event: lambda_handler(event, InvocationContext(function_name="aijobs-dead-letters"))


@pytest.fixture
def recorder(store: DynamoJobStore, registry: JobRegistry) -> DeadLetterRecorder:
    return DeadLetterRecorder(store, registry)


@pytest.fixture
def s3_keys(stack: StackResources) -> Callable[[], list[str]]:
    """The keys in the payload bucket, as a function to call after the fact."""
    s3 = boto3.client("s3")
    return lambda: [found["Key"] for found in s3.list_objects_v2(Bucket=stack.payload_bucket).get("Contents", [])]


def dead_letter(body: Any, message_id: str | None = None) -> dict[str, Any]:
    return sqs_record(body, message_id=message_id, receive_count=RECEIVES)


def test_a_garbage_message_is_kept_whole_and_acknowledged(handler: Handler, table: TableReader) -> None:
    # Given a message on the dead-letter queue whose body is not even JSON
    record = dead_letter("not json", message_id="dl-garbage")

    # When the dead-letter function handles it
    response = handler(sqs_event(record))

    # Then it is acknowledged, and kept with its body, attributes, receive count and reason
    assert response == ACKNOWLEDGED
    item = table.dead_letter("dl-garbage")
    assert item is not None
    assert (item["message_id"], item["body"], item["receive_count"]) == ("dl-garbage", "not json", RECEIVES)
    assert item["attributes"] == record["attributes"]
    assert item["attributes"]["ApproximateReceiveCount"] == str(RECEIVES)
    assert item["reason"] == REASON
    assert item["recorded_at"] > 0


def test_a_dead_lettered_queued_job_fails_with_its_input_kept_so_that_it_can_be_retried(
    handler: Handler,
    worker: WorkerHandler,
    provider: FakeProvider,
    jobs_client: AiJobsClient,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a message-carried job put back in the queue after a 503 (its input is only in the message)
    message = job_message("classify", "dl-queued")
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    record = enqueue(message)
    assert worker.handle(sqs_event(record), InvocationContext()) != ACKNOWLEDGED
    queued = table.job("dl-queued")
    assert (queued.status, queued.input_stored) == (JobStatus.QUEUED, False)

    # When that message reaches the dead-letter queue
    response = handler(sqs_event(dead_letter(message, message_id=record["messageId"])))

    # Then the message is kept and acknowledged, and the job fails with dead_lettered
    assert response == ACKNOWLEDGED
    assert table.dead_letter(record["messageId"]) is not None
    job = table.job("dl-queued")
    assert job.error is not None
    assert (job.status, job.error.code, job.error.retryable) == (JobStatus.FAILED, ErrorCode.DEAD_LETTERED, False)
    assert job.error.message == REASON
    assert job.finished_at is not None
    # And the input the message carried is stored now
    assert job.input_stored
    stored = table.input_item("dl-queued")
    assert stored is not None
    assert stored["input"] == '{"text":"Win a free cruise now!","labels":["spam","ham"]}'

    # So that `aijobs retry` puts it back in the queue
    assert jobs_client.retry("dl-queued").status is JobStatus.QUEUED


def test_a_dead_lettered_job_whose_worker_died_fails_in_three_requests(
    store: DynamoJobStore,
    registry: JobRegistry,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a message-carried job claimed by a worker that died (a 60 s lease), and a recorder 2 min later
    message = job_message("summarize", "dl-orphan")
    t0 = now_ms()
    store.claim_job("dl-orphan", "dead-worker", 60_000, t0, new_job(message))
    recorder = DeadLetterRecorder(store, registry, clock=lambda: (t0 + 120_000) / 1000)
    dynamodb_requests.reset()

    # When its message reaches the dead-letter queue
    outcome = recorder.record("m-orphan", json_body(message), {"ApproximateReceiveCount": "11"}, RECEIVES)

    # Then the job fails with dead_lettered and keeps its input: the record, a read, one write
    assert outcome == "failed"
    assert dict(dynamodb_requests.operations) == {"GetItem": 1, "TransactWriteItems": 2}
    job = table.job("dl-orphan")
    assert job.error is not None
    assert (job.status, job.error.code, job.lease_owner) == (JobStatus.FAILED, ErrorCode.DEAD_LETTERED, None)
    assert table.input_item("dl-orphan") is not None
    assert table.dead_letter("m-orphan") is not None


def test_a_dead_lettered_job_held_with_a_live_lease_is_left_to_its_worker(
    store: DynamoJobStore,
    recorder: DeadLetterRecorder,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job a worker holds for another five minutes
    message = job_message("classify", "dl-held")
    store.claim_job("dl-held", "live-worker", 300_000, now_ms(), new_job(message))
    before = table.job_item("dl-held")

    # When a copy of its message reaches the dead-letter queue
    outcome = recorder.record("m-held", json_body(message), {}, RECEIVES)

    # Then the message is kept but the job is not failed under its worker
    assert outcome == "held"
    assert table.dead_letter("m-held") is not None
    assert table.job_item("dl-held") == before


def test_a_dead_lettered_finished_job_stays_as_it_was(
    handler: Handler, worker: WorkerHandler, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a job that succeeded
    message = job_message("classify", "dl-done")
    assert worker.handle(sqs_event(enqueue(message)), InvocationContext()) == ACKNOWLEDGED
    before = table.job_item("dl-done")

    # When a duplicate of its message reaches the dead-letter queue
    response = handler(sqs_event(dead_letter(message, message_id="m-done")))

    # Then the duplicate is kept and acknowledged, and the job is unchanged
    assert response == ACKNOWLEDGED
    assert table.dead_letter("m-done") is not None
    assert table.job_item("dl-done") == before


def test_a_message_the_table_refuses_for_good_is_kept_in_the_payload_bucket_and_acknowledged(
    handler: Handler, monkeypatch: pytest.MonkeyPatch, table: TableReader, payloads: Any
) -> None:
    # Given a dead-letter function whose table does not exist (a refusal no retry will change)
    monkeypatch.setenv("JOBS_TABLE_NAME", "aijobs-no-such-table")
    record = dead_letter(json_body({"job_id": "dl-lost-job"}), message_id="dl-lost")

    # When it handles a message
    response = handler(sqs_event(record))

    # Then the message is acknowledged, kept whole in the payload bucket with why it was not recorded
    assert response == ACKNOWLEDGED
    kept = json.loads(payloads.get("dead-letters/unrecorded/dl-lost.json"))
    assert kept["message_id"] == "dl-lost"
    assert kept["body"] == json_body({"job_id": "dl-lost-job"})
    assert kept["attributes"] == record["attributes"]
    assert (kept["receive_count"], kept["reason"]) == (RECEIVES, REASON)
    assert kept["not_recorded_because"] == "ResourceNotFoundException: ResourceNotFoundException"
    assert kept["kept_at"] > 0
    assert table.dead_letter("dl-lost") is None


def test_a_message_neither_the_table_nor_the_bucket_takes_stays_on_the_queue(
    handler: Handler, monkeypatch: pytest.MonkeyPatch, table: TableReader
) -> None:
    # Given a dead-letter function whose table and bucket do not exist
    monkeypatch.setenv("JOBS_TABLE_NAME", "aijobs-no-such-table")
    monkeypatch.setenv("JOBS_PAYLOAD_BUCKET", "aijobs-no-such-bucket")
    record = dead_letter("not json", message_id="dl-nowhere")

    # When it handles a message
    response = handler(sqs_event(record))

    # Then the message is reported as failed (so it is not deleted): the queue's retention is its end
    assert response == {"batchItemFailures": [{"itemIdentifier": "dl-nowhere"}]}
    assert table.dead_letter("dl-nowhere") is None


def test_a_message_the_table_may_take_later_stays_on_the_queue_and_is_not_copied(
    stack: StackResources, dynamodb: Any, registry: JobRegistry, payloads: Any, s3_keys: Callable[[], list[str]]
) -> None:
    # Given a recorder whose table answers as a throttled or unavailable one does
    store = DynamoJobStore(stack.table_name, client=RefusingTransactions(dynamodb), payloads=payloads)  # type: ignore[arg-type]
    recorder = DeadLetterRecorder(store, registry, is_transient=is_transient)
    record = dead_letter("not json", message_id="dl-throttled")

    # When it handles the message
    response = dead_letter_handler(recorder)(sqs_event(record), InvocationContext(function_name="aijobs-dead-letters"))

    # Then it stays on the queue, to be recorded on a later receive; nothing went to the bucket
    assert response == {"batchItemFailures": [{"itemIdentifier": "dl-throttled"}]}
    assert s3_keys() == []


class RefusingTransactions:
    """A DynamoDB client whose TransactWriteItems (a dead letter's write) fails as a throttled or
    unreachable table's would."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **_: Any) -> Any:
        raise ClientError({"Error": {"Code": "InternalServerError", "Message": "try again"}}, "TransactWriteItems")


def test_a_job_is_not_failed_when_its_dead_letter_could_not_be_recorded(
    stack: StackResources,
    dynamodb: Any,
    registry: JobRegistry,
    store: DynamoJobStore,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a queued job, and a recorder whose writes of records fail
    message = job_message("classify", "dl-unrecorded")
    store.create_job("dl-unrecorded", new_job(message), message["input"], now_ms())
    before = table.job_item("dl-unrecorded")
    recorder = DeadLetterRecorder(DynamoJobStore(stack.table_name, client=RefusingTransactions(dynamodb)), registry)  # type: ignore[arg-type]

    # When its message reaches the dead-letter queue, Then the recorder raises (the record stays on the queue)
    with pytest.raises(ClientError, match="InternalServerError"):
        recorder.record("m-unrecorded", json_body({"job_id": "dl-unrecorded"}), {}, RECEIVES)

    # And the job is left as it was: nothing is ended without its message kept
    assert table.job_item("dl-unrecorded") == before
    assert table.dead_letter("m-unrecorded") is None


def json_body(message: dict[str, Any]) -> str:
    return json.dumps(message)


def test_a_dead_lettered_message_that_conflicts_with_its_job_neither_fails_it_nor_gives_it_its_input(
    worker: WorkerHandler, provider: FakeProvider, recorder: DeadLetterRecorder, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a message-carried job put back in the queue after a 503 (its own message will come back)
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    assert worker.handle(sqs_event(enqueue(job_message("classify", "dl-conflict"))), InvocationContext()) != (
        ACKNOWLEDGED
    )
    before = table.job_item("dl-conflict")

    # When another message with the same job id but a different input reaches the dead-letter queue
    other = job_message("classify", "dl-conflict", input={"text": "Lunch at noon?", "labels": ["spam", "ham"]})
    recorder.record("m-conflict", json_body(other), {}, RECEIVES)

    # Then it is kept, but the job it does not belong to is left as it was, without the other input
    assert table.dead_letter("m-conflict") is not None
    assert table.input_item("dl-conflict") is None
    assert table.job_item("dl-conflict") == before


# --- jobs that reached the dead-letter queue before any worker created them ----------------------


def test_a_dead_lettered_request_whose_job_was_never_created_becomes_a_failed_job_that_can_be_retried(
    handler: Handler,
    worker: WorkerHandler,
    provider: FakeProvider,
    jobs_client: AiJobsClient,
    table: TableReader,
    sqs: Any,
    stack: StackResources,
) -> None:
    # Given a full job request that reached the dead-letter queue with no worker ever claiming it
    # (a deployment whose worker crashed on import, say)
    message = job_message("classify", "dl-unclaimed")
    assert table.job_item("dl-unclaimed") is None

    # When the dead-letter function handles it
    response = handler(sqs_event(dead_letter(message, message_id="m-unclaimed")))

    # Then the message is kept, and its job exists: failed with dead_lettered, its input stored
    assert response == ACKNOWLEDGED
    assert table.dead_letter("m-unclaimed") is not None
    view = jobs_client.get("dl-unclaimed")
    assert view.error is not None
    assert (view.status, view.job_type, view.user_id) == (JobStatus.FAILED, "classify", "user-1")
    assert (view.error.code, view.error.message) == (ErrorCode.DEAD_LETTERED, REASON)
    assert "dl-unclaimed" not in open_job_ids(table)
    stored = table.input_item("dl-unclaimed")
    assert stored is not None
    assert json.loads(stored["input"]) == message["input"]

    # And `aijobs retry` runs it
    assert jobs_client.retry("dl-unclaimed").status is JobStatus.QUEUED
    (body,) = queued_bodies(sqs, stack.queue_url)
    assert worker.handle(sqs_event(sqs_record(body)), InvocationContext()) == ACKNOWLEDGED
    assert table.job("dl-unclaimed").status is JobStatus.SUCCEEDED
    assert provider.calls == 1


def test_a_duplicate_dead_letter_of_an_unclaimed_request_leaves_the_job_as_it_is(
    recorder: DeadLetterRecorder, table: TableReader
) -> None:
    message = job_message("classify", "dl-twice")

    first = recorder.record("m-1", json_body(message), {}, RECEIVES)
    second = recorder.record("m-2", json_body(message), {}, RECEIVES)

    assert (first, second) == ("failed", "recorded")
    assert table.job("dl-twice").status is JobStatus.FAILED


def test_a_dead_lettered_bad_message_with_a_job_id_fails_that_job_with_its_own_error(
    recorder: DeadLetterRecorder, table: TableReader
) -> None:
    message = job_message("classify", "dl-bad") | {"job_type": "no_such_type"}

    outcome = recorder.record("m-bad", json_body(message), {}, RECEIVES)

    assert outcome == "failed"
    job = table.job("dl-bad")
    assert job.error is not None
    assert (job.status, job.error.code, job.job_type) == (JobStatus.FAILED, ErrorCode.UNKNOWN_JOB_TYPE, "no_such_type")


def test_a_600_kb_dead_letter_is_kept_whole_in_the_payload_bucket(
    handler: Handler, table: TableReader, payloads: Any
) -> None:
    body = "z" * 600_000

    response = handler(sqs_event(dead_letter(body, message_id="dl-huge")))

    assert response == ACKNOWLEDGED
    item = table.dead_letter("dl-huge")
    assert item is not None
    assert payloads.get(item["body_key"]).decode() == body
