"""Completion events as a consumer receives them: from a queue that a rule on the bus copies them to.

The local stack makes such a queue (`JOBS_EVENTS_QUEUE_URL`); on AWS, a rule on the stack's bus
with an SQS target makes one (docs/events.md). `EventsTap` reads it; `aijobs events` prints what it
reads, or POSTs each event to a webhook.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from aijobs.amounts import usd

# The longest long poll SQS allows.
MAX_WAIT_SECONDS = 20


class EventsTap:
    def __init__(self, sqs: Any, queue_url: str) -> None:
        self._sqs = sqs
        self._queue_url = queue_url

    def receive(self, wait_seconds: int = 1) -> list[tuple[dict[str, Any], str]]:
        """Up to 10 events with their receipt handles (an event is read again unless `done` with)."""
        response = self._sqs.receive_message(
            QueueUrl=self._queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=min(wait_seconds, MAX_WAIT_SECONDS)
        )
        return [(json.loads(message["Body"]), message["ReceiptHandle"]) for message in response.get("Messages", [])]

    def done(self, receipt_handle: str) -> None:
        self._sqs.delete_message(QueueUrl=self._queue_url, ReceiptHandle=receipt_handle)

    def collect(self, job_ids: set[str], wait_seconds: float, late_seconds: int = 1) -> list[dict[str, Any]]:
        """The events on the queue, read until every job of `job_ids` has one (or `wait_seconds` have
        passed), then for `late_seconds` more, so that a duplicate shows."""
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline and not job_ids <= {event["detail"].get("job_id") for event in events}:
            events += self.drain()
        events += self.drain(late_seconds)
        return events

    def drain(self, wait_seconds: int = 1) -> Iterator[dict[str, Any]]:
        """Every event on the queue now, each deleted once yielded; stops at the first empty receive."""
        while batch := self.receive(wait_seconds):
            for event, receipt_handle in batch:
                yield event
                self.done(receipt_handle)


def event_line(event: dict[str, Any]) -> str:
    """One line per event: when, what, which job, and what it cost (nothing, for a job that took the
    answer of the job it names as `reused_from`; a job type's rollback: which version, production's,
    and why)."""
    detail = event.get("detail", {})
    if "job_id" not in detail and "production_version" in detail:  # Job Type Rolled Back
        return "  ".join(
            str(part)
            for part in (
                event.get("time", ""),
                event.get("detail-type", ""),
                f"type={detail.get('job_type')}",
                f"version={detail.get('version')}",
                f"production={detail.get('production_version')}",
                detail.get("reason", ""),
            )
        )
    usage = detail.get("usage") or {}
    error = detail.get("error") or {}
    parts = [
        event.get("time", ""),
        event.get("detail-type", ""),
        detail.get("job_id", ""),
        f"type={detail.get('job_type')}",
        f"user={detail.get('user_id')}",
        f"attempts={detail.get('attempt_count')}",
        f"tokens={usage.get('input_tokens', 0)}+{usage.get('output_tokens', 0)}",
        f"cost={usd(usage.get('cost_usd', 0))}",
    ]
    if error:
        parts.append(f"error={error.get('code')}")
    if detail.get("reused_from"):  # no call, no cost: it took the answer another job paid for
        parts.append(f"reused_from={detail['reused_from']}")
    if "decision" in detail:  # a pipeline's review decided (Job Reviewed): who decided what
        parts = [*parts[:5], f"decision={detail['decision']}", f"by={detail.get('by') or '-'}"]
    return "  ".join(str(part) for part in parts)
