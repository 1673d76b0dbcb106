"""Attempt outcomes: retryable, rate limited, permanent, invalid answers, lost leases, time and deadlines."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from engine.core import ErrorCode, JobStatus, NewJob
from engine.core.errors import ProviderRateLimitedError, ProviderRejectedError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.worker import Worker
from handlers.worker import QUEUE_VISIBILITY_SECONDS, VISIBILITY_MARGIN_SECONDS, WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import Enqueue, RecordingQueue, TableReader, WorkerFactory, now_ms
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS, FakeProvider, valid_answer

ONE_ROUND_TRIP = {"UpdateItem": 1, "TransactWriteItems": 1}
# 100 input and 20 output tokens: gpt-4o-mini at $0.15/$0.60 per million, gpt-4o at $2.50/$10.00.
COST_OF_ONE_MINI_CALL = Decimal("0.000027")
COST_OF_ONE_4O_CALL = Decimal("0.00045")


def failed_record(record: dict[str, Any]) -> dict[str, Any]:
    return {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}


# --- retryable ----------------------------------------------------------------------------------


def test_an_unavailable_provider_puts_the_job_back_with_a_backoff(
    worker: WorkerHandler,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider answering 5xx
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    record = enqueue(job_message("classify", "retry-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the record comes back after a backoff of attempt 1 (full jitter in [1, 2] s)
    requests = dict(dynamodb_requests.operations)
    assert response == failed_record(record)
    assert requests == ONE_ROUND_TRIP
    ((handle, seconds),) = queue.visibility_changes
    assert handle == record["receiptHandle"]
    assert 1 <= seconds <= 2
    assert queue.refused == []
    # And the job is queued again with the error and the attempt recorded
    job = table.job("retry-1")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_UNAVAILABLE, True)
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    assert job.lease_owner is None
    attempt = table.attempt("retry-1", 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"]) == ("retryable", "provider_unavailable")


def test_the_last_allowed_attempt_fails_the_job_and_keeps_its_input(
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job with a budget of 2 attempts and a provider that is always down
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    message = job_message("classify", "spent-1", max_attempts=2)
    first = enqueue(message)
    assert worker.handle(sqs_event(first), InvocationContext()) == failed_record(first)
    dynamodb_requests.reset()

    # When the message is delivered a second time
    second = enqueue(message)
    response = worker.handle(sqs_event(second), InvocationContext())

    # Then the job fails for good and the message is acknowledged
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == ONE_ROUND_TRIP
    job = table.job("spent-1")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.MAX_ATTEMPTS_EXCEEDED, False)
    assert (job.attempt_count, job.max_attempts, job.usage.attempts) == (2, 2, 2)
    assert provider.calls == 2
    assert table.attempt("spent-1", 1) is not None
    assert table.attempt("spent-1", 2) is not None
    # And its input is stored now, so that `aijobs retry` can run it again
    stored = table.input_item("spent-1")
    assert stored is not None
    assert stored["input"] == '{"text":"Win a free cruise now!","labels":["spam","ham"]}'
    assert job.input_stored


def test_a_rate_limited_attempt_is_refunded_and_honours_retry_after(
    worker: WorkerHandler,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider answering 429 with Retry-After: 7
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=7)
    record = enqueue(job_message("classify", "limited-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the record comes back after exactly the provider's Retry-After
    requests = dict(dynamodb_requests.operations)
    assert response == failed_record(record)
    assert requests == ONE_ROUND_TRIP
    assert queue.visibility_changes == [(record["receiptHandle"], 7)]
    # And the attempt does not count against the budget, though it is recorded
    job = table.job("limited-1")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert job.error.code is ErrorCode.PROVIDER_RATE_LIMITED
    assert (job.attempt_count, job.usage.attempts) == (0, 1)


@pytest.mark.parametrize(
    ("receive_count", "first_received_ago", "expected_limit"),
    [
        # A first receive 2 minutes ago (this receive): SQS accepts 12 h from it
        (1, 120, 43_200 - 120 - VISIBILITY_MARGIN_SECONDS),
        # A redelivery first received 2 days ago: this receive is at most a visibility timeout old
        (4, 2 * 86_400, 43_200 - QUEUE_VISIBILITY_SECONDS - VISIBILITY_MARGIN_SECONDS),
    ],
)
def test_a_retry_after_past_what_sqs_accepts_is_clamped_to_it(
    receive_count: int,
    first_received_ago: int,
    expected_limit: int,
    worker: WorkerHandler,
    provider: FakeProvider,
    queue: RecordingQueue,
    enqueue: Enqueue,
) -> None:
    # Given a provider asking to wait 20 hours, for a job with a 7-day deadline
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=72_000)
    record = enqueue(job_message("classify", f"clamped-{receive_count}", deadline_seconds=604_800))
    first_received = int((time.time() - first_received_ago) * 1000)
    record["attributes"] |= {
        "ApproximateReceiveCount": str(receive_count),
        "ApproximateFirstReceiveTimestamp": str(first_received),
    }

    # When the worker handles it
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the message is hidden for the longest time SQS accepts for this receipt (not refused)
    assert response == failed_record(record)
    ((_, seconds),) = queue.visibility_changes
    assert expected_limit - 5 <= seconds <= expected_limit
    assert queue.refused == []


# --- permanent ----------------------------------------------------------------------------------


def test_a_rejected_request_fails_the_job_and_acknowledges_the_message(
    worker: WorkerHandler,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider that rejects the request (bad key)
    provider.script = lambda _: ProviderRejectedError("provider rejected the request (HTTP 401)", status_code=401)
    record = enqueue(job_message("summarize", "rejected-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the job fails once and for all, with the attempt and the input recorded in the same write
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == ONE_ROUND_TRIP
    assert queue.visibility_changes == []
    job = table.job("rejected-1")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_REJECTED, False)
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    assert table.attempt("rejected-1", 1) is not None
    assert table.input_item("rejected-1") is not None


@pytest.mark.parametrize(
    ("job_type", "answer", "code"),
    [
        pytest.param("classify", "this is not JSON", ErrorCode.SCHEMA_VALIDATION_FAILED, id="not-json"),
        pytest.param("classify", {"label": "spam"}, ErrorCode.SCHEMA_VALIDATION_FAILED, id="missing-field"),
        pytest.param(
            "classify", {"label": "eggs", "confidence": 0.5}, ErrorCode.BUSINESS_VALIDATION_FAILED, id="label"
        ),
        pytest.param(
            "summarize", {"summary": " ".join(["word"] * 13)}, ErrorCode.BUSINESS_VALIDATION_FAILED, id="too-long"
        ),
        pytest.param(
            "answer_with_citations",
            {"answer": "Up to 14 days.", "citations": ["d9"]},
            ErrorCode.REFERENCE_VALIDATION_FAILED,
            id="unknown-citation",
        ),
    ],
)
def test_an_answer_that_fails_validation_fails_the_job_with_its_tokens(
    job_type: str,
    answer: Any,
    code: ErrorCode,
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model whose answer breaks the job type's output model or rule, and again when re-asked
    provider.script = lambda _: answer
    job_id = f"invalid-{job_type}"
    record = enqueue(job_message(job_type, job_id))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the job fails with the matching code after the answer and its one repair, both paid for
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == ONE_ROUND_TRIP
    assert provider.calls == 2
    job = table.job(job_id)
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (code, False)
    assert job.output is None
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (200, 40, 1)
    assert job.usage.cost_usd == 2 * COST_OF_ONE_MINI_CALL
    attempt = table.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"]) == ("failed", code.value)
    assert (attempt["input_tokens"], attempt["output_tokens"], attempt["calls"]) == (200, 40, 2)
    assert (attempt["tier"], attempt["model"]) == ("primary", "gpt-4o-mini")


def test_an_answer_mended_on_the_re_ask_succeeds_with_the_tokens_of_both_calls(
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model that offers a label the input does not, then corrects itself when told why
    def wrong_then_right(request: CompletionRequest) -> Any:
        if not request.conversation:
            return {"label": "eggs", "confidence": 0.5}
        return valid_answer(request)

    provider.script = wrong_then_right
    record = enqueue(job_message("classify", "mended-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the job succeeds in one attempt, with the corrected answer, in the usual two writes
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == ONE_ROUND_TRIP
    assert provider.calls == 2
    assert "label 'eggs' is not one of the 2 labels offered" in provider.requests[1].conversation[1].content
    job = table.job("mended-1")
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == VALID_OUTPUTS["classify"]
    assert job.error is None
    # And the usage holds both calls of the one attempt
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    assert (job.usage.input_tokens, job.usage.output_tokens) == (200, 40)
    assert job.usage.cost_usd == 2 * COST_OF_ONE_MINI_CALL
    attempt = table.attempt("mended-1", 1)
    assert attempt is not None
    assert attempt["outcome"] == "succeeded"
    assert "error_code" not in attempt
    assert (attempt["calls"], attempt["tier"], attempt["model"]) == (2, "primary", "gpt-4o-mini")
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (200, 40)
    assert Decimal(attempt["cost_usd"]) == 2 * COST_OF_ONE_MINI_CALL
    assert table.attempt("mended-1", 2) is None


# --- fallback -----------------------------------------------------------------------------------


def test_an_unavailable_primary_model_falls_back_within_the_attempt(
    store: DynamoJobStore,
    provider: FakeProvider,
    registry: JobRegistry,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a worker with a fallback model, and a primary model answering 503
    gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini", "gpt-4o"))
    runner = JobRunner(store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(7))
    worker = WorkerHandler(Worker(runner), queue)

    def primary_down(request: CompletionRequest) -> Any:
        if request.model == "gpt-4o-mini":
            return ProviderUnavailableError("provider unavailable (HTTP 503)")
        return valid_answer(request)

    provider.script = primary_down
    record = enqueue(job_message("classify", "fallback-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then the fallback model's answer succeeds the job in one attempt, without a backoff
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == ONE_ROUND_TRIP
    assert queue.visibility_changes == []
    assert [request.model for request in provider.requests] == ["gpt-4o-mini", "gpt-4o"]
    job = table.job("fallback-1")
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == VALID_OUTPUTS["classify"]
    assert job.error is None
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    # And only the fallback's answer is paid for, at its price
    assert (job.usage.input_tokens, job.usage.output_tokens) == (100, 20)
    assert job.usage.cost_usd == COST_OF_ONE_4O_CALL
    # And the attempt names the model that answered and its tier
    attempt = table.attempt("fallback-1", 1)
    assert attempt is not None
    assert attempt["outcome"] == "succeeded"
    assert "error_code" not in attempt
    assert (attempt["model"], attempt["tier"], attempt["calls"]) == ("gpt-4o", "fallback", 2)
    assert Decimal(attempt["cost_usd"]) == COST_OF_ONE_4O_CALL
    assert table.attempt("fallback-1", 2) is None


# --- lease lost ---------------------------------------------------------------------------------


def test_a_worker_that_lost_its_lease_keeps_the_usage_but_not_the_result(
    worker: WorkerHandler,
    provider: FakeProvider,
    stack: Any,
    dynamodb: Any,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider call during which the lease expires and another worker takes the job over
    other_store = DynamoJobStore(stack.table_name, client=dynamodb)

    def answer_after_takeover(request: CompletionRequest) -> Any:
        after_lease = now_ms() + 400_000  # past the first worker's lease (the context's 300 s)
        other_store.claim_job("lease-1", "other-worker", 60_000, after_lease, None)
        return valid_answer(request)

    provider.script = answer_after_takeover
    record = enqueue(job_message("classify", "lease-1"))

    # When the first worker finishes
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then its fenced finish is refused: the record comes back while the other worker holds the job
    requests = dict(dynamodb_requests.operations)
    assert response == failed_record(record)
    # claim, the takeover, the refused finish, the orphan attempt's usage
    assert requests == {"UpdateItem": 2, "TransactWriteItems": 2}
    # And the job is the other worker's, without this worker's output
    job = table.job("lease-1")
    assert job.status is JobStatus.RUNNING
    assert job.lease_owner == "other-worker"
    assert job.output is None
    assert (job.attempt_count, job.claim_count) == (2, 2)
    # And the tokens this attempt spent are still accounted for
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    attempt = table.attempt("lease-1", 1)
    assert attempt is not None
    assert attempt["outcome"] == "succeeded"


# --- time ---------------------------------------------------------------------------------------


def test_too_little_invocation_time_releases_the_job_without_spending_an_attempt(
    worker: WorkerHandler,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given an invocation with 30 s left, less than classify's 60 s timeout plus the finishing margin
    record = enqueue(job_message("classify", "short-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext(timeout_seconds=30))

    # Then the provider is not called and the job goes back to the queue with its attempt refunded
    requests = dict(dynamodb_requests.operations)
    assert response == failed_record(record)
    assert requests == {"UpdateItem": 2}
    assert provider.calls == 0
    ((handle, seconds),) = queue.visibility_changes
    assert handle == record["receiptHandle"]
    assert seconds >= 1
    job = table.job("short-1")
    assert job.status is JobStatus.QUEUED
    assert (job.attempt_count, job.usage.attempts) == (0, 0)
    assert job.lease_owner is None
    assert table.attempt("short-1", 1) is None


def test_a_re_ask_gets_only_the_invocation_time_left_less_the_finishing_margin(
    worker: WorkerHandler, provider: FakeProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a 300 s invocation in which the model's first, wrong answer takes 250 s
    context = InvocationContext(timeout_seconds=300)

    def slow_wrong_then_right(request: CompletionRequest) -> Any:
        if not request.conversation:
            context._deadline -= 250  # 250 s pass
            return {"label": "eggs", "confidence": 0.5}
        return valid_answer(request)

    provider.script = slow_wrong_then_right
    record = enqueue(job_message("classify", "clock-1"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), context)

    # Then the first call may take classify's 60 s, the re-ask only what is left less 5 s for the finish
    assert response == {"batchItemFailures": []}
    first, second = (request.timeout_seconds for request in provider.requests)
    assert first == 60.0
    assert 40.0 < second <= 45.0  # 300 - 250 - 5, less the moments the test itself took
    assert table.job("clock-1").status is JobStatus.SUCCEEDED


def test_a_re_ask_without_time_left_puts_the_job_back_and_keeps_the_first_answers_tokens(
    worker: WorkerHandler, provider: FakeProvider, queue: RecordingQueue, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a 300 s invocation in which the model's first, wrong answer takes 295 s
    context = InvocationContext(timeout_seconds=300)

    def slow_and_wrong(_: CompletionRequest) -> Any:
        context._deadline -= 295
        return {"label": "eggs", "confidence": 0.5}

    provider.script = slow_and_wrong
    record = enqueue(job_message("classify", "clock-2"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), context)

    # Then no re-ask starts: the attempt times out, and the job is queued again with a backoff
    assert response == failed_record(record)
    assert provider.calls == 1
    ((_, seconds),) = queue.visibility_changes
    assert 1 <= seconds <= 2
    job = table.job("clock-2")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_TIMEOUT, True)
    # And the one answer's tokens are paid for
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    attempt = table.attempt("clock-2", 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"], attempt["calls"]) == ("retryable", "provider_timeout", 1)


def test_a_job_past_its_deadline_fails_without_a_provider_call(
    store: DynamoJobStore,
    make_worker: WorkerFactory,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job created with a 60 s deadline, and a worker whose clock is two minutes later
    message = job_message("classify", "late-1")
    store.create_job("late-1", new_job(message, deadline_seconds=60), message["input"], now_ms())
    worker = make_worker(clock=lambda: time.time() + 120)
    dynamodb_requests.reset()

    # When a reference to the job is delivered
    response = worker.handle(sqs_event(sqs_record({"job_id": "late-1"})), InvocationContext())

    # Then the refused claim is explained by the deadline and the job fails, acknowledged
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 2}
    assert provider.calls == 0
    job = table.job("late-1")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.DEADLINE_EXCEEDED, False)
    assert job.attempt_count == 0


def rate_limited_then_late(make_worker: WorkerFactory, provider: FakeProvider, enqueue: Enqueue) -> dict[str, Any]:
    """A message-carried job with a 60 s deadline is rate limited, then redelivered after its deadline."""
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=7)
    message = job_message("classify", "late-2", deadline_seconds=60)
    first = enqueue(message)
    assert make_worker().handle(sqs_event(first), InvocationContext()) == failed_record(first)
    late = make_worker(clock=lambda: time.time() + 120)
    return late.handle(sqs_event(enqueue(message)), InvocationContext())


def test_a_message_carried_job_redelivered_after_its_deadline_fails(
    make_worker: WorkerFactory, provider: FakeProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a job released after a 429, When its message comes back after the deadline
    response = rate_limited_then_late(make_worker, provider, enqueue)

    # Then the job fails with deadline_exceeded, and the message is acknowledged
    assert response == {"batchItemFailures": []}
    assert provider.calls == 1
    job = table.job("late-2")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code is ErrorCode.DEADLINE_EXCEEDED


def test_a_job_failed_at_its_deadline_keeps_the_input_its_message_carried(
    make_worker: WorkerFactory, provider: FakeProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a job released after a 429, When its message comes back after the deadline
    rate_limited_then_late(make_worker, provider, enqueue)

    # Then the failed job keeps its input, so that `aijobs retry` can run it (as _finish does)
    assert table.job("late-2").status is JobStatus.FAILED
    assert table.input_item("late-2") is not None
