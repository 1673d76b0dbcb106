"""Usage over a time range, by user, job type, model, lane and route: Queries of the attempt records' indexes.

A route is how an attempt's first call was made (its `via`: real time, a provider's batch, the flex
tier, or reuse of an earlier job's answer with no call); beside its cost each attempt records what the
same calls would have cost in real time at the standard tier (docs/cost.md). The index does not hold
that standard cost (a deployed index's projection cannot change), and it equals the cost but on the
batch and flex routes: those records' standard costs are read from the records themselves, a
BatchGetItem of 100 at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from engine.core import Via
from engine.core.days import bounded_utc_days
from engine.store.expressions import index_query
from engine.store.items import USAGE_DAY_SHARDS, Item, from_item, usage_day_partition
from engine.store.retries import BATCH_GET_KEYS, Backoff, batch_get
from engine.store.table import default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BY_DAY_INDEX = "UsageByDay"
# A range of more days than this is refused rather than fanned out into thousands of queries.
MAX_RANGE_DAYS = 400
# The routes an attempt takes, in the order the usage views list them: `via` as attempts record it
# (engine.core.Via). `reuse`: a job answered from an earlier identical one, with no call and no cost.
ROUTES = ("realtime", "batch", "flex", "reuse")
# The routes whose calls may cost less than in real time at the standard tier: their records keep
# their standard cost apart (engine.store.items), read with the records themselves.
DISCOUNTED_ROUTES = frozenset({"batch", "flex"})


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Attempts of one (user, job type, model, lane, route), summed; token kinds as in engine.core.Usage."""

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
    # What the same calls would have cost in real time at the standard tier.
    standard_cost_usd: Decimal = Decimal(0)
    # The route (ROUTES): how their first calls were made.
    via: str | None = None

    @property
    def saved_usd(self) -> Decimal:
        """What their routes saved: the standard real-time cost of the same calls, less their cost."""
        return self.standard_cost_usd - self.cost_usd

    def plus(self, record: dict[str, Any]) -> UsageRow:
        """This row with one more attempt record (an item of the UsageByDay index) added. A record keeps
        its standard cost only where it differs from its cost (engine.store.items)."""
        return replace(
            self,
            attempts=self.attempts + 1,
            unpriced_attempts=self.unpriced_attempts + bool(record.get("unpriced")),
            reused=self.reused + (record.get("via") == Via.REUSE.value),
            standard_cost_usd=self.standard_cost_usd
            + Decimal(record.get("standard_cost_usd", record.get("cost_usd", 0))),
            **{name: getattr(self, name) + int(record.get(name, 0)) for name in _COUNTS},
            **{name: getattr(self, name) + Decimal(record.get(name, 0)) for name in _AMOUNTS},
        )

    def plus_standard(self, extra_usd: Decimal) -> UsageRow:
        """This row with `extra_usd` more of standard cost (what a discounted record's calls saved)."""
        return replace(self, standard_cost_usd=self.standard_cost_usd + extra_usd)

    def merged(self, other: UsageRow) -> UsageRow:
        """This row's sums and `other`'s added up, under this row's user, job type, model, lane and route."""
        return replace(
            self,
            attempts=self.attempts + other.attempts,
            reused=self.reused + other.reused,
            unpriced_attempts=self.unpriced_attempts + other.unpriced_attempts,
            **{name: getattr(self, name) + getattr(other, name) for name in (*_COUNTS, *_AMOUNTS, "standard_cost_usd")},
        )


_COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens")
_AMOUNTS = ("cost_usd", "cache_savings_usd")


def summed(rows: Iterable[UsageRow]) -> UsageRow:
    """`rows` added up into one row (of no user, job type, model, lane or route)."""
    total = UsageRow(None, None, None)
    for row in rows:
        total = total.merged(row)
    return total


def by_route(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """`rows` summed by route: one row for each of ROUTES (zeros where none took it), in that order, then
    any other route the records name."""
    routes: dict[str, UsageRow] = {route: UsageRow(None, None, None, via=route) for route in ROUTES}
    for row in rows:
        route = row.via or "realtime"
        routes[route] = routes[route].merged(row) if route in routes else replace(row, via=route)
    return [replace(row, user_id=None, job_type=None, model=None, lane=None) for row in routes.values()]


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Usage over a range: by (user, job type, model), costliest first, and by UTC day, every day of the
    range oldest first (a day with no attempts holds a row of zeros)."""

    rows: list[UsageRow]
    days: list[tuple[str, UsageRow]]


RowKey = tuple[str | None, str | None, str | None, str | None, str | None]


@dataclass(frozen=True, slots=True)
class _Discounted:
    """A record of a discounted route, counted at its cost until its standard cost is read."""

    key: Item
    row: RowKey
    day: str
    cost_usd: Decimal


class UsageLedger:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None, backoff: Backoff | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._backoff = backoff or Backoff()

    def summarize(self, since_ms: int, until_ms: int, user_id: str | None = None) -> list[UsageRow]:
        """Attempts finished in [since, until], summed by (user, job type, model, lane, route); costliest first."""
        return self.report(since_ms, until_ms, user_id).rows

    def report(self, since_ms: int, until_ms: int, user_id: str | None = None) -> UsageReport:
        """Attempts finished in [since, until], summed by (user, job type, model, lane, route) and by day:
        one pass."""
        if until_ms < since_ms:
            raise ValueError("the usage range ends before it starts")
        totals: dict[RowKey, UsageRow] = {}
        days = bounded_utc_days(since_ms, until_ms, MAX_RANGE_DAYS, "a usage range")
        by_day = {day: UsageRow(None, None, None) for day in days}
        discounted: list[_Discounted] = []
        for day in days:
            for item in self._records(day, since_ms, until_ms, user_id):
                record = from_item(item)
                # Attempts recorded before lanes were interactive ones.
                lane = record.get("lane", "interactive")
                via = record.get("via", "realtime")
                key = (record.get("user_id"), record.get("job_type"), record.get("model"), lane, via)
                totals[key] = (totals.get(key) or UsageRow(*key[:4], via=via)).plus(record)
                by_day[day] = by_day[day].plus(record)
                if via in DISCOUNTED_ROUTES:
                    keys = {"pk": item["pk"], "sk": item["sk"]}
                    discounted.append(_Discounted(keys, key, day, Decimal(record.get("cost_usd", 0))))
        for counted, standard in self._standard_costs(discounted):
            totals[counted.row] = totals[counted.row].plus_standard(standard - counted.cost_usd)
            by_day[counted.day] = by_day[counted.day].plus_standard(standard - counted.cost_usd)
        rows = sorted(
            totals.values(),
            key=lambda row: (-row.cost_usd, -row.input_tokens, str(row.user_id), str(row.job_type)),
        )
        return UsageReport(rows, list(by_day.items()))

    def _standard_costs(self, discounted: list[_Discounted]) -> Iterator[tuple[_Discounted, Decimal]]:
        """Each discounted record with its standard cost, read from the record (its cost when the record
        keeps none: its calls cost what they would have in real time)."""
        for start in range(0, len(discounted), BATCH_GET_KEYS):
            chunk = discounted[start : start + BATCH_GET_KEYS]
            keys = [counted.key for counted in chunk]
            found = {
                (item["pk"]["S"], item["sk"]["S"]): from_item(item).get("standard_cost_usd")
                for item in batch_get(
                    self._client, self.table_name, keys, False, self._backoff, ("pk", "sk", "standard_cost_usd")
                )
            }
            for counted in chunk:
                standard = found.get((counted.key["pk"]["S"], counted.key["sk"]["S"]))
                yield counted, counted.cost_usd if standard is None else Decimal(standard)

    def _records(self, day: str, since_ms: int, until_ms: int, user_id: str | None) -> Iterator[Item]:
        for shard in range(USAGE_DAY_SHARDS):
            yield from self._query(usage_day_partition(day, shard), since_ms, until_ms, user_id)

    def _query(self, partition: str, since_ms: int, until_ms: int, user_id: str | None) -> Iterator[Item]:
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
            yield from page.get("Items", [])
