"""Every provider fault class through the engine: WorkerHandler.handle -> the real OpenAI-compatible provider ->
HTTP -> the local provider, with the job's fault picked by a `fault:<kind>` marker in its input.

Each test checks the job's status, error and attempt count, and that the tokens recorded on the job
and on its attempt items are exactly what the provider's request log billed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from aijobs.local.faults import FaultKind
from aijobs.local.provider import LocalProvider
from engine.core import ErrorCode, JobStatus
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import BUILTIN_DEFINITIONS, JobRegistry
from engine.definitions.classify import CLASSIFY
from engine.definitions.pipelines import PipelineDefinition
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, StructuredOutput, static_api_key
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.integration.conftest import Enqueue, RecordingQueue, TableReader
from tests.support.events import InvocationContext, job_message, sqs_event
from tests.support.http_provider import expected_output

API_KEY = "sk-local-test"
MODEL = "local-model"
RETRY_AFTER_SECONDS = 7
# classify with a 1 s provider timeout, so that a hang costs the test about a second.
QUICK_CLASSIFY = replace(CLASSIFY, name="quick_classify", timeout_seconds=1.0)
HANG_SECONDS = 3.0
REGISTERED = (*BUILTIN_DEFINITIONS, QUICK_CLASSIFY)

WorkerFactory = Callable[..., WorkerHandler]


@pytest.fixture
def model_server() -> Iterator[LocalProvider]:
    with LocalProvider(
        api_key=API_KEY, latency_seconds=0, retry_after_seconds=RETRY_AFTER_SECONDS, hang_seconds=HANG_SECONDS
    ) as server:
        yield server


@pytest.fixture
def http_worker(store: DynamoJobStore, queue: RecordingQueue, model_server: LocalProvider) -> Iterator[WorkerFactory]:
    """A worker whose gateway calls the local provider over real HTTP."""
    client = httpx.Client(trust_env=False)

    def build(api_key: str = API_KEY, structured_output: StructuredOutput = "json_schema") -> WorkerHandler:
        provider = OpenAICompatibleProvider(
            model_server.url, static_api_key(api_key), structured_output=structured_output, client=client
        )
        registry = JobRegistry(REGISTERED)
        gateway = ModelGateway(provider, ModelTiers(MODEL))
        runner = JobRunner(store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(7))
        return WorkerHandler(Worker(runner), queue)

    yield build
    client.close()


def faulty_job(job_type: str, job_id: str, marker: str, **overrides: Any) -> dict[str, Any]:
    """A built-in job type's message whose free text (answer_with_citations: the question) carries `marker`."""
    message = job_message(job_type, job_id, **overrides)
    field = "question" if job_type == "answer_with_citations" else "text"
    message["input"] = {**message["input"], field: f"{message['input'][field]} {marker}"}
    return message


def failed_record(record: dict[str, Any]) -> dict[str, Any]:
    return {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}


def assert_usage_is_what_the_provider_billed(
    table: TableReader, job_id: str, model_server: LocalProvider, attempts: int
) -> None:
    """The job's tokens, and the sum over its attempt items, equal the tokens the provider's log billed."""
    billed = model_server.billed_tokens()
    job = table.job(job_id)
    assert (job.usage.input_tokens, job.usage.output_tokens) == billed
    assert job.usage.attempts == attempts
    items = [table.attempt(job_id, number) for number in range(1, attempts + 1)]
    assert all(item is not None for item in items)
    recorded = (
        sum(int(item["input_tokens"]) for item in items if item),
        sum(int(item["output_tokens"]) for item in items if item),
    )
    assert recorded == billed
    assert table.attempt(job_id, attempts + 1) is None


# --- faults that give no answer: retryable ------------------------------------------------------------


def test_a_rate_limited_call_requeues_the_job_after_retry_after_with_the_attempt_refunded(
    http_worker: WorkerFactory,
    model_server: LocalProvider,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider that answers 429 with Retry-After: 7
    record = enqueue(faulty_job("classify", "fault-429", "fault:rate_limited"))

    # When the worker handles the job
    response = http_worker().handle(sqs_event(record), InvocationContext())

    # Then the record comes back after exactly Retry-After, and the attempt is not counted
    assert response == failed_record(record)
    assert queue.visibility_changes == [(record["receiptHandle"], RETRY_AFTER_SECONDS)]
    job = table.job("fault-429")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_RATE_LIMITED, True)
    assert job.attempt_count == 0
    # And the provider was asked once, billed nothing, and the engine recorded nothing
    assert [(entry.fault, entry.status) for entry in model_server.log] == [(FaultKind.RATE_LIMITED, 429)]
    assert_usage_is_what_the_provider_billed(table, "fault-429", model_server, attempts=1)
    assert model_server.billed_tokens() == (0, 0)


@pytest.mark.parametrize(
    ("kind", "status"),
    [("server_error", 500), ("unavailable", 503), ("drop", None)],
)
def test_an_unavailable_provider_requeues_the_job_with_a_backoff(
    kind: str,
    status: int | None,
    http_worker: WorkerFactory,
    model_server: LocalProvider,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider that answers 5xx, or closes the connection without a response
    job_id = f"fault-{kind}"
    record = enqueue(faulty_job("summarize", job_id, f"fault:{kind}"))

    # When the worker handles the job
    response = http_worker().handle(sqs_event(record), InvocationContext())

    # Then the job is queued again with provider_unavailable, after a backoff of attempt 1
    assert response == failed_record(record)
    ((_, seconds),) = queue.visibility_changes
    assert 1 <= seconds <= 2
    job = table.job(job_id)
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_UNAVAILABLE, True)
    assert job.attempt_count == 1
    assert [(entry.fault, entry.status) for entry in model_server.log] == [(FaultKind(kind), status)]
    assert_usage_is_what_the_provider_billed(table, job_id, model_server, attempts=1)


def test_a_provider_that_hangs_past_the_timeout_requeues_the_job(
    http_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a job type with a 1 s provider timeout, and a provider that does not answer for 3 s
    record = enqueue({**faulty_job("classify", "fault-hang", "fault:hang"), "job_type": QUICK_CLASSIFY.name})

    # When the worker handles the job
    response = http_worker().handle(sqs_event(record), InvocationContext())

    # Then the call times out and the job is queued again with provider_timeout
    assert response == failed_record(record)
    job = table.job("fault-hang")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_TIMEOUT, True)
    assert job.attempt_count == 1
    assert [(entry.fault, entry.status) for entry in model_server.log] == [(FaultKind.HANG, None)]
    assert_usage_is_what_the_provider_billed(table, "fault-hang", model_server, attempts=1)


def test_a_rejected_key_fails_the_job(
    http_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a worker configured with the wrong API key
    record = enqueue(job_message("classify", "fault-401"))

    # When it handles a job
    response = http_worker(api_key="sk-wrong").handle(sqs_event(record), InvocationContext())

    # Then the provider's 401 fails the job for good
    assert response == {"batchItemFailures": []}
    job = table.job("fault-401")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_REJECTED, False)
    assert [entry.status for entry in model_server.log] == [401]
    assert_usage_is_what_the_provider_billed(table, "fault-401", model_server, attempts=1)


def test_a_fault_served_twice_then_an_answer_succeeds_on_the_third_attempt(
    http_worker: WorkerFactory,
    model_server: LocalProvider,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job with 3 attempts whose prompt the provider refuses twice with 503
    message = faulty_job("classify", "fault-twice", "fault:unavailable*2", max_attempts=3)
    worker = http_worker()

    # When its message is delivered three times
    responses = [worker.handle(sqs_event(record), InvocationContext()) for record in map(enqueue, [message] * 3)]

    # Then the first two deliveries come back and the third succeeds
    assert [response["batchItemFailures"] != [] for response in responses] == [True, True, False]
    assert len(queue.visibility_changes) == 2
    job = table.job("fault-twice")
    assert job.status is JobStatus.SUCCEEDED
    assert job.error is None
    assert job.attempt_count == 3
    assert job.output is not None
    assert job.output["label"] in message["input"]["labels"]
    # And the usage of the three attempts is the one answer's
    assert [entry.fault for entry in model_server.log] == [FaultKind.UNAVAILABLE, FaultKind.UNAVAILABLE, None]
    assert_usage_is_what_the_provider_billed(table, "fault-twice", model_server, attempts=3)
    assert model_server.billed_tokens() != (0, 0)
    attempts = [table.attempt("fault-twice", number) for number in (1, 2, 3)]
    assert [(item or {}).get("outcome") for item in attempts] == ["retryable", "retryable", "succeeded"]


# --- faults in the answer: permanent, after one repair re-ask ----------------------------------------


@pytest.mark.parametrize(
    ("kind", "job_type", "code"),
    [
        pytest.param("non_json", "classify", ErrorCode.SCHEMA_VALIDATION_FAILED, id="non_json"),
        pytest.param("wrong_shape", "answer_with_citations", ErrorCode.SCHEMA_VALIDATION_FAILED, id="wrong_shape"),
        pytest.param("business_invalid", "classify", ErrorCode.BUSINESS_VALIDATION_FAILED, id="business-label"),
        pytest.param("business_invalid", "summarize", ErrorCode.BUSINESS_VALIDATION_FAILED, id="business-words"),
        pytest.param("reference_invalid", "answer_with_citations", ErrorCode.REFERENCE_VALIDATION_FAILED, id="ref"),
    ],
)
@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_an_invalid_answer_fails_the_job_after_one_repair_re_ask_paying_for_both_calls(
    kind: str,
    job_type: str,
    code: ErrorCode,
    mode: StructuredOutput,
    http_worker: WorkerFactory,
    model_server: LocalProvider,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a provider whose every answer to this prompt is invalid, re-asks included
    job_id = f"fault-{kind}-{job_type}-{mode}"
    record = enqueue(faulty_job(job_type, job_id, f"fault:{kind}"))

    # When the worker handles the job
    response = http_worker(structured_output=mode).handle(sqs_event(record), InvocationContext())

    # Then the model was asked, then re-asked with the validation error, within the one attempt
    assert [(entry.fault, entry.status, entry.repair) for entry in model_server.log] == [
        (FaultKind(kind), 200, False),
        (FaultKind(kind), 200, True),
    ]
    # And the job fails with the last answer's error, acknowledged
    assert response == {"batchItemFailures": []}
    assert queue.visibility_changes == []
    job = table.job(job_id)
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (code, False)
    assert job.attempt_count == 1
    assert job.output is None
    attempt = table.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt["outcome"], attempt["error_code"]) == ("failed", code.value)
    # And both calls' tokens are on the job and its attempt
    assert_usage_is_what_the_provider_billed(table, job_id, model_server, attempts=1)


def test_a_repairable_answer_succeeds_on_the_re_ask_paying_for_both_calls(
    http_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a provider whose first answer is of the wrong shape and whose answer to the re-ask is valid
    message = faulty_job("summarize", "fault-repairable", "fault:repairable")
    record = enqueue(message)

    # When the worker handles the job
    response = http_worker().handle(sqs_event(record), InvocationContext())

    # Then the job succeeds in one attempt with the repaired answer
    assert response == {"batchItemFailures": []}
    assert [(entry.fault, entry.status, entry.repair) for entry in model_server.log] == [
        (FaultKind.REPAIRABLE, 200, False),
        (None, 200, True),
    ]
    job = table.job("fault-repairable")
    assert job.status is JobStatus.SUCCEEDED
    assert job.attempt_count == 1
    assert job.output is not None
    assert len(job.output["summary"].split()) <= message["input"]["max_words"]
    # And the tokens of both calls are recorded
    assert_usage_is_what_the_provider_billed(table, "fault-repairable", model_server, attempts=1)


# --- any job type, in either structured output mode ------------------------------------------------


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
# (A pipeline calls no model: its steps' job types do, each of them here.)
@pytest.mark.parametrize(
    "job_type", [definition.name for definition in REGISTERED if not isinstance(definition, PipelineDefinition)]
)
def test_every_registered_job_type_gets_the_answer_its_schema_calls_for(
    job_type: str,
    mode: StructuredOutput,
    http_worker: WorkerFactory,
    model_server: LocalProvider,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job of each type, the soak's own quick classify too (a type the provider knows nothing of)
    message = job_message("classify" if job_type == QUICK_CLASSIFY.name else job_type, f"any-{job_type}-{mode}")
    record = enqueue({**message, "job_type": job_type})

    # When the worker handles it, asking for structured output in either mode
    response = http_worker(structured_output=mode).handle(sqs_event(record), InvocationContext())

    # Then one call answers it with the output computed from the schema the engine sent
    assert response == {"batchItemFailures": []}
    job = table.job(f"any-{job_type}-{mode}")
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == expected_output(job_type, message["input"], JobRegistry(REGISTERED))
    assert [(entry.status, entry.job_type, entry.repair) for entry in model_server.log] == [(200, job_type, False)]
    assert_usage_is_what_the_provider_billed(table, f"any-{job_type}-{mode}", model_server, attempts=1)
