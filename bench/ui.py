"""The dashboard's figures of `make bench`: with 10,000 jobs in the table, the server time of a page over
the time of the reads of the table it needs, for the jobs page and for a job with 100 attempts.
`python -m bench.ui` runs them alone.

The table is filled with items in the store's own shape (one job made by the engine, its items
copied under other ids and creation times) written with BatchWriteItem: submitting 10,000 jobs
through moto would take minutes. The dashboard serves on 127.0.0.1 as `aijobs ui` does; a
page's time is what its Server-Timing header says. Each page's Query requests are recorded as it sends
them, then replayed bare with boto3, issued the same way (a page of jobs queries the shards of a
day side by side); pages and replays alternate, and their medians are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from itertools import islice
from typing import Any

import boto3
import httpx
from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from aijobs.ui.server import DashboardServer
from bench.report import Figure, print_figures
from bench.stacks import moto_stack
from engine.config import load_settings
from engine.core import AttemptOutcome, AttemptRecord, NewJob
from engine.intake import request_hash
from engine.store import DynamoJobStore
from engine.store.items import JOB_SK, OPEN_SHARD, Item, attempt_item, job_key, listing_keys, to_item
from engine.store.table import creation_attributes

JOBS = 10_000
ATTEMPTS = 100
ROUNDS = 6
LIMIT = 2.0
INPUT = {"text": "My invoice shows the wrong amount", "labels": ["billing", "bug", "account", "spam"]}
# BatchWriteItem takes at most 25 items a request.
WRITE_BATCH = 25


def ui_figures(console: Console, jobs: int = JOBS, rounds: int = ROUNDS) -> list[Figure]:
    console.print(f"dashboard: {jobs:,} jobs, one with {ATTEMPTS} attempts ...")
    with moto_stack() as stack:
        now = int(time.time() * 1000)
        dynamodb = boto3.client("dynamodb")
        write(dynamodb, stack.table_name, table_items(stack, now, jobs))
        session = boto3.Session()
        recorded = QueryRecorder(session)
        client = AiJobsClient.from_settings(load_settings(stack.environment()), session)
        with DashboardServer(client, port=0) as server, httpx.Client(base_url=server.url, timeout=120) as http:
            listing = measure(http, "/jobs?limit=100", recorded, dynamodb, rounds)
            job = measure(http, "/jobs/busy", recorded, dynamodb, rounds)
    table = f"moto in process, {jobs:,} job items; median of {rounds}"
    return [
        page_figure(
            f"jobs page (100 of {jobs:,} jobs)", listing, "one Query per shard of the day (8), side by side", table
        ),
        page_figure(f"job page ({ATTEMPTS} attempts)", job, "one Query of the job's partition", table),
        Figure(
            "  what stands in the way: the DynamoDB emulator",
            f"{job[1]:.0f} ms a Query",
            "-",
            None,
            f"moto reads and sorts every item of the table for each Query ({jobs + ATTEMPTS + 2:,} here), and serves "
            "one request at a time; DynamoDB reads the partition alone, so both sides of each ratio shrink",
        ),
    ]


def page_figure(name: str, measured: tuple[float, float, int], reads: str, table: str) -> Figure:
    page_ms, reads_ms, queries = measured
    ratio = page_ms / reads_ms
    return Figure(
        f"server time of the {name} / the Queries it needs",
        f"{ratio:.2f}  ({page_ms:.1f} ms / {reads_ms:.1f} ms)",
        f"<= {LIMIT}",
        ratio <= LIMIT,
        f"{reads} ({queries} recorded, replayed bare with boto3); page time from its Server-Timing header, "
        f"served on 127.0.0.1; {table}",
    )


class QueryRecorder:
    """Keeps the parameters of the Query requests every client of a session sends."""

    def __init__(self, session: boto3.Session) -> None:
        self.queries: list[dict[str, Any]] = []
        session.events.register("provide-client-params.dynamodb.Query", self._keep)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        self.queries.append(json.loads(json.dumps(params)))


def measure(
    http: httpx.Client, path: str, recorded: QueryRecorder, dynamodb: Any, rounds: int
) -> tuple[float, float, int]:
    """(median page ms, median ms of its Queries replayed side by side, Queries per page).

    The page's Queries are recorded on a first request (which also compiles its templates); then
    pages and replays alternate, each going first in every other round.
    """
    recorded.queries.clear()
    page_ms(http, path)
    queries = list(recorded.queries)
    pages, replays = [], []
    with ThreadPoolExecutor(max_workers=8) as pool:

        def replay() -> float:
            started = time.perf_counter()
            list(pool.map(lambda params: dynamodb.query(**params), queries))
            return (time.perf_counter() - started) * 1000

        for number in range(rounds):
            if number % 2:
                replays.append(replay())
                pages.append(page_ms(http, path))
            else:
                pages.append(page_ms(http, path))
                replays.append(replay())
    return statistics.median(pages), statistics.median(replays), len(queries)


def page_ms(http: httpx.Client, path: str) -> float:
    """The server time of one request for the page, from its Server-Timing header."""
    answer = http.get(path)
    if answer.status_code != 200:
        raise RuntimeError(f"{path} answered {answer.status_code}")
    return float(answer.headers["server-timing"].removeprefix("app;dur="))


def table_items(stack: StackResources, now: int, jobs: int) -> Iterator[Item]:
    """One job made by the engine's store, then `jobs` copies of its item under other ids and creation
    times; and a job "busy" with its input and ATTEMPTS attempt records."""
    store = DynamoJobStore(stack.table_name, client=boto3.client("dynamodb"))
    new_job = NewJob("classify", "bench", 1, 3, 86_400, request_hash("classify", "bench", INPUT))
    store.create_job("busy", new_job, INPUT, now)
    for number in range(1, ATTEMPTS + 1):
        yield attempt_item(attempt(number, now), now // 1000 + 86_400)
    shape = to_item(
        {name: value for name, value in creation_attributes("shape", new_job, now).items() if name != OPEN_SHARD}
        | {"status": "succeeded", "updated_at": now, "started_at": now, "finished_at": now, "claim_count": 1}
        | {"attempt_count": 1, "output": json.dumps({"label": "billing", "confidence": 0.9}), "output_hash": "0" * 64}
        | {"input_tokens": 120, "output_tokens": 12, "cost_usd": Decimal("0.0000252"), "usage_attempts": 1}
    )
    for number in range(jobs):
        job_id, created_at = f"bench-{number:05d}", now - number * 7
        yield (
            shape
            | job_key(job_id, JOB_SK)
            | to_item({"job_id": job_id, "created_at": created_at, **listing_keys(job_id, created_at)})
        )


def attempt(number: int, now: int) -> AttemptRecord:
    return AttemptRecord(
        job_id="busy",
        attempt=number,
        user_id="bench",
        job_type="classify",
        started_at=now + number * 1_000,
        finished_at=now + number * 1_000 + 800,
        outcome=AttemptOutcome.RETRYABLE if number < ATTEMPTS else AttemptOutcome.SUCCEEDED,
        provider="openai",
        tier="primary",
        model="gpt-4o-mini",
        calls=1,
        input_tokens=120,
        output_tokens=12,
        cost_usd=Decimal("0.0000252"),
        latency_ms=800,
    )


def write(dynamodb: Any, table: str, items: Iterator[Item]) -> None:
    while batch := list(islice(items, WRITE_BATCH)):
        request: dict[str, Any] = {table: [{"PutRequest": {"Item": item}} for item in batch]}
        while request:
            request = dynamodb.batch_write_item(RequestItems=request).get("UnprocessedItems") or {}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print_figures("aijobs bench: the dashboard", ui_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
