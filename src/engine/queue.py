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
from engine.retry import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


# The message attribute that sends a job to real time whatever its deadline: set on the messages
# of jobs a provider's batch handed back (docs/batches.md).
ROUTE_ATTRIBUTE = "aijobs_route"
REALTIME_ROUTE = "realtime"
# SQS's longest delay of a message, and its most entries in a SendMessageBatch.
MAX_SEND_DELAY_SECONDS = 900
SEND_BATCH_ENTRIES = 10


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

    def resend(self, messages: Sequence[Resend]) -> int:
        """Send messages again, ten to a SendMessageBatch, marked for real time; how many SQS refused
        (each is logged by the caller's count: a refused entry is not retried here)."""
        refused = 0
        for start in range(0, len(messages), SEND_BATCH_ENTRIES):
            entries: list[Any] = []
            for index, message in enumerate(messages[start : start + SEND_BATCH_ENTRIES]):
                entry: dict[str, Any] = {
                    "Id": str(index),
                    "MessageBody": message.body,
                    "DelaySeconds": max(0, min(message.delay_seconds, MAX_SEND_DELAY_SECONDS)),
                    "MessageAttributes": {ROUTE_ATTRIBUTE: {"DataType": "String", "StringValue": REALTIME_ROUTE}},
                }
                if message.group_id is not None:
                    entry["MessageGroupId"] = message.group_id
                entries.append(entry)
            response = self._client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            refused += len(response.get("Failed", []))
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
