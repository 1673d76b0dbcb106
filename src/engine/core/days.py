"""UTC days: what listings, usage and budgets are kept by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

DAY_MS = 86_400_000


def utc_day(epoch_ms: int) -> str:
    """The UTC day of an instant, as YYYY-MM-DD."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d")


def next_utc_midnight_ms(epoch_ms: int) -> int:
    """When the UTC day after the one of `epoch_ms` begins (epoch ms)."""
    today = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).date()
    return int(datetime.combine(today + timedelta(days=1), datetime.min.time(), tzinfo=UTC).timestamp() * 1000)


def utc_day_count(since_ms: int, until_ms: int) -> int:
    """How many UTC days `utc_days` would list, counted without dates: a range's bound is checked before its
    days are listed, and an instant no date can hold (a --since of a million years) is counted all the same."""
    return until_ms // DAY_MS - since_ms // DAY_MS + 1


def utc_days(since_ms: int, until_ms: int) -> list[str]:
    """The UTC days from the one of `since_ms` to the one of `until_ms`, oldest first, as YYYY-MM-DD."""
    first = datetime.fromtimestamp(since_ms / 1000, tz=UTC).date()
    last = datetime.fromtimestamp(until_ms / 1000, tz=UTC).date()
    return [(first + timedelta(days=offset)).isoformat() for offset in range((last - first).days + 1)]


def bounded_utc_days(since_ms: int, until_ms: int, most: int, what: str) -> list[str]:
    """`utc_days`, refused (ValueError naming `what`, e.g. "a usage range") when they would be more than
    `most`: the bound is checked on their count, before a date is made."""
    count = utc_day_count(since_ms, until_ms)
    if count > most:
        raise ValueError(f"{what} spans at most {most} days; this one spans {count}")
    return utc_days(since_ms, until_ms)
