"""Usage over a time range, by user, job type, model and lane: Queries of the attempt records' indexes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from engine.core import Via
from engine.core.days import utc_days
from engine.store.expressions import index_query
from engine.store.items import USAGE_DAY_SHARDS, from_item, usage_day_partition
from engine.store.table import default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BY_DAY_INDEX = "UsageByDay"
# A range of more days than this is refused rather than fanned out into thousands of queries.
MAX_RANGE_DAYS = 400


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Attempts of one (user, job type, model, lane), summed; token kinds as in engine.core.Usage."""

    user_id: str | None
    job_type: str | None
    model: str | None
    # Attempts recorded before lanes were interactive ones.
    lane: str | None = None
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_savings_usd: Decimal = Decimal(0)
    # Attempts that called a model with no price: their cost is unknown, counted as 0.
    unpriced_attempts: int = 0
    # Jobs that took an answer already paid for (their attempt `via` reuse: no call, no cost).
    reused: int = 0

    def plus(self, record: dict[str, Any]) -> UsageRow:
        """This row with one more attempt record (an item of the UsageByDay index) added."""
        return replace(
            self,
            attempts=self.attempts + 1,
            unpriced_attempts=self.unpriced_attempts + bool(record.get("unpriced")),
            reused=self.reused + (record.get("via") == Via.REUSE.value),
            **{name: getattr(self, name) + int(record.get(name, 0)) for name in _COUNTS},
            **{name: getattr(self, name) + Decimal(record.get(name, 0)) for name in _AMOUNTS},
        )

    def merged(self, other: UsageRow) -> UsageRow:
        """This row's sums and `other`'s added up, under this row's user, job type and model."""
        return replace(
            self,
            attempts=self.attempts + other.attempts,
            reused=self.reused + other.reused,
            **{name: getattr(self, name) + getattr(other, name) for name in (*_COUNTS, *_AMOUNTS)},
        )


_COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens")
_AMOUNTS = ("cost_usd", "cache_savings_usd")


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Usage over a range: by (user, job type, model), costliest first, and by UTC day, every day of the
    range oldest first (a day with no attempts holds a row of zeros)."""

    rows: list[UsageRow]
    days: list[tuple[str, UsageRow]]


class UsageLedger:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()

    def summarize(self, since_ms: int, until_ms: int, user_id: str | None = None) -> list[UsageRow]:
        """Attempts finished in [since, until], summed by (user, job type, model, lane); costliest first."""
        return self.report(since_ms, until_ms, user_id).rows

    def report(self, since_ms: int, until_ms: int, user_id: str | None = None) -> UsageReport:
        """Attempts finished in [since, until], summed by (user, job type, model, lane) and by day: one pass."""
        if until_ms < since_ms:
            raise ValueError("the usage range ends before it starts")
        totals: dict[tuple[str | None, str | None, str | None, str | None], UsageRow] = {}
        days = _days(since_ms, until_ms)
        by_day = {day: UsageRow(None, None, None) for day in days}
        for day in days:
            for record in self._records(day, since_ms, until_ms, user_id):
                # Attempts recorded before lanes were interactive ones.
                lane = record.get("lane", "interactive")
                key = (record.get("user_id"), record.get("job_type"), record.get("model"), lane)
                totals[key] = (totals.get(key) or UsageRow(*key)).plus(record)
                by_day[day] = by_day[day].plus(record)
        rows = sorted(
            totals.values(),
            key=lambda row: (-row.cost_usd, -row.input_tokens, str(row.user_id), str(row.job_type)),
        )
        return UsageReport(rows, list(by_day.items()))

    def _records(self, day: str, since_ms: int, until_ms: int, user_id: str | None) -> Iterator[dict[str, Any]]:
        for shard in range(USAGE_DAY_SHARDS):
            yield from self._query(usage_day_partition(day, shard), since_ms, until_ms, user_id)

    def _query(self, partition: str, since_ms: int, until_ms: int, user_id: str | None) -> Iterator[dict[str, Any]]:
        params = index_query(
            self.table_name,
            BY_DAY_INDEX,
            "#key = :value AND #at BETWEEN :since AND :until",
            {"#key": "usage_day", "#at": "usage_at"},
            {":value": {"S": partition}, ":since": {"N": str(since_ms)}, ":until": {"N": str(until_ms)}},
            user_id,
        )
        pages = self._client.get_paginator("query").paginate(**params)
        for page in pages:
            for item in page.get("Items", []):
                yield from_item(item)


def _days(since_ms: int, until_ms: int) -> list[str]:
    days = utc_days(since_ms, until_ms)
    if len(days) > MAX_RANGE_DAYS:
        raise ValueError(f"a usage range spans at most {MAX_RANGE_DAYS} days; this one spans {len(days)}")
    return days
