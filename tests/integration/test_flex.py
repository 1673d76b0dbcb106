"""Flex tiers through the engine on moto: WorkerHandler.handle -> the OpenAI-compatible adapter -> HTTP ->
the local provider, flex on. What each attempt records (`via: flex`, the tier that served it, its cost
beside its standard cost), a refusal far from the deadline and near it, and interactive jobs."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from aijobs.local.provider import LocalProvider
from engine.core import ErrorCode, JobStatus
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import ACKNOWLEDGED, Enqueue, RecordingQueue, TableReader
from tests.support.events import InvocationContext, job_message, sqs_event

FLEX_MODEL = "gpt-5-mini"
API_KEY = "sk-local-test"

WorkerFactory = Callable[..., WorkerHandler]


@pytest.fixture
def model_server() -> Iterator[LocalProvider]:
    with LocalProvider(api_key=API_KEY, latency_seconds=0, flex_latency_seconds=0) as server:
        yield server


@pytest.fixture
def flex_worker(store: DynamoJobStore, queue: RecordingQueue, model_server: LocalProvider) -> Iterator[WorkerFactory]:
    """A worker with flex on (or off) whose gateway calls the local provider over real HTTP."""
    client = httpx.Client(trust_env=False)

    def build(flex: bool = True) -> WorkerHandler:
        provider = OpenAICompatibleProvider(model_server.url, static_api_key(API_KEY), client=client)
        registry = JobRegistry()
        gateway = ModelGateway(provider, ModelTiers(FLEX_MODEL))
        recorder = DeadLetterRecorder(store, registry)
        runner = JobRunner(store, gateway, registry, recorder, rng=random.Random(7), flex=flex)
        return WorkerHandler(Worker(runner), queue)

    yield build
    client.close()


def background(job_id: str, text: str = "Win a free cruise now!", **overrides: Any) -> dict[str, Any]:
    message = job_message("classify", job_id, lane="background", **overrides)
    message["input"] = {**message["input"], "text": text}
    return message


def test_a_background_job_is_served_at_the_flex_tier_for_two_requests_and_half_the_price(
    flex_worker: WorkerFactory,
    model_server: LocalProvider,
    table: TableReader,
    enqueue: Enqueue,
    dynamodb_requests: RequestCounter,
) -> None:
    record = enqueue(background("flex-ok"))
    dynamodb_requests.reset()

    response = flex_worker().handle(sqs_event(record), InvocationContext())

    # Then it succeeded with its two requests, as any job
    assert response == ACKNOWLEDGED
    assert sum(dynamodb_requests.operations.values()) == 2
    job = table.job("flex-ok")
    assert job.status is JobStatus.SUCCEEDED
    # And it asked the flex tier, which served it: the attempt says so, at half its standard cost
    assert [(entry.asked_tier, entry.service_tier) for entry in model_server.log] == [("flex", "flex")]
    attempt = table.attempt("flex-ok", 1)
    assert attempt is not None
    assert (attempt["via"], attempt["service_tier"]) == ("flex", "flex")
    assert Decimal(attempt["standard_cost_usd"]) == 2 * Decimal(attempt["cost_usd"]) > 0
    assert job.usage.standard_cost_usd == 2 * job.usage.cost_usd


def test_far_from_its_deadline_a_refused_job_waits_for_flex_its_attempt_refunded(
    flex_worker: WorkerFactory,
    model_server: LocalProvider,
    queue: RecordingQueue,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job the flex tier refuses once, with an hour to its deadline
    record = enqueue(background("flex-wait", "Win a cruise fault:flex_unavailable*1", deadline_seconds=3_600))
    worker = flex_worker()

    # When the worker handles it
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then it goes back to the queue for a later try at flex, no attempt spent, nothing paid
    assert response == {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    ((_, seconds),) = queue.visibility_changes
    assert 1 <= seconds <= 2  # the backoff of a first receive
    waiting = table.job("flex-wait")
    assert (waiting.status, waiting.attempt_count) == (JobStatus.QUEUED, 0)
    assert waiting.error is not None
    assert waiting.error.code is ErrorCode.PROVIDER_RATE_LIMITED
    refused = table.attempt("flex-wait", 1)
    assert refused is not None
    assert (refused["via"], Decimal(refused["cost_usd"]), refused.get("service_tier")) == ("flex", 0, None)

    # And when it comes back, the flex tier serves it
    assert worker.handle(sqs_event(record), InvocationContext()) == ACKNOWLEDGED
    assert table.job("flex-wait").status is JobStatus.SUCCEEDED
    assert [(entry.status, entry.asked_tier) for entry in model_server.log] == [(429, "flex"), (200, "flex")]


def test_near_its_deadline_a_refused_job_is_answered_at_the_standard_tier_in_the_same_attempt(
    flex_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    # Given a job the flex tier always refuses, five minutes from its deadline
    record = enqueue(background("flex-near", "Win a cruise fault:flex_unavailable", deadline_seconds=300))

    response = flex_worker().handle(sqs_event(record), InvocationContext())

    # Then it was asked at flex, refused, and answered at the standard tier at once
    assert response == ACKNOWLEDGED
    assert [(entry.status, entry.asked_tier, entry.service_tier) for entry in model_server.log] == [
        (429, "flex", None),
        (200, None, "default"),
    ]
    job = table.job("flex-near")
    assert (job.status, job.attempt_count) == (JobStatus.SUCCEEDED, 1)
    attempt = table.attempt("flex-near", 1)
    assert attempt is not None
    assert (attempt["via"], attempt["service_tier"], attempt["calls"]) == ("flex", "default", 2)
    assert "standard_cost_usd" not in attempt  # paid the standard price: nothing saved
    assert job.usage.standard_cost_usd == job.usage.cost_usd > 0


@pytest.mark.parametrize("flex", [True, False])
def test_an_interactive_job_never_asks_the_flex_tier(
    flex: bool, flex_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    record = enqueue(job_message("classify", f"now-{flex}", lane="interactive"))

    assert flex_worker(flex).handle(sqs_event(record), InvocationContext()) == ACKNOWLEDGED

    assert [(entry.asked_tier, entry.service_tier) for entry in model_server.log] == [(None, "default")]
    attempt = table.attempt(f"now-{flex}", 1)
    assert attempt is not None
    assert (attempt["via"], attempt["service_tier"]) == ("realtime", "default")


def test_with_flex_off_a_background_job_is_called_at_the_standard_tier(
    flex_worker: WorkerFactory, model_server: LocalProvider, table: TableReader, enqueue: Enqueue
) -> None:
    record = enqueue(background("off"))

    assert flex_worker(flex=False).handle(sqs_event(record), InvocationContext()) == ACKNOWLEDGED

    assert [entry.asked_tier for entry in model_server.log] == [None]
    assert table.job("off").usage.standard_cost_usd == table.job("off").usage.cost_usd
