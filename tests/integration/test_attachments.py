"""Jobs with attachments through the worker handler on moto: read from the payload bucket and from an allowed
other bucket by engine.store.attachments.S3Attachments, what was read written on the job's item, two
DynamoDB requests a successful job; a bucket not allowed fails attachment_invalid with no S3 read, and
an object deleted after the first attempt fails the retry the same way."""

from __future__ import annotations

import random
from typing import Any

import boto3
import pytest

from aijobs.stack import StackResources
from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.aws_errors import is_transient
from engine.core import ErrorCode, JobStatus
from engine.core.attachments import MediaType
from engine.core.errors import ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.queue import JobQueue
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.attachments import S3Attachments
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader
from tests.support.attachment_files import READ_FILES, image, pdf
from tests.support.events import InvocationContext, sqs_event, sqs_record
from tests.support.providers import FakeProvider

OTHER, FOREIGN = "aijobs-test-scans", "aijobs-test-foreign"
ANSWER = {"summary": "An invoice of 4711 EUR."}


class S3Calls:
    def __init__(self) -> None:
        self.operations: list[str] = []

    def __call__(self, event_name: str, **_: Any) -> None:
        self.operations.append(event_name.rsplit(".", 1)[-1])


class Stack:
    def __init__(self, stack: StackResources, store: DynamoJobStore, sqs: Any, provider: FakeProvider) -> None:
        self.s3: Any = boto3.client("s3")
        for bucket in (OTHER, FOREIGN):
            self.s3.create_bucket(Bucket=bucket)
        self.s3_calls = S3Calls()
        self.s3.meta.events.register("before-call.s3.*", self.s3_calls)
        self.payload_bucket = stack.payload_bucket
        registry = JobRegistry()
        registry.register(READ_FILES)
        loader = AttachmentLoader(S3Attachments(lambda: self.s3), [stack.payload_bucket, OTHER], OPENAI)
        runner = JobRunner(
            store,
            ModelGateway(provider, ModelTiers("gpt-4o-mini")),
            registry,
            DeadLetterRecorder(store, registry),
            rng=random.Random(7),
            is_transient=is_transient,
            attachments=loader,
        )
        self.worker = WorkerHandler(Worker(runner), JobQueue(stack.queue_url, client=sqs))

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.s3.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def handle(self, job_id: str, uris: list[str], receive_count: int = 1) -> dict[str, Any]:
        message = {
            "job_id": job_id,
            "job_type": READ_FILES.name,
            "user_id": "user-1",
            "input": {"question": "What is due?"},
            "attachments": [{"s3": uri} for uri in uris],
        }
        self.s3_calls.operations.clear()
        record = sqs_record(message, receive_count=receive_count)
        response: dict[str, Any] = self.worker.handle(sqs_event(record), InvocationContext())
        return response


@pytest.fixture
def world(stack: StackResources, store: DynamoJobStore, sqs: Any, provider: FakeProvider) -> Stack:
    provider.script = lambda _request: ANSWER
    return Stack(stack, store, sqs, provider)


def test_a_job_reads_attachments_from_the_payload_bucket_and_another_with_two_dynamodb_requests(
    world: Stack, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    document, scan = pdf(2, "Invoice 4711"), image(MediaType.PNG, 64, 48)
    uris = [world.put(world.payload_bucket, "attachments/j/invoice.pdf", document), world.put(OTHER, "scan.png", scan)]
    dynamodb_requests.reset()

    response = world.handle("att-ok", uris)

    assert response == {"batchItemFailures": []}
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "TransactWriteItems": 1}
    assert world.s3_calls.operations == ["HeadObject", "HeadObject", "GetObject", "GetObject"]
    job = table.job("att-ok")
    assert job.status is JobStatus.SUCCEEDED
    assert job.output == ANSWER
    item = table.job_item("att-ok")
    assert item is not None
    assert [(read["bytes"], read.get("pages"), read.get("width")) for read in item["attachments_read"]] == [
        (len(document), 2, None),
        (len(scan), None, 64),
    ]
    [request] = provider.requests
    assert [attachment.data for attachment in request.attachments] == [document, scan]


def test_a_bucket_not_allowed_fails_attachment_invalid_with_no_s3_read(
    world: Stack, provider: FakeProvider, table: TableReader
) -> None:
    uri = world.put(FOREIGN, "secret.pdf", pdf())

    assert world.handle("att-foreign", [uri]) == {"batchItemFailures": []}

    job = table.job("att-foreign")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code is ErrorCode.ATTACHMENT_INVALID
    assert job.error.message.startswith("attachment secret.pdf: bucket aijobs-test-foreign is not one this stack reads")
    assert world.s3_calls.operations == []
    assert provider.calls == 0


def test_an_object_deleted_after_the_first_attempt_fails_the_retry_attachment_invalid(
    world: Stack, provider: FakeProvider, table: TableReader
) -> None:
    answers = iter([ProviderUnavailableError("try again")])

    def flaky(_request: CompletionRequest) -> Any:
        return next(answers, ANSWER)

    provider.script = flaky
    uri = world.put(world.payload_bucket, "attachments/j/invoice.pdf", pdf(1))
    first = world.handle("att-gone", [uri])
    assert len(first["batchItemFailures"]) == 1  # tried again later
    world.s3.delete_object(Bucket=world.payload_bucket, Key="attachments/j/invoice.pdf")

    assert world.handle("att-gone", [uri], receive_count=2) == {"batchItemFailures": []}

    job = table.job("att-gone")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.message) == (
        ErrorCode.ATTACHMENT_INVALID,
        f"attachment invoice.pdf: {uri} is gone",
    )
    assert world.s3_calls.operations == ["HeadObject"]
    assert provider.calls == 1
