"""Answers already paid for (docs/reuse.md) through the worker's handler on moto: the DynamoDB requests
each job costs, counted with a botocore hook: 2 with reuse off, 3 with it on (a hit or a miss), and
the provider calls a repeated request makes: none.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace
from decimal import Decimal
from typing import Any

import boto3
import pytest

from aijobs.stack import StackResources
from engine.core import JobStatus
from engine.definitions import JobRegistry
from engine.definitions.classify import CLASSIFY
from engine.definitions.summarize import SUMMARIZE
from engine.store import PayloadStore, UsageLedger
from engine.store.payloads import REUSE_INLINE_BYTES
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS, FakeProvider

HOUR = 3_600
OFF = {"UpdateItem": 1, "TransactWriteItems": 1}
ON = {"UpdateItem": 1, "GetItem": 1, "TransactWriteItems": 1}
# A job type whose answers are long: a summary past the inline bound of a kept answer.
LONG_SUMMARY = replace(SUMMARIZE, name="long_summary", max_tokens=4_096, reuse_seconds=HOUR)
LONG_TEXT = " ".join(["abcdefghijklmno"] * (REUSE_INLINE_BYTES // 16 + 64))


@pytest.fixture
def registry() -> JobRegistry:
    """classify reusing its answers for an hour; summarize as it is built in (no reuse); long_summary."""
    return JobRegistry([replace(CLASSIFY, reuse_seconds=HOUR), SUMMARIZE, LONG_SUMMARY])


@pytest.fixture
def s3_requests() -> Counter[str]:
    """The S3 requests of the store's payload bucket, by operation."""
    return Counter()


@pytest.fixture
def payloads(stack: StackResources, s3_requests: Counter[str]) -> PayloadStore:
    """The template's payload bucket, its requests counted."""
    s3 = boto3.client("s3")
    s3.meta.events.register("before-call.s3.*", lambda event_name, **_: s3_requests.update([event_name.split(".")[-1]]))
    return PayloadStore(stack.payload_bucket, lambda: s3)


def handled(worker: WorkerHandler, *messages: dict[str, Any]) -> dict[str, Any]:
    return worker.handle(sqs_event(*(sqs_record(message) for message in messages)), InvocationContext())


def test_reuse_off_each_job_costs_two_requests_and_a_call(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a job type that reuses nothing: two jobs of one request, one after the other
    costs = []
    for job_id in ("off-1", "off-2"):
        dynamodb_requests.reset()
        assert handled(worker, job_message("summarize", job_id)) == {"batchItemFailures": []}
        costs.append(dict(dynamodb_requests.operations))

    # Then each is a claim and a finish, and each called the model: nothing is read or kept
    assert costs == [OFF, OFF]
    assert provider.calls == 2
    assert {key[0][:6] for key in table.snapshot()} == {"JOB#of"}


def test_reuse_on_a_miss_and_a_hit_cost_three_requests_each_and_the_hit_no_call(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a job of a job type that reuses its answers for an hour, the first of its request
    first = job_message("classify", "paid") | {"user_id": "user-a"}
    assert handled(worker, first) == {"batchItemFailures": []}
    miss = dict(dynamodb_requests.operations)

    # When the same request comes again, from another user
    dynamodb_requests.reset()
    assert handled(worker, job_message("classify", "again") | {"user_id": "user-b"}) == {"batchItemFailures": []}
    hit = dict(dynamodb_requests.operations)

    # Then both cost a claim, a read of the kept answer and a finish; only the first called the model
    assert (miss, hit) == (ON, ON)
    assert provider.calls == 1
    paid, again = table.job("paid"), table.job("again")
    assert (again.status, again.output, again.reused_from) == (JobStatus.SUCCEEDED, VALID_OUTPUTS["classify"], "paid")
    assert (again.usage.input_tokens, again.usage.cost_usd, again.usage.attempts) == (0, Decimal(0), 1)
    record = table.attempt("again", 1)
    assert record is not None
    assert (record["via"], record["reused_from"], record["calls"], record["cost_usd"]) == ("reuse", "paid", 0, 0)
    # And the table keeps one answer, the paying job's, which expires with its reuse time
    [(key, item)] = [(key, item) for key, item in table.snapshot().items() if key[0].startswith("REUSE#")]
    assert (key[1], item["job_id"], json.loads(item["answer"])) == ("REUSE", "paid", VALID_OUTPUTS["classify"])
    assert item["until"] == item["answered_at"] + HOUR * 1000 == paid.finished_at + HOUR * 1000


def test_a_batch_of_ten_repeats_costs_thirty_requests_and_no_call(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a paid answer
    handled(worker, job_message("classify", "source"))
    dynamodb_requests.reset()

    # When a batch of ten jobs of the same request comes
    response = handled(worker, *(job_message("classify", f"repeat-{n}") for n in range(10)))

    # Then each took the answer: three requests each, no call
    assert response == {"batchItemFailures": []}
    assert dynamodb_requests.operations == Counter({"UpdateItem": 10, "GetItem": 10, "TransactWriteItems": 10})
    assert provider.calls == 1
    assert {table.job(f"repeat-{n}").reused_from for n in range(10)} == {"source"}


def test_repeats_that_run_side_by_side_before_any_answer_each_call(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given no answer yet: three jobs of one request in one batch (docs/reuse.md: not promised)
    response = handled(worker, *(job_message("classify", f"early-{n}") for n in range(3)))

    # Then none waits for another: each calls, at three requests; one answer stays kept
    assert response == {"batchItemFailures": []}
    assert provider.calls == 3
    assert dynamodb_requests.total == 9
    assert {table.job(f"early-{n}").reused_from for n in range(3)} == {None}
    assert sum(key[0].startswith("REUSE#") for key in table.snapshot()) == 1


def test_an_answer_past_the_inline_bound_goes_through_the_payload_bucket(
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    s3_requests: Counter[str],
    table: TableReader,
) -> None:
    # Given a job type whose answer is longer than a kept answer's item holds
    provider.script = lambda _: {"summary": LONG_TEXT}
    message = job_message("summarize") | {"job_type": "long_summary", "input": {"text": "x", "max_words": 1000}}

    # When two jobs of one request run, one after the other
    handled(worker, message | {"job_id": "long-1"})
    paid = (dict(dynamodb_requests.operations), dict(s3_requests))
    dynamodb_requests.reset()
    s3_requests.clear()
    handled(worker, message | {"job_id": "long-2"})
    reused = (dict(dynamodb_requests.operations), dict(s3_requests))

    # Then the DynamoDB requests are the same three; the answer is put in the bucket once and read once
    assert paid == (ON, {"PutObject": 1})
    assert reused == (ON, {"GetObject": 1})
    assert provider.calls == 1
    second = table.job("long-2")
    assert (second.reused_from, second.output) == ("long-1", {"summary": LONG_TEXT})


def test_usage_counts_the_reused_job_under_its_own_user_at_no_cost(
    worker: WorkerHandler, stack: StackResources, table: TableReader
) -> None:
    # Given a paid answer of user-a, taken by a job of user-b
    handled(worker, job_message("classify", "by-a") | {"user_id": "user-a"})
    handled(worker, job_message("classify", "by-b") | {"user_id": "user-b"})

    # When usage is read from the attempt records' index
    now = int(time.time() * 1000)
    rows = {row.user_id: row for row in UsageLedger(stack.table_name, table.client).summarize(now - 60_000, now)}

    # Then user-b has one record, reused, at no cost; user-a paid for the call
    assert (rows["user-b"].attempts, rows["user-b"].reused, rows["user-b"].cost_usd) == (1, 1, Decimal(0))
    assert (rows["user-a"].attempts, rows["user-a"].reused) == (1, 0)
    assert rows["user-a"].cost_usd > 0
