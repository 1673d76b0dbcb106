"""JobRunner's decision table on the in-memory store: what becomes of a delivery, and of its job.

The same behaviours as tests/integration (test_failures, test_duplicates, test_cancel_retry,
test_takeover, test_hostile_messages), without moto: a scripted provider, a clock the test moves.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from engine.core import (
    Ack,
    AttemptOutcome,
    ClaimRefusal,
    Delivery,
    ErrorCode,
    Fate,
    Job,
    JobErrorInfo,
    JobStatus,
    Lane,
    NewJob,
    Retry,
    Succeeded,
)
from engine.core.errors import (
    ClaimRefusedError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from engine.dead_letters import DeadLetterRecorder
from engine.decisions import RETRY_SOON_SECONDS, output_hash
from engine.definitions import JobDefinition, JobRegistry, Prompt
from engine.definitions.base import MAX_OUTPUT_BYTES
from engine.definitions.summarize import SummarizeInput
from engine.fleet.admission import Hold, Pass
from engine.gateway import Completion, CompletionRequest, ModelGateway, ModelTiers
from engine.intake import sha256_hex
from engine.observability import GENAI_USAGE_ATTRIBUTES, job_metrics
from engine.retry import MAX_DELAY_SECONDS, RESERVE_RECEIVES, backoff_seconds
from engine.runner import FINISH_MARGIN_MS, GIVE_UP_RECEIVES, Claimed, JobRunner
from engine.testing import InMemoryJobStore
from tests.support.clock import Clock
from tests.support.events import job_message, new_job_for
from tests.support.providers import VALID_OUTPUTS, FakeProvider, valid_answer

LEASE_MS = 300_000  # the runner's default lease, used when no remaining time is given
# 100 input and 20 output tokens of gpt-4o-mini at $0.15/$0.60 per million.
COST_OF_ONE_CALL = Decimal("0.000027")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> InMemoryJobStore:
    return InMemoryJobStore()


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


RunnerFactory = Callable[..., JobRunner]


@pytest.fixture
def make_runner(store: InMemoryJobStore, provider: FakeProvider, registry: JobRegistry, clock: Clock) -> RunnerFactory:
    def build(on: InMemoryJobStore | None = None, **options: Any) -> JobRunner:
        used = on if on is not None else store
        gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini"))
        recorder = DeadLetterRecorder(used, registry, clock=clock)
        return JobRunner(used, gateway, registry, recorder, clock=clock, rng=random.Random(7), **options)

    return build


@pytest.fixture
def runner(make_runner: RunnerFactory) -> JobRunner:
    return make_runner()


def delivery(body: Any, message_id: str = "m-1", receive_count: int = 1) -> Delivery:
    text = body if isinstance(body, str) else json.dumps(body)
    return Delivery(message_id, text, receive_count, {"ApproximateReceiveCount": str(receive_count)})


def job_of(store: InMemoryJobStore, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None, f"job {job_id} does not exist"
    return job


def error_of(job: Job) -> tuple[JobStatus, ErrorCode, bool]:
    assert job.error is not None, f"job {job.job_id} has no error"
    return job.status, job.error.code, job.error.retryable


# --- success ------------------------------------------------------------------------------------


def test_a_job_the_model_answers_succeeds_with_its_output_and_usage(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a full message for a classify job
    message = job_message("classify", "ok-1")

    # When the runner processes it
    disposition = runner.process(delivery(message))

    # Then the message is acknowledged as succeeded after one provider call
    assert disposition == Ack(Fate.SUCCEEDED)
    assert provider.calls == 1
    # And the job holds the output, its hash and the usage of the one attempt, its lease let go
    job = job_of(store, "ok-1")
    assert (job.status, job.output, job.error) == (JobStatus.SUCCEEDED, VALID_OUTPUTS["classify"], None)
    assert job.output_hash == output_hash(VALID_OUTPUTS["classify"])
    assert (job.attempt_count, job.claim_count, job.lease_owner) == (1, 1, None)
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    assert job.usage.cost_usd == COST_OF_ONE_CALL
    assert (job.started_at, job.finished_at) == (clock.now_ms, clock.now_ms)
    # And one attempt record, under the claim's number
    (attempt,) = store.attempts("ok-1")
    assert (attempt.attempt, attempt.outcome, attempt.error_code) == (1, AttemptOutcome.SUCCEEDED, None)
    assert (attempt.tier, attempt.model, attempt.calls) == ("primary", "gpt-4o-mini", 1)
    # And the input the message carried is not stored (a succeeded job is never retried)
    assert (job.input_stored, store.get_input("ok-1")) == (False, None)


def test_the_attempt_records_cached_and_reasoning_tokens_and_the_job_sums_them(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a provider that served 60 of the 100 prompt tokens from its cache and reasoned for 8
    def cached_answer(request: CompletionRequest) -> Completion:
        content = json.dumps(valid_answer(request))
        return Completion(content, request.model, 100, 20, 5, cached_input_tokens=60, reasoning_tokens=8)

    provider.script = cached_answer

    # When a job runs
    assert runner.process(delivery(job_message("classify", "cached-1"))) == Ack(Fate.SUCCEEDED)

    # Then its attempt record and its usage both carry the kinds, priced at the cached rate
    (attempt,) = store.attempts("cached-1")
    assert (attempt.cached_input_tokens, attempt.cache_write_input_tokens, attempt.reasoning_tokens) == (60, 0, 8)
    assert attempt.cost_usd == Decimal("0.0000225")  # 40 x 0.15 + 60 x 0.075 + 20 x 0.60, per million
    assert attempt.cache_savings_usd == Decimal("0.0000045")
    usage = job_of(store, "cached-1").usage
    assert (usage.cached_input_tokens, usage.reasoning_tokens, usage.cost_usd) == (60, 8, attempt.cost_usd)


def test_the_attempts_log_line_names_its_usage_as_opentelemetry_genai_attributes(
    runner: JobRunner, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider.script = lambda request: Completion(
        json.dumps(valid_answer(request)), request.model, 100, 20, 5, cached_input_tokens=60, reasoning_tokens=8
    )
    caplog.set_level(logging.INFO, logger="aijobs")

    runner.process(delivery(job_message("classify", "logged-1")))

    (line,) = [record for record in caplog.records if record.getMessage() == "job attempt finished"]
    assert {name: getattr(line, name) for name in GENAI_USAGE_ATTRIBUTES} == {
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 60,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "gen_ai.usage.reasoning.output_tokens": 8,
    }


# --- refused claims -----------------------------------------------------------------------------


def test_a_duplicate_of_a_finished_job_is_acknowledged_as_a_duplicate(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a job that succeeded
    message = job_message("classify", "dup-1")
    assert runner.process(delivery(message)) == Ack(Fate.SUCCEEDED)
    before = job_of(store, "dup-1")

    # When the same message is delivered again
    disposition = runner.process(delivery(message, message_id="m-2"))

    # Then it is acknowledged (FINISHED), nothing runs again and the job is unchanged
    assert disposition == Ack(Fate.DUPLICATE)
    assert provider.calls == 1
    assert job_of(store, "dup-1") == before


def test_a_duplicate_of_a_held_job_is_hidden_until_the_lease_ends(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a job another worker claimed 20 s ago for 120 s
    message = job_message("classify", "held-1")
    store.claim_job("held-1", "other-worker", 120_000, clock.now_ms, new_job_for(message))
    held = job_of(store, "held-1")
    clock.advance(20)

    # When its message is delivered
    disposition = runner.process(delivery(message))

    # Then it comes back once the 100 s the lease has left are over (HELD), and the job is untouched
    assert disposition == Retry(Fate.HELD, 100, "job held-1 is held by another worker")
    assert provider.calls == 0
    assert job_of(store, "held-1") == held


class RacingClaims(InMemoryJobStore):
    """A store whose claim is refused though the job it read satisfies the condition (it changed meanwhile)."""

    def claim_job(
        self, job_id: str, owner: str, lease_ms: int, now_ms: int, new_job: NewJob | None, batch: object = None
    ) -> Job:
        raise ClaimRefusedError(job_of(self, job_id), ClaimRefusal.RACED)


def test_a_claim_that_raced_another_write_comes_back_soon(
    make_runner: RunnerFactory, provider: FakeProvider, clock: Clock
) -> None:
    # Given a queued job whose claim meets a write that changed it in between
    store = RacingClaims()
    message = job_message("classify", "raced-1")
    store.create_job("raced-1", new_job_for(message), message["input"], clock.now_ms)
    before = job_of(store, "raced-1")

    # When its message is delivered
    disposition = make_runner(store).process(delivery(message))

    # Then the message comes back soon (RACED) and nothing ran
    assert disposition == Retry(Fate.RACED, RETRY_SOON_SECONDS, "job raced-1 changed while it was being claimed")
    assert provider.calls == 0
    assert job_of(store, "raced-1") == before


class RacingSettles(InMemoryJobStore):
    """A store whose end_job always finds the job changed since it was read."""

    def end_job(self, *args: Any, **kwargs: Any) -> bool:
        return False


def test_a_refused_claim_whose_end_raced_comes_back_soon(
    make_runner: RunnerFactory, provider: FakeProvider, clock: Clock
) -> None:
    # Given a job past its deadline, whose end meets a write that changed it in between
    store = RacingSettles()
    message = job_message("classify", "raced-2")
    store.create_job("raced-2", new_job_for(message, deadline_seconds=60), message["input"], clock.now_ms)
    clock.advance(120)

    # When its reference message is delivered
    disposition = make_runner(store).process(delivery({"job_id": "raced-2"}))

    # Then the message comes back soon (RACED), and the job is as it was
    assert disposition == Retry(Fate.RACED, RETRY_SOON_SECONDS, "job raced-2 changed while it was being ended")
    assert provider.calls == 0
    assert job_of(store, "raced-2").status is JobStatus.QUEUED


def test_a_message_reusing_a_job_id_with_other_input_is_kept_as_a_dead_letter(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a job that succeeded
    assert runner.process(delivery(job_message("classify", "conflict-1"))) == Ack(Fate.SUCCEEDED)
    before = job_of(store, "conflict-1")

    # When a message with the same job id and another input arrives
    other = job_message("classify", "conflict-1", input={"text": "Lunch at noon?", "labels": ["spam", "ham"]})
    conflicting = delivery(other, message_id="m-conflict")
    disposition = runner.process(conflicting)

    # Then it is acknowledged as a dead letter (CONFLICT), kept whole, and the job is unchanged
    assert disposition == Ack(Fate.DEAD_LETTERED)
    assert provider.calls == 1
    assert job_of(store, "conflict-1") == before
    dead = store.dead_letter("m-conflict")
    assert dead is not None
    assert (dead.body, dead.receive_count, dead.recorded_at) == (conflicting.body, 1, clock.now_ms)
    assert dead.reason == "job conflict-1 exists with a different job type, user or input"


def test_a_cancel_requested_after_the_worker_died_cancels_the_job_at_the_next_delivery(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a job claimed by a worker that died (a 60 s lease), whose cancel was then requested
    message = job_message("classify", "cancel-1")
    store.create_job("cancel-1", new_job_for(message), message["input"], clock.now_ms)
    store.claim_job("cancel-1", "dead-worker", 60_000, clock.now_ms, None)
    assert store.request_cancel("cancel-1", clock.now_ms).status is JobStatus.RUNNING
    clock.advance(120)

    # When its reference message is delivered after the lease expired
    disposition = runner.process(delivery({"job_id": "cancel-1"}))

    # Then the refused claim (CANCEL_REQUESTED) ends the job cancelled, with no provider call
    assert disposition == Ack(Fate.CANCELLED)
    assert provider.calls == 0
    job = job_of(store, "cancel-1")
    assert (job.status, job.cancel_requested, job.error, job.lease_owner) == (JobStatus.CANCELLED, True, None, None)
    assert (job.attempt_count, job.usage.attempts, job.finished_at) == (1, 0, clock.now_ms)


def test_a_job_redelivered_after_its_deadline_fails_and_keeps_the_input_its_message_carried(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a message-carried job with a 60 s deadline, put back after a 429 (its input only in the message)
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=7)
    message = job_message("classify", "late-1", deadline_seconds=60)
    assert runner.process(delivery(message)) == Retry(
        Fate.RETRIED, 7, "provider_rate_limited: provider rate limit (HTTP 429)"
    )
    assert job_of(store, "late-1").input_stored is False

    # When its message comes back two minutes later
    clock.advance(120)
    disposition = runner.process(delivery(message, receive_count=2))

    # Then the refused claim (DEADLINE_PASSED) fails the job with deadline_exceeded, acknowledged
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 1
    job = job_of(store, "late-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED, False)
    assert (job.attempt_count, job.finished_at) == (0, clock.now_ms)
    # And the input the message carried is stored, so that it can be retried
    assert (job.input_stored, store.get_input("late-1")) == (True, message["input"])


def test_a_job_whose_budget_a_dead_worker_spent_fails_at_the_next_delivery(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a message-carried job of one attempt, claimed by a worker that died (a 60 s lease)
    message = job_message("classify", "spent-1", max_attempts=1)
    store.claim_job("spent-1", "dead-worker", 60_000, clock.now_ms, new_job_for(message, max_attempts=1))
    clock.advance(120)

    # When its message is delivered again after the lease expired
    disposition = runner.process(delivery(message, receive_count=2))

    # Then the refused claim (ATTEMPTS_SPENT) fails the job with max_attempts_exceeded, with no provider call
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 0
    job = job_of(store, "spent-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.MAX_ATTEMPTS_EXCEEDED, False)
    assert job.error is not None
    assert job.error.message == "attempt budget spent (1 of 1)"
    assert (job.attempt_count, job.lease_owner) == (1, None)
    assert store.get_input("spent-1") == message["input"]


def test_a_reference_to_a_job_that_does_not_exist_is_kept_as_a_dead_letter(
    runner: JobRunner, store: InMemoryJobStore
) -> None:
    # Given no job "ghost-1", When a reference message to it is delivered
    disposition = runner.process(delivery({"job_id": "ghost-1"}, message_id="m-ghost"))

    # Then it is acknowledged as a dead letter, and no job is created
    assert disposition == Ack(Fate.DEAD_LETTERED)
    dead = store.dead_letter("m-ghost")
    assert dead is not None
    assert "job ghost-1 does not exist" in dead.reason
    assert store.get_job("ghost-1") is None


# --- the provider's errors ----------------------------------------------------------------------


def test_a_retryable_error_puts_the_job_back_with_a_backoff_and_counts_the_attempt(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a provider answering 503
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")

    # When the runner processes a job
    disposition = runner.process(delivery(job_message("classify", "retry-1")))

    # Then the message comes back after the backoff of attempt 1 (full jitter in [1, 2] s)
    expected_delay = backoff_seconds(1, random.Random(7))
    assert disposition == Retry(Fate.RETRIED, expected_delay, "provider_unavailable: provider unavailable (HTTP 503)")
    assert 1 <= expected_delay <= 2
    # And the job is queued again with the error, the attempt counted and recorded
    job = job_of(store, "retry-1")
    assert error_of(job) == (JobStatus.QUEUED, ErrorCode.PROVIDER_UNAVAILABLE, True)
    assert (job.attempt_count, job.usage.attempts, job.lease_owner) == (1, 1, None)
    (attempt,) = store.attempts("retry-1")
    assert (attempt.outcome, attempt.error_code) == (AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_UNAVAILABLE)


def test_a_rate_limited_attempt_is_refunded_and_honours_retry_after(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a provider answering 429 with Retry-After: 7
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=7)

    # When the runner processes a job
    disposition = runner.process(delivery(job_message("classify", "limited-1")))

    # Then the message comes back after exactly the Retry-After
    assert disposition == Retry(Fate.RETRIED, 7, "provider_rate_limited: provider rate limit (HTTP 429)")
    # And the attempt does not count against the budget, though it is recorded
    job = job_of(store, "limited-1")
    assert error_of(job) == (JobStatus.QUEUED, ErrorCode.PROVIDER_RATE_LIMITED, True)
    assert (job.attempt_count, job.claim_count, job.usage.attempts) == (0, 1, 1)
    (attempt,) = store.attempts("limited-1")
    assert attempt.error_code is ErrorCode.PROVIDER_RATE_LIMITED


def test_the_last_allowed_attempt_fails_the_job_and_stores_its_input(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a job with a budget of 2 attempts, a provider that is always down, and a first attempt put back
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    message = job_message("classify", "spent-2", max_attempts=2)
    assert isinstance(runner.process(delivery(message)), Retry)
    clock.advance(10)

    # When the message is delivered a second time
    disposition = runner.process(delivery(message, receive_count=2))

    # Then the job fails for good with max_attempts_exceeded and the message is acknowledged
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 2
    job = job_of(store, "spent-2")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.MAX_ATTEMPTS_EXCEEDED, False)
    assert job.error is not None
    assert job.error.message.startswith("attempt budget spent (2 of 2); last error provider_unavailable")
    assert (job.attempt_count, job.max_attempts, job.usage.attempts) == (2, 2, 2)
    assert [attempt.attempt for attempt in store.attempts("spent-2")] == [1, 2]
    # And the input its message carried is stored, so that it can be retried
    assert (job.input_stored, store.get_input("spent-2")) == (True, message["input"])


def test_a_retry_that_would_land_past_the_deadline_fails_the_job_now(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a job with a 60 s deadline and a provider asking to wait 120 s
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=120)
    message = job_message("classify", "late-2", deadline_seconds=60)

    # When the runner processes it
    disposition = runner.process(delivery(message))

    # Then the job fails with deadline_exceeded rather than coming back too late, its input stored
    assert disposition == Ack(Fate.FAILED)
    job = job_of(store, "late-2")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED, False)
    assert job.error is not None
    assert job.error.message.startswith("the deadline passes before the next try; last error provider_rate_limited")
    assert job.usage.attempts == 1
    assert store.get_input("late-2") == message["input"]


def test_too_little_invocation_time_defers_the_job_without_spending_an_attempt(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given an invocation with 30 s left, less than classify's 60 s timeout plus the finishing margin
    remaining = 30_000
    assert remaining < 60_000 + FINISH_MARGIN_MS

    # When the runner processes a job
    disposition = runner.process(delivery(job_message("classify", "short-1")), lambda: remaining)

    # Then the provider is not called and the job is handed back with its attempt refunded (DEFERRED)
    assert disposition == Retry(Fate.DEFERRED, RETRY_SOON_SECONDS, "not enough time left in this invocation")
    assert provider.calls == 0
    job = job_of(store, "short-1")
    assert (job.status, job.attempt_count, job.claim_count, job.error) == (JobStatus.QUEUED, 0, 1, None)
    assert (job.usage.attempts, job.lease_owner) == (0, None)
    assert store.attempts("short-1") == []


def test_a_permanent_error_fails_the_job_and_acknowledges_the_message(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a provider that rejects the request (a bad key)
    provider.script = lambda _: ProviderRejectedError("provider rejected the request (HTTP 401)", status_code=401)
    message = job_message("summarize", "rejected-1")

    # When the runner processes a job
    disposition = runner.process(delivery(message))

    # Then the job fails once and for all, with its attempt recorded and its input stored
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 1
    job = job_of(store, "rejected-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.PROVIDER_REJECTED, False)
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    (attempt,) = store.attempts("rejected-1")
    assert (attempt.outcome, attempt.error_code) == (AttemptOutcome.FAILED, ErrorCode.PROVIDER_REJECTED)
    assert store.get_input("rejected-1") == message["input"]


# --- what changed while the provider ran --------------------------------------------------------


def test_a_cancel_requested_while_the_provider_runs_cancels_the_job_and_keeps_its_usage(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a model call during which the job's cancel is requested
    def answer_after_cancel(request: CompletionRequest) -> Any:
        seen = store.request_cancel("cancel-2", clock.now_ms)
        assert (seen.status, seen.cancel_requested) == (JobStatus.RUNNING, True)
        return valid_answer(request)

    provider.script = answer_after_cancel

    # When the runner finishes the job
    disposition = runner.process(delivery(job_message("classify", "cancel-2")))

    # Then the finish meets the cancel: the job is cancelled, its output discarded, the message acknowledged
    assert disposition == Ack(Fate.CANCELLED)
    job = job_of(store, "cancel-2")
    assert (job.status, job.cancel_requested, job.lease_owner) == (JobStatus.CANCELLED, True, None)
    assert (job.output, job.output_hash, job.error) == (None, None, None)
    # And the attempt's usage is kept
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.cost_usd) == (100, 20, COST_OF_ONE_CALL)
    (attempt,) = store.attempts("cancel-2")
    assert attempt.outcome is AttemptOutcome.SUCCEEDED


def test_a_lease_lost_while_the_provider_runs_discards_the_result_and_keeps_the_usage(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a model so slow that this worker's 300 s lease expires and another worker claims the job for 60 s
    def answer_after_takeover(request: CompletionRequest) -> Any:
        clock.advance(LEASE_MS // 1000 + 100)
        store.claim_job("lease-1", "other-worker", 60_000, clock.now_ms, None)
        return valid_answer(request)

    provider.script = answer_after_takeover

    # When this worker finishes
    disposition = runner.process(delivery(job_message("classify", "lease-1")))

    # Then its finish is refused: the message comes back once the other worker's lease ends
    assert disposition == Retry(Fate.LEASE_LOST, 60, "job lease-1 is held by another worker")
    # And the job is the other worker's, without this worker's output
    job = job_of(store, "lease-1")
    assert (job.status, job.lease_owner, job.output) == (JobStatus.RUNNING, "other-worker", None)
    assert (job.attempt_count, job.claim_count) == (2, 2)
    # And the tokens this attempt spent are kept, through an orphan attempt record
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    (attempt,) = store.attempts("lease-1")
    assert (attempt.attempt, attempt.outcome) == (1, AttemptOutcome.SUCCEEDED)


def test_a_lease_lost_to_a_worker_that_already_finished_the_job_is_acknowledged(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a model so slow that another worker takes the job over and finishes it meanwhile
    def answer_after_another_finish(request: CompletionRequest) -> Any:
        clock.advance(LEASE_MS // 1000 + 100)
        other = store.claim_job("lease-2", "other-worker", 60_000, clock.now_ms, None)
        store.finish_job(other, Succeeded({"label": "ham", "confidence": 0.5}, "other-hash"), clock.now_ms)
        return valid_answer(request)

    provider.script = answer_after_another_finish

    # When this worker finishes
    disposition = runner.process(delivery(job_message("classify", "lease-2")))

    # Then the message is done with (LEASE_LOST), the other worker's output stands, this usage is kept
    assert disposition == Ack(Fate.LEASE_LOST)
    job = job_of(store, "lease-2")
    assert (job.status, job.output_hash) == (JobStatus.SUCCEEDED, "other-hash")
    assert (job.usage.input_tokens, job.usage.attempts) == (100, 1)


# --- bad messages -------------------------------------------------------------------------------


def test_a_bad_message_without_a_job_id_is_kept_as_a_dead_letter(runner: JobRunner, store: InMemoryJobStore) -> None:
    # Given a body that is not JSON, When it is delivered
    disposition = runner.process(delivery("not json", message_id="m-garbage", receive_count=2))

    # Then it is acknowledged and kept whole, with why
    assert disposition == Ack(Fate.DEAD_LETTERED)
    dead = store.dead_letter("m-garbage")
    assert dead is not None
    assert (dead.body, dead.receive_count, dead.attributes) == ("not json", 2, {"ApproximateReceiveCount": "2"})
    assert dead.reason.startswith("message body is not JSON")


def test_a_bad_message_with_a_job_id_fails_its_job(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a message whose input breaks the job type's input model
    bad = job_message("classify", "bad-1", input={"text": "hi", "labels": ["only-one"]})
    body = json.dumps(bad)

    # When it is delivered
    disposition = runner.process(delivery(body))

    # Then its job is recorded failed with input_validation_failed, with no provider call and no input stored
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 0
    job = job_of(store, "bad-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.INPUT_VALIDATION_FAILED, False)
    assert (job.job_type, job.user_id, job.attempt_count) == ("classify", "user-1", 0)
    assert job.request_hash == sha256_hex(body)
    assert (job.input_stored, store.get_input("bad-1")) == (False, None)


@pytest.mark.parametrize(
    ("queue_lane", "named", "lane"),
    [
        (Lane.BACKGROUND, None, Lane.BACKGROUND),
        (Lane.INTERACTIVE, None, Lane.INTERACTIVE),
        (Lane.INTERACTIVE, "background", Lane.BACKGROUND),
        (Lane.BACKGROUND, "nowhere", Lane.BACKGROUND),
    ],
)
def test_a_bad_message_fails_its_job_in_the_lane_it_names_or_its_queue_s(
    runner: JobRunner, store: InMemoryJobStore, queue_lane: Lane, named: str | None, lane: Lane
) -> None:
    # Given a bad message naming a lane (or none, or one that does not exist), from one lane's queue
    bad = job_message("classify", "bad-lane", input={"text": "hi", "labels": ["only-one"]})
    if named is not None:
        bad["lane"] = named
    body = json.dumps(bad)

    # When it is delivered
    disposition = runner.process(replace(delivery(body), lane=queue_lane))

    # Then its job is failed in the lane the message names, else in its queue's: retried or listed by lane, it
    # stays where its user sent it
    assert disposition == Ack(Fate.FAILED)
    assert job_of(store, "bad-lane").lane is lane


def test_the_same_bad_message_again_is_a_duplicate_and_another_is_a_dead_letter(
    runner: JobRunner, store: InMemoryJobStore
) -> None:
    # Given a bad message that failed its job
    bad = job_message("classify", "bad-2", input={"text": "hi", "labels": ["only-one"]})
    assert runner.process(delivery(bad)) == Ack(Fate.FAILED)
    failed = job_of(store, "bad-2")

    # When it is delivered again, Then it is a duplicate
    assert runner.process(delivery(bad, message_id="m-2")) == Ack(Fate.DUPLICATE)

    # And when another bad message names the same job, Then it is kept as a dead letter, the job unchanged
    other = bad | {"user_id": "user 2"}
    assert runner.process(delivery(other, message_id="m-3")) == Ack(Fate.DEAD_LETTERED)
    dead = store.dead_letter("m-3")
    assert dead is not None
    assert dead.reason.startswith("job bad-2 exists; this message is invalid")
    assert job_of(store, "bad-2") == failed


# --- unexpected errors --------------------------------------------------------------------------


class BrokenClaims(InMemoryJobStore):
    """A store whose claim fails in a way nothing expects (a bug, a request AWS refuses)."""

    def claim_job(
        self, job_id: str, owner: str, lease_ms: int, now_ms: int, new_job: NewJob | None, batch: object = None
    ) -> Job:
        raise RuntimeError("a bug in the claim")


def test_an_unexpected_error_is_retried_twice_then_given_up_on_at_the_third_receive(
    make_runner: RunnerFactory, provider: FakeProvider
) -> None:
    # Given a store whose claim always fails unexpectedly
    store = BrokenClaims()
    runner = make_runner(store)
    message = job_message("classify", "boom-1")

    # When the message is received once, then twice
    first = runner.process(delivery(message, receive_count=1))
    second = runner.process(delivery(message, receive_count=2))

    # Then it comes back after a backoff each time, nothing recorded
    assert isinstance(first, Retry)
    assert isinstance(second, Retry)
    assert (first.fate, second.fate) == (Fate.ERROR, Fate.ERROR)
    assert 1 <= first.visibility_seconds <= 2
    assert 1 <= second.visibility_seconds <= 4
    assert store.dead_letter("m-1") is None
    assert store.get_job("boom-1") is None

    # When it is received a third time
    third = runner.process(delivery(message, receive_count=GIVE_UP_RECEIVES))

    # Then it is given up on: acknowledged, kept as a dead letter, its job recorded failed with internal_error
    assert third == Ack(Fate.DEAD_LETTERED)
    dead = store.dead_letter("m-1")
    assert dead is not None
    assert dead.reason == f"internal error (RuntimeError) on receive {GIVE_UP_RECEIVES}; given up"
    assert dead.receive_count == GIVE_UP_RECEIVES
    job = job_of(store, "boom-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.INTERNAL_ERROR, False)
    assert store.get_input("boom-1") == message["input"]
    assert provider.calls == 0


def test_a_transient_unexpected_error_is_retried_even_at_the_tenth_receive(
    make_runner: RunnerFactory, provider: FakeProvider
) -> None:
    # Given a store whose claim keeps failing, with errors judged transient (throttling, an outage)
    store = BrokenClaims()
    runner = make_runner(store, is_transient=lambda _: True)

    # When the message is received a tenth time
    disposition = runner.process(delivery(job_message("classify", "boom-2"), receive_count=10))

    # Then it still comes back after a backoff, and nothing is given up on
    assert isinstance(disposition, Retry)
    assert (disposition.fate, disposition.reason) == (Fate.ERROR, "internal error")
    assert 1 <= disposition.visibility_seconds <= 900
    assert store.dead_letter("m-1") is None
    assert store.get_job("boom-2") is None


# --- answers too large --------------------------------------------------------------------------


def test_an_answer_longer_than_max_tokens_can_be_fails_the_job_with_its_usage(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    # Given a model answering far more than summarize's max_tokens can hold
    provider.script = lambda _: {"summary": "w" * 450_000}

    # When the runner processes a job
    disposition = runner.process(delivery(job_message("summarize", "huge-1")))

    # Then the job fails with output_too_large after one paid call, not re-asked nor retried
    assert disposition == Ack(Fate.FAILED)
    assert provider.calls == 1
    job = job_of(store, "huge-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.OUTPUT_TOO_LARGE, False)
    assert job.output is None
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    (attempt,) = store.attempts("huge-1")
    assert (attempt.outcome, attempt.error_code) == (AttemptOutcome.FAILED, ErrorCode.OUTPUT_TOO_LARGE)


class LongOutput(BaseModel):
    text: str


# A job type allowed long answers, so that an answer passes validation yet is too large to store.
LONG_WRITER = JobDefinition(
    name="long_writer",
    input_model=SummarizeInput,
    output_model=LongOutput,
    prompt=Prompt(key="long_writer", version="1", system="Write.", user="Text: {text}"),
    max_tokens=100_000,
)


def test_a_valid_answer_too_large_to_store_fails_the_job_with_its_usage(
    runner: JobRunner, provider: FakeProvider, registry: JobRegistry, store: InMemoryJobStore
) -> None:
    # Given a job type whose valid answer is larger than a job can store
    registry.register(LONG_WRITER)
    provider.script = lambda _: {"text": "x" * (MAX_OUTPUT_BYTES + 1)}

    # When the runner processes a job of it
    disposition = runner.process(delivery(job_message("summarize", "long-1") | {"job_type": "long_writer"}))

    # Then the job fails with output_too_large, its answer not stored, its usage and attempt kept
    assert disposition == Ack(Fate.FAILED)
    job = job_of(store, "long-1")
    assert error_of(job) == (JobStatus.FAILED, ErrorCode.OUTPUT_TOO_LARGE, False)
    assert job.error is not None
    assert str(MAX_OUTPUT_BYTES) in job.error.message
    assert job.output is None
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    (attempt,) = store.attempts("long-1")
    assert (attempt.outcome, attempt.error_code) == (AttemptOutcome.FAILED, ErrorCode.OUTPUT_TOO_LARGE)


def test_a_reference_to_a_message_created_job_never_runs_another_requests_input(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, clock: Clock
) -> None:
    # Given a job a message created (its input only in that message), released after a 503, and a
    # submission under the same id refused as a conflict that left its own input behind
    message = job_message("classify", "shared-id")
    provider.script = lambda _: ProviderUnavailableError("provider unavailable (HTTP 503)")
    assert isinstance(runner.process(delivery(message)), Retry)
    other = job_message("classify", "shared-id", input={"text": "someone else's text", "labels": ["a", "b"]})
    with pytest.raises(Exception, match="different job type, user or input"):
        store.create_job("shared-id", new_job_for(other), other["input"], clock.now_ms)
    assert store.get_input("shared-id") == other["input"]
    provider.script = valid_answer
    clock.advance(10)

    # When a bare reference to the job is delivered
    response = runner.process(delivery({"job_id": "shared-id"}, message_id="m-ref"))

    # Then the other request's input is not run: the job fails, saying it has no stored input
    assert response == Ack(Fate.FAILED)
    assert provider.calls == 1
    job = job_of(store, "shared-id")
    assert job.error is not None
    assert (job.error.code, job.error.message) == (
        ErrorCode.INPUT_VALIDATION_FAILED,
        "job shared-id has no stored input",
    )


@pytest.mark.parametrize("receive_count", [1, 5, 9])
def test_a_rate_limit_without_retry_after_backs_off_by_the_receives_not_the_refunded_attempts(
    runner: JobRunner, provider: FakeProvider, receive_count: int
) -> None:
    # Given a provider that rate-limits without Retry-After (as Bedrock does): the attempt is refunded
    provider.script = lambda _: ProviderRateLimitedError("Bedrock rate limit (ThrottlingException, HTTP 429)")

    # When the message comes for the nth time
    response = runner.process(delivery(job_message("classify", "throttled"), receive_count=receive_count))

    # Then it is hidden for a backoff drawn as for the nth try (so that maxReceiveCount lasts hours)
    assert isinstance(response, Retry)
    assert response.fate is Fate.RETRIED
    assert response.visibility_seconds == backoff_seconds(receive_count, random.Random(7))


def deliver_until_acknowledged(
    runner: JobRunner, clock: Clock, message: dict[str, Any], max_receives: int, hold: Callable[[], Hold] | None = None
) -> int:
    """Deliver `message` as SQS would, on the test's clock: each Retry hides it for what the worker may
    ask (12 hours from the receive at most), each delivery is one more receive. The receive that
    acknowledged it; fails when SQS would have moved it to the dead-letter queue first."""
    for receive_count in range(1, max_receives + 1):
        arrived = delivery(message, receive_count=receive_count)
        if hold is None:
            disposition = runner.process(arrived)
        else:
            claimed = runner.claim(arrived)
            disposition = runner.run(claimed, None, hold()) if isinstance(claimed, Claimed) else claimed
        if isinstance(disposition, Ack):
            return receive_count
        clock.advance(min(disposition.visibility_seconds, MAX_DELAY_SECONDS - 10))
    pytest.fail(f"after {max_receives} receives SQS moves the message to the dead-letter queue")


@pytest.mark.parametrize("max_receives", [100, 21])
def test_a_job_throttled_throughout_ends_deadline_exceeded_before_its_receives_run_out(
    make_runner: RunnerFactory, provider: FakeProvider, store: InMemoryJobStore, clock: Clock, max_receives: int
) -> None:
    # Given a 7-day job and a provider that rate-limits it without Retry-After, every time
    provider.script = lambda _: ProviderRateLimitedError("Bedrock rate limit (ThrottlingException, HTTP 429)")
    runner = make_runner(max_receives=max_receives)
    message = job_message("classify", "throttled-week", deadline_seconds=604_800)
    created = clock.seconds

    # When SQS delivers its message until the engine acknowledges it
    deliver_until_acknowledged(runner, clock, message, max_receives)

    # Then the job ended deadline_exceeded, near its deadline, tried again and again meanwhile
    job = job_of(store, "throttled-week")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED)
    assert clock.seconds >= created + 604_800 - MAX_DELAY_SECONDS
    assert provider.calls >= max_receives - RESERVE_RECEIVES - 1


def test_a_job_waiting_a_week_for_its_budget_is_never_dead_lettered(
    make_runner: RunnerFactory, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a 7-day job whose user's budget holds it every time (it looks again every 30 minutes)
    runner = make_runner()
    message = job_message("classify", "budget-week", deadline_seconds=604_800)

    def budget_spent() -> Hold:
        return Hold(ErrorCode.BUDGET_EXCEEDED, clock.now_ms + 30 * 60_000, "waiting: budget spent")

    deliver_until_acknowledged(runner, clock, message, 100, hold=budget_spent)

    job = job_of(store, "budget-week")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.BUDGET_EXCEEDED)
    assert provider.calls == 0


# --- admission: a Pass's call time, a Hold (engine.fleet) ----------------------------------------


def claimed_job(runner: JobRunner, message: dict[str, Any]) -> Claimed:
    claimed = runner.claim(delivery(message))
    assert isinstance(claimed, Claimed)
    return claimed


def test_a_pass_waits_until_its_call_time_then_calls_and_records_what_it_used(
    make_runner: RunnerFactory, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    slept: list[float] = []
    runner = make_runner(sleep=slept.append)
    claimed = claimed_job(runner, job_message("classify", "pass-1"))
    admitted = Pass(call_at_ms=clock.now_ms + 1_500)

    disposition = runner.run(claimed, None, admitted)

    assert disposition == Ack(Fate.SUCCEEDED)
    assert slept == [1.5]
    assert admitted.execution is not None
    assert (admitted.execution.calls, admitted.execution.cost_usd) == (1, job_of(store, "pass-1").usage.cost_usd)


def test_a_pass_whose_wait_leaves_too_little_time_is_deferred_with_no_call(
    make_runner: RunnerFactory, provider: FakeProvider, store: InMemoryJobStore, clock: Clock
) -> None:
    slept: list[float] = []
    runner = make_runner(sleep=slept.append)
    claimed = claimed_job(runner, job_message("classify", "pass-late"))
    timeout_ms = int(claimed.definition.timeout_seconds * 1000)

    # 1 s short of the wait, the job type's timeout and the finishing margin
    remaining = 8_000 + timeout_ms + FINISH_MARGIN_MS - 1_000
    disposition = runner.run(claimed, lambda: remaining, Pass(call_at_ms=clock.now_ms + 8_000))

    assert disposition == Retry(Fate.DEFERRED, RETRY_SOON_SECONDS, "not enough time left in this invocation")
    assert (provider.calls, slept) == (0, [])
    assert job_of(store, "pass-late").attempt_count == 0


@pytest.mark.parametrize(
    ("code", "fate"),
    [(ErrorCode.PROVIDER_RATE_LIMITED, Fate.THROTTLED), (ErrorCode.BUDGET_EXCEEDED, Fate.OVER_BUDGET)],
)
def test_a_held_job_waits_queued_with_the_reason_its_attempt_refunded_and_no_call(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, clock: Clock, code: ErrorCode, fate: Fate
) -> None:
    claimed = claimed_job(runner, job_message("classify", "held-back"))

    disposition = runner.run(claimed, None, Hold(code, clock.now_ms + 12_300, "waiting: the reason"))

    assert disposition == Retry(fate, 13, "waiting: the reason")
    assert provider.calls == 0
    job = job_of(store, "held-back")
    assert (job.status, job.attempt_count, job.lease_owner) == (JobStatus.QUEUED, 0, None)
    assert job.error == JobErrorInfo(code, "waiting: the reason", retryable=True)


@pytest.mark.parametrize("code", [ErrorCode.PROVIDER_RATE_LIMITED, ErrorCode.BUDGET_EXCEEDED])
def test_a_held_job_counts_as_held_back_not_as_a_provider_429_or_an_attempt(
    runner: JobRunner, clock: Clock, code: ErrorCode
) -> None:
    claimed = claimed_job(runner, job_message("classify", "held-count"))
    job_metrics.clear()

    runner.run(claimed, None, Hold(code, clock.now_ms + 12_300, "waiting: the reason"))

    counted = job_metrics.snapshot()
    reason = "Retries_throttled" if code is ErrorCode.PROVIDER_RATE_LIMITED else "Retries_over_budget"
    assert counted == {("classify", ""): {reason: [1.0]}}


@pytest.mark.parametrize(
    ("code", "ends_with"),
    [
        (ErrorCode.PROVIDER_RATE_LIMITED, ErrorCode.DEADLINE_EXCEEDED),
        (ErrorCode.BUDGET_EXCEEDED, ErrorCode.BUDGET_EXCEEDED),
    ],
)
def test_a_hold_that_outlasts_the_deadline_fails_the_job_now(
    runner: JobRunner, store: InMemoryJobStore, clock: Clock, code: ErrorCode, ends_with: ErrorCode
) -> None:
    claimed = claimed_job(runner, job_message("classify", "held-late", deadline_seconds=60))

    disposition = runner.run(claimed, None, Hold(code, clock.now_ms + 60_000, "waiting: the reason"))

    assert disposition == Ack(Fate.FAILED)
    job = job_of(store, "held-late")
    assert job.error is not None
    assert (job.status, job.error.code, job.error.retryable) == (JobStatus.FAILED, ends_with, False)
    assert job.error.message.endswith("waiting: the reason")


def test_a_job_that_waited_for_its_budget_until_its_deadline_ends_budget_exceeded_at_its_next_claim(
    runner: JobRunner, store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a job held for its user's budget, whose message comes back after its deadline
    message = job_message("classify", "budget-late", deadline_seconds=60)
    runner.run(claimed_job(runner, message), None, Hold(ErrorCode.BUDGET_EXCEEDED, clock.now_ms + 30_000, "waiting"))
    clock.advance(61)

    disposition = runner.process(delivery(message))

    assert disposition == Ack(Fate.FAILED)
    job = job_of(store, "budget-late")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.BUDGET_EXCEEDED)
