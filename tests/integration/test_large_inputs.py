"""Inputs up to what one SQS message carries (1 MiB) run and can be retried; past an item's size they are
kept in the payload bucket, transparently; past 1 MiB they are refused at the edge."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aijobs.client import AiJobsClient
from engine.core import JobStatus
from engine.core.errors import InputValidationError, ProviderRejectedError
from engine.definitions import MAX_INPUT_BYTES
from engine.store.payloads import INLINE_BYTES, PayloadStore, input_key
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import ACKNOWLEDGED, Enqueue, TableReader, queued_bodies
from tests.support.events import InvocationContext, sqs_event, sqs_record
from tests.support.providers import FakeProvider, valid_answer


def documents_input(total_bytes: int) -> dict[str, Any]:
    """An answer_with_citations input of about `total_bytes` as JSON (documents of 100,000 characters)."""
    count = max(1, total_bytes // 100_000)
    documents = [{"id": "d1" if index == 0 else f"doc-{index}", "text": "t" * 100_000} for index in range(count)]
    return {"question": "How long?", "documents": documents}


def size_of(job_input: dict[str, Any]) -> int:
    return len(json.dumps(job_input, separators=(",", ":")).encode())


def test_a_600_kb_message_carried_input_runs_and_after_a_failure_is_retried_from_the_bucket(
    worker: WorkerHandler,
    provider: FakeProvider,
    jobs_client: AiJobsClient,
    payloads: PayloadStore,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    sqs: Any,
    stack: Any,
    enqueue: Enqueue,
) -> None:
    # Given a job whose input is 600 KB, carried by its message, and a provider that rejects it
    job_input = documents_input(600_000)
    assert INLINE_BYTES < size_of(job_input) < MAX_INPUT_BYTES
    provider.script = lambda _: ProviderRejectedError("provider rejected the request (HTTP 400)", status_code=400)
    message = {"job_id": "big-1", "job_type": "answer_with_citations", "user_id": "u1", "input": job_input}

    # When the worker runs it
    assert worker.handle(sqs_event(enqueue(message)), InvocationContext()) == ACKNOWLEDGED

    # Then it failed in the usual two requests, and its input is kept in the bucket, referenced
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "TransactWriteItems": 1}
    item = table.input_item("big-1")
    assert item is not None
    assert ("input" in item, item["input_key"]) == (False, input_key("big-1"))
    assert json.loads(payloads.get(item["input_key"])) == job_input

    # When it is retried and delivered to a healthy provider
    assert jobs_client.retry("big-1").status is JobStatus.QUEUED
    (body,) = queued_bodies(sqs, stack.queue_url)
    provider.script = valid_answer
    assert worker.handle(sqs_event(sqs_record(body)), InvocationContext()) == ACKNOWLEDGED

    # Then it ran from the input read back from the bucket
    assert table.job("big-1").status is JobStatus.SUCCEEDED
    assert provider.requests[-1].user.count("t" * 100_000) == 6


def test_a_600_kb_input_submitted_with_the_client_is_stored_in_the_bucket_and_runs(
    worker: WorkerHandler,
    provider: FakeProvider,
    jobs_client: AiJobsClient,
    payloads: PayloadStore,
    table: TableReader,
    sqs: Any,
    stack: Any,
) -> None:
    job_input = documents_input(600_000)

    result = jobs_client.submit("answer_with_citations", "u1", job_input, job_id="big-2")

    assert result.created
    item = table.input_item("big-2")
    assert item is not None
    assert json.loads(payloads.get(item["input_key"])) == job_input
    (body,) = queued_bodies(sqs, stack.queue_url)
    assert worker.handle(sqs_event(sqs_record(body)), InvocationContext()) == ACKNOWLEDGED
    assert table.job("big-2").status is JobStatus.SUCCEEDED
    assert provider.calls == 1


def test_an_input_within_the_inline_bound_stays_on_its_item(
    jobs_client: AiJobsClient, table: TableReader, payloads: PayloadStore
) -> None:
    job_input = documents_input(INLINE_BYTES - 100_000)
    assert size_of(job_input) <= INLINE_BYTES

    jobs_client.submit("answer_with_citations", "u1", job_input, job_id="inline-1")

    item = table.input_item("inline-1")
    assert item is not None
    assert (json.loads(item["input"]), "input_key" in item) == (job_input, False)


def test_an_input_past_one_mib_is_refused_at_the_edge_and_nothing_is_written(
    jobs_client: AiJobsClient, table: TableReader, dynamodb_requests: RequestCounter
) -> None:
    job_input = documents_input(MAX_INPUT_BYTES + 200_000)

    with pytest.raises(InputValidationError) as caught:
        jobs_client.submit("answer_with_citations", "u1", job_input, job_id="too-big")

    assert f"the limit is {MAX_INPUT_BYTES}" in caught.value.message
    assert dynamodb_requests.total == 0
    assert table.snapshot() == {}
