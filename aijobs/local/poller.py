"""A local SQS event source mapping: what Lambda does between the jobs queue and the worker function.

Each poller thread long-polls the queue, gathers up to `batch_size` messages within the batching
window, invokes the handler with the event Lambda would send (same record fields, a context whose
remaining time counts down from the function's timeout), then deletes exactly the records the
response does not list in `batchItemFailures` (ReportBatchItemFailures). As with Lambda, a handler
that raises, returns a malformed response or outlives its timeout fails the whole batch: nothing is
deleted and the messages come back after their visibility timeout.

Plain boto3: it runs against a local endpoint (AWS_ENDPOINT_URL) or a real queue alike.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Self

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from aijobs.local.lambda_events import InvocationContext, received_record, sqs_event

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        ChangeMessageVisibilityBatchRequestEntryTypeDef,
        DeleteMessageBatchRequestEntryTypeDef,
        MessageTypeDef,
    )

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], LambdaContext], object]

# SQS limits: a receive returns at most 10 messages and long-polls at most 20 s; a batch request
# (delete, change visibility) holds at most 10 entries.
MAX_MESSAGES_PER_RECEIVE = 10
MAX_WAIT_SECONDS = 20
MAX_BATCH_ENTRIES = 10
# Lambda's limits for a standard queue's event source mapping.
MAX_BATCH_SIZE = 10_000
MAX_BATCHING_WINDOW_SECONDS = 300.0
# Within the batching window, an empty short poll is followed by this pause (no busy loop).
_WINDOW_POLL_PAUSE_SECONDS = 0.05
# After a failed SQS call a poller waits this long before it polls again.
_ERROR_PAUSE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class MappingStats:
    """What the mapping did so far. `failed` counts records left on the queue after an invocation."""

    batches: int = 0
    records: int = 0
    deleted: int = 0
    failed: int = 0
    # Invocations that failed as a whole: the handler raised, answered malformed, or timed out.
    batch_errors: int = 0
    # SQS calls that failed (receive, delete): the records concerned simply come back later.
    sqs_errors: int = 0


class BatchResponseError(ValueError):
    """The handler's response is not a valid partial batch response: the whole batch fails."""


def failed_message_ids(response: object, message_ids: Sequence[str]) -> set[str]:
    """The records a handler's response reports as failed, by Lambda's rules for ReportBatchItemFailures.

    None, `{}` and an empty or null `batchItemFailures` mean every record succeeded. A response that
    is not JSON-serializable or not an object, or an item whose `itemIdentifier` is missing, empty or
    not a message of the batch, raises BatchResponseError (Lambda fails the whole batch).
    """
    if response is None:
        return set()
    try:
        # What Lambda receives is the response serialized: a value JSON cannot carry is an invalid response.
        decoded = json.loads(json.dumps(response))
    except (TypeError, ValueError) as exc:
        raise BatchResponseError(f"the response is not JSON-serializable: {exc}") from exc
    if not isinstance(decoded, dict):
        raise BatchResponseError(f"the response is a JSON {type(decoded).__name__}, not an object")
    failures = decoded.get("batchItemFailures")
    if failures is None:
        return set()
    if not isinstance(failures, list):
        raise BatchResponseError("batchItemFailures is not a list")
    known = set(message_ids)
    failed: set[str] = set()
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(identifier, str) or not identifier:
            raise BatchResponseError(f"batch item failure {failure!r} has no itemIdentifier")
        if identifier not in known:
            raise BatchResponseError(f"batch item failure {identifier!r} is not a message of this batch")
        failed.add(identifier)
    return failed


class EventSourceMapping:
    """Polls an SQS queue and invokes `handler` with Lambda-shaped batches, from `concurrency` threads."""

    def __init__(
        self,
        queue_url: str,
        handler: Handler,
        *,
        batch_size: int = 10,
        batching_window_seconds: float = 1.0,
        wait_seconds: int = MAX_WAIT_SECONDS,
        function_timeout_seconds: float = 300.0,
        concurrency: int = 1,
        function_name: str = "aijobs-worker",
        memory_limit_in_mb: int = 512,
        sqs_client: SQSClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size {batch_size} is not within 1..{MAX_BATCH_SIZE}")
        if not 0 <= batching_window_seconds <= MAX_BATCHING_WINDOW_SECONDS:
            raise ValueError(f"batching_window_seconds {batching_window_seconds} is not within 0..300")
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(f"wait_seconds {wait_seconds} is not within 0..{MAX_WAIT_SECONDS}")
        if function_timeout_seconds <= 0:
            raise ValueError("function_timeout_seconds must be positive")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queue_url = queue_url
        self._handler = handler
        self._batch_size = batch_size
        self._window_seconds = batching_window_seconds
        self._wait_seconds = wait_seconds
        self._timeout_seconds = function_timeout_seconds
        self._concurrency = concurrency
        self._function_name = function_name
        self._memory_limit_in_mb = memory_limit_in_mb
        # What the invocations' remaining time counts down on.
        self._clock = clock
        # Every poller may hold a long poll and a delete at once.
        self._sqs: SQSClient = sqs_client or boto3.client(
            "sqs", config=Config(max_pool_connections=max(10, 2 * concurrency))
        )
        self._queue_arn: str | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stats_lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> Self:
        if self.running:
            raise RuntimeError("the event source mapping is already running")
        self._queue_arn = self._sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self._stopping.clear()
        self._threads = [
            threading.Thread(target=self._poll, name=f"aijobs-poller-{number}", daemon=True)
            for number in range(1, self._concurrency + 1)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Let each poller finish its current batch and exit; True when every thread ended in time.

        A poller in a long poll notices within `wait_seconds`; one running a batch, when the batch is
        done. The default `timeout` covers both.
        """
        self._stopping.set()
        if timeout is None:
            timeout = self._wait_seconds + self._window_seconds + self._timeout_seconds + 5
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            logger.warning("pollers still running after %.1fs: %s", timeout, ", ".join(alive))
            return False
        self._threads = []
        return True

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    @property
    def stopping(self) -> bool:
        """Whether stop was asked: each poller finishes its batch and takes no other."""
        return self._stopping.is_set()

    def run_until(self, predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
        """Run (starting when stopped) until `predicate()` holds or `timeout` passes, then stop.

        Returns whether the predicate held.
        """
        if not self.running:
            self.start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if predicate():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(interval, left))
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def stats(self) -> MappingStats:
        with self._stats_lock:
            return MappingStats(**{field.name: self._counts[field.name] for field in fields(MappingStats)})

    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            self._counts.update(increments)

    # --- one poller --------------------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stopping.is_set():
            try:
                messages = self._gather()
            except Exception:
                logger.exception("receiving from %s failed", self.queue_url)
                self._count(sqs_errors=1)
                self._stopping.wait(_ERROR_PAUSE_SECONDS)
                continue
            if not messages:
                continue
            if self._stopping.is_set():
                # Received while stopping: hand the messages back now rather than after their visibility timeout.
                self._release(messages)
                return
            self._invoke(messages)

    def _gather(self) -> list[MessageTypeDef]:
        """Up to batch_size messages: a long poll for the first, then more within the batching window."""
        batch = self._receive(self._batch_size, self._wait_seconds)
        if not batch:
            return []
        window_ends = time.monotonic() + self._window_seconds
        by_id = {message["MessageId"]: message for message in batch}
        while len(by_id) < self._batch_size and not self._stopping.is_set():
            left = window_ends - time.monotonic()
            if left <= 0:
                break
            # SQS waits in whole seconds; below one second left, a short poll and a pause.
            more = self._receive(self._batch_size - len(by_id), min(int(left), MAX_WAIT_SECONDS))
            # A message seen twice (its visibility ran out meanwhile) keeps its newest receipt handle.
            by_id.update((message["MessageId"], message) for message in more)
            if not more:
                self._stopping.wait(min(_WINDOW_POLL_PAUSE_SECONDS, max(0.0, window_ends - time.monotonic())))
        return list(by_id.values())

    def _receive(self, wanted: int, wait_seconds: int) -> list[MessageTypeDef]:
        response = self._sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=min(wanted, MAX_MESSAGES_PER_RECEIVE),
            WaitTimeSeconds=wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(response.get("Messages", []))

    def _invoke(self, messages: list[MessageTypeDef]) -> None:
        assert self._queue_arn is not None
        event = sqs_event(*(received_record(message, self._queue_arn) for message in messages))
        message_ids = [message["MessageId"] for message in messages]
        region = self._queue_arn.split(":")[3]
        context = InvocationContext(
            self._function_name, self._timeout_seconds, self._memory_limit_in_mb, region, clock=self._clock
        )
        try:
            response = self._handler(event, context)
            if context.timed_out:
                # Lambda would have ended the invocation: its response never reaches the mapping.
                raise TimeoutError(f"the invocation outlived the function timeout ({self._timeout_seconds:g}s)")
            failed = failed_message_ids(response, message_ids)
        except Exception:
            logger.exception("the invocation failed; its %d records stay on the queue", len(messages))
            self._count(batches=1, records=len(messages), failed=len(messages), batch_errors=1)
            return
        done = [message for message in messages if message["MessageId"] not in failed]
        deleted = self._delete(done)
        self._count(batches=1, records=len(messages), deleted=deleted, failed=len(messages) - deleted)

    def _delete(self, messages: list[MessageTypeDef]) -> int:
        """Delete the messages in batches of 10; the number SQS confirmed."""
        deleted = 0
        for start in range(0, len(messages), MAX_BATCH_ENTRIES):
            chunk = messages[start : start + MAX_BATCH_ENTRIES]
            entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
                {"Id": str(i), "ReceiptHandle": message["ReceiptHandle"]} for i, message in enumerate(chunk)
            ]
            try:
                response = self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception:
                logger.exception("deleting %d messages failed; they will be delivered again", len(chunk))
                self._count(sqs_errors=1)
                continue
            for failure in response.get("Failed", []):
                logger.warning("SQS did not delete a message: %s", failure.get("Message") or failure["Code"])
            deleted += len(response.get("Successful", []))
        return deleted

    def _release(self, messages: list[MessageTypeDef]) -> None:
        """Make messages visible again at once (received but not invoked)."""
        for start in range(0, len(messages), MAX_BATCH_ENTRIES):
            chunk = messages[start : start + MAX_BATCH_ENTRIES]
            entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
                {"Id": str(i), "ReceiptHandle": message["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, message in enumerate(chunk)
            ]
            try:
                self._sqs.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception:
                logger.exception("releasing %d messages failed; they come back after their visibility", len(chunk))
                self._count(sqs_errors=1)
