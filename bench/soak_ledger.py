"""What the soak compares (bench.soak): the provider's own log priced at the soak's prices, the table
read whole, and the report those two make, one row per check or figure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rich.table import Table

from aijobs.local.provider import ServedRequest
from engine.core import Job, Usage
from engine.store.batches import BATCHES_PK
from engine.store.items import from_item, job_from_item

# USD per million input, cached input and output tokens of the local model, so that costs reconcile
# too; the local provider's prompt cache and reasoning tokens make every kind count.
PRICES = {"input": Decimal("0.15"), "cached_input": Decimal("0.075"), "output": Decimal("0.60")}
# What a line of a provider's batch costs, as a share of the same call in real time (AIJOBS_PRICES'
# `batch`): not the engine's default (half), so that the reconciliation shows the configured one applied.
BATCH_PRICE_SHARE = Decimal("0.4")


@dataclass
class TableContents:
    jobs: dict[str, Job] = field(default_factory=dict)
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    dead_letters: int = 0
    # The records of the batches (engine.core.batches), as items.
    batches: list[dict[str, Any]] = field(default_factory=list)


def read_table(client: Any, table_name: str) -> TableContents:
    contents = TableContents()
    kwargs: dict[str, Any] = {"TableName": table_name, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        for raw in page.get("Items", []):
            sk, pk = raw["sk"]["S"], raw["pk"]["S"]
            if sk == "JOB":
                job = job_from_item(raw)
                contents.jobs[job.job_id] = job
            elif sk.startswith("ATTEMPT#"):
                item = from_item(raw)
                contents.attempts[str(item["job_id"])].append(item)
            elif pk.startswith("DEADLETTER#"):
                contents.dead_letters += 1
            elif pk == BATCHES_PK:
                contents.batches.append(from_item(raw))
        if "LastEvaluatedKey" not in page:
            return contents
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass
class CallTally:
    """A prompt's calls in the provider's log."""

    calls: int = 0
    valid_answers: int = 0
    tokens: Tokens = (0, 0, 0, 0)
    cost: Decimal = Decimal(0)
    # Its calls that were lines of a provider's batch.
    batch_calls: int = 0
    # Its calls in the log's order.
    entries: list[ServedRequest] = field(default_factory=list)

    def add(self, entry: ServedRequest) -> None:
        self.calls += 1
        self.valid_answers += entry.status == 200 and entry.fault is None
        self.tokens = add_tokens(self.tokens, logged_tokens(entry))
        self.cost += call_cost(entry)
        self.batch_calls += entry.batch_id is not None
        self.entries.append(entry)

    def batch_attempts(self) -> dict[str, tuple[Tokens, Decimal]]:
        """The attempts a batch answered, by batch id: the tokens and cost of its line (at the batch
        price) and of the re-asks made in real time after it, as the engine must record them."""
        attempts: dict[str, list[ServedRequest]] = {}
        current: list[ServedRequest] | None = None
        for entry in self.entries:
            if entry.batch_id is not None and entry.status == 200:
                current = attempts[entry.batch_id] = [entry]
            elif current is not None and entry.batch_id is None and entry.repair:
                current.append(entry)
            else:
                current = None
        return {
            batch_id: (total_tokens(logged_tokens(entry) for entry in calls), sum(map(call_cost, calls), Decimal(0)))
            for batch_id, calls in attempts.items()
        }


def recorded_batch_attempts(attempts: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Tokens, Decimal]] | None:
    """A job's attempt items made through a batch, by batch id: their tokens and cost. None when an
    item's `via` does not say whether it has a batch id."""
    if any((attempt.get("via") == "batch") != bool(attempt.get("batch_id")) for attempt in attempts):
        return None
    return {
        str(attempt["batch_id"]): (item_tokens(attempt), Decimal(attempt["cost_usd"]))
        for attempt in attempts
        if attempt.get("batch_id")
    }


# Token counts as (input, output, cached input, reasoning): how the engine records them, and how
# the provider's log bills them.
Tokens = tuple[int, int, int, int]
TOKEN_KINDS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


def logged_tokens(entry: ServedRequest) -> Tokens:
    return (entry.prompt_tokens, entry.completion_tokens, entry.cached_tokens, entry.reasoning_tokens)


def usage_tokens(usage: Usage) -> Tokens:
    return (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)


def item_tokens(attempt: Mapping[str, Any]) -> Tokens:
    """The token kinds of an attempt item (kinds it did not have are absent from it)."""
    input_tokens, output_tokens, cached, reasoning = (int(attempt.get(name, 0)) for name in TOKEN_KINDS)
    return (input_tokens, output_tokens, cached, reasoning)


def add_tokens(a: Tokens, b: Tokens) -> Tokens:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def total_tokens(counts: Iterable[Tokens]) -> Tokens:
    total = (0, 0, 0, 0)
    for item in counts:
        total = add_tokens(total, item)
    return total


class Report:
    """The rows of the table: a check (expected vs actual) or a figure (no expectation)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, bool | None]] = []

    def check(self, name: str, expected: object, actual: object, ok: bool | None = None) -> None:
        self.rows.append((name, str(expected), str(actual), (expected == actual) if ok is None else ok))

    def figure(self, name: str, value: object) -> None:
        self.rows.append((name, "", str(value), None))

    @property
    def passed(self) -> bool:
        return all(ok is not False for *_, ok in self.rows)

    def table(self, title: str, caption: str) -> Table:
        table = Table(title=title, caption=caption, caption_justify="left")
        table.add_column("check")
        table.add_column("expected", justify="right")
        table.add_column("actual", justify="right")
        table.add_column("", justify="center")
        for name, expected, actual, ok in self.rows:
            mark = "" if ok is None else "[green]ok[/green]" if ok else "[bold red]FAIL[/bold red]"
            table.add_row(name, expected, actual, mark)
        return table


def call_cost(entry: ServedRequest, batch_price: bool = True) -> Decimal:
    """What one logged call costs at the soak's prices (a batch's line at the batch price, unless not
    `batch_price`), rounded as the engine's price table rounds."""
    uncached = entry.prompt_tokens - entry.cached_tokens
    share = BATCH_PRICE_SHARE if entry.batch_id is not None and batch_price else Decimal(1)
    cost = (
        (
            uncached * PRICES["input"]
            + entry.cached_tokens * PRICES["cached_input"]
            + entry.completion_tokens * PRICES["output"]
        )
        * share
        / 1_000_000
    )
    return cost.quantize(Decimal("0.000000001"))


def format_tokens(counts: tuple[int, ...]) -> str:
    return " / ".join(f"{count:,}" for count in counts)
