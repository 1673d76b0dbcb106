"""Lambda-shaped events and contexts for the bench, with nothing but the standard library.

A worker process measured for memory imports this and the handler, nothing else.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

CLASSIFY_INPUT = {"text": "My invoice shows the wrong amount", "labels": ["billing", "bug", "account", "spam"]}


def message(job_id: str) -> str:
    return json.dumps({"job_id": job_id, "job_type": "classify", "user_id": "bench", "input": CLASSIFY_INPUT})


def sqs_event(bodies: list[str]) -> dict[str, Any]:
    now = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": str(uuid.uuid4()),
                "receiptHandle": f"bench-{n}",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": now,
                    "SenderId": "BENCH",
                    "ApproximateFirstReceiveTimestamp": now,
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:aijobs-jobs",
                "awsRegion": "us-east-1",
            }
            for n, body in enumerate(bodies)
        ]
    }


class LambdaContext:
    def __init__(self, timeout_seconds: float = 300.0) -> None:
        self._deadline = time.monotonic() + timeout_seconds
        self.function_name = "aijobs-worker"
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:aijobs-worker"
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)
