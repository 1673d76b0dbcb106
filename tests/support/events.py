"""Job messages for the tests, and the events/ files; SQS events and Lambda contexts come from
aijobs.local.lambda_events, the builders the local event source mapping uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aijobs.local.lambda_events import InvocationContext, sqs_event, sqs_record
from engine.core import NewJob
from engine.intake import request_hash

__all__ = ["InvocationContext", "job_message", "load_event", "new_job_for", "sqs_event", "sqs_record"]

EVENTS_DIR = Path(__file__).resolve().parents[2] / "events"


def load_event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS_DIR / f"{name}.json").read_text())
    return loaded


def job_message(job_type: str = "classify", job_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid message (docs/messages.md) for one of the built-in job types."""
    inputs = {
        "classify": {"text": "Win a free cruise now!", "labels": ["spam", "ham"]},
        "summarize": {"text": "SQS stores messages redundantly and delivers them at least once.", "max_words": 10},
        "answer_with_citations": {
            "question": "How long does SQS keep messages?",
            "documents": [{"id": "d1", "text": "Up to 14 days."}, {"id": "d2", "text": "1 MiB per message."}],
        },
        "extract": {
            "fields": [
                {"name": "invoice_number", "description": "as printed", "type": "string"},
                {"name": "total", "description": "the amount due", "type": "number"},
                {"name": "due", "description": "the date it is due", "type": "date"},
            ],
            "text": "Invoice 4711: EUR 120.50, due 2026-01-31.",
        },
    }
    message: dict[str, Any] = {"job_type": job_type, "user_id": "user-1", "input": inputs[job_type]}
    if job_id is not None:
        message["job_id"] = job_id
    message.update(overrides)
    return message


def new_job_for(message: dict[str, Any], **overrides: Any) -> NewJob:
    """The NewJob a full message creates (what the store's claim_job and create_job take)."""
    fields: dict[str, Any] = {
        "job_type": message["job_type"],
        "user_id": message["user_id"],
        "schema_version": 1,
        "max_attempts": 3,
        "deadline_seconds": 86_400,
        "request_hash": request_hash(message["job_type"], message["user_id"], message["input"]),
    }
    fields.update(overrides)
    return NewJob(**fields)
