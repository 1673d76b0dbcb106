"""Messages that cannot run as sent (malformed, wrong schema version) and references to jobs created beforehand."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from engine.core import ErrorCode, JobStatus, NewJob
from engine.core.errors import JobConflictError
from engine.store import DynamoJobStore
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader, WorkerFactory, now_ms
from tests.support.events import InvocationContext, job_message, load_event, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS, FakeProvider

NOT_JSON_ID = "0b6f0d3e-5d54-4c57-9b2a-1f3c8a7e1004"
LIST_BODY_ID = "0b6f0d3e-5d54-4c57-9b2a-1f3c8a7e1005"

# --- malformed messages -------------------------------------------------------------------------


def test_malformed_messages_are_recorded_and_acknowledged(
    worker: WorkerHandler, provider: FakeProvider, table: TableReader
) -> None:
    # Given events/malformed.json: not JSON, a JSON list, an invalid input, an unknown job type
    event = load_event("malformed")

    # When the worker handles it
    response = worker.handle(event, InvocationContext())

    # Then all four records are acknowledged and nothing reached the provider
    assert response == {"batchItemFailures": []}
    assert provider.calls == 0
    # And the two bodies that name no job are kept as dead letters, with the body and a one-line reason
    for record in event["Records"][:2]:
        dead = table.dead_letter(record["messageId"])
        assert dead is not None, record["messageId"]
        assert dead["body"] == record["body"]
        assert dead["reason"]
        assert "\n" not in dead["reason"]
    dead_not_json = table.dead_letter(NOT_JSON_ID)
    dead_list = table.dead_letter(LIST_BODY_ID)
    assert dead_not_json is not None
    assert dead_list is not None
    assert "not JSON" in dead_not_json["reason"]
    assert "list" in dead_list["reason"]
    # And the two that name a job fail it with the matching code
    bad_input = table.job("evt-bad-input-1")
    assert bad_input.status is JobStatus.FAILED
    assert bad_input.error is not None
    assert bad_input.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert "labels" in bad_input.error.message
    assert (bad_input.job_type, bad_input.user_id) == ("classify", "user-1")
    unknown = table.job("evt-unknown-type-1")
    assert unknown.status is JobStatus.FAILED
    assert unknown.error is not None
    assert unknown.error.code is ErrorCode.UNKNOWN_JOB_TYPE


def test_a_redelivered_malformed_event_never_loops(
    worker: WorkerHandler, provider: FakeProvider, table: TableReader
) -> None:
    # Given events/malformed.json handled once
    event = load_event("malformed")
    worker.handle(event, InvocationContext())
    jobs = {job_id: table.job_item(job_id) for job_id in ("evt-bad-input-1", "evt-unknown-type-1")}

    # When the same event is delivered again
    response = worker.handle(event, InvocationContext())

    # Then every record is acknowledged again, the failed jobs are unchanged, nothing was called
    assert response == {"batchItemFailures": []}
    assert provider.calls == 0
    assert {job_id: table.job_item(job_id) for job_id in jobs} == jobs


def test_a_redelivered_malformed_event_changes_nothing(
    make_worker: WorkerFactory, provider: FakeProvider, table: TableReader
) -> None:
    # Given events/malformed.json handled once by a worker whose clock stands still
    frozen = time.time()
    worker = make_worker(clock=lambda: frozen)
    event = load_event("malformed")
    worker.handle(event, InvocationContext())
    before = table.snapshot()

    # When the same event is delivered again
    worker.handle(event, InvocationContext())

    # Then the table is exactly as it was
    assert table.snapshot() == before


# --- schema versions ----------------------------------------------------------------------------


def test_a_message_of_another_schema_version_fails_its_job(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a message written for schema version 2 of classify (which is at version 1)
    record = sqs_record(job_message("classify", "version-1", schema_version=2))

    # When the worker handles it
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the job is written as failed, without a claim or a provider call, and acknowledged
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"PutItem": 1}
    assert provider.calls == 0
    job = table.job("version-1")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code is ErrorCode.SCHEMA_VERSION_MISMATCH
    assert job.attempt_count == 0


def test_a_job_created_with_another_schema_version_fails_when_claimed(
    worker: WorkerHandler,
    store: DynamoJobStore,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job created beforehand with schema version 2
    message = job_message("classify", "version-2")
    store.create_job("version-2", new_job(message, schema_version=2), message["input"], now_ms())
    dynamodb_requests.reset()

    # When a reference to it is delivered
    response = worker.handle(sqs_event(sqs_record({"job_id": "version-2"})), InvocationContext())

    # Then the job is claimed, then failed without reading its input or calling the provider
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 2}
    assert provider.calls == 0
    job = table.job("version-2")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code is ErrorCode.SCHEMA_VERSION_MISMATCH
    assert job.attempt_count == 1
    assert job.started_at is not None


# --- jobs created beforehand --------------------------------------------------------------------


def test_a_job_created_beforehand_runs_from_a_reference_message(
    worker: WorkerHandler,
    store: DynamoJobStore,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job created by the client: input stored once, status queued
    message = job_message("answer_with_citations", "created-1")
    job, created = store.create_job("created-1", new_job(message), message["input"], now_ms())
    assert created
    assert job.status is JobStatus.QUEUED
    dynamodb_requests.reset()

    # When a message of only its job id is delivered
    response = worker.handle(sqs_event(sqs_record({"job_id": "created-1"})), InvocationContext())

    # Then it succeeds with one request more than a message-carried job: claim, read input, finish
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 1, "GetItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 1
    assert "Up to 14 days." in provider.requests[0].user
    finished = table.job("created-1")
    assert finished.status is JobStatus.SUCCEEDED
    assert finished.output == VALID_OUTPUTS["answer_with_citations"]
    assert (finished.attempt_count, finished.usage.attempts) == (1, 1)


def test_creating_a_job_is_idempotent_and_refuses_a_different_input(
    store: DynamoJobStore, table: TableReader, new_job: Callable[..., NewJob]
) -> None:
    # Given a job created once
    message = job_message("classify", "created-2")
    first, created = store.create_job("created-2", new_job(message), message["input"], now_ms())
    assert created

    # When the same request is made again, Then it is the same job, not a new one
    again, created_again = store.create_job("created-2", new_job(message), message["input"], now_ms())
    assert not created_again
    assert again == first

    # When the id is reused with another input, Then it is refused and the stored input is kept
    other = job_message("classify", "created-2", input={"text": "Lunch?", "labels": ["spam", "ham"]})
    with pytest.raises(JobConflictError):
        store.create_job("created-2", new_job(other), other["input"], now_ms())
    stored = table.input_item("created-2")
    assert stored is not None
    assert "Win a free cruise now!" in stored["input"]


def test_a_reference_to_a_job_that_does_not_exist_is_dead_lettered(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a message naming a job nobody created
    record = sqs_record({"job_id": "nobody-made-this"})

    # When the worker handles it
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then it is kept as a dead letter and acknowledged; no job is created
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 0
    dead = table.dead_letter(record["messageId"])
    assert dead is not None
    assert dead["body"] == record["body"]
    assert "nobody-made-this" in dead["reason"]
    assert table.job_item("nobody-made-this") is None
