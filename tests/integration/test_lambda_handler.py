"""The events/ files through the real Lambda entry point, configured from the environment only.

DynamoDB and SQS are moto (the template's stack); the model is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import handlers.worker
from aijobs.stack import StackResources
from engine.core import ErrorCode, JobStatus
from engine.wiring import entry_point
from tests.integration.conftest import TableReader
from tests.support.events import InvocationContext, load_event
from tests.support.http_provider import LocalProvider, expected_output

API_KEY = "local-key"
MODEL = "local-model"
EVENT_JOBS = {
    "summarize": "evt-summarize-1",
    "classify": "evt-classify-1",
    "answer_with_citations": "evt-answer-1",
}

Handler = Callable[[dict[str, Any]], dict[str, Any]]


@pytest.fixture
def model_server() -> Iterator[LocalProvider]:
    # It answers 401 to any request without the key, so a 200 in its log proves the key was sent.
    with LocalProvider(api_key=API_KEY, latency_seconds=0) as server:
        yield server


@pytest.fixture
def handler(stack: StackResources, model_server: LocalProvider, monkeypatch: pytest.MonkeyPatch) -> Handler:
    """`handlers.worker.lambda_handler` with the stack's and the loopback provider's settings."""
    for name, value in stack.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AI_PROVIDER", "openai")
    monkeypatch.setenv("AI_BASE_URL", model_server.url)
    monkeypatch.setenv("AI_API_KEY", API_KEY)
    monkeypatch.setenv("AI_MODEL_PRIMARY", MODEL)
    for name in ("AI_API_KEY_SECRET_ARN", "AI_MODEL_FALLBACK", "AIJOBS_JOB_MODULES", "AIJOBS_PRICES"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    # The entry point of handlers.worker, built afresh for this test's stack (the module's own one
    # keeps the parts of its first invocation, as a warm Lambda does).
    lambda_handler = entry_point(handlers.worker.build)
    return lambda event: lambda_handler(event, InvocationContext())


def assert_lambda_response(response: Any, event: dict[str, Any]) -> list[str]:
    """The partial batch response Lambda expects; returns the ids of the records to retry."""
    assert isinstance(response, dict)
    assert list(response) == ["batchItemFailures"]
    failures = response["batchItemFailures"]
    assert isinstance(failures, list)
    ids = [failure["itemIdentifier"] for failure in failures]
    assert all(list(failure) == ["itemIdentifier"] for failure in failures)
    assert set(ids) <= {record["messageId"] for record in event["Records"]}
    return ids


@pytest.mark.parametrize("event_name", list(EVENT_JOBS))
def test_an_event_file_runs_its_job_through_the_lambda_handler(
    event_name: str, handler: Handler, model_server: LocalProvider, table: TableReader
) -> None:
    # Given the sample event of a job type
    event = load_event(event_name)

    # When Lambda invokes the handler with it
    response = handler(event)

    # Then the record is acknowledged after one HTTP call to the provider, with the key and the model
    assert assert_lambda_response(response, event) == []
    (request,) = model_server.log
    assert (request.status, request.model, request.schema_name) == (200, MODEL, event_name)
    # And the job succeeded with the provider's answer and usage
    body = json.loads(event["Records"][0]["body"])
    job = table.job(EVENT_JOBS[event_name])
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == expected_output(event_name, body["input"])
    assert (job.usage.input_tokens, job.usage.output_tokens) == model_server.billed_tokens()
    assert job.usage.attempts == 1


def test_the_duplicate_event_runs_its_job_once(
    handler: Handler, model_server: LocalProvider, table: TableReader
) -> None:
    # Given events/duplicate.json: two records of the same job in one batch
    event = load_event("duplicate")

    # When Lambda invokes the handler with it
    response = handler(event)

    # Then the provider was asked once and the job succeeded once
    retried = assert_lambda_response(response, event)
    assert len(model_server.log) == 1
    job = table.job("evt-duplicate-1")
    assert job.status is JobStatus.SUCCEEDED
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    # And the other record was either acknowledged as a duplicate or reported as held
    assert len(retried) <= 1


def test_the_malformed_event_is_acknowledged_through_the_lambda_handler(
    handler: Handler, model_server: LocalProvider, table: TableReader
) -> None:
    # Given events/malformed.json
    event = load_event("malformed")

    # When Lambda invokes the handler with it, twice
    first = handler(event)
    second = handler(event)

    # Then every record is acknowledged both times and the provider is never called
    assert assert_lambda_response(first, event) == []
    assert assert_lambda_response(second, event) == []
    assert model_server.log == []
    # And what could be recorded was: two dead letters, two failed jobs
    for record in event["Records"][:2]:
        assert table.dead_letter(record["messageId"]) is not None
    assert table.job("evt-bad-input-1").error.code is ErrorCode.INPUT_VALIDATION_FAILED  # type: ignore[union-attr]
    assert table.job("evt-unknown-type-1").error.code is ErrorCode.UNKNOWN_JOB_TYPE  # type: ignore[union-attr]
