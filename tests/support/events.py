"""Builders for SQS events and Lambda contexts, shaped as Lambda sends them; and the events/ files."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENTS_DIR = Path(__file__).resolve().parents[2] / "events"


def load_event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS_DIR / f"{name}.json").read_text())
    return loaded


def sqs_record(
    body: Any, message_id: str | None = None, receive_count: int = 1, receipt_handle: str | None = None
) -> dict[str, Any]:
    message_id = message_id or str(uuid.uuid4())
    return {
        "messageId": message_id,
        "receiptHandle": receipt_handle or f"handle-{message_id}",
        "body": body if isinstance(body, str) else json.dumps(body),
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(int(time.time() * 1000)),
            "SenderId": "AIDAEXAMPLE",
            "ApproximateFirstReceiveTimestamp": str(int(time.time() * 1000)),
        },
        "messageAttributes": {},
        "md5OfBody": "00000000000000000000000000000000",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:aijobs-jobs",
        "awsRegion": "us-east-1",
    }


def sqs_event(*records: dict[str, Any]) -> dict[str, Any]:
    return {"Records": list(records)}


def job_message(job_type: str = "classify", job_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid SPEC section 2 message for one of the built-in job types."""
    inputs = {
        "classify": {"text": "Win a free cruise now!", "labels": ["spam", "ham"]},
        "summarize": {"text": "SQS stores messages redundantly and delivers them at least once.", "max_words": 10},
        "answer_with_citations": {
            "question": "How long does SQS keep messages?",
            "documents": [{"id": "d1", "text": "Up to 14 days."}, {"id": "d2", "text": "1 MiB per message."}],
        },
    }
    message: dict[str, Any] = {"job_type": job_type, "user_id": "user-1", "input": inputs[job_type]}
    if job_id is not None:
        message["job_id"] = job_id
    message.update(overrides)
    return message


@dataclass
class FakeLambdaContext:
    """A Lambda context whose remaining time counts down from `timeout_ms` like the real one."""

    timeout_ms: int = 300_000
    function_name: str = "aijobs-worker"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:aijobs-worker"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self.timeout_ms - int((time.monotonic() - self._started) * 1000))
