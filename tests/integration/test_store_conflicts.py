"""Transactions DynamoDB cancels for a conflict with another write (TransactionConflict): the store sends
them again, and when the conflict outlasts its tries it raises a transient error, never a refused
condition, and writes nothing in their place. On moto, whose transactions never conflict, through a
client that cancels the first ones as DynamoDB would."""

from __future__ import annotations

import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from aijobs.stack import StackResources
from engine.aws_errors import is_transient
from engine.core import ErrorCode, JobErrorInfo, JobStatus, NewJob, Succeeded
from engine.store import DynamoJobStore
from engine.store.payloads import PayloadStore
from engine.store.retries import Backoff

NOW = 1_800_000_000_000
INPUT = {"text": "My invoice is wrong", "labels": ["billing", "other"]}
DEAD = JobErrorInfo(ErrorCode.DEAD_LETTERED, "reached the dead-letter queue", retryable=False)


class Conflicting:
    """The DynamoDB client, whose next `conflicts` transactions are cancelled by a TransactionConflict."""

    def __init__(self, client: Any, conflicts: int) -> None:
        self.transactions = 0
        self._client = client
        self._conflicts = conflicts

    def transact_write_items(self, **params: Any) -> Any:
        self.transactions += 1
        if self.transactions <= self._conflicts:
            reasons = [{"Code": "None"}] * len(params["TransactItems"])
            reasons[0] = {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            error = {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"}
            raise ClientError({"Error": error, "CancellationReasons": reasons}, "TransactWriteItems")
        return self._client.transact_write_items(**params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def store_with(
    dynamodb: Any, payloads: PayloadStore, stack: StackResources, conflicts: int
) -> tuple[DynamoJobStore, Conflicting]:
    client = Conflicting(dynamodb, conflicts)
    backoff = Backoff(sleep=lambda _: None, rng=random.Random(1))
    return DynamoJobStore(stack.table_name, client=client, payloads=payloads, backoff=backoff), client  # type: ignore[arg-type]


def new_job() -> NewJob:
    return NewJob("classify", "acme", 1, 3, 86_400, "r")


def test_a_finish_that_meets_a_conflict_is_sent_again_and_lands(
    dynamodb: Any, payloads: PayloadStore, stack: StackResources, store: DynamoJobStore
) -> None:
    # Given a running job, and a store whose next two transactions meet a conflicting write
    job = store.claim_job("c-1", "w1", 60_000, NOW, new_job())
    conflicted, client = store_with(dynamodb, payloads, stack, conflicts=2)

    # When the worker finishes it, with its input to keep (a transaction)
    conflicted.finish_job(job, Succeeded({"label": "billing", "confidence": 0.9}, "h"), NOW + 1, store_input=INPUT)

    # Then the third try lands
    assert client.transactions == 3
    finished = store.get_job("c-1")
    assert finished is not None
    assert finished.status is JobStatus.SUCCEEDED
    assert store.get_input("c-1") == INPUT


def test_a_conflict_that_outlasts_the_tries_is_transient_and_changes_nothing(
    dynamodb: Any, payloads: PayloadStore, stack: StackResources, store: DynamoJobStore
) -> None:
    # Given a running job, and a store whose transactions all meet a conflicting write
    job = store.claim_job("c-2", "w1", 60_000, NOW, new_job())
    conflicted, client = store_with(dynamodb, payloads, stack, conflicts=1_000)

    # When the worker finishes it
    with pytest.raises(ClientError) as raised:
        conflicted.finish_job(job, Succeeded({"label": "billing", "confidence": 0.9}, "h"), NOW + 1, store_input=INPUT)

    # Then it failed transiently (the delivery is retried), not as a lost lease, and nothing changed
    assert is_transient(raised.value)
    assert client.transactions == Backoff().tries
    assert store.get_job("c-2") == job


def test_a_dead_lettered_request_that_meets_conflicts_is_not_recorded_as_another_requests(
    dynamodb: Any, payloads: PayloadStore, stack: StackResources, store: DynamoJobStore
) -> None:
    # Given a store whose transactions all meet a conflicting write
    conflicted, _ = store_with(dynamodb, payloads, stack, conflicts=1_000)

    # When a full request whose job was never created is recorded as dead-lettered
    with pytest.raises(ClientError) as raised:
        conflicted.create_dead_lettered_job("c-3", new_job(), INPUT, DEAD, NOW)

    # Then it fails transiently (it is recorded on the next try), and no job was written in its place
    assert is_transient(raised.value)
    assert store.get_job("c-3") is None
