"""`AiJobsClient.submit(attachments=...)` on moto with the template's bucket and table: the uploads, the
requests they cost, a resubmission that changes nothing, a conflicting one that changes nothing either,
a refusal that writes nothing, and the worker reading what was uploaded."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

from aijobs.attachments import AttachmentBucket, NamedAttachment, SizeLimits
from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.aws_errors import is_transient
from engine.core import Delivery, JobStatus
from engine.core.attachments import MediaType
from engine.core.errors import InputValidationError, JobConflictError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.registry import BUILTIN_DEFINITIONS
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.runner import JobRunner
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.store.attachments import S3Attachments
from engine.store.payloads import PayloadStore
from tests.integration.conftest import RecordingQueue, TableReader, queued_bodies
from tests.support.documents import JOB_DEFINITIONS, image, pdf
from tests.support.providers import FakeProvider

QUESTION = {"question": "What is the total?"}


class Requests:
    """The AWS requests of the client's own clients, by "<service> <Operation>"."""

    def __init__(self) -> None:
        self.counted: Counter[str] = Counter()

    def watch(self, client: Any) -> Any:
        client.meta.events.register(
            "before-call.*.*", lambda event_name, **_: self.counted.update([" ".join(event_name.split(".")[1:3])])
        )
        return client

    def take(self) -> dict[str, int]:
        taken = dict(self.counted)
        self.counted.clear()
        return taken


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry([*BUILTIN_DEFINITIONS, *JOB_DEFINITIONS])


@pytest.fixture
def requests() -> Requests:
    return Requests()


@pytest.fixture
def s3(stack: StackResources) -> Any:
    return boto3.client("s3")


@pytest.fixture
def client(
    stack: StackResources, dynamodb: Any, sqs: Any, registry: JobRegistry, requests: Requests, s3: Any
) -> AiJobsClient:
    """The client as from_settings builds it, on clients of its own whose requests are counted."""
    own_dynamodb, own_sqs, own_s3 = (requests.watch(boto3.client(name)) for name in ("dynamodb", "sqs", "s3"))
    store = DynamoJobStore(stack.table_name, client=own_dynamodb)
    return AiJobsClient(
        store,
        RecordingQueue(stack.queue_url, own_sqs),
        registry,
        listing=JobListing(stack.table_name, own_dynamodb),
        ledger=UsageLedger(stack.table_name, own_dynamodb),
        attachments=AttachmentBucket.connected(stack.payload_bucket, lambda: own_s3, SizeLimits.of()),
    )


def objects(s3: Any, bucket: str) -> dict[str, dict[str, Any]]:
    """Every object under attachments/: its bytes, content type and ETag, by key."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="attachments/").get("Contents", [])
    found = {}
    for item in listed:
        got = s3.get_object(Bucket=bucket, Key=item["Key"])
        found[item["Key"]] = {"data": got["Body"].read(), "type": got["ContentType"], "etag": got["ETag"]}
    return found


def test_local_attachments_are_uploaded_before_the_job_at_a_put_each(
    client: AiJobsClient, requests: Requests, stack: StackResources, table: TableReader, s3: Any, tmp_path: Path
) -> None:
    # Given a job without attachments, for the requests a submission costs
    client.submit("summarize", "u-1", {"text": "SQS delivers at least once.", "max_words": 10}, job_id="plain")
    usual = requests.take()
    invoice = tmp_path / "invoice.pdf"
    invoice.write_bytes(pdf(2))

    # When a job is submitted with a file, bytes with a name, and an object already in the bucket
    s3.put_object(Bucket=stack.payload_bucket, Key="inbox/receipt.jpg", Body=image(kind="JPEG"))
    result = client.submit(
        "read_documents",
        "u-1",
        QUESTION,
        job_id="with-files",
        attachments=[invoice, NamedAttachment(image(), "photo.png"), f"s3://{stack.payload_bucket}/inbox/receipt.jpg"],
    )

    # Then it costs the usual requests and one PutObject for each local attachment
    assert (result.created, result.status) == (True, JobStatus.QUEUED)
    assert requests.take() == usual | {"s3 PutObject": 2}
    # and the job names the three, its uploads kept under attachments/<job id>/ with their content and type
    job = table.job("with-files")
    uploaded = objects(s3, stack.payload_bucket)
    assert [ref.label for ref in job.attachments] == ["invoice.pdf", "photo.png", "receipt.jpg"]
    first, second, third = job.attachments
    assert uploaded[first.key]["data"] == invoice.read_bytes()
    assert (uploaded[first.key]["type"], uploaded[second.key]["type"]) == ("application/pdf", "image/png")
    assert sorted(uploaded) == sorted([first.key, second.key])
    assert first.key.startswith("attachments/with-files/1-")
    assert second.key.startswith("attachments/with-files/2-")
    assert third.uri == f"s3://{stack.payload_bucket}/inbox/receipt.jpg"
    # and the view lists them, not read yet
    view = client.get("with-files")
    assert [(a.name, a.s3, a.media_type) for a in view.attachments] == [
        ("invoice.pdf", first.uri, None),
        ("photo.png", second.uri, None),
        ("receipt.jpg", third.uri, None),
    ]


def test_a_resubmission_with_the_same_files_is_the_same_job_and_replaces_no_object(
    client: AiJobsClient, requests: Requests, stack: StackResources, sqs: Any, s3: Any, tmp_path: Path
) -> None:
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(pdf(1))
    client.submit("read_documents", "u-1", QUESTION, job_id="again", attachments=[scan])
    before = objects(s3, stack.payload_bucket)
    requests.take()

    # When the same job is submitted again with the same file
    again = client.submit("read_documents", "u-1", QUESTION, job_id="again", attachments=[scan])

    # Then it is the same job (its request hash matches), and its object was not written again
    assert (again.created, again.status) == (False, JobStatus.QUEUED)
    assert objects(s3, stack.payload_bucket) == before
    assert requests.take()["s3 PutObject"] == 1  # refused by If-None-Match: the key holds it already
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "again"}, {"job_id": "again"}]


def test_the_same_job_id_with_another_file_is_a_conflict_and_the_first_file_stays(
    client: AiJobsClient, stack: StackResources, table: TableReader, s3: Any, tmp_path: Path
) -> None:
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(pdf(1))
    client.submit("read_documents", "u-1", QUESTION, job_id="taken", attachments=[scan])
    (ref,) = table.job("taken").attachments

    # When the same id is submitted with other content under the same name
    scan.write_bytes(pdf(4))
    with pytest.raises(JobConflictError):
        client.submit("read_documents", "u-1", QUESTION, job_id="taken", attachments=[scan])

    # Then the job still names its own file, whose object is as it was
    assert table.job("taken").attachments == (ref,)
    assert s3.get_object(Bucket=stack.payload_bucket, Key=ref.key)["Body"].read() == pdf(1)


def test_a_refused_attachment_writes_nothing(
    client: AiJobsClient, requests: Requests, stack: StackResources, s3: Any, tmp_path: Path
) -> None:
    # Given a good PDF, then a Word file
    good = tmp_path / "good.pdf"
    good.write_bytes(pdf(1))
    docx = tmp_path / "invoice.docx"
    docx.write_bytes(b"PK\x03\x04" + bytes(range(256)))

    # When both are attached
    with pytest.raises(InputValidationError) as refused:
        client.submit("read_documents", "u-1", QUESTION, job_id="refused", attachments=[good, docx])

    # Then the refusal names the Word file, and nothing was uploaded, written or sent
    assert str(refused.value) == f"attachments {docx}: not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"
    assert requests.take() == {}
    assert objects(s3, stack.payload_bucket) == {}


def test_the_worker_reads_what_the_client_uploaded(
    client: AiJobsClient, stack: StackResources, store: DynamoJobStore, registry: JobRegistry, tmp_path: Path
) -> None:
    # Given a job submitted with a PDF file and a PNG as bytes
    invoice = tmp_path / "invoice.pdf"
    invoice.write_bytes(pdf(3))
    client.submit("read_documents", "u-1", QUESTION, job_id="read", attachments=[invoice, image(640, 480)])
    # and a worker's runner that reads the payload bucket
    sent: list[CompletionRequest] = []
    provider = FakeProvider(lambda request: sent.append(request) or {"answer": "42 EUR"})
    s3 = boto3.client("s3")
    loader = AttachmentLoader(S3Attachments(lambda: s3), {stack.payload_bucket}, OPENAI)
    runner = JobRunner(
        store,
        ModelGateway(provider, ModelTiers("gpt-4o-mini")),
        registry,
        DeadLetterRecorder(store, registry),
        rng=random.Random(7),
        is_transient=is_transient,
        attachments=loader,
    )

    # When it runs the job
    runner.process(Delivery("m-1", json.dumps({"job_id": "read"})))

    # Then the provider was sent both, and the view says what was read of each
    view = client.get("read")
    assert view.status is JobStatus.SUCCEEDED
    (request,) = sent
    assert [attachment.data for attachment in request.attachments] == [invoice.read_bytes(), image(640, 480)]
    pdf_view, png_view = view.attachments
    assert (pdf_view.name, pdf_view.media_type, pdf_view.pages, pdf_view.bytes) == (
        "invoice.pdf",
        MediaType.PDF,
        3,
        len(pdf(3)),
    )
    assert (png_view.name, png_view.media_type, png_view.width, png_view.height) == (
        "attachment-2.png",
        MediaType.PNG,
        640,
        480,
    )


def test_put_new_never_replaces_an_object(payloads: PayloadStore, stack: StackResources, s3: Any) -> None:
    # Given an object a worker may be reading
    assert payloads.put_new("attachments/j/1-x/a.pdf", b"first", "application/pdf")
    etag = s3.head_object(Bucket=stack.payload_bucket, Key="attachments/j/1-x/a.pdf")["ETag"]

    # When the key is written again, with other bytes
    written = payloads.put_new("attachments/j/1-x/a.pdf", b"second", "application/pdf")

    # Then nothing was written: the object, and its version, are as they were
    assert written is False
    got = s3.get_object(Bucket=stack.payload_bucket, Key="attachments/j/1-x/a.pdf")
    assert (got["Body"].read(), got["ETag"]) == (b"first", etag)
