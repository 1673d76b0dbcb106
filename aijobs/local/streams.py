"""The jobs table's stream, read as Lambda's DynamoDB event source mapping reads it, for the local stack.

moto keeps a table's stream (one shard) and serves it through the DynamoDB Streams API, but runs
no event source mapping. `TableStream` is one: from the oldest record (TRIM_HORIZON), batches of up
to `batch_size` records in Lambda's event shape; when the handler reports batch item failures,
the batch is read again from the lowest failed sequence number, as Lambda does (but until it
succeeds: no bisection, no giving up). It hands every
record to the handler: the template's filter criteria select the same records as the handler's
own check (tests/unit/test_events.py holds the two together).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import boto3

from aijobs.local.lambda_events import InvocationContext
from engine.observability import log_unexpected

Handler = Callable[[dict[str, Any], Any], Any]


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
    ) -> None:
        self._table_name = table_name
        self._handler = handler
        self._dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
        self._streams = session.client("dynamodbstreams", endpoint_url=endpoint_url)
        self._timeout = function_timeout_seconds
        self._batch_size = batch_size
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aijobs-table-stream", daemon=True)
        self.delivered = 0  # records handed to the handler and not reported as failed

    def start(self) -> TableStream:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        arn = shard = iterator = ""
        while not self._stop.is_set():
            try:
                if not iterator:  # found once, then followed: a failure later never starts it over
                    arn = self._dynamodb.describe_table(TableName=self._table_name)["Table"]["LatestStreamArn"]
                    shard = self._streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
                    iterator = self._iterator(arn, shard, "TRIM_HORIZON")
                page = self._streams.get_records(ShardIterator=iterator, Limit=self._batch_size)
                records = page.get("Records", [])
                if not records:
                    iterator = page["NextShardIterator"]
                    self._stop.wait(self._poll_seconds)
                    continue
                failed = self._invoke(arn, records)
                if failed is None:
                    self.delivered += len(records)
                    iterator = page["NextShardIterator"]
                else:
                    self.delivered += sum(int(r["dynamodb"]["SequenceNumber"]) < int(failed) for r in records)
                    iterator = self._iterator(arn, shard, "AT_SEQUENCE_NUMBER", failed)
                    self._stop.wait(1.0)  # Lambda retries a failed batch after a moment
            except Exception as exc:
                log_unexpected("the local table stream could not be read", exc)
                self._stop.wait(1.0)

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


def _lambda_record(record: Any, arn: str) -> dict[str, Any]:
    """A stream record as Lambda delivers it: the API's record, with its source named."""
    return {**record, "eventSource": "aws:dynamodb", "eventSourceARN": arn}
