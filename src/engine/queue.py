"""JobQueue: the only code that talks to SQS."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3

from engine.retry import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


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
