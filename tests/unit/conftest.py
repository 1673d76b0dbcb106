"""Fixtures of the unit tests that speak HTTP to the local provider on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from aijobs.local.provider import LocalProvider


@pytest.fixture
def server() -> Iterator[LocalProvider]:
    """A local provider that answers at once, batches included (a module may define its own)."""
    with LocalProvider(latency_seconds=0, batch_delay_seconds=0) as provider:
        yield provider


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """A client that goes straight to loopback, whatever proxy the environment names."""
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        yield client
