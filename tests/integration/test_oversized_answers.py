"""Answers too large to keep: the job ends at once, `output_too_large`, one paid call, its usage recorded."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from engine.core import ErrorCode, JobStatus
from engine.definitions import JobDefinition, JobRegistry, Prompt
from engine.definitions.base import MAX_OUTPUT_BYTES
from engine.definitions.summarize import SummarizeInput
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader, WorkerFactory
from tests.support.events import InvocationContext, job_message, sqs_event
from tests.support.providers import FakeProvider

Enqueue = Callable[[Any], dict[str, Any]]
ACKNOWLEDGED: dict[str, Any] = {"batchItemFailures": []}
ONE_ROUND_TRIP = {"UpdateItem": 1, "TransactWriteItems": 1}


def assert_ended_too_large_after_one_paid_call(table: TableReader, job_id: str, provider: FakeProvider) -> None:
    job = table.job(job_id)
    assert job.error is not None
    assert (job.status, job.error.code, job.error.retryable) == (JobStatus.FAILED, ErrorCode.OUTPUT_TOO_LARGE, False)
    assert job.output is None
    # The call was paid for: its tokens and cost are on the job and on its attempt record
    assert provider.calls == 1
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.attempts) == (100, 20, 1)
    assert job.usage.cost_usd > 0
    attempt = table.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"], attempt["input_tokens"]) == ("failed", "output_too_large", 100)


@pytest.mark.parametrize(
    ("job_type", "answer"),
    [
        ("summarize", {"summary": "w" * 450_000}),  # one 450 KB "word"
        ("classify", {"label": "l" * 450_000, "confidence": 0.5}),  # a 450 KB label, quoted in the rule's error
        ("answer_with_citations", {"answer": "a", "citations": ["c" * 100_000] * 5}),  # five 100 KB citations
    ],
)
def test_an_answer_longer_than_max_tokens_can_be_ends_the_job_at_once(
    job_type: str,
    answer: dict[str, Any],
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model (or a proxy in front of it) answering far more than max_tokens can hold
    provider.script = lambda _: answer
    record = enqueue(job_message(job_type, f"huge-{job_type}"))

    # When the worker handles the job
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then it is acknowledged, not retried nor re-asked, and the job ends in the usual two requests
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == ONE_ROUND_TRIP
    assert_ended_too_large_after_one_paid_call(table, f"huge-{job_type}", provider)


class LongOutput(BaseModel):
    text: str


# A job type allowed long answers (100k tokens), so that an answer passes validation yet cannot be stored.
LONG_WRITER = JobDefinition(
    name="long_writer",
    input_model=SummarizeInput,
    output_model=LongOutput,
    prompt=Prompt(key="long_writer", version="1", system="Write.", user="Text: {text}"),
    max_tokens=100_000,
)


def test_a_valid_answer_too_large_for_the_jobs_item_ends_the_job_with_its_usage(
    make_worker: WorkerFactory,
    registry: JobRegistry,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    registry.register(LONG_WRITER)
    worker = make_worker()
    provider.script = lambda _: {"text": "x" * (MAX_OUTPUT_BYTES + 1)}
    record = enqueue(job_message("summarize", "long-1") | {"job_type": "long_writer"})

    response = worker.handle(sqs_event(record), InvocationContext())

    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == ONE_ROUND_TRIP
    assert_ended_too_large_after_one_paid_call(table, "long-1", provider)
    assert str(MAX_OUTPUT_BYTES) in str(table.job("long-1").error)


def test_an_answer_just_within_the_bound_is_stored(
    make_worker: WorkerFactory, registry: JobRegistry, provider: FakeProvider, table: TableReader, enqueue: Enqueue
) -> None:
    registry.register(LONG_WRITER)
    worker = make_worker()
    text = "x" * (MAX_OUTPUT_BYTES - len(json.dumps({"text": ""})))
    provider.script = lambda _: {"text": text}

    response = worker.handle(sqs_event(enqueue(job_message("summarize", "long-2") | {"job_type": "long_writer"})), None)

    assert response == ACKNOWLEDGED
    job = table.job("long-2")
    assert (job.status, job.output) == (JobStatus.SUCCEEDED, {"text": text})
