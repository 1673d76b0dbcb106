"""The bench's job messages, with nothing but the standard library (a measured worker process
imports this, aijobs.local.lambda_events and the handler, nothing else)."""

from __future__ import annotations

import json

CLASSIFY_INPUT = {"text": "My invoice shows the wrong amount", "labels": ["billing", "bug", "account", "spam"]}


def message(job_id: str) -> str:
    return json.dumps({"job_id": job_id, "job_type": "classify", "user_id": "bench", "input": CLASSIFY_INPUT})
