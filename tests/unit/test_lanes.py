"""Lanes under a shared limit and budgets (engine.fleet.admission), on the in-memory fleet stores.

Interactive jobs take capacity as far ahead as their invocation can wait; background jobs only about
a second ahead, waiting in their worker as capacity comes, so that an interactive arrival never
queues behind a background backlog; with no interactive demand, background jobs use the whole
limit. Background jobs may not reserve the last part of a user's daily cap.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from engine.core import ErrorCode, Lane
from engine.fleet.admission import BACKGROUND_HORIZON_MS, Admission, Ask, Hold, Pass, Verdict
from engine.fleet.budgets import Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import ModelLimit
from engine.gateway import CallPlan
from engine.testing import InMemoryBudgetStore, InMemoryLimitStore
from tests.support.clock import T0_MS, Clock

MODEL = "gpt-4o-mini"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limits() -> InMemoryLimitStore:
    return InMemoryLimitStore()


@pytest.fixture
def budgets() -> InMemoryBudgetStore:
    return InMemoryBudgetStore()


def admission(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore, rpm: int = 60, keep: str = "0.1"
) -> Admission:
    limiter = RateLimiter(limits, {MODEL: ModelLimit(rpm=rpm)}, random.Random(1))
    return Admission(limiter, Budgets(budgets, None), clock=clock, background_keep=Decimal(keep), sleep=clock.sleep)


def ask(lane: Lane, user: str = "acme", worst: str = "0.001") -> Ask:
    return Ask(user, CallPlan(MODEL, 100, Decimal(worst)), lane)


def call_offsets(verdicts: list[Verdict]) -> list[float]:
    """Seconds from the start at which the passed jobs call."""
    return [(verdict.call_at_ms - T0_MS) / 1000 for verdict in verdicts if isinstance(verdict, Pass)]


def as_capacity_comes(fleet: Admission, asks: list[Ask], call_within_ms: int) -> list[Verdict]:
    verdicts: dict[int, Verdict] = {}
    fleet.admit_as_capacity_comes(asks, call_within_ms, verdicts.__setitem__)
    return [verdicts[index] for index in range(len(asks))]


def test_interactive_jobs_take_capacity_as_far_ahead_as_their_invocation_can_wait(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)

    # A batch of ten at one call a second, in an invocation that lets them call within a minute
    verdicts = as_capacity_comes(fleet, [ask(Lane.INTERACTIVE)] * 10, 60_000)

    # All are admitted at once, a second apart, with one take
    assert call_offsets(verdicts) == [float(n) for n in range(10)]
    assert clock.now_ms == T0_MS  # no waiting in the worker
    assert limits.writes <= 2  # a new bucket: the refused add, then its first write


def test_background_jobs_take_capacity_only_about_a_second_ahead(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=600)  # a call every 100 ms

    verdicts = fleet.admit([ask(Lane.BACKGROUND)] * 20, 60_000)

    # Only the calls within the background horizon are taken; the others learn when capacity comes
    assert call_offsets(verdicts) == [n / 10 for n in range(11)]
    held = [verdict for verdict in verdicts if isinstance(verdict, Hold)]
    assert len(held) == 9
    assert all(hold.code is ErrorCode.PROVIDER_RATE_LIMITED for hold in held)
    assert [hold.would_call_at_ms for hold in held] == [T0_MS + 1_100 + 100 * n for n in range(9)]


def test_an_interactive_arrival_never_waits_behind_background_calls_which_it_pushes_back(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=600)
    # Given a background backlog that took all the capacity it may: calls up to a second ahead
    background = fleet.admit([ask(Lane.BACKGROUND)] * 50, 60_000)
    assert max(call_offsets(background)) == BACKGROUND_HORIZON_MS / 1000

    # When interactive jobs arrive
    interactive = fleet.admit([ask(Lane.INTERACTIVE)] * 2, 60_000)

    # Then they call at once, at their own lane's rate, as if no background job had taken anything
    assert call_offsets(interactive) == [0.0, 0.1]
    # And the background calls to come are pushed back by their cost: the next starts after both
    [later] = fleet.admit([ask(Lane.BACKGROUND)], 60_000)
    assert isinstance(later, Hold)
    assert later.would_call_at_ms == T0_MS + BACKGROUND_HORIZON_MS + 100 + 2 * 100


def test_background_jobs_get_no_capacity_that_interactive_jobs_have_taken(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)
    # Given interactive jobs that took the next 20 seconds
    fleet.admit([ask(Lane.INTERACTIVE)] * 20, 60_000)

    # When a background job asks
    [verdict] = fleet.admit([ask(Lane.BACKGROUND)], 60_000)

    # Then it waits until the interactive ones are through (taken two calls ahead at 60 rpm)
    assert isinstance(verdict, Hold)
    assert verdict.would_call_at_ms == T0_MS + 20_000
    assert verdict.capacity_at_ms == T0_MS + 20_000 - 2_000


def test_within_a_batch_of_both_lanes_interactive_jobs_take_first(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)

    verdicts = fleet.admit([ask(Lane.BACKGROUND), ask(Lane.INTERACTIVE), ask(Lane.INTERACTIVE)], 60_000)

    # At 60 rpm a background take reaches two calls ahead: it gets the call after the interactive ones
    assert call_offsets(verdicts) == [2.0, 0.0, 1.0]


def test_with_no_interactive_demand_background_jobs_use_the_whole_limit_as_capacity_comes(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)

    # A batch of 30 background jobs in an invocation that lets them call within 40 s
    verdicts = as_capacity_comes(fleet, [ask(Lane.BACKGROUND)] * 30, 40_000)

    # Every one is admitted in the worker as capacity comes, at the full rate: a call a second
    assert call_offsets(verdicts) == [float(n) for n in range(30)]
    # And taking it cost about one write per two calls (two calls ahead at a time), no more
    assert limits.writes <= 30 / 2 + 2


def test_background_jobs_that_cannot_call_within_the_invocation_wait_on_the_queue(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)

    verdicts = as_capacity_comes(fleet, [ask(Lane.BACKGROUND)] * 10, 4_500)

    # The turn that comes in time ran; the rest are handed back for when their turn comes
    assert call_offsets(verdicts) == [0.0, 1.0, 2.0, 3.0, 4.0]
    held = [verdict for verdict in verdicts if isinstance(verdict, Hold)]
    assert len(held) == 5
    assert {hold.until_ms for hold in held} == {T0_MS + 5_000}
    assert {hold.code for hold in held} == {ErrorCode.PROVIDER_RATE_LIMITED}


def test_background_jobs_leave_the_last_part_of_a_users_cap_to_interactive_ones(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    # Given a user capped at $1.00, of which background jobs may not reserve the last 10%
    budgets.own_caps["acme"] = Decimal("1.00")
    fleet = admission(clock, limits, budgets, rpm=6_000)

    # When background jobs of $0.20 worst case each ask, then interactive ones
    background = fleet.admit([ask(Lane.BACKGROUND, worst="0.20")] * 5, 60_000)
    interactive = fleet.admit([ask(Lane.INTERACTIVE, worst="0.05")] * 3, 60_000)

    # Then four background ones fit in the $0.90 they may use, and the fifth waits, saying why
    assert [isinstance(verdict, Pass) for verdict in background] == [True] * 4 + [False]
    waiting = background[4]
    assert isinstance(waiting, Hold)
    assert waiting.code is ErrorCode.BUDGET_EXCEEDED
    assert waiting.reason == (
        "waiting: user acme has spent or reserved its daily budget of $1.00,"
        " less the $0.1 kept for its interactive jobs"
    )
    # And the interactive ones still have the $0.20 left
    assert [isinstance(verdict, Pass) for verdict in interactive] == [True] * 3


# --- a 429 meanwhile ------------------------------------------------------------------------------


def test_capacity_a_429_voids_is_taken_again_once_for_the_calls_that_fit_the_invocation(
    clock: Clock, limits: InMemoryLimitStore, budgets: InMemoryBudgetStore
) -> None:
    fleet = admission(clock, limits, budgets, rpm=60)
    # Given five interactive jobs admitted a second apart, in an invocation that lets them call within 8 s
    verdicts = as_capacity_comes(fleet, [ask(Lane.INTERACTIVE)] * 5, 8_000)
    passes = [verdict for verdict in verdicts if isinstance(verdict, Pass)]
    assert call_offsets(passes) == [0.0, 1.0, 2.0, 3.0, 4.0]
    # and the first call meeting a 429 that asks for a pause of 2 s
    assert passes[0].revoked() is None
    assert fleet._limiter is not None
    fleet._limiter.throttled(MODEL, T0_MS, T0_MS, retry_after_ms=2_000)
    writes = limits.writes

    # When the second job's time comes
    clock.now_ms = T0_MS + 1_000
    assert passes[1].revoked() is None

    # Then it waited out the pause and called at the first time the void calls left (5 s); the later
    # ones were taken again with it at the lowered rate (x0.7, climbed back to 0.71 in 2 s: 1,408 ms
    # apart), as far as the invocation lets them call
    assert clock.now_ms == T0_MS + 5_000
    assert [verdict.call_at_ms - T0_MS for verdict in passes[1:]] == [5_000, 6_409, 7_817, 4_000]
    # in one take for all of them (an add refused, since not all of them fit, then the exact write)
    assert limits.writes == writes + 2
    clock.now_ms = T0_MS + 5_500
    assert passes[2].revoked() is None
    assert clock.now_ms == T0_MS + 6_409  # it waits for its new time
    # And the one that could not call in time waits on the queue until the pause is over, with no
    # take of its own
    held = passes[4].revoked()
    assert isinstance(held, Hold)
    assert held.reason.startswith("waiting: gpt-4o-mini answered 429 after this call's capacity was taken")
    assert held.taken is None  # void: not given back
    assert limits.writes == writes + 2
