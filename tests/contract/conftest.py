"""The contract suite's stores: every test runs once in memory and once on AWS (moto, the template's table
and bucket)."""

from __future__ import annotations

from typing import Protocol

import pytest

from engine.batching.files import Objects
from engine.core.batches import BatchRecords
from engine.core.ports import AdminStore, DeadLetterStore, JobReader, ReconcilerStore, WorkerStore
from engine.store import DynamoJobStore
from engine.store.batches import BatchTable
from engine.testing import InMemoryJobStore, MemoryBatchRecords, MemoryObjects


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


@pytest.fixture(params=["memory", "dynamodb"])
def records(request: pytest.FixtureRequest) -> BatchRecords:
    """Where batch records are kept: in memory, or the template's table."""
    if request.param == "memory":
        return MemoryBatchRecords()
    return BatchTable(request.getfixturevalue("stack").table_name, request.getfixturevalue("dynamodb"))


@pytest.fixture(params=["memory", "s3"])
def objects(request: pytest.FixtureRequest) -> Objects:
    """The bucket the batch files use: in memory, or tests/conftest.py's `payloads` (the template's bucket)."""
    if request.param == "memory":
        return MemoryObjects()
    payloads: Objects = request.getfixturevalue("payloads")
    return payloads
