"""retry: exponential backoff with full jitter, and the provider's Retry-After."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.errors import InternalError, ProviderRateLimitedError, ProviderTimeoutError, ProviderUnavailableError
from engine.retry import (
    BASE_DELAY_SECONDS,
    MAX_BACKOFF_SECONDS,
    MAX_DELAY_SECONDS,
    REACH_SECONDS,
    RESERVE_RECEIVES,
    backoff_seconds,
    reach_floor_seconds,
    retry_delay_seconds,
)

SEEDS = range(300)


def delays(attempt: int, **kwargs: float) -> list[int]:
    return [backoff_seconds(attempt, random.Random(seed), **kwargs) for seed in SEEDS]


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 10, 12, 20, 50])
def test_backoff_stays_within_1_and_the_exponential_ceiling(attempt: int) -> None:
    ceiling = min(MAX_BACKOFF_SECONDS, BASE_DELAY_SECONDS * 2 ** (attempt - 1))

    observed = delays(attempt)

    assert all(isinstance(delay, int) for delay in observed)
    assert min(observed) >= 1
    assert max(observed) <= math.ceil(ceiling)


@pytest.mark.parametrize(("base", "cap"), [(1.0, 10.0), (3.0, 100.0), (0.5, 5.0)])
def test_backoff_honours_a_custom_base_and_cap(base: float, cap: float) -> None:
    for attempt in range(1, 12):
        ceiling = min(cap, base * 2 ** (attempt - 1))
        observed = delays(attempt, base=base, cap=cap)
        assert min(observed) >= 1
        assert max(observed) <= max(1, math.ceil(ceiling))


def test_backoff_is_jittered_not_fixed() -> None:
    assert len(set(delays(6))) > 10


def test_backoff_grows_with_the_attempt_until_the_cap() -> None:
    means = [sum(delays(attempt)) / len(SEEDS) for attempt in range(1, 11)]

    assert means == sorted(means)
    assert means[-1] > 4 * means[2]


def test_backoff_reaches_but_never_passes_the_cap() -> None:
    observed = delays(40)

    assert max(observed) <= MAX_BACKOFF_SECONDS
    assert max(observed) > MAX_BACKOFF_SECONDS * 0.9


def test_backoff_for_attempt_zero_is_treated_as_the_first() -> None:
    assert max(delays(0)) <= BASE_DELAY_SECONDS


def test_backoff_is_a_pure_function_of_its_inputs() -> None:
    assert backoff_seconds(7, random.Random(42)) == backoff_seconds(7, random.Random(42))


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [
        (30.0, 30),
        (0.2, 1),
        (1.5, 2),
        (0.0, 1),
        (43_199.1, 43_200),
        (43_200.0, 43_200),
        (50_000.0, 43_200),
        (1e9, 43_200),
    ],
)
def test_retry_after_is_rounded_up_and_capped_at_12_hours(retry_after: float, expected: int) -> None:
    error = ProviderRateLimitedError("429", retry_after_seconds=retry_after)

    assert retry_delay_seconds(error, attempt=1, rng=random.Random(0)) == expected


def test_retry_after_wins_over_backoff_at_any_attempt() -> None:
    error = ProviderRateLimitedError("429", retry_after_seconds=7)

    assert {retry_delay_seconds(error, attempt, random.Random(attempt)) for attempt in range(1, 10)} == {7}


@pytest.mark.parametrize(
    "error",
    [
        ProviderRateLimitedError("429 without Retry-After"),
        ProviderTimeoutError("timeout"),
        ProviderUnavailableError("503"),
        InternalError("bug"),
    ],
)
def test_without_retry_after_the_delay_is_the_backoff(error: ProviderRateLimitedError) -> None:
    for attempt in (1, 4, 9):
        assert retry_delay_seconds(error, attempt, random.Random(attempt)) == backoff_seconds(
            attempt, random.Random(attempt)
        )


def test_the_12_hour_cap_is_sqs_maximum_visibility() -> None:
    assert MAX_DELAY_SECONDS == 12 * 3600


@pytest.mark.parametrize("retry_after", [math.inf, math.nan])
def test_a_non_finite_retry_after_still_gives_a_bounded_delay(retry_after: float) -> None:
    error = ProviderRateLimitedError("429", retry_after_seconds=retry_after)

    assert 1 <= retry_delay_seconds(error, attempt=1, rng=random.Random(0)) <= MAX_DELAY_SECONDS


@given(
    seconds_to_deadline=st.integers(min_value=0, max_value=604_800),
    max_receives=st.integers(min_value=21, max_value=1000),
    data=st.data(),
)
def test_the_reach_floor_leaves_receives_that_span_the_time_to_the_deadline(
    seconds_to_deadline: int, max_receives: int, data: st.DataObject
) -> None:
    receive_count = data.draw(st.integers(min_value=1, max_value=max_receives))
    floor = reach_floor_seconds(seconds_to_deadline, receive_count, max_receives)
    left = max_receives - receive_count - RESERVE_RECEIVES

    # Hidden for the floor, the last receive kept (reserve aside) can still come at the deadline
    assert floor + max(left - 1, 0) * REACH_SECONDS >= seconds_to_deadline
    # And the floor asks nothing while the receives left reach the deadline anyway
    if (left - 1) * REACH_SECONDS >= seconds_to_deadline:
        assert floor == 0


def test_a_seven_day_deadline_leaves_the_first_receives_to_the_backoff() -> None:
    assert reach_floor_seconds(604_800, 1, 100) == 0
    assert reach_floor_seconds(604_800, 1, 21) > 0
