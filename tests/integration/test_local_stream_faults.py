"""The local stack's faults for the soak, on moto: a table stream that delivers every record again, in
batches of their own (aijobs.local.streams.StreamCopies), and invocations killed just before or just after
a chosen request (aijobs.local.kills), each once, failing their invocation as a whole."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from aijobs.local.kills import InvocationDiedError, InvocationKilled, KillPoint, Kills
from aijobs.local.streams import StreamCopies, TableStream
from aijobs.stack import StackResources
from engine.store.items import job_key, to_item

RECORDS = 12
BOUND_SECONDS = 30.0


def put_jobs(table_name: str, count: int) -> None:
    client = boto3.client("dynamodb")
    for number in range(count):
        item = job_key(f"job-{number}") | to_item({"job_id": f"job-{number}", "status": "queued", "created_at": 0})
        client.put_item(TableName=table_name, Item=item)


class Deliveries:
    """A stream handler that keeps each batch's sequence numbers, failing batches as `fail` says."""

    def __init__(self, fail: Callable[[list[str]], str | None] = lambda _: None) -> None:
        self.batches: list[list[str]] = []
        self.done: Counter[str] = Counter()
        self._fail = fail
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any], _: Any) -> dict[str, Any]:
        sequences = [record["dynamodb"]["SequenceNumber"] for record in event["Records"]]
        failed = self._fail(sequences)
        with self._lock:
            self.batches.append(sequences)
            self.done.update(sequence for sequence in sequences if failed is None or int(sequence) < int(failed))
        return {"batchItemFailures": [] if failed is None else [{"itemIdentifier": failed}]}

    def until(self, done: Callable[[Counter[str]], bool]) -> bool:
        deadline = time.monotonic() + BOUND_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                if done(self.done):
                    return True
            time.sleep(0.05)
        return False


def stream_until_each_came(stack: StackResources, handler: Deliveries, copies: StreamCopies) -> TableStream:
    """Run the table's stream until the handler took every record as many times as `copies` says (one)."""
    (times,) = copies.copies
    stream = TableStream(stack.table_name, handler, boto3.Session(), None, poll_seconds=0.05, copies=copies)
    stream.start()
    try:
        complete = handler.until(lambda done: len(done) == RECORDS and set(done.values()) == {times})
    finally:
        stream.stop()
    assert complete, handler.done
    return stream


def test_every_record_is_delivered_as_many_times_as_its_copies_each_time_in_another_batch(
    stack: StackResources,
) -> None:
    put_jobs(stack.table_name, RECORDS)
    handler = Deliveries()

    # When the stream runs until every record has come three times
    stream = stream_until_each_came(stack, handler, StreamCopies(copies=(3,), spread_seconds=0.5, seed=1))

    # Then each came exactly three times, never twice in one batch, and in order within each batch
    assert all(len(batch) == len(set(batch)) for batch in handler.batches)
    assert all(batch == sorted(batch, key=int) for batch in handler.batches)
    assert stream.delivered == RECORDS
    assert stream.copies_delivered == 2 * RECORDS


def test_a_batch_of_copies_that_fails_is_delivered_again_from_its_failed_record(stack: StackResources) -> None:
    put_jobs(stack.table_name, RECORDS)
    seen: set[str] = set()
    refused: set[str] = set()

    def fail_once(sequences: list[str]) -> str | None:
        """Each record's first delivery passes; a copy is refused the first time it comes."""
        first = next((sequence for sequence in sequences if sequence in seen and sequence not in refused), None)
        seen.update(sequences)
        if first is not None:
            refused.add(first)
        return first

    handler = Deliveries(fail_once)

    # When the stream runs until every record has come twice without failing
    stream_until_each_came(stack, handler, StreamCopies(copies=(2,), spread_seconds=0.2, seed=2))

    # Then some copy was refused on the way, and came again
    assert refused


# --- kills -------------------------------------------------------------------------------------------


def puts_job(job_id: str) -> Callable[[Any, Any], bool]:
    key = job_key(job_id)["pk"]["S"]
    return lambda params, _: params.get("Item", {}).get("pk", {}).get("S") == key


def sends(job_id: str) -> Callable[[Any, Any], bool]:
    return lambda params, _: json.loads(params["MessageBody"]).get("job_id") == job_id


@pytest.fixture
def killed_session() -> tuple[Kills, boto3.Session]:
    kills = Kills()
    session = boto3.Session(region_name="us-east-1")
    kills.install(session)
    return kills, session


def test_a_kill_after_a_write_dies_with_the_write_made_once(
    stack: StackResources, killed_session: tuple[Kills, boto3.Session]
) -> None:
    kills, session = killed_session
    point = KillPoint("after job-1 made", "dynamodb PutItem", True, puts_job("job-1"))
    kills.arm(point)
    client = session.client("dynamodb")
    item = job_key("job-1") | to_item({"job_id": "job-1", "status": "queued", "created_at": 0})

    # When the matching write is made
    with pytest.raises(InvocationKilled):
        client.put_item(TableName=stack.table_name, Item=item)

    # Then it was made, the kill fired once, and the same write again passes
    assert "Item" in client.get_item(TableName=stack.table_name, Key=job_key("job-1"))
    assert kills.fired == [point]
    assert not kills.is_armed(point)
    client.put_item(TableName=stack.table_name, Item=item)


def test_a_kill_before_a_request_dies_with_it_not_sent_and_spares_the_others(
    stack: StackResources, killed_session: tuple[Kills, boto3.Session]
) -> None:
    kills, session = killed_session
    kills.arm(KillPoint("before job-2's message", "sqs SendMessage", False, sends("job-2")))
    sqs = session.client("sqs")

    sqs.send_message(QueueUrl=stack.queue_url, MessageBody=json.dumps({"job_id": "job-1"}))
    with pytest.raises(InvocationKilled):
        sqs.send_message(QueueUrl=stack.queue_url, MessageBody=json.dumps({"job_id": "job-2"}))

    received = sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=10)["Messages"]
    assert [json.loads(message["Body"]) for message in received] == [{"job_id": "job-1"}]


def test_a_killed_invocation_fails_as_a_whole_once_its_batch_is_handed_on(
    stack: StackResources, killed_session: tuple[Kills, boto3.Session]
) -> None:
    kills, session = killed_session
    kills.arm(KillPoint("before job-3's message", "sqs SendMessage", False, sends("job-3")))
    sqs = session.client("sqs")
    dead: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], _: Any) -> dict[str, Any]:
        for job_id in event["jobs"]:
            sqs.send_message(QueueUrl=stack.queue_url, MessageBody=json.dumps({"job_id": job_id}))
        return {"batchItemFailures": []}

    dying = kills.dying(handler, dead.append)
    event = {"jobs": ["job-3"]}

    with pytest.raises(InvocationDiedError):
        dying(event, None)
    assert dead == [event]
    # The kill fired once: the batch delivered again goes through
    assert dying(event, None) == {"batchItemFailures": []}
