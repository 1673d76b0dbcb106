"""The arithmetic of a shared bucket (engine.fleet.limits): spacing, horizon, debts, AIMD."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import (
    DECREASE,
    HORIZON_MS,
    MIN_FACTOR,
    RECOVERY_PER_SECOND,
    BucketState,
    Costs,
    Debt,
    ModelLimit,
    add_bounds,
    schedule,
)
from engine.testing import InMemoryLimitStore

NOW = 1_800_000_000_000  # ms
NS = 1_000_000  # ns per ms


def rpm(limit: int, factor: float = 1.0) -> Costs:
    return Costs.of(ModelLimit(rpm=limit), factor)


def test_an_idle_bucket_lets_its_first_call_go_at_once_then_spaces_calls_at_the_rate() -> None:
    # 600 rpm: one request per 100 ms, from now
    plan = schedule(BucketState(), rpm(600), [1] * 10, NOW)

    assert [call - NOW for call in plan.call_at_ms] == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]
    assert plan.fits_at_ms == ()
    assert plan.request_at == (NOW + 1_000) * NS


def test_a_busy_bucket_spaces_every_call() -> None:
    busy = BucketState(request_at=(NOW + 2_000) * NS)

    plan = schedule(busy, rpm(600), [1] * 3, NOW)

    assert [call - NOW for call in plan.call_at_ms] == [2_000, 2_100, 2_200]


def test_asks_past_the_horizon_are_not_taken_and_learn_when_they_would_fit() -> None:
    # 60 rpm: one a second; the horizon holds about ten seconds of calls
    plan = schedule(BucketState(), rpm(60), [1] * 15, NOW)

    assert len(plan.call_at_ms) == 11  # at 0, 1 s ... 10 s
    assert plan.call_at_ms[-1] - NOW == HORIZON_MS
    # The bucket keeps only what was taken; the rest would fit a second apart, later
    assert plan.request_at == (NOW + 11_000) * NS
    assert [fits - NOW for fits in plan.fits_at_ms] == [1_000, 2_000, 3_000, 4_000]


def test_tokens_space_calls_by_their_size() -> None:
    # 60,000 tpm: one token per ms; jobs of 1,000 tokens call a second apart, small ones sooner
    costs = Costs.of(ModelLimit(tpm=60_000), 1.0)

    plan = schedule(BucketState(), costs, [1_000, 1_000, 10, 1_000], NOW)

    assert [call - NOW for call in plan.call_at_ms] == [0, 1_000, 2_000, 2_010]
    assert plan.token_at == (NOW + 3_010) * NS


def test_both_limits_bind_and_the_later_call_time_wins() -> None:
    costs = Costs.of(ModelLimit(rpm=600, tpm=60_000), 1.0)

    plan = schedule(BucketState(), costs, [10, 10, 2_000, 10], NOW)

    # requests space the small ones 100 ms apart; the 2,000 tokens of the third, counted from its
    # call at 200 ms, hold the fourth until 2,200 ms
    assert [call - NOW for call in plan.call_at_ms] == [0, 100, 200, 2_200]


def test_a_limit_left_behind_by_the_other_lends_no_slack_to_later_calls() -> None:
    # Given 600 rpm (100 ms a request) and 60,000 tpm (1 ms a token): ten large asks bound by tokens
    costs = Costs.of(ModelLimit(rpm=600, tpm=60_000), 1.0)

    plan = schedule(BucketState(), costs, [1_000] * 5 + [10] * 5, NOW)

    # Then the small asks after them are still spaced by the request rate, not 10 ms apart
    small = plan.call_at_ms[5:]
    assert [later - earlier for earlier, later in itertools.pairwise(small)] == [100] * 4
    assert costs.both
    # And a batch longer than the horizon has bounds no bucket lies within: the limiter writes exactly
    one_a_second = Costs.of(ModelLimit(rpm=60), 1.0)
    assert not add_bounds(one_a_second, [1] * 15, NOW, Debt()).feasible
    assert add_bounds(one_a_second, [1] * 5, NOW, Debt()).feasible


def test_a_give_back_makes_room_but_never_credit_past_now() -> None:
    busy = BucketState(request_at=(NOW + 3_000) * NS)

    owed = schedule(busy, rpm(600), [1], NOW, Debt(requests=-10))
    assert owed.call_at_ms == (NOW + 2_000,)

    idle = schedule(BucketState(request_at=(NOW - 60_000) * NS), rpm(600), [1] * 3, NOW, Debt(requests=-100))
    assert [call - NOW for call in idle.call_at_ms] == [0, 100, 200]


def test_a_debt_of_re_asks_pushes_the_next_calls_back() -> None:
    plan = schedule(BucketState(request_at=NOW * NS), rpm(600), [1, 1], NOW, Debt(requests=5))

    assert [call - NOW for call in plan.call_at_ms] == [500, 600]
    assert plan.request_at == (NOW + 700) * NS


def test_the_factor_scales_the_rate_and_shards_split_it() -> None:
    assert rpm(600).request_ns == 100 * NS
    assert rpm(600, factor=0.5).request_ns == 200 * NS
    assert Costs.of(ModelLimit(rpm=600, shards=4), 1.0).request_ns == 400 * NS
    assert Costs.of(ModelLimit(tpm=120_000), 1.0).token_ns == NS // 2


@pytest.mark.parametrize(
    ("limit", "shards"),
    [(ModelLimit(rpm=500), 1), (ModelLimit(rpm=30_000), 1), (ModelLimit(rpm=30_001), 2), (ModelLimit(tpm=10**9), 1)],
)
def test_shards_follow_the_request_rate_a_partition_takes(limit: ModelLimit, shards: int) -> None:
    assert limit.shard_count == shards


def test_a_429_lowers_the_factor_which_climbs_back_while_none_comes() -> None:
    state = BucketState(factor=1.0)

    lowered = state.lowered(NOW)
    assert lowered == pytest.approx(DECREASE)

    after = BucketState(factor=lowered, factor_at=NOW)
    ten_seconds = after.factor_now(NOW + 10_000)
    assert ten_seconds == pytest.approx(DECREASE + 10 * RECOVERY_PER_SECOND)
    assert after.factor_now(NOW + 10**9) == 1.0
    assert BucketState(factor=0.01, factor_at=NOW).factor_now(NOW) == MIN_FACTOR
    assert BucketState(factor=MIN_FACTOR, factor_at=NOW).lowered(NOW) == MIN_FACTOR


@settings(max_examples=300, deadline=None)
@given(
    request_offset_ms=st.integers(min_value=-5_000, max_value=20_000),
    token_offset_ms=st.integers(min_value=-5_000, max_value=20_000),
    asks=st.lists(st.integers(min_value=1, max_value=50_000), min_size=1, max_size=12),
    debt=st.builds(Debt, st.integers(-20, 20), st.integers(-100_000, 100_000)),
    # One limit, requests or tokens: the only buckets a take adds to (limiter.RateLimiter)
    limit=st.one_of(
        st.builds(ModelLimit, rpm=st.integers(1, 100_000)), st.builds(ModelLimit, tpm=st.integers(1_000, 10_000_000))
    ),
)
def test_an_add_within_its_bounds_takes_exactly_what_the_exact_schedule_takes(
    request_offset_ms: int, token_offset_ms: int, asks: list[int], debt: Debt, limit: ModelLimit
) -> None:
    # Given a bucket, and the condition under which adding the batch's cost needs no clamp
    state = BucketState((NOW + request_offset_ms) * NS, (NOW + token_offset_ms) * NS)
    costs = Costs.of(limit, 1.0)
    bounds = add_bounds(costs, asks, NOW, debt)
    within = all(
        bound is None or bound[0] <= at <= bound[1]
        for bound, at in ((bounds.request, state.request_at), (bounds.token, state.token_at))
    )
    plan = schedule(state, costs, asks, NOW, debt)
    request_ns, token_ns = costs.moves(debt.requests + len(asks), debt.tokens + sum(asks))

    # Then the add is taken exactly when every ask fits with no clamp, and it writes what the schedule would
    event(f"within bounds: {within}")
    debt_request, debt_token = costs.moves(debt.requests, debt.tokens)
    unclamped = (not costs.request_ns or state.request_at + debt_request >= NOW * NS) and (
        not costs.token_ns or state.token_at + debt_token >= NOW * NS
    )
    assert within == (unclamped and len(plan.call_at_ms) == len(asks))
    if within:
        assert len(plan.call_at_ms) == len(asks)
        if costs.request_ns:
            assert plan.request_at == state.request_at + request_ns
        if costs.token_ns:
            assert plan.token_at == state.token_at + token_ns
    # And bounds no bucket can lie within are never sent (DynamoDB refuses such a BETWEEN)
    assert bounds.feasible or not within
    # And every call the schedule gives is within the horizon and never before now
    assert all(NOW <= call <= NOW + HORIZON_MS for call in plan.call_at_ms)
    assert len(plan.call_at_ms) + len(plan.fits_at_ms) == len(asks)


class RefusingStore:
    """A bucket store that checks the add's bounds as DynamoDB does, then fails like an outage."""

    def __init__(self) -> None:
        self.adds = 0

    def add(self, model: str, shard: int, request_ns: int, token_ns: int, bounds: Any, *_: Any, **__: Any) -> Any:
        assert bounds.feasible, "DynamoDB: the BETWEEN operator requires upper bound >= lower bound"
        self.adds += 1
        raise RuntimeError("the table is unavailable")

    def replace(self, *_: Any) -> Any:
        raise RuntimeError("the table is unavailable")

    def lower(self, *_: Any) -> Any:
        raise RuntimeError("the table is unavailable")


def test_a_take_that_fails_keeps_what_is_owed_and_never_sends_impossible_bounds() -> None:
    store = RefusingStore()
    limiter = RateLimiter(store, {"m": ModelLimit(rpm=60)}, random.Random(1))  # type: ignore[arg-type]
    limiter.settle("m", 0, Debt(requests=2))

    # A batch longer than the horizon goes straight to the exact write; a short one tries the add
    for asks in ([1] * 15, [1] * 3):
        with pytest.raises(RuntimeError):
            limiter.take("m", asks, NOW)

    assert store.adds == 1
    # And the debt is still owed after both failures
    assert limiter._debts[("m", 0)] == Debt(requests=2)


class RivalFirst(InMemoryLimitStore):
    """A bucket store where, before each of a worker's exact writes, another worker's take of a batch
    lands first."""

    def __init__(self) -> None:
        super().__init__()
        self.rival = RateLimiter(self, {"m": ModelLimit(rpm=60)}, random.Random(2))
        self.rival_takes = 0
        self._rivals_turn = False

    def replace(self, *args: Any, **kwargs: Any) -> tuple[bool, BucketState | None]:
        if not self._rivals_turn:
            self._rivals_turn = True
            try:
                self.rival.take("m", [1] * 10, NOW, 240_000)
                self.rival_takes += 1
            finally:
                self._rivals_turn = False
        return super().replace(*args, **kwargs)


def test_workers_meeting_a_new_bucket_at_once_all_take_their_batch() -> None:
    # Given a bucket that does not exist yet, and another worker whose take gets in before each of
    # this worker's exact writes (many workers' first batches of a burst, at once)
    store = RivalFirst()
    limiter = RateLimiter(store, {"m": ModelLimit(rpm=60)}, random.Random(1))

    # When this worker takes for its batch of ten, within a 4-minute invocation
    taken = limiter.take("m", [1] * 10, NOW, 240_000)

    # Then it gets all ten, after the rival's batch: its refused write returned a busy bucket, which
    # an add (that no other worker's add can refuse) takes from; none of its jobs waits on the queue
    assert taken.call_at_ms == tuple(NOW + 10_000 + 1_000 * n for n in range(10))
    assert store.rival_takes == 1
    # Its three writes (the add refused for want of a bucket, the exact write refused, the add) and
    # the rival's two
    assert store.writes == 3 + 2
