"""Integration fixtures: the engine on moto (fitted: linearizable), a recording queue, real SQS
deliveries, and a reader that inspects the table without adding to the request counts."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from aijobs.client import AiJobsClient
from aijobs.local.provider import LocalProvider
from aijobs.stack import StackResources
from engine.aws_errors import is_transient
from engine.config import Settings, load_settings
from engine.core import Job, NewJob
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import ModelGateway, ModelTiers
from engine.queue import JobQueue
from engine.runner import JobRunner
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.store.items import INPUT_SK, OPEN_SHARDS, attempt_sk, dead_letter_key, from_item, job_key, open_shard_key
from engine.store.open_jobs import OPEN_JOBS_INDEX
from engine.store.payloads import PayloadStore
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.support.events import new_job_for, sqs_record
from tests.support.providers import FakeProvider

MODEL = "gpt-4o-mini"


class RecordingQueue(JobQueue):
    """The real JobQueue, remembering every visibility change and whether SQS accepted it."""

    def __init__(self, queue_url: str, client: Any) -> None:
        super().__init__(queue_url, client=client)
        self.visibility_changes: list[tuple[str, int]] = []
        self.refused: list[str] = []

    def change_visibility(self, receipt_handle: str, seconds: int) -> None:
        self.visibility_changes.append((receipt_handle, seconds))
        try:
            super().change_visibility(receipt_handle, seconds)
        except Exception as exc:
            self.refused.append(f"{type(exc).__name__}: {exc}")
            raise


class TableReader:
    """Reads the jobs table through a client of its own, so reads never count as engine requests."""

    def __init__(self, table_name: str) -> None:
        self.table_name = table_name
        self.client = boto3.client("dynamodb")
        self._store = DynamoJobStore(table_name, client=self.client)

    def job(self, job_id: str) -> Job:
        job = self._store.get_job(job_id)
        assert job is not None, f"job {job_id} does not exist"
        return job

    def item(self, key: dict[str, Any]) -> dict[str, Any] | None:
        item = self.client.get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")
        return from_item(item) if item else None

    def job_item(self, job_id: str) -> dict[str, Any] | None:
        return self.item(job_key(job_id))

    def input_item(self, job_id: str) -> dict[str, Any] | None:
        return self.item(job_key(job_id, INPUT_SK))

    def attempt(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        return self.item(job_key(job_id, attempt_sk(attempt)))

    def dead_letter(self, message_id: str) -> dict[str, Any] | None:
        return self.item(dead_letter_key(message_id))

    def snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every item of the table, keyed by (pk, sk)."""
        items: dict[tuple[str, str], dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        for _ in range(100):  # bounded: the tests' tables hold a few dozen items
            page = self.client.scan(**kwargs)
            for raw in page.get("Items", []):
                item = from_item(raw)
                items[(item["pk"], item["sk"])] = item
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        raise AssertionError("the table did not fit in 100 scan pages")


@pytest.fixture
def queue(stack: StackResources, sqs: Any) -> RecordingQueue:
    return RecordingQueue(stack.queue_url, sqs)


@pytest.fixture
def worker(runner: JobRunner, queue: RecordingQueue) -> WorkerHandler:
    return WorkerHandler(Worker(runner), queue)


@pytest.fixture
def table(stack: StackResources) -> TableReader:
    return TableReader(stack.table_name)


WorkerFactory = Callable[..., WorkerHandler]


@pytest.fixture
def make_worker(
    stack: StackResources,
    dynamodb: Any,
    provider: FakeProvider,
    registry: JobRegistry,
    queue: RecordingQueue,
    payloads: PayloadStore,
) -> WorkerFactory:
    """A worker of its own: its own store on the shared (counted) client, a clock, a provider."""

    def build(clock: Callable[[], float] = time.time, fake: FakeProvider | None = None) -> WorkerHandler:
        store = DynamoJobStore(stack.table_name, client=dynamodb, payloads=payloads)
        gateway = ModelGateway(fake or provider, ModelTiers(MODEL))
        recorder = DeadLetterRecorder(store, registry, clock=clock)
        runner = JobRunner(
            store, gateway, registry, recorder, clock=clock, rng=random.Random(7), is_transient=is_transient
        )
        return WorkerHandler(Worker(runner), queue, clock=clock)

    return build


# What a test's `enqueue` fixture is, and the batch response of a batch with nothing to retry.
Enqueue = Callable[[Any], dict[str, Any]]
ACKNOWLEDGED: dict[str, Any] = {"batchItemFailures": []}


@pytest.fixture
def enqueue(stack: StackResources, sqs: Any) -> Enqueue:
    """Send a body to the jobs queue and receive it: an SQS record with a real receipt handle."""

    def send_and_receive(body: Any) -> dict[str, Any]:
        record = sqs_record(body)
        sqs.send_message(QueueUrl=stack.queue_url, MessageBody=record["body"])
        received = sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=0)
        (message,) = received["Messages"]
        return sqs_record(message["Body"], message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"])

    return send_and_receive


@pytest.fixture
def new_job() -> Callable[..., NewJob]:
    return new_job_for


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def clock_ms() -> Callable[[], int]:
    return now_ms


# --- reliability: cancel, retry, dead letters, reconciler, takeover ------------------------------


@pytest.fixture
def side_store(table: TableReader, payloads: PayloadStore) -> DynamoJobStore:
    """Another process's store (the CLI, a dead worker) on the reader's client: its requests are not counted."""
    return DynamoJobStore(table.table_name, client=table.client, payloads=payloads)


@pytest.fixture
def jobs_client(
    store: DynamoJobStore, queue: RecordingQueue, registry: JobRegistry, stack: StackResources, dynamodb: Any
) -> AiJobsClient:
    """The client API on the fixtures' store (its requests counted) and the moto jobs queue."""
    listing, ledger = JobListing(stack.table_name, dynamodb), UsageLedger(stack.table_name, dynamodb)
    return AiJobsClient(store, queue, registry, listing=listing, ledger=ledger)


def open_job_ids(table: TableReader) -> set[str]:
    """The job ids in the OpenJobs index, read the way the reconciler reads it (every shard)."""
    ids: set[str] = set()
    for shard in range(OPEN_SHARDS):
        response = table.client.query(
            TableName=table.table_name,
            IndexName=OPEN_JOBS_INDEX,
            KeyConditionExpression="open_shard = :shard",
            ExpressionAttributeValues={":shard": {"S": open_shard_key(shard)}},
        )
        ids.update(item["pk"]["S"].removeprefix("JOB#") for item in response.get("Items", []))
    return ids


def queued_messages(sqs: Any, queue_url: str) -> list[tuple[Any, str | None]]:
    """(body, MessageGroupId) of the messages visible on a queue now (received, so hidden after)."""
    messages: list[tuple[Any, str | None]] = []
    for _ in range(10):  # bounded: the tests send a handful
        received = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageSystemAttributeNames=["All"]
        )
        batch = received.get("Messages", [])
        if not batch:
            return messages
        messages.extend((json.loads(m["Body"]), m.get("Attributes", {}).get("MessageGroupId")) for m in batch)
    raise AssertionError("the queue held more messages than expected")


def queued_bodies(sqs: Any, queue_url: str) -> list[Any]:
    """The bodies of the messages visible on a queue now (received, so they are hidden after)."""
    return [body for body, _ in queued_messages(sqs, queue_url)]


@pytest.fixture
def lambda_environment(stack: StackResources, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The environment a function reads its settings from: the stack's table, queues and bucket."""
    for name, value in stack.environment().items():
        monkeypatch.setenv(name, value)
    for name in ("AIJOBS_JOB_MODULES", "AIJOBS_PRICES", "LAMBDA_TASK_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return load_settings()


@pytest.fixture
def local_provider() -> Iterator[LocalProvider]:
    """The local provider over HTTP, answering batches a fifth of a second after they are created."""
    provider = LocalProvider(api_key="k", latency_seconds=0.0, batch_delay_seconds=0.2).start()
    yield provider
    provider.stop()
