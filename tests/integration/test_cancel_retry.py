"""Cancellation (a queued job at once, a running one at its finishing fence) and `retry` of a failed job."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.core import ErrorCode, JobStatus, NewJob
from engine.core.errors import JobNotFoundError, JobStateError, ProviderRejectedError, ProviderUnavailableError
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest
from engine.store import DynamoJobStore, JobListing, UsageLedger
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import (
    ACKNOWLEDGED,
    Enqueue,
    RecordingQueue,
    TableReader,
    WorkerFactory,
    now_ms,
    open_job_ids,
    queued_bodies,
)
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS, FakeProvider, valid_answer

DAY_MS = 86_400_000


# --- cancel a queued job ------------------------------------------------------------------------


def test_cancelling_a_queued_job_ends_it_at_once_and_its_message_runs_nothing(
    store: DynamoJobStore,
    jobs_client: AiJobsClient,
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job created beforehand and waiting in the queue
    message = job_message("classify", "cancel-queued")
    store.create_job("cancel-queued", new_job(message), message["input"], now_ms())
    assert "cancel-queued" in open_job_ids(table)
    dynamodb_requests.reset()

    # When it is cancelled
    view = jobs_client.cancel("cancel-queued")

    # Then it is cancelled at once, in one write, and leaves the OpenJobs index
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1}
    assert (view.status, view.cancel_requested) == (JobStatus.CANCELLED, True)
    job = table.job("cancel-queued")
    assert (job.status, job.cancel_requested) == (JobStatus.CANCELLED, True)
    assert job.finished_at is not None
    assert (job.attempt_count, job.output, job.error) == (0, None, None)
    assert "cancel-queued" not in open_job_ids(table)
    dynamodb_requests.reset()

    # And when its reference message is delivered later, it is acknowledged without a provider call
    response = worker.handle(sqs_event(sqs_record({"job_id": "cancel-queued"})), InvocationContext())
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1}  # the refused claim only
    assert provider.calls == 0
    assert table.job("cancel-queued").status is JobStatus.CANCELLED


# --- cancel a running job -----------------------------------------------------------------------


def test_a_cancel_requested_during_the_provider_call_discards_the_output_and_keeps_the_usage(
    worker: WorkerHandler,
    provider: FakeProvider,
    side_store: DynamoJobStore,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model call during which the job's cancel is requested (by the CLI, say)
    def answer_after_cancel(request: CompletionRequest) -> Any:
        seen = side_store.request_cancel("cancel-running", now_ms())
        assert (seen.status, seen.cancel_requested) == (JobStatus.RUNNING, True)
        return valid_answer(request)

    provider.script = answer_after_cancel
    record = enqueue(job_message("classify", "cancel-running"))

    # When the worker finishes the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the finish meets the cancel fence: the job is cancelled and the message acknowledged
    assert response == ACKNOWLEDGED
    assert queue.visibility_changes == []
    # claim, the finish refused by the fence, the cancelled finish with the attempt
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "TransactWriteItems": 2}
    assert provider.calls == 1
    job = table.job("cancel-running")
    assert (job.status, job.cancel_requested) == (JobStatus.CANCELLED, True)
    assert job.finished_at is not None
    assert job.lease_owner is None
    # And the output is not stored
    assert (job.output, job.output_hash, job.error) == (None, None, None)
    # And the attempt's usage is kept
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    assert (job.usage.input_tokens, job.usage.output_tokens) == (100, 20)
    attempt = table.attempt("cancel-running", 1)
    assert attempt is not None
    assert attempt["outcome"] == "succeeded"
    assert "cancel-running" not in open_job_ids(table)


def test_a_retryable_failure_of_a_job_cancelled_meanwhile_ends_it_instead_of_retrying(
    worker: WorkerHandler,
    provider: FakeProvider,
    side_store: DynamoJobStore,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model call that fails with a 503, during which the job's cancel is requested
    def unavailable_after_cancel(_: CompletionRequest) -> Any:
        side_store.request_cancel("cancel-retryable", now_ms())
        return ProviderUnavailableError("provider unavailable (HTTP 503)")

    provider.script = unavailable_after_cancel
    record = enqueue(job_message("classify", "cancel-retryable"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the job is cancelled, not queued again, and the message is acknowledged without a backoff
    assert response == ACKNOWLEDGED
    assert queue.visibility_changes == []
    assert provider.calls == 1
    job = table.job("cancel-retryable")
    assert (job.status, job.cancel_requested) == (JobStatus.CANCELLED, True)
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    attempt = table.attempt("cancel-retryable", 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"]) == ("retryable", "provider_unavailable")


def test_a_cancel_requested_after_the_worker_died_is_settled_by_the_next_delivery(
    store: DynamoJobStore,
    side_store: DynamoJobStore,
    make_worker: WorkerFactory,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job claimed by a worker that died (a 60 s lease), whose cancel was then requested
    message = job_message("classify", "cancel-orphan")
    t0 = now_ms()
    store.create_job("cancel-orphan", new_job(message), message["input"], t0)
    store.claim_job("cancel-orphan", "dead-worker", 60_000, t0, None)
    assert side_store.request_cancel("cancel-orphan", t0).status is JobStatus.RUNNING
    later = make_worker(clock=lambda: (t0 + 120_000) / 1000)
    dynamodb_requests.reset()

    # When its message is delivered again after the lease expired
    response = later.handle(sqs_event(sqs_record({"job_id": "cancel-orphan"})), InvocationContext())

    # Then the refused claim is explained by the cancel and the job is cancelled, with no provider call
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 2}
    assert provider.calls == 0
    job = table.job("cancel-orphan")
    assert (job.status, job.cancel_requested) == (JobStatus.CANCELLED, True)
    assert (job.lease_owner, job.attempt_count, job.usage.attempts) == (None, 1, 0)
    assert "cancel-orphan" not in open_job_ids(table)


# --- cancel what cannot be cancelled ------------------------------------------------------------


def test_cancelling_a_finished_job_leaves_it_as_it_was(
    worker: WorkerHandler,
    jobs_client: AiJobsClient,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job that succeeded
    assert worker.handle(sqs_event(enqueue(job_message("classify", "cancel-done"))), InvocationContext()) == (
        ACKNOWLEDGED
    )
    before = table.job_item("cancel-done")
    dynamodb_requests.reset()

    # When it is cancelled
    view = jobs_client.cancel("cancel-done")

    # Then it is returned as it is, unchanged, after one refused write
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1}
    assert (view.status, view.cancel_requested) == (JobStatus.SUCCEEDED, False)
    assert view.output == VALID_OUTPUTS["classify"]
    assert table.job_item("cancel-done") == before


def test_cancelling_an_unknown_job_raises_job_not_found_and_creates_nothing(
    jobs_client: AiJobsClient, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given no job "cancel-nobody", When it is cancelled, Then JobNotFoundError
    with pytest.raises(JobNotFoundError, match="cancel-nobody"):
        jobs_client.cancel("cancel-nobody")

    # And the refused conditional write left no item behind
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1}
    assert table.job_item("cancel-nobody") is None


# --- retry --------------------------------------------------------------------------------------


def test_retrying_a_failed_job_runs_it_again_with_a_fresh_budget_and_adds_up_the_usage(
    stack: StackResources,
    sqs: Any,
    worker: WorkerHandler,
    provider: FakeProvider,
    store: DynamoJobStore,
    queue: RecordingQueue,
    registry: JobRegistry,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a message-carried job that failed permanently (its failing finish stored its input)
    provider.script = lambda _: ProviderRejectedError("provider rejected the request (HTTP 401)", status_code=401)
    assert worker.handle(sqs_event(enqueue(job_message("classify", "retry-1"))), InvocationContext()) == ACKNOWLEDGED
    failed = table.job("retry-1")
    assert failed.status is JobStatus.FAILED
    assert failed.input_stored
    assert failed.deadline_at is not None
    assert "retry-1" not in open_job_ids(table)
    # And a client whose clock is an hour later
    listing, ledger = JobListing(table.table_name, table.client), UsageLedger(table.table_name, table.client)
    client = AiJobsClient(store, queue, registry, listing=listing, ledger=ledger, clock=lambda: time.time() + 3600)
    dynamodb_requests.reset()

    # When it is retried
    view = client.retry("retry-1")

    # Then it is queued again with a fresh attempt budget and deadline, and its error cleared
    # (the job read, its update, and its input's expiry moved past the new deadline)
    assert dict(dynamodb_requests.operations) == {"GetItem": 1, "UpdateItem": 2}
    assert (view.status, view.attempt_count, view.error) == (JobStatus.QUEUED, 0, None)
    job = table.job("retry-1")
    assert (job.status, job.attempt_count, job.error, job.finished_at) == (JobStatus.QUEUED, 0, None, None)
    assert job.deadline_at is not None
    assert job.deadline_at >= failed.deadline_at + 3_600_000
    assert "retry-1" in open_job_ids(table)
    stored_input = table.input_item("retry-1")
    assert stored_input is not None
    assert stored_input["expires_at"] * 1000 > job.deadline_at
    # And a reference message is on the queue
    (body,) = queued_bodies(sqs, stack.queue_url)
    assert body == {"job_id": "retry-1"}
    dynamodb_requests.reset()

    # When that message is delivered to a healthy provider
    provider.script = valid_answer
    response = worker.handle(sqs_event(sqs_record(body)), InvocationContext())

    # Then the job succeeds: claim, the stored input, the finish
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "GetItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 2
    job = table.job("retry-1")
    assert (job.status, job.output, job.error) == (JobStatus.SUCCEEDED, VALID_OUTPUTS["classify"], None)
    assert (job.attempt_count, job.claim_count) == (1, 2)
    # And the usage of both runs adds up (the rejected call was not paid for), one attempt record each
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 2)
    first, second = table.attempt("retry-1", 1), table.attempt("retry-1", 2)
    assert first is not None
    assert second is not None
    assert (first["outcome"], first["error_code"]) == ("failed", ErrorCode.PROVIDER_REJECTED.value)
    assert second["outcome"] == "succeeded"
    assert "retry-1" not in open_job_ids(table)


def test_only_a_failed_job_can_be_retried(
    stack: StackResources,
    sqs: Any,
    store: DynamoJobStore,
    worker: WorkerHandler,
    jobs_client: AiJobsClient,
    table: TableReader,
    enqueue: Enqueue,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a queued job and a succeeded one
    message = job_message("classify", "retry-queued")
    store.create_job("retry-queued", new_job(message), message["input"], now_ms())
    assert worker.handle(sqs_event(enqueue(job_message("classify", "retry-done"))), InvocationContext()) == (
        ACKNOWLEDGED
    )
    before = {job_id: table.job_item(job_id) for job_id in ("retry-queued", "retry-done")}

    # When each is retried, Then JobStateError names its status
    with pytest.raises(JobStateError, match=r"job retry-queued is queued; only a failed job can be retried"):
        jobs_client.retry("retry-queued")
    with pytest.raises(JobStateError, match=r"job retry-done is succeeded; only a failed job can be retried"):
        jobs_client.retry("retry-done")
    with pytest.raises(JobNotFoundError, match="retry-nobody"):
        jobs_client.retry("retry-nobody")

    # And nothing changed, nothing was enqueued
    assert {job_id: table.job_item(job_id) for job_id in before} == before
    assert queued_bodies(sqs, stack.queue_url) == []


def test_a_failed_job_without_a_stored_input_cannot_be_retried(
    stack: StackResources,
    sqs: Any,
    worker: WorkerHandler,
    jobs_client: AiJobsClient,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given the failed job of a bad message (its input did not validate, so none was stored)
    bad = job_message("classify", "retry-bad", input={"text": "hi", "labels": ["only-one"]})
    assert worker.handle(sqs_event(enqueue(bad)), InvocationContext()) == ACKNOWLEDGED
    failed = table.job("retry-bad")
    assert failed.error is not None
    assert (failed.status, failed.error.code, failed.input_stored) == (
        JobStatus.FAILED,
        ErrorCode.INPUT_VALIDATION_FAILED,
        False,
    )
    before = table.job_item("retry-bad")

    # When it is retried, Then JobStateError says why
    with pytest.raises(JobStateError, match="no stored input"):
        jobs_client.retry("retry-bad")

    # And the job is unchanged and nothing was enqueued
    assert table.job_item("retry-bad") == before
    assert queued_bodies(sqs, stack.queue_url) == []
