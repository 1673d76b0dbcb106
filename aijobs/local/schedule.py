"""A scheduled function, as an EventBridge schedule runs it: one invocation every so often, one at a time.

The embedded stack runs the batcher this way (template.yaml's BatchFunction runs every minute; locally
every few seconds, so that batches move at the pace of a demo).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from aijobs.local.lambda_events import InvocationContext
from engine.observability import Handle, log_unexpected


def scheduled_event(function_name: str) -> dict[str, Any]:
    """The event a scheduled rule gives its target."""
    return {
        "version": "0",
        "source": "aws.events",
        "detail-type": "Scheduled Event",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "resources": [f"arn:aws:events:us-east-1:123456789012:rule/{function_name}"],
        "detail": {},
    }


class Schedule:
    def __init__(
        self, handle: Handle, every_seconds: float, function_timeout_seconds: float, function_name: str
    ) -> None:
        self._handle = handle
        self._every = every_seconds
        self._timeout = function_timeout_seconds
        self._name = function_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"schedule-{function_name}", daemon=True)
        self.invocations = 0

    def start(self) -> Schedule:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._handle(scheduled_event(self._name), InvocationContext(self._name, self._timeout))
            except Exception as exc:  # a failed invocation; the next one comes on schedule
                log_unexpected("a scheduled invocation failed", exc, function_name=self._name)
            self.invocations += 1
