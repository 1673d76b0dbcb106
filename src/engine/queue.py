"""JobQueue and JobQueues: the only code that talks to SQS.

Each lane has a queue of its own (docs/lanes.md): the interactive one (`JOBS_QUEUE_URL`) and the
background one (`JOBS_BACKGROUND_QUEUE_URL`; without it, background jobs share the interactive queue).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3

from engine.core import Lane
from engine.observability import log_unexpected
from engine.retry import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


# The message attribute that sends a job to real time whatever its deadline: set on the messages
# of jobs a provider's batch handed back (docs/batches.md).
ROUTE_ATTRIBUTE = "aijobs_route"
REALTIME_ROUTE = "realtime"
# SQS's longest delay of a message; its most entries in a SendMessageBatch, and the most bytes of
# their messages together (a message's size counts its body and its attributes' names, types and
# values: the queues' MaximumMessageSize, 1 MiB, is also the most a whole batch may hold).
MAX_SEND_DELAY_SECONDS = 900
SEND_BATCH_ENTRIES = 10
SEND_BATCH_BYTES = 1_048_576


@dataclass(frozen=True, slots=True)
class Resend:
    """A job's message sent again, as it came (its body), to run in real time after `delay_seconds`."""

    body: str
    group_id: str | None = None
    delay_seconds: int = 0


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """A queue's messages, as SQS approximates them: waiting, in flight (received, not deleted), delayed."""

    waiting: int
    in_flight: int
    delayed: int


class JobQueue:
    def __init__(self, queue_url: str, client: SQSClient | None = None) -> None:
        self.queue_url = queue_url
        self._client = client or boto3.client("sqs")

    def change_visibility(self, receipt_handle: str, seconds: int) -> None:
        """Hide a message for `seconds` from now: the backoff of a retry, or a held duplicate's wait."""
        self._client.change_message_visibility(
            QueueUrl=self.queue_url,
            ReceiptHandle=receipt_handle,
            VisibilityTimeout=max(0, min(int(seconds), MAX_DELAY_SECONDS)),
        )

    def send(self, body: dict[str, Any], group_id: str | None = None) -> str:
        """Enqueue `body`. `group_id` (the job's user) lets SQS fair queues keep one user's burst
        from delaying the others' messages; a standard queue takes it, and the engine never needs it."""
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if group_id is None:
            response = self._client.send_message(QueueUrl=self.queue_url, MessageBody=text)
        else:
            response = self._client.send_message(QueueUrl=self.queue_url, MessageBody=text, MessageGroupId=group_id)
        return str(response["MessageId"])

    def resend(self, messages: Sequence[Resend]) -> list[Resend]:
        """Send messages again, marked for real time, in SendMessageBatch requests of at most ten entries
        and 1 MiB: the messages SQS refused (an entry it answered `Failed`, or a whole request that
        failed), in their order; none when every one was sent."""
        refused: list[Resend] = []
        for batch in _send_batches(messages):
            entries = [_resend_entry(str(index), message) for index, message in enumerate(batch)]
            try:
                response = self._client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception as exc:
                log_unexpected("messages could not be sent again", exc, count=len(batch))
                refused.extend(batch)
                continue
            failed = {int(entry["Id"]) for entry in response.get("Failed", [])}
            refused.extend(message for index, message in enumerate(batch) if index in failed)
        return refused

    def depth(self) -> QueueDepth:
        """How many messages wait, are in flight and are delayed: one GetQueueAttributes."""
        attributes = self._client.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return QueueDepth(
            waiting=int(attributes.get("ApproximateNumberOfMessages", 0)),
            in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
            delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
        )


class JobQueues:
    """The queue of each lane; a lane without one of its own uses the interactive lane's."""

    def __init__(self, queues: Mapping[Lane, JobQueue]) -> None:
        self._queues = dict(queues)
        self._interactive = self._queues[Lane.INTERACTIVE]

    @classmethod
    def of(cls, queue: JobQueue | JobQueues) -> JobQueues:
        """Queues as given, or one queue for both lanes."""
        return queue if isinstance(queue, JobQueues) else cls({Lane.INTERACTIVE: queue})

    def __getitem__(self, lane: Lane) -> JobQueue:
        return self._queues.get(lane, self._interactive)

    def own(self) -> list[tuple[Lane, JobQueue]]:
        """Each lane that has a queue of its own, with it."""
        return list(self._queues.items())

    def lane_of(self, event_source_arn: str | None) -> Lane:
        """The lane of the queue a record came from (its ARN ends with the queue's name, as its URL does)."""
        name = (event_source_arn or "").rsplit(":", 1)[-1]
        for lane, queue in self._queues.items():
            if name and queue.queue_url.rstrip("/").rsplit("/", 1)[-1] == name:
                return lane
        return Lane.INTERACTIVE


# What the route attribute adds to a message's size.
ROUTE_BYTES = len(ROUTE_ATTRIBUTE) + len("String") + len(REALTIME_ROUTE)


def _resend_entry(entry_id: str, message: Resend) -> Any:
    entry: dict[str, Any] = {
        "Id": entry_id,
        "MessageBody": message.body,
        "DelaySeconds": max(0, min(message.delay_seconds, MAX_SEND_DELAY_SECONDS)),
    }
    if _body_bytes(message) + ROUTE_BYTES <= SEND_BATCH_BYTES:
        # (A body that fills a message alone goes without it: its job runs as its first message said.)
        entry["MessageAttributes"] = {ROUTE_ATTRIBUTE: {"DataType": "String", "StringValue": REALTIME_ROUTE}}
    if message.group_id is not None:
        entry["MessageGroupId"] = message.group_id
    return entry


def _body_bytes(message: Resend) -> int:
    return len(message.body.encode("utf-8", "surrogatepass"))


def _message_bytes(message: Resend) -> int:
    """What a resent message counts against SQS's size limits: its body, and its route attribute when
    it has room for it."""
    body = _body_bytes(message)
    return body + ROUTE_BYTES if body + ROUTE_BYTES <= SEND_BATCH_BYTES else body


def _send_batches(messages: Sequence[Resend]) -> list[list[Resend]]:
    """The messages in SendMessageBatch requests: at most ten entries and SEND_BATCH_BYTES each, in order."""
    batches: list[list[Resend]] = []
    size = 0
    for message in messages:
        count = _message_bytes(message)
        if not batches or len(batches[-1]) == SEND_BATCH_ENTRIES or size + count > SEND_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(message)
        size += count
    return batches
