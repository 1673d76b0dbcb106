"""The contract suite's store: every test runs once in memory and once on DynamoDB (moto, the template's table)."""

from __future__ import annotations

from typing import Protocol

import pytest

from engine.core.ports import AdminStore, DeadLetterStore, JobReader, ReconcilerStore, WorkerStore
from engine.store import DynamoJobStore
from engine.testing import InMemoryJobStore


class JobStore(JobReader, WorkerStore, DeadLetterStore, ReconcilerStore, AdminStore, Protocol):
    """Every role of engine.core.ports at once: what both stores are."""


@pytest.fixture(params=["memory", "dynamodb"])
def job_store(request: pytest.FixtureRequest) -> JobStore:
    """The store under test; the moto stack is created for the DynamoDB one only."""
    if request.param == "memory":
        return InMemoryJobStore()
    # tests/conftest.py's `store`: the template's table and payload bucket on moto.
    dynamo: DynamoJobStore = request.getfixturevalue("store")
    return dynamo
