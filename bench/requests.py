"""Counting the AWS requests of every client a boto3 session makes (a botocore hook on the session:
register before the clients are made, they copy the session's hooks)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import boto3


class SessionRequests:
    def __init__(self, session: boto3.Session) -> None:
        self.operations: Counter[str] = Counter()  # "<service> <Operation>" -> requests
        session.events.register("before-call.*.*", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        _hook, service, operation = event_name.split(".", 2)
        self.operations[f"{service} {operation}"] += 1

    def of(self, service: str) -> Counter[str]:
        """One service's requests, by operation."""
        prefix = f"{service} "
        return Counter(
            {name.removeprefix(prefix): count for name, count in self.operations.items() if name.startswith(prefix)}
        )
