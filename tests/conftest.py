"""Shared fixtures: AWS credentials that go nowhere, the stack from template.yaml on moto, runners."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from aijobs.local.moto_patches import fit_moto
from aijobs.stack import StackResources, create_stack_resources
from engine.aws_errors import is_transient
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import ModelGateway, ModelTiers
from engine.queue import JobQueue
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.payloads import PayloadStore
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.support.providers import FakeProvider

# moto as the tests, the soak and the embedded stack all run it: linearizable, with cheap transactions.
fit_moto()

# How the reason begins when tests/ui skips for want of a browser: a run that skipped them ends saying so.
BROWSERLESS = "browser tests not run:"
TESTS = Path(__file__).resolve().parent


# The tiers, one a directory of tests/ and a marker each (pyproject.toml): `pytest -m unit` runs one.
TIERS = ("unit", "contract", "integration", "e2e", "ui")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the directory it is in."""
    for item in items:
        parts = item.path.relative_to(TESTS).parts
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the summary's last line (where a terminal summary hook would come before it): one line when
    the browser tests were skipped, with the reason tests/ui gave (which Chromium it looked for)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        return
    reasons = {_skip_reason(report) for report in reporter.stats.get("skipped", [])}
    for reason in sorted(reason for reason in reasons if reason.startswith(BROWSERLESS)):
        reporter.write_line(reason.split("; ")[0], yellow=True, bold=True)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else ""


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def stack() -> Iterator[StackResources]:
    """The template's table and queues, created from template.yaml's own properties on moto."""
    with mock_aws():
        yield create_stack_resources()


class RequestCounter:
    """Counts the DynamoDB requests a client sends (a botocore event hook)."""

    def __init__(self) -> None:
        self.operations: Counter[str] = Counter()

    def __call__(self, event_name: str, **_: Any) -> None:
        self.operations[event_name.rsplit(".", 1)[-1]] += 1

    @property
    def total(self) -> int:
        return sum(self.operations.values())

    def reset(self) -> None:
        self.operations.clear()


@pytest.fixture
def dynamodb(stack: StackResources) -> Any:
    return boto3.client("dynamodb")


@pytest.fixture
def sqs(stack: StackResources) -> Any:
    return boto3.client("sqs")


@pytest.fixture
def dynamodb_requests(dynamodb: Any) -> RequestCounter:
    counter = RequestCounter()
    dynamodb.meta.events.register("before-call.dynamodb.*", counter)
    return counter


@pytest.fixture
def payloads(stack: StackResources) -> PayloadStore:
    s3 = boto3.client("s3")
    return PayloadStore(stack.payload_bucket, lambda: s3)


@pytest.fixture
def store(stack: StackResources, dynamodb: Any, payloads: PayloadStore) -> DynamoJobStore:
    return DynamoJobStore(stack.table_name, client=dynamodb, payloads=payloads)


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
def runner(store: DynamoJobStore, provider: FakeProvider, registry: JobRegistry) -> JobRunner:
    gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini"))
    recorder = DeadLetterRecorder(store, registry)
    return JobRunner(store, gateway, registry, recorder, rng=random.Random(7), is_transient=is_transient)


@pytest.fixture
def worker(runner: JobRunner, stack: StackResources, sqs: Any) -> WorkerHandler:
    return WorkerHandler(Worker(runner), JobQueue(stack.queue_url, client=sqs))
