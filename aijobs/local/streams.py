"""The jobs table's stream, read as Lambda's DynamoDB event source mapping reads it, for the local stack.

moto keeps a table's stream (one shard) and serves it through the DynamoDB Streams API, but runs
no event source mapping. `TableStream` is one: from the oldest record (TRIM_HORIZON), batches of up
to `batch_size` records in Lambda's event shape; when the handler reports batch item failures,
the batch is read again from the lowest failed sequence number, as Lambda does (but until it
succeeds: no bisection, no giving up). It hands every
record to the handler: the template's filter criteria select the same records as the handler's
own check (tests/unit/test_events.py holds the two together).

For the soak, `StreamCopies` delivers every record more than once, as a stream may (its event source
mapping retries a batch after a crash; a record is processed at least once): besides its delivery in
order, each record comes again 1-2 more times, in batches of copies of other records too, from a thread
of their own, soon enough that some copies run while the record's first delivery does. A batch of copies
whose invocation fails is delivered again from its first failed record, as any other.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3

from aijobs.local.lambda_events import InvocationContext
from engine.observability import log_unexpected

Handler = Callable[[dict[str, Any], Any], Any]
# A failed batch is delivered again after this long, as Lambda retries one after a moment.
RETRY_PAUSE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class StreamCopies:
    """Every record delivered as many times in all as one of `copies` (chosen at random), the copies
    within `spread_seconds` after the record was first read."""

    copies: tuple[int, ...] = (2, 3)
    spread_seconds: float = 2.0
    seed: int = 0


class TableStream:
    def __init__(
        self,
        table_name: str,
        handler: Handler,
        session: boto3.Session,
        endpoint_url: str | None,
        *,
        function_timeout_seconds: float = 60.0,
        batch_size: int = 100,
        poll_seconds: float = 0.2,
        copies: StreamCopies | None = None,
    ) -> None:
        self._table_name = table_name
        self._handler = handler
        self._dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
        self._streams = session.client("dynamodbstreams", endpoint_url=endpoint_url)
        self._timeout = function_timeout_seconds
        self._batch_size = batch_size
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name="aijobs-table-stream", daemon=True)]
        self.delivered = 0  # records handed to the handler and not reported as failed
        # The copies to deliver: (when, order, record), and the records read so far (by sequence number).
        self._copies = copies
        self._rng = random.Random(copies.seed if copies else 0)
        self._due: list[tuple[float, int, dict[str, Any]]] = []
        self._order = itertools.count()
        self._read: set[str] = set()
        self._copies_lock = threading.Lock()
        self._arn = ""
        self.copies_delivered = 0  # copies handed to the handler and not reported as failed
        if copies is not None:
            self._threads.append(threading.Thread(target=self._run_copies, name="aijobs-stream-copies", daemon=True))

    def start(self) -> TableStream:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _run(self) -> None:
        arn = shard = iterator = ""
        while not self._stop.is_set():
            try:
                if not iterator:  # found once, then followed: a failure later never starts it over
                    arn = self._dynamodb.describe_table(TableName=self._table_name)["Table"]["LatestStreamArn"]
                    shard = self._streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
                    iterator = self._iterator(arn, shard, "TRIM_HORIZON")
                    self._arn = arn
                page = self._streams.get_records(ShardIterator=iterator, Limit=self._batch_size)
                records = page.get("Records", [])
                if not records:
                    iterator = page["NextShardIterator"]
                    self._stop.wait(self._poll_seconds)
                    continue
                self._copy(records)
                failed = self._invoke(arn, records)
                if failed is None:
                    self.delivered += len(records)
                    iterator = page["NextShardIterator"]
                else:
                    self.delivered += sum(int(r["dynamodb"]["SequenceNumber"]) < int(failed) for r in records)
                    iterator = self._iterator(arn, shard, "AT_SEQUENCE_NUMBER", failed)
                    self._stop.wait(RETRY_PAUSE_SECONDS)
            except Exception as exc:
                log_unexpected("the local table stream could not be read", exc)
                self._stop.wait(1.0)

    def _copy(self, records: list[Any]) -> None:
        """Plan the copies of the records read for the first time."""
        if self._copies is None:
            return
        now = time.monotonic()
        with self._copies_lock:
            for record in records:
                sequence = record["dynamodb"]["SequenceNumber"]
                if sequence in self._read:
                    continue
                self._read.add(sequence)
                for _ in range(self._rng.choice(self._copies.copies) - 1):
                    when = now + self._rng.uniform(0, self._copies.spread_seconds)
                    heapq.heappush(self._due, (when, next(self._order), record))

    def _run_copies(self) -> None:
        while not self._stop.is_set():
            batch = self._due_copies()
            if not batch:
                self._stop.wait(0.05)
                continue
            failed = self._invoke(self._arn, batch)
            done = [record for record in batch if failed is None or int(_sequence(record)) < int(failed)]
            self.copies_delivered += len(done)
            if failed is not None:
                later = time.monotonic() + RETRY_PAUSE_SECONDS
                with self._copies_lock:
                    for record in batch[len(done) :]:
                        heapq.heappush(self._due, (later, next(self._order), record))

    def _due_copies(self) -> list[Any]:
        """Up to a batch of copies whose time has come, each of a different record, in the stream's order."""
        now = time.monotonic()
        batch: dict[str, Any] = {}
        kept: list[tuple[float, int, dict[str, Any]]] = []
        with self._copies_lock:
            while self._due and self._due[0][0] <= now and len(batch) < self._batch_size:
                due = heapq.heappop(self._due)
                sequence = _sequence(due[2])
                if sequence in batch:
                    kept.append(due)  # a batch holds a record once: its other copy waits for the next
                else:
                    batch[sequence] = due[2]
            for due in kept:
                heapq.heappush(self._due, due)
        return sorted(batch.values(), key=lambda record: int(_sequence(record)))

    def _invoke(self, arn: str, records: list[Any]) -> str | None:
        """Hand a batch to the handler: the lowest sequence number it reported failed, if any."""
        event = {"Records": [_lambda_record(record, arn) for record in records]}
        context = InvocationContext("aijobs-events", self._timeout)
        started = time.monotonic()
        try:
            response = self._handler(event, context) or {}
        except Exception as exc:
            log_unexpected("the events function failed on a batch", exc, seconds=time.monotonic() - started)
            return str(records[0]["dynamodb"]["SequenceNumber"])
        failures = [item["itemIdentifier"] for item in response.get("batchItemFailures", [])]
        return min(failures, key=int) if failures else None

    def _iterator(self, arn: str, shard: str, kind: str, sequence: str | None = None) -> str:
        params: dict[str, Any] = {"StreamArn": arn, "ShardId": shard, "ShardIteratorType": kind}
        if sequence is not None:
            params["SequenceNumber"] = sequence
        iterator: str = self._streams.get_shard_iterator(**params)["ShardIterator"]
        return iterator


def _sequence(record: Any) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def _lambda_record(record: Any, arn: str) -> dict[str, Any]:
    """A stream record as Lambda delivers it: the API's record, with its source named."""
    return {**record, "eventSource": "aws:dynamodb", "eventSourceARN": arn}
