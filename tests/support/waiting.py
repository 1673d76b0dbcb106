"""Waiting on a condition instead of sleeping: a bounded poll that fails with a clear message.

Tests run side by side (`-n auto`) on a shared machine, so they never sleep for a fixed time to let
something happen, and never assert how long something took: they wait until what they expect holds,
up to a timeout generous enough for a loaded machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

# How long a test waits for a condition before it fails.
TIMEOUT_SECONDS = 30.0


def eventually(
    check: Callable[[], T], timeout: float = TIMEOUT_SECONDS, interval: float = 0.2, what: str = "the condition"
) -> T:
    """Poll `check` until it returns something truthy, and return that; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} did not hold within {timeout:g}s")
        time.sleep(interval)
