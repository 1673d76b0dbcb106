"""Which tier an attempt asks for, and what becomes of a job the flex tier did not serve: the pure
decisions (engine.decisions), then the runner on the in-memory store with a scripted provider."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core import (
    AttemptOutcome,
    Delivery,
    ErrorCode,
    Fate,
    Job,
    JobStatus,
    Lane,
    Released,
    Retry,
    Via,
)
from engine.core.errors import FlexUnavailableError, ProviderTimeoutError
from engine.dead_letters import DeadLetterRecorder
from engine.decisions import (
    FLEX_STANDARD_CALLS,
    FLEX_TRY_SECONDS,
    Moment,
    attempt_record,
    decide,
    decide_tier,
    flex_margin_ms,
)
from engine.definitions import JobRegistry
from engine.gateway import CallTier, Completion, CompletionRequest, Execution, ModelGateway, ModelTiers
from engine.gateway.provider import FLEX_TIER
from engine.runner import JobRunner
from engine.testing import InMemoryJobStore
from handlers.worker import FUNCTION_TIMEOUT_SECONDS
from tests.support.clock import T0_MS, Clock
from tests.support.events import job_message
from tests.support.providers import VALID_OUTPUTS, FakeProvider

CLASSIFY = JobRegistry().get("classify")
MARGIN_MS = flex_margin_ms(CLASSIFY)


def job(lane: Lane = Lane.BACKGROUND, deadline_in_ms: int | None = 3_600_000, **fields: Any) -> Job:
    return Job(
        job_id="job-1",
        job_type="classify",
        user_id="u-1",
        status=JobStatus.RUNNING,
        created_at=T0_MS,
        updated_at=T0_MS,
        max_attempts=3,
        attempt_count=1,
        claim_count=1,
        deadline_at=None if deadline_in_ms is None else T0_MS + deadline_in_ms,
        lane=lane,
        **fields,
    )


def moment(now_ms: int = T0_MS, receive_count: int = 1) -> Moment:
    return Moment(now_ms, receive_count, 100, random.Random(3))


def refused(error: FlexUnavailableError) -> Execution:
    definition = CLASSIFY
    prompt = definition.render_prompt(definition.parse_input({"text": "t", "labels": ["a", "b"]}))
    return Execution(prompt, "openai", "primary", "gpt-5-mini", error=error, calls=1, via=Via.FLEX)


# --- the tier ------------------------------------------------------------------------------------


def test_the_margin_holds_a_flex_try_of_a_whole_invocation_and_the_standard_calls_after_it() -> None:
    assert FLEX_TRY_SECONDS == FUNCTION_TIMEOUT_SECONDS  # the template's worker Timeout
    assert MARGIN_MS == (FLEX_TRY_SECONDS + FLEX_STANDARD_CALLS * CLASSIFY.timeout_seconds) * 1000 == 540_000


@pytest.mark.parametrize(
    ("lane", "flex", "deadline_in_ms", "tier"),
    [
        (Lane.INTERACTIVE, True, 3_600_000, CallTier.STANDARD),
        (Lane.INTERACTIVE, True, 60_000, CallTier.STANDARD),
        (Lane.BACKGROUND, False, 3_600_000, CallTier.STANDARD),
        (Lane.BACKGROUND, True, 3_600_000, CallTier.FLEX),
        (Lane.BACKGROUND, True, MARGIN_MS, CallTier.FLEX),
        (Lane.BACKGROUND, True, MARGIN_MS - 1, CallTier.FLEX_OR_STANDARD),
        (Lane.BACKGROUND, True, 1_000, CallTier.FLEX_OR_STANDARD),
        (Lane.BACKGROUND, True, None, CallTier.FLEX_OR_STANDARD),
    ],
)
def test_only_background_jobs_ask_the_flex_tier_and_near_their_deadline_keep_the_standard_one(
    lane: Lane, flex: bool, deadline_in_ms: int | None, tier: CallTier
) -> None:
    assert decide_tier(job(lane, deadline_in_ms), CLASSIFY, flex, T0_MS) is tier


# --- flex unavailable ----------------------------------------------------------------------------


def test_a_job_the_flex_tier_did_not_serve_waits_for_it_its_attempt_refunded() -> None:
    waiting = job(deadline_in_ms=3_600_000)
    execution = refused(FlexUnavailableError("the provider's flex tier is unavailable (HTTP 429)"))

    decision = decide(waiting, CLASSIFY, execution, attempt_record(waiting, execution, T0_MS, T0_MS), moment())

    assert isinstance(decision.outcome, Released)
    assert decision.outcome.refund_attempt
    assert decision.outcome.error is not None
    assert decision.outcome.error.code is ErrorCode.PROVIDER_RATE_LIMITED
    assert isinstance(decision.then, Retry)
    assert decision.then.fate is Fate.RETRIED
    assert decision.attempt is not None
    assert (decision.attempt.via, decision.attempt.outcome) == (Via.FLEX, AttemptOutcome.RETRYABLE)


def test_a_long_retry_after_from_the_flex_tier_is_cut_so_the_job_comes_back_before_its_deadline_is_near() -> None:
    waiting = job(deadline_in_ms=MARGIN_MS + 30_000)
    execution = refused(FlexUnavailableError("429", retry_after_seconds=3_600))

    decision = decide(waiting, CLASSIFY, execution, None, moment())  # type: ignore[arg-type]

    assert isinstance(decision.then, Retry)
    assert decision.then.visibility_seconds == 30


@given(
    left_ms=st.integers(MARGIN_MS + 1_000, 7 * 86_400_000),
    receive_count=st.integers(1, 90),
    retry_after=st.one_of(st.none(), st.floats(0, 10**9, allow_nan=False)),
)
def test_a_flex_refusal_far_from_the_deadline_never_ends_the_job_and_brings_it_back_in_time(
    left_ms: int, receive_count: int, retry_after: float | None
) -> None:
    waiting = job(deadline_in_ms=left_ms)
    execution = refused(FlexUnavailableError("429", retry_after_seconds=retry_after))

    decision = decide(waiting, CLASSIFY, execution, None, moment(receive_count=receive_count))  # type: ignore[arg-type]

    assert isinstance(decision.outcome, Released)
    assert isinstance(decision.then, Retry)
    back = T0_MS + decision.then.visibility_seconds * 1000
    assert back < T0_MS + left_ms  # before the deadline, and (the receives it has left allowing) ...
    if receive_count < 50:
        assert back <= T0_MS + left_ms - MARGIN_MS + 1_000  # ... while it still leaves the standard tier room


# --- the runner ----------------------------------------------------------------------------------


def answer_at(tier: str | None) -> Completion:
    return Completion(json.dumps(VALID_OUTPUTS["classify"]), "gpt-5-mini", 100, 20, latency_ms=5, service_tier=tier)


def scripted(*answers: Any) -> FakeProvider:
    remaining = list(answers)
    return FakeProvider(lambda request: remaining.pop(0))


def run_one(
    provider: FakeProvider,
    store: InMemoryJobStore,
    clock: Clock,
    lane: str = "background",
    deadline_seconds: int = 3_600,
    flex: bool = True,
) -> Any:
    registry = JobRegistry()
    gateway = ModelGateway(provider, ModelTiers("gpt-5-mini"))
    recorder = DeadLetterRecorder(store, registry, clock=clock)
    runner = JobRunner(store, gateway, registry, recorder, clock=clock, rng=random.Random(7), flex=flex)
    body = job_message("classify", "j-1", lane=lane, deadline_seconds=deadline_seconds)
    # 300 s left in the invocation, as a worker's Lambda has at its start.
    return runner.process(Delivery("m-1", json.dumps(body), 1, lane=Lane(lane)), lambda: 300_000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> InMemoryJobStore:
    return InMemoryJobStore()


def only_job(store: InMemoryJobStore) -> Job:
    found = store.get_job("j-1")
    assert found is not None
    return found


def test_a_background_job_runs_at_the_flex_tier_and_records_it(store: InMemoryJobStore, clock: Clock) -> None:
    provider = scripted(answer_at(FLEX_TIER))

    disposition = run_one(provider, store, clock)

    assert disposition.fate is Fate.SUCCEEDED
    assert provider.requests[0].service_tier == FLEX_TIER
    ended = only_job(store)
    (attempt,) = store.attempts("j-1")
    assert (attempt.via, attempt.service_tier) == (Via.FLEX, FLEX_TIER)
    assert attempt.cost_usd == Decimal("0.0000325")
    assert attempt.standard_cost_usd == Decimal("0.000065")
    assert (ended.usage.cost_usd, ended.usage.standard_cost_usd) == (attempt.cost_usd, attempt.standard_cost_usd)


def test_an_interactive_job_never_asks_the_flex_tier(store: InMemoryJobStore, clock: Clock) -> None:
    provider = scripted(answer_at("default"))

    assert run_one(provider, store, clock, lane="interactive").fate is Fate.SUCCEEDED

    assert provider.requests[0].service_tier is None
    (attempt,) = store.attempts("j-1")
    assert attempt.via is Via.REALTIME
    assert attempt.cost_usd == attempt.standard_cost_usd


def test_with_flex_off_a_background_job_runs_at_the_standard_tier(store: InMemoryJobStore, clock: Clock) -> None:
    provider = scripted(answer_at("default"))

    assert run_one(provider, store, clock, flex=False).fate is Fate.SUCCEEDED

    assert provider.requests[0].service_tier is None


def test_a_refused_flex_call_queues_the_job_again_without_spending_an_attempt(
    store: InMemoryJobStore, clock: Clock
) -> None:
    provider = scripted(FlexUnavailableError("the provider's flex tier is unavailable (HTTP 429)"))

    disposition = run_one(provider, store, clock)

    assert isinstance(disposition, Retry)
    assert provider.calls == 1
    waiting = only_job(store)
    assert waiting.status is JobStatus.QUEUED
    assert waiting.attempt_count == 0  # refunded
    assert waiting.error is not None
    assert waiting.error.code is ErrorCode.PROVIDER_RATE_LIMITED
    (attempt,) = store.attempts("j-1")
    assert (attempt.via, attempt.calls, attempt.cost_usd) == (Via.FLEX, 1, 0)


def test_near_its_deadline_a_refused_flex_call_is_made_again_at_the_standard_tier_in_the_same_attempt(
    store: InMemoryJobStore, clock: Clock
) -> None:
    provider = scripted(FlexUnavailableError("429"), answer_at("default"))

    disposition = run_one(provider, store, clock, deadline_seconds=300)

    assert disposition.fate is Fate.SUCCEEDED
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, None]
    (attempt,) = store.attempts("j-1")
    assert (attempt.via, attempt.service_tier, attempt.calls) == (Via.FLEX, "default", 2)
    assert attempt.cost_usd == attempt.standard_cost_usd == Decimal("0.000065")
    assert only_job(store).attempt_count == 1


def test_near_its_deadline_a_flex_call_that_never_answers_leaves_the_standard_call_its_time_before_the_deadline(
    store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a background job three minutes from its deadline, in an invocation of 300 s, whose flex
    # tier never answers
    provider = scripted(ProviderTimeoutError("no answer"), answer_at("default"))

    # When it runs
    disposition = run_one(provider, store, clock, deadline_seconds=180)

    # Then its flex call may take only what the deadline leaves after the standard call's 60 s (not
    # what is left of the invocation), and the standard call follows with its own timeout
    assert disposition.fate is Fate.SUCCEEDED
    assert [(request.service_tier, request.timeout_seconds) for request in provider.requests] == [
        (FLEX_TIER, 180.0 - CLASSIFY.timeout_seconds),
        (None, CLASSIFY.timeout_seconds),
    ]
    assert only_job(store).attempt_count == 1


def test_within_twice_its_timeout_of_its_deadline_a_job_asks_the_standard_tier_alone(
    store: InMemoryJobStore, clock: Clock
) -> None:
    # Given a background job 100 s from its deadline: a flex call would leave the standard call less
    # than its 60 s before the deadline, or get less than that itself
    provider = scripted(answer_at("default"))

    # When it runs, then it is called at the standard tier alone, in real time
    assert run_one(provider, store, clock, deadline_seconds=100).fate is Fate.SUCCEEDED
    assert [request.service_tier for request in provider.requests] == [None]
    (attempt,) = store.attempts("j-1")
    assert (attempt.via, attempt.calls) == (Via.REALTIME, 1)


def test_a_job_back_from_waiting_for_flex_near_its_deadline_gets_the_standard_tier(
    store: InMemoryJobStore, clock: Clock
) -> None:
    provider = scripted(FlexUnavailableError("429"), FlexUnavailableError("429"), answer_at("default"))
    assert isinstance(run_one(provider, store, clock, deadline_seconds=900), Retry)

    # When its message comes back with its deadline near
    clock.advance(900 - MARGIN_MS / 1000 + 10)
    disposition = run_one(provider, store, clock, deadline_seconds=900)

    # Then it asked flex once more and, refused, the standard tier at once
    assert disposition.fate is Fate.SUCCEEDED
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, FLEX_TIER, None]
    assert [attempt.via for attempt in store.attempts("j-1")] == [Via.FLEX, Via.FLEX]


def test_a_usage_total_sums_the_standard_cost_of_every_attempt(store: InMemoryJobStore, clock: Clock) -> None:
    provider = scripted(FlexUnavailableError("429"), answer_at(FLEX_TIER))
    run_one(provider, store, clock)
    run_one(provider, store, clock)

    ended = only_job(store)
    assert ended.status is JobStatus.SUCCEEDED
    attempts = store.attempts("j-1")
    assert ended.usage.standard_cost_usd == sum((attempt.standard_cost_usd for attempt in attempts), Decimal(0))
    assert ended.usage.attempts == 2
    assert replace(ended.usage, standard_cost_usd=Decimal(0)).cost_usd == Decimal("0.0000325")


def test_the_scripted_provider_is_asked_a_complete_request(store: InMemoryJobStore, clock: Clock) -> None:
    provider = scripted(answer_at(FLEX_TIER))
    run_one(provider, store, clock)

    request: CompletionRequest = provider.requests[0]
    assert (request.model, request.schema_name, request.timeout_seconds) == ("gpt-5-mini", "classify", 295.0)
