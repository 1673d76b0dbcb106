"""UTC days, what listings, usage and budgets are kept by: a range's days are counted before they are
listed, so that a range of a million years is refused by its bound, not by the calendar."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core.days import DAY_MS, utc_day_count, utc_days

# 0001-01-02 to 9999-12-30 in epoch milliseconds: the instants a date holds.
FIRST_MS = -62_135_510_400_000
LAST_MS = 253_402_128_000_000


@given(st.integers(FIRST_MS, LAST_MS), st.integers(0, 900 * DAY_MS))
def test_the_count_of_a_range_s_days_is_the_number_of_days_it_lists(since_ms: int, span_ms: int) -> None:
    until_ms = min(since_ms + span_ms, LAST_MS)

    assert utc_day_count(since_ms, until_ms) == len(utc_days(since_ms, until_ms))


def test_a_range_that_starts_before_any_date_is_counted_all_the_same() -> None:
    # Given a range of a hundred billion weeks back from 2027-01-15 (`--since 100000000000w`)
    until_ms = 1_800_000_000_000
    since_ms = until_ms - 100_000_000_000 * 7 * DAY_MS

    # When its days are counted
    count = utc_day_count(since_ms, until_ms)

    # Then the count is exact, with no date made for either end
    assert count == 700_000_000_001
