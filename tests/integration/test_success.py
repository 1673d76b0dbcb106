"""Successful jobs through the worker's handler: the result, the usage, and exactly two DynamoDB requests each."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

import pytest

from engine.core import JobStatus
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import MODEL, TableReader
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import VALID_OUTPUTS, FakeProvider

JOB_TYPES = ["summarize", "classify", "answer_with_citations"]
# gpt-4o-mini: 100 input tokens x $0.15/M + 20 output tokens x $0.60/M
COST_OF_ONE_CALL = Decimal("0.000027")
SUCCESS_REQUESTS = {"UpdateItem": 1, "TransactWriteItems": 1}


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


@pytest.mark.parametrize("job_type", JOB_TYPES)
def test_a_message_carried_job_succeeds_with_two_requests(
    job_type: str,
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a valid message for a new job of this type
    job_id = f"ok-{job_type}"
    event = sqs_event(sqs_record(job_message(job_type, job_id)))

    # When the worker handles it
    response = worker.handle(event, InvocationContext())

    # Then it is acknowledged after one claim and one finishing write, and one provider call
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == SUCCESS_REQUESTS
    assert provider.calls == 1
    # And the job holds the provider's answer, its hash and the usage of the one attempt
    job = table.job(job_id)
    expected = VALID_OUTPUTS[job_type]
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == expected
    assert job.output_hash == canonical_sha256(expected)
    assert job.error is None
    assert job.attempt_count == 1
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    assert job.usage.cost_usd == COST_OF_ONE_CALL
    assert job.lease_owner is None
    assert job.finished_at is not None
    # And the attempt is recorded with its prompt, model and tokens
    attempt = table.attempt(job_id, 1)
    assert attempt is not None
    assert attempt["prompt_key"] == job_type
    assert attempt["prompt_version"] == "2"
    assert attempt["model"] == MODEL
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (100, 20)
    assert attempt["outcome"] == "succeeded"
    assert Decimal(attempt["cost_usd"]) == COST_OF_ONE_CALL
    # And the input stays in the message: no input item, and none on the job item (docs/protocol.md)
    assert table.input_item(job_id) is None
    job_item = table.job_item(job_id)
    assert job_item is not None
    assert "input" not in job_item


def test_a_batch_of_ten_jobs_costs_twenty_requests(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given one event of ten distinct jobs of every type
    messages = [job_message(JOB_TYPES[i % 3], f"batch-{i}") for i in range(10)]
    event = sqs_event(*(sqs_record(message) for message in messages))

    # When the worker handles the batch
    response = worker.handle(event, InvocationContext())

    # Then every record is acknowledged: 10 claims, 10 finishes, 10 provider calls
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 10, "TransactWriteItems": 10}
    assert provider.calls == 10
    assert {table.job(message["job_id"]).status for message in messages} == {JobStatus.SUCCEEDED}
