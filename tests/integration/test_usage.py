"""Usage by user, job type and model over a time range, from the attempt records' indexes."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from rich.console import Console

from aijobs.render import UNPRICED_NOTE, usage_json, usage_table
from engine.core import AttemptOutcome, AttemptRecord, Via
from engine.store import DynamoJobStore, UsageLedger, UsageRow, by_route
from engine.store.items import attempt_item
from tests.conftest import RequestCounter

DAY_MS = 86_400_000
NOW = 1_796_205_600_000  # 2026-12-02T10:00:00Z


def record(
    job_id: str, user: str, job_type: str, model: str, finished_at: int, tokens: int, cost: str, cached: int = 0
) -> AttemptRecord:
    return AttemptRecord(
        job_id=job_id,
        attempt=1,
        user_id=user,
        job_type=job_type,
        started_at=finished_at - 100,
        finished_at=finished_at,
        outcome=AttemptOutcome.SUCCEEDED,
        model=model,
        input_tokens=tokens,
        output_tokens=tokens // 10,
        cost_usd=Decimal(cost),
        cached_input_tokens=cached,
        reasoning_tokens=tokens // 20,
        cache_savings_usd=Decimal(cached) / 10**6,
    )


def realtime(row: UsageRow) -> UsageRow:
    """A row of attempts made in real time at the standard tier: their standard cost is their cost."""
    return replace(row, via="realtime", standard_cost_usd=row.cost_usd)


def seed(dynamodb: Any, table_name: str, records: list[AttemptRecord]) -> None:
    # Attempt records are written by the finishing transaction; here directly, to place them in time.
    for attempt in records:
        dynamodb.put_item(TableName=table_name, Item=attempt_item(attempt, 0))


def test_usage_is_summed_by_user_job_type_and_model_within_the_range(
    store: DynamoJobStore, dynamodb: Any, dynamodb_requests: RequestCounter
) -> None:
    # Given attempts of two users over three days, one of them outside the range
    seed(
        dynamodb,
        store.table_name,
        [
            record("j1", "alice", "classify", "gpt-4o-mini", NOW, 100, "0.001", cached=60),
            record("j2", "alice", "classify", "gpt-4o-mini", NOW - DAY_MS, 300, "0.003", cached=200),
            record("j3", "alice", "summarize", "gpt-4o", NOW, 1000, "0.02"),
            record("j4", "bob", "classify", "gpt-4o-mini", NOW, 50, "0.0005"),
            record("j5", "bob", "classify", "gpt-4o-mini", NOW - 10 * DAY_MS, 999, "0.5"),
        ],
    )
    ledger = UsageLedger(store.table_name, client=dynamodb)
    dynamodb_requests.reset()

    # When usage over the last two days is asked for
    rows = ledger.summarize(NOW - 2 * DAY_MS, NOW)

    # Then each (user, job type, model) is summed, costliest first, with Queries only; in real time, each
    # cost is its standard one
    assert rows == [
        realtime(
            UsageRow("alice", "summarize", "gpt-4o", "interactive", 1, 1000, 100, Decimal("0.02"), reasoning_tokens=50)
        ),
        realtime(
            UsageRow(
                "alice",
                "classify",
                "gpt-4o-mini",
                "interactive",
                2,
                400,
                40,
                Decimal("0.004"),
                cached_input_tokens=260,
                reasoning_tokens=20,
                cache_savings_usd=Decimal("0.00026"),
            )
        ),
        realtime(
            UsageRow("bob", "classify", "gpt-4o-mini", "interactive", 1, 50, 5, Decimal("0.0005"), reasoning_tokens=2)
        ),
    ]
    assert set(dynamodb_requests.operations) == {"Query"}

    # And one user's usage comes from the same index, filtered: Queries only
    dynamodb_requests.reset()
    assert ledger.summarize(NOW - 20 * DAY_MS, NOW, user_id="bob") == [
        realtime(
            UsageRow(
                "bob", "classify", "gpt-4o-mini", "interactive", 2, 1049, 104, Decimal("0.5005"), reasoning_tokens=51
            )
        ),
    ]
    assert set(dynamodb_requests.operations) == {"Query"}


def test_usage_recorded_without_a_price_is_marked_and_the_table_says_so(store: DynamoJobStore, dynamodb: Any) -> None:
    # Given two attempts on a model with no price (cost recorded as 0) and one on a priced model
    unpriced = {"cost": "0", "tokens": 500}
    seed(
        dynamodb,
        store.table_name,
        [
            replace(record("u1", "alice", "classify", "my-fine-tune", NOW, **unpriced), priced=False),
            replace(record("u2", "alice", "classify", "my-fine-tune", NOW, **unpriced), priced=False),
            record("u3", "alice", "classify", "gpt-4o-mini", NOW, 100, "0.001"),
        ],
    )

    rows = UsageLedger(store.table_name, client=dynamodb).summarize(NOW - DAY_MS, NOW)

    # Then the index carries the mark: each row counts its unpriced attempts
    assert {(row.model, row.unpriced_attempts) for row in rows} == {("gpt-4o-mini", 0), ("my-fine-tune", 2)}
    # And `aijobs usage` shows the count and says what it means
    console = Console(width=200, record=True)
    console.print(usage_table(rows, "usage"))
    text = console.export_text()
    assert UNPRICED_NOTE in text
    assert "unpriced" in text.splitlines()[2]
    assert usage_json(rows[1])["unpriced_attempts"] == 2


def test_usage_by_route_reads_the_standard_cost_of_batch_and_flex_records_only(
    store: DynamoJobStore, dynamodb: Any, dynamodb_requests: RequestCounter
) -> None:
    # Given 150 attempts at the flex tier (half price), 2 through a batch and one in real time
    flex = [
        replace(
            record(f"f{n}", "alice", "classify", "gpt-5-mini", NOW, 100, "0.001"),
            via=Via.FLEX,
            standard_cost_usd=Decimal("0.002"),
        )
        for n in range(150)
    ]
    batch = [
        replace(
            record(f"b{n}", "alice", "classify", "gpt-5-mini", NOW, 100, "0.001"),
            via=Via.BATCH,
            standard_cost_usd=Decimal("0.002"),
        )
        for n in range(2)
    ]
    now = replace(
        record("r1", "alice", "classify", "gpt-5-mini", NOW, 100, "0.002"), standard_cost_usd=Decimal("0.002")
    )
    seed(dynamodb, store.table_name, [*flex, *batch, now])
    dynamodb_requests.reset()

    # When usage is asked for
    rows = UsageLedger(store.table_name, client=dynamodb).summarize(NOW - DAY_MS, NOW)

    # Then each route's row holds its cost and what the same calls would have cost in real time
    by_via = {row.via: (row.attempts, row.cost_usd, row.standard_cost_usd, row.saved_usd) for row in rows}
    assert by_via == {
        "flex": (150, Decimal("0.150"), Decimal("0.300"), Decimal("0.150")),
        "batch": (2, Decimal("0.002"), Decimal("0.004"), Decimal("0.002")),
        "realtime": (1, Decimal("0.002"), Decimal("0.002"), Decimal(0)),
    }
    # And the standard costs the index does not hold were read for the discounted records alone, 100 a request
    assert dynamodb_requests.operations["BatchGetItem"] == 2
    assert set(dynamodb_requests.operations) == {"Query", "BatchGetItem"}
    # And by route, in order, with reuse at zero
    assert [(route.via, route.attempts) for route in by_route(rows)] == [
        ("realtime", 1),
        ("batch", 2),
        ("flex", 150),
        ("reuse", 0),
    ]
