"""Job types that read documents: a text or an attachment at intake, then whole jobs on the runner.

`summarize`, `classify` and `extract` take up to 20 attachments; a job of theirs needs a text that is
not empty or at least one attachment (their policy's `required_unless`). A message with neither is
refused at intake as `input_validation_failed` (the input lacks what the job reads), before anything
is claimed or read; the client refuses it the same way (tests/integration/test_submit_content.py).
The jobs then run on the in-memory store with their attachments read from a bucket in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from PIL import Image
from pypdf import PdfWriter

from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.core import Ack, ErrorCode, Fate, Job, JobStatus
from engine.core.attachments import AttachmentRef, MediaType, ObjectHead
from engine.core.errors import AttachmentInvalidError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.extract import EXTRACT, fields_schema
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.intake import BadMessageError, parse_message
from engine.runner import JobRunner
from engine.testing import InMemoryJobStore
from tests.support.events import job_message
from tests.support.providers import VALID_OUTPUTS, FakeProvider
from tests.unit.test_runner_decisions import Clock, delivery

BUCKET = "aijobs-payloads"
INVOICE_FIELDS = [
    {"name": "invoice_number", "description": "as printed", "type": "string"},
    {"name": "total", "description": "the amount due", "type": "number"},
    {"name": "due", "description": "when it is due", "type": "date"},
]
EXTRACTED = {"invoice_number": "4711", "total": 120.5, "due": "2026-01-31"}


def pdf_bytes() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=612, height=792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 32), "white").save(out, "PNG")
    return out.getvalue()


OBJECTS = {
    "in/invoice.pdf": pdf_bytes(),
    "in/scan.png": png_bytes(),
    "in/notes.txt": b"Invoice 4711, EUR 120.50, due 2026-01-31.",
}


class BucketInMemory:
    """AttachmentObjects over a dict of keys and bytes, counting what it is asked."""

    def __init__(self, objects: Mapping[str, bytes]) -> None:
        self.objects = dict(objects)
        self.heads: list[str] = []
        self.reads: list[str] = []

    def head(self, ref: AttachmentRef) -> ObjectHead:
        self.heads.append(ref.key)
        data = self.objects.get(ref.key)
        if ref.bucket != BUCKET or data is None:
            raise AttachmentInvalidError(f"attachment {ref.label}: the object is gone")
        return ObjectHead(len(data), hashlib.sha256(data).hexdigest())

    def read(self, ref: AttachmentRef, head: ObjectHead) -> bytes:
        self.reads.append(ref.key)
        return self.objects[ref.key]


def attached(*keys: str) -> list[dict[str, str]]:
    return [{"s3": f"s3://{BUCKET}/{key}", "name": key.rsplit("/", 1)[-1]} for key in keys]


def answers(request: CompletionRequest) -> dict[str, Any]:
    return EXTRACTED if request.schema_name == "extract" else VALID_OUTPUTS[request.schema_name]


@dataclass
class Documents:
    """A worker's world for these tests: the store and the bucket in memory, a clock the test moves."""

    store: InMemoryJobStore = field(default_factory=InMemoryJobStore)
    bucket: BucketInMemory = field(default_factory=lambda: BucketInMemory(OBJECTS))
    clock: Clock = field(default_factory=Clock)

    def runner(self, provider: FakeProvider) -> JobRunner:
        registry = JobRegistry()
        return JobRunner(
            self.store,
            ModelGateway(provider, ModelTiers("gpt-4o-mini")),
            registry,
            DeadLetterRecorder(self.store, registry, clock=self.clock),
            clock=self.clock,
            rng=random.Random(7),
            attachments=AttachmentLoader(self.bucket, [BUCKET], OPENAI),
        )


@pytest.fixture
def world() -> Documents:
    return Documents()


@pytest.fixture
def store(world: Documents) -> InMemoryJobStore:
    return world.store


@pytest.fixture
def bucket(world: Documents) -> BucketInMemory:
    return world.bucket


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(answers)


@pytest.fixture
def runner(world: Documents, provider: FakeProvider) -> JobRunner:
    return world.runner(provider)


def message(job_type: str, job_input: dict[str, Any], *keys: str, job_id: str = "doc-1") -> dict[str, Any]:
    body: dict[str, Any] = {"job_id": job_id, "job_type": job_type, "user_id": "user-1", "input": job_input}
    if keys:
        body["attachments"] = attached(*keys)
    return body


def job_of(store: InMemoryJobStore, job_id: str = "doc-1") -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


# --- at intake: a text or an attachment ----------------------------------------------------------

NOTHING_TO_READ = [
    ("summarize", {"text": "", "max_words": 20}),
    ("classify", {"text": "", "labels": ["invoice", "receipt"]}),
    ("extract", {"fields": INVOICE_FIELDS}),
    ("extract", {"fields": INVOICE_FIELDS, "text": ""}),
    ("extract", {"fields": INVOICE_FIELDS, "text": None, "instructions": "Amounts in euros."}),
]


@pytest.mark.parametrize(("job_type", "job_input"), NOTHING_TO_READ)
def test_a_message_with_neither_a_text_nor_an_attachment_is_refused_as_its_input(
    job_type: str, job_input: dict[str, Any], registry: JobRegistry
) -> None:
    with pytest.raises(BadMessageError) as caught:
        parse_message(json.dumps(message(job_type, job_input)), "m-1", registry)

    # The message names its job, so the job is recorded failed under it; the reason is one line
    assert caught.value.job_id == "doc-1"
    assert caught.value.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert caught.value.error.message == (
        f"input.text: {job_type} needs a text or at least one attachment, and has neither"
    )


@pytest.mark.parametrize(("job_type", "job_input"), NOTHING_TO_READ)
def test_one_attachment_is_enough_to_read(job_type: str, job_input: dict[str, Any], registry: JobRegistry) -> None:
    request = parse_message(json.dumps(message(job_type, job_input, "in/invoice.pdf")), "m-1", registry)

    assert request.new_job is not None
    assert [ref.uri for ref in request.new_job.attachments] == [f"s3://{BUCKET}/in/invoice.pdf"]


@pytest.mark.parametrize(
    ("job_type", "job_input"),
    [
        ("summarize", {"text": "x", "max_words": 20}),
        ("classify", {"text": " ", "labels": ["invoice", "receipt"]}),
        ("extract", {"fields": INVOICE_FIELDS, "text": "Invoice 4711"}),
    ],
)
def test_a_text_is_enough_to_read(job_type: str, job_input: dict[str, Any], registry: JobRegistry) -> None:
    request = parse_message(json.dumps(message(job_type, job_input)), "m-1", registry)

    assert request.new_job is not None
    assert request.new_job.attachments == ()


def test_a_job_type_that_takes_no_attachments_refuses_a_message_naming_one(registry: JobRegistry) -> None:
    body = job_message("answer_with_citations", "doc-1", attachments=attached("in/invoice.pdf"))

    with pytest.raises(BadMessageError) as caught:
        parse_message(json.dumps(body), "m-1", registry)

    assert caught.value.error.code is ErrorCode.ATTACHMENT_INVALID
    assert caught.value.error.message == "answer_with_citations takes no attachments; the message names 1"


# --- whole jobs on the runner --------------------------------------------------------------------


def test_an_extract_job_of_a_pdf_and_a_scan_is_answered_with_the_fields_asked(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, bucket: BucketInMemory
) -> None:
    # Given an extract job with no text, a PDF and a PNG attached
    body = message("extract", {"fields": INVOICE_FIELDS}, "in/invoice.pdf", "in/scan.png")

    # When the runner processes it
    disposition = runner.process(delivery(body))

    # Then it succeeded with the fields extracted, after one call
    assert disposition == Ack(Fate.SUCCEEDED)
    job = job_of(store)
    assert (job.status, job.output) == (JobStatus.SUCCEEDED, EXTRACTED)
    assert provider.calls == 1
    # And the call carried both attachments after the attachments' prompt, and the schema of the fields
    (request,) = provider.requests
    assert [attachment.media_type for attachment in request.attachments] == [MediaType.PDF, MediaType.PNG]
    assert request.user.startswith("Instructions: null\n\nExtract these fields from the attachments that follow")
    assert request.user.endswith("Text: null")
    assert request.output_schema == fields_schema(EXTRACT.parse_input({"fields": INVOICE_FIELDS}))  # type: ignore[arg-type]
    assert request.cache_key == "extract:attachments-1"
    # And the attempt names that prompt; the job keeps what was read of each attachment
    (attempt,) = store.attempts("doc-1")
    assert (attempt.prompt_key, attempt.prompt_version) == ("extract", "attachments-1")
    assert [(info.media_type, info.pages, info.width) for info in job.attachments_read] == [
        (MediaType.PDF, 1, None),
        (MediaType.PNG, None, 64),
    ]
    assert (bucket.heads, bucket.reads) == (["in/invoice.pdf", "in/scan.png"], ["in/invoice.pdf", "in/scan.png"])


def test_an_extract_answer_missing_a_field_is_asked_again_with_the_attachments(
    world: Documents, store: InMemoryJobStore
) -> None:
    # Given a model whose first answer lacks the due date
    replies = iter([{"invoice_number": "4711", "total": 120.5}, EXTRACTED])
    provider = FakeProvider(lambda request: next(replies))

    world.runner(provider).process(
        delivery(message("extract", {"fields": INVOICE_FIELDS, "text": "see the scan"}, "in/scan.png"))
    )

    # Then the re-ask names the field, resends the scan, and the second answer is the output
    assert job_of(store).output == EXTRACTED
    first, second = provider.requests
    assert "output.due: Field required" in second.conversation[-1].content
    assert second.attachments == first.attachments
    assert len(second.attachments) == 1


def test_a_summary_of_a_text_attachment_with_an_empty_text_is_the_jobs_output(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore
) -> None:
    runner.process(delivery(message("summarize", {"text": "", "max_words": 20}, "in/notes.txt")))

    assert job_of(store).output == VALID_OUTPUTS["summarize"]
    (request,) = provider.requests
    assert request.user == (
        'Summarize the attachments that follow, and the text when it is not empty, in at most 20 words.\n\nText: ""'
    )
    assert [attachment.media_type for attachment in request.attachments] == [MediaType.TEXT]


def test_a_text_only_classify_job_asks_with_the_prompt_it_always_had(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, bucket: BucketInMemory
) -> None:
    runner.process(delivery(job_message("classify", "doc-1")))

    assert job_of(store).status is JobStatus.SUCCEEDED
    (request,) = provider.requests
    assert (request.attachments, request.cache_key) == ((), "classify:2")
    assert (store.attempts("doc-1")[0].prompt_version, bucket.heads) == ("2", [])


def test_an_extract_job_with_nothing_to_read_fails_before_any_read_or_call(
    runner: JobRunner, provider: FakeProvider, store: InMemoryJobStore, bucket: BucketInMemory
) -> None:
    disposition = runner.process(delivery(message("extract", {"fields": INVOICE_FIELDS})))

    assert disposition == Ack(Fate.FAILED)
    job = job_of(store)
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.INPUT_VALIDATION_FAILED, False)
    assert (provider.calls, bucket.heads, bucket.reads) == (0, [], [])
