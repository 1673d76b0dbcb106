"""`aijobs inspect` and `aijobs dead-letters` on moto: what each reads and writes, and in how many requests."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from aijobs.client import AiJobsClient, RedriveOutcome, RedriveResult
from aijobs.stack import StackResources
from engine.core import AttemptOutcome, ErrorCode, JobStatus, NewJob, Via
from engine.core.errors import JobNotFoundError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.store.items import dead_letter_key, job_key
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import ACKNOWLEDGED, RecordingQueue, TableReader, now_ms, queued_messages
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider, valid_answer

DAY_MS = 86_400_000
NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
RETENTION_S = 90 * 86_400


@pytest.fixture
def recorder(side_store: DynamoJobStore, registry: JobRegistry) -> DeadLetterRecorder:
    """The dead-letter function's recorder, on a client whose requests are not counted."""
    return DeadLetterRecorder(side_store, registry)


def client_at(store: DynamoJobStore, queue: RecordingQueue, registry: JobRegistry, at_ms: int) -> AiJobsClient:
    """The client API on the counted store, its clock at `at_ms`."""
    listing, ledger = JobListing(store.table_name), UsageLedger(store.table_name)
    return AiJobsClient(store, queue, registry, listing=listing, ledger=ledger, clock=lambda: at_ms / 1000)


# --- what recording a dead letter writes ------------------------------------------------------------


def test_a_dead_letter_naming_a_job_is_one_request_listing_it_and_pointing_to_it_from_the_job(
    store: DynamoJobStore, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # When a message naming a job is kept as a dead letter
    store.record_dead_letter("m-1", '{"job_id": "job-1"}', {}, 100, "reached the queue", NOW, "job-1")

    # Then one request wrote the dead letter, its entry in the day's listing and the job's pointer
    assert dict(dynamodb_requests.operations) == {"TransactWriteItems": 1}
    summary = {
        "message_id": "m-1",
        "job_id": "job-1",
        "receive_count": 100,
        "reason": "reached the queue",
        "recorded_at": NOW,
        "expires_at": NOW // 1000 + RETENTION_S,
    }
    letter = table.dead_letter("m-1")
    assert letter is not None
    assert {name: letter[name] for name in summary} == summary
    entry_key = {"pk": {"S": "DEADLETTERS#2027-01-15"}, "sk": {"S": f"{NOW:013d}#m-1"}}
    assert table.item(entry_key) == {"pk": "DEADLETTERS#2027-01-15", "sk": f"{NOW:013d}#m-1", **summary}
    assert table.item(job_key("job-1", "DEADLETTER#m-1")) == {"pk": "JOB#job-1", "sk": "DEADLETTER#m-1", **summary}


def test_a_dead_letter_naming_no_job_is_one_request_and_listed_only(
    store: DynamoJobStore, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # When a body that names no job is kept
    store.record_dead_letter("m-1", "not json", {}, 1, "not JSON", NOW)

    # Then one request wrote the dead letter and its listing entry, and nothing else
    assert dict(dynamodb_requests.operations) == {"TransactWriteItems": 1}
    assert set(table.snapshot()) == {("DEADLETTER#m-1", "DEADLETTER"), ("DEADLETTERS#2027-01-15", f"{NOW:013d}#m-1")}


def test_recording_a_message_again_is_one_refused_request_that_changes_nothing(
    store: DynamoJobStore, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a message kept as a dead letter naming a job
    store.record_dead_letter("m-1", '{"job_id": "job-1"}', {}, 3, "given up", NOW, "job-1")
    before = table.snapshot()
    dynamodb_requests.reset()

    # When it is recorded again a minute later, with another reason
    store.record_dead_letter("m-1", '{"job_id": "job-1"}', {}, 100, "reached the queue", NOW + 60_000, "job-1")

    # Then the one request is refused as a whole: the first recording stands, nothing is added
    assert dict(dynamodb_requests.operations) == {"TransactWriteItems": 1}
    assert table.snapshot() == before


# --- inspect ----------------------------------------------------------------------------------------


def test_inspect_reads_the_job_and_its_attempts_and_dead_letters_in_two_requests(
    store: DynamoJobStore,
    jobs_client: AiJobsClient,
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a submitted job (its input stored) that met a 503, then succeeded, and a dead letter naming it
    message = job_message("classify", "inspect-1")
    store.create_job("inspect-1", new_job(message), message["input"], now_ms())
    unavailable = ProviderUnavailableError("provider unavailable (HTTP 503)")
    provider.script = lambda request: unavailable if provider.calls == 1 else valid_answer(request)
    assert worker.handle(sqs_event(sqs_record({"job_id": "inspect-1"})), InvocationContext()) != ACKNOWLEDGED
    assert worker.handle(sqs_event(sqs_record({"job_id": "inspect-1"})), InvocationContext()) == ACKNOWLEDGED
    store.record_dead_letter("m-late", '{"job_id": "inspect-1"}', {}, 1, "a late copy", now_ms(), "inspect-1")
    dynamodb_requests.reset()

    # When it is inspected
    inspection = jobs_client.inspect("inspect-1")

    # Then two requests read it: the job, and one Query of its attempts and dead letters (not its input)
    assert dict(dynamodb_requests.operations) == {"GetItem": 1, "Query": 1}
    # The job as `get` reads it, and how its latest attempt ran (read with the attempts)
    assert inspection.job == jobs_client.get("inspect-1").model_copy(update={"via": Via.REALTIME})
    assert inspection.job.status is JobStatus.SUCCEEDED
    first, second = inspection.attempts
    assert (first.attempt, first.outcome, first.error_code) == (
        1,
        AttemptOutcome.RETRYABLE,
        ErrorCode.PROVIDER_UNAVAILABLE,
    )
    assert (second.attempt, second.outcome, second.error_code) == (2, AttemptOutcome.SUCCEEDED, None)
    assert (second.model, second.calls, second.input_tokens, second.output_tokens) == ("gpt-4o-mini", 1, 100, 20)
    assert second.duration_ms >= 0
    assert sum(Decimal(str(a.cost_usd)) for a in inspection.attempts) == Decimal(str(inspection.job.usage.cost_usd))
    assert [(d.message_id, d.job_id, d.reason) for d in inspection.dead_letters] == [
        ("m-late", "inspect-1", "a late copy")
    ]
    assert inspection.lease is None
    assert table.input_item("inspect-1") is not None


def test_inspect_of_a_running_job_shows_its_lease_and_whether_it_expired(
    store: DynamoJobStore, queue: RecordingQueue, registry: JobRegistry, new_job: Callable[..., NewJob]
) -> None:
    # Given a job a worker claimed with a one-minute lease
    store.claim_job("running-1", "worker-a", 60_000, NOW, new_job(job_message("classify", "running-1")))

    # When it is inspected during the lease, and after it
    during = client_at(store, queue, registry, NOW + 1_000).inspect("running-1")
    after = client_at(store, queue, registry, NOW + 61_000).inspect("running-1")

    # Then the lease is shown with its owner and expiry, expired only after it
    assert during.lease is not None
    assert after.lease is not None
    assert (during.lease.owner, during.lease.expires_at, during.lease.expired) == (
        "worker-a",
        "2027-01-15T08:01:00Z",
        False,
    )
    assert after.lease.expired
    assert during.attempts == []


def test_inspect_of_an_unknown_job_raises_not_found(jobs_client: AiJobsClient) -> None:
    with pytest.raises(JobNotFoundError, match="job ghost does not exist"):
        jobs_client.inspect("ghost")


# --- the listing ------------------------------------------------------------------------------------


def test_dead_letters_are_listed_newest_first_across_days_one_query_a_day(
    store: DynamoJobStore,
    side_store: DynamoJobStore,
    queue: RecordingQueue,
    registry: JobRegistry,
    dynamodb_requests: RequestCounter,
) -> None:
    # Given dead letters recorded yesterday, and two today
    side_store.record_dead_letter("m-yesterday", "not json", {}, 1, "not JSON", NOW - DAY_MS + 3_600_000)
    side_store.record_dead_letter("m-today-1", '{"job_id": "job-1"}', {}, 100, "reached", NOW - 2_000, "job-1")
    side_store.record_dead_letter("m-today-2", "not json", {}, 1, "not JSON", NOW - 1_000)
    client = client_at(store, queue, registry, NOW)
    dynamodb_requests.reset()

    # When the last day's are listed
    letters = client.dead_letters(since_seconds=86_400)

    # Then they come newest first, today's partition then yesterday's: one Query each
    assert [(letter.message_id, letter.job_id) for letter in letters] == [
        ("m-today-2", None),
        ("m-today-1", "job-1"),
        ("m-yesterday", None),
    ]
    assert letters[0].recorded_at == "2027-01-15T07:59:59Z"
    assert (letters[1].receive_count, letters[1].reason) == (100, "reached")
    assert dict(dynamodb_requests.operations) == {"Query": 2}
    dynamodb_requests.reset()

    # And with a limit that today's fill, yesterday's partition is not read
    assert [letter.message_id for letter in client.dead_letters(86_400, limit=2)] == ["m-today-2", "m-today-1"]
    assert dict(dynamodb_requests.operations) == {"Query": 1}


# --- redrive ----------------------------------------------------------------------------------------


def test_redrive_of_a_dead_letter_naming_a_failed_job_requeues_it_as_retry_does(
    stack: StackResources,
    sqs: Any,
    recorder: DeadLetterRecorder,
    jobs_client: AiJobsClient,
    worker: WorkerHandler,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a full request that reached the dead-letter queue before any worker claimed it
    message = job_message("classify", "redrive-1")
    assert recorder.record("m-dl", json.dumps(message), {}, 100) == "failed"
    assert table.job("redrive-1").status is JobStatus.FAILED
    dynamodb_requests.reset()

    # When its dead letter is redriven
    results = jobs_client.redrive(["m-dl"])

    # Then its job is queued again and its message sent: the dead letter read, then a retry's requests
    assert results == [RedriveResult("m-dl", "redrive-1", RedriveOutcome.REQUEUED, "job redrive-1 queued again")]
    assert dict(dynamodb_requests.operations) == {"GetItem": 2, "UpdateItem": 2}
    assert table.job("redrive-1").status is JobStatus.QUEUED
    ((body, group),) = queued_messages(sqs, stack.queue_url)
    assert (body, group) == ({"job_id": "redrive-1"}, message["user_id"])

    # And that message runs it to success
    assert worker.handle(sqs_event(sqs_record(body)), InvocationContext()) == ACKNOWLEDGED
    assert table.job("redrive-1").status is JobStatus.SUCCEEDED


def test_redrive_never_resends_a_body_that_names_no_job(
    stack: StackResources,
    sqs: Any,
    recorder: DeadLetterRecorder,
    jobs_client: AiJobsClient,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a body that names no job, kept as a dead letter
    recorder.record("m-garbage", "not json", {}, 100)
    before = table.snapshot()
    dynamodb_requests.reset()

    # When it is redriven, with the id of a dead letter that does not exist
    results = jobs_client.redrive(["m-garbage", "m-missing"])

    # Then neither is redriven; nothing is sent or written, only the dead letters read
    assert results == [
        RedriveResult("m-garbage", None, RedriveOutcome.NO_JOB, "names no job; not re-sent"),
        RedriveResult("m-missing", None, RedriveOutcome.ERROR, "no such dead letter"),
    ]
    assert not any(result.redriven for result in results)
    assert dict(dynamodb_requests.operations) == {"GetItem": 2}
    assert queued_messages(sqs, stack.queue_url) == []
    assert table.snapshot() == before


def test_redrive_all_requeues_failed_jobs_and_skips_the_others(
    stack: StackResources,
    sqs: Any,
    recorder: DeadLetterRecorder,
    jobs_client: AiJobsClient,
    worker: WorkerHandler,
    table: TableReader,
) -> None:
    # Given, oldest first: a request dead-lettered before its job was created, a body naming no job,
    # and a copy of a message whose job succeeded
    recorder.record("m-1", json.dumps(job_message("classify", "all-1")), {}, 100)
    recorder.record("m-2", "not json", {}, 100)
    assert worker.handle(sqs_event(sqs_record(job_message("classify", "all-3"))), InvocationContext()) == ACKNOWLEDGED
    recorder.record("m-3", json.dumps({"job_id": "all-3"}), {}, 100)

    # When every dead letter of the last day is redriven
    results = jobs_client.redrive_all(since_seconds=86_400)

    # Then, newest first: the succeeded job is skipped, the garbage not re-sent, the failed job requeued
    assert [(result.message_id, result.outcome) for result in results] == [
        ("m-3", RedriveOutcome.SKIPPED),
        ("m-2", RedriveOutcome.NO_JOB),
        ("m-1", RedriveOutcome.REQUEUED),
    ]
    assert results[0].detail == "job all-3 is succeeded; only a failed job can be retried"
    assert [body for body, _ in queued_messages(sqs, stack.queue_url)] == [{"job_id": "all-1"}]
    assert table.job("all-3").status is JobStatus.SUCCEEDED
    assert table.item(dead_letter_key("m-2")) is not None
