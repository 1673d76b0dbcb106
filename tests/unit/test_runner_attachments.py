"""Jobs with attachments through the runner, on the in-memory store and engine.testing.MemoryAttachments:
whatever bytes a job names (arbitrary, cut short, a header claiming any size, encrypted), it either
runs or ends failed / attachment_invalid at its first claim with no provider call, never a crash and
never a retry; an object gone at a retry fails the retry; what was read is on the job.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.attachments.inspection import inspect
from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.core import ErrorCode, Fate, Job, JobStatus
from engine.core.attachments import AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.runner import JobRunner
from engine.testing import InMemoryJobStore, MemoryAttachments
from tests.support.attachment_files import READ_FILES, encrypted, image, pdf, png_header
from tests.support.providers import FakeProvider
from tests.unit.test_runner_decisions import Clock, delivery

PAYLOADS, OTHER = "payloads", "scans"
ANSWER = {"summary": "An invoice of 4711 EUR."}


def answer(_: CompletionRequest) -> dict[str, Any]:
    return ANSWER


class World:
    """A worker's world: the store and the buckets in memory, the provider counting its calls."""

    def __init__(self, provider: FakeProvider | None = None) -> None:
        self.store = InMemoryJobStore()
        self.objects = MemoryAttachments()
        self.provider = provider or FakeProvider(answer)
        self.clock = Clock()
        registry = JobRegistry()
        registry.register(READ_FILES)
        self.runner = JobRunner(
            self.store,
            ModelGateway(self.provider, ModelTiers("gpt-4o-mini")),
            registry,
            DeadLetterRecorder(self.store, registry, clock=self.clock),
            clock=self.clock,
            rng=random.Random(7),
            attachments=AttachmentLoader(self.objects, [PAYLOADS, OTHER], OPENAI),
        )

    def run(self, refs: list[AttachmentRef], job_id: str = "j-1", receive_count: int = 1) -> Fate:
        """The fate of one delivery of the job's message."""
        body = {
            "job_id": job_id,
            "job_type": READ_FILES.name,
            "user_id": "user-1",
            "input": {"question": "What is due?"},
            "attachments": [{"s3": ref.uri, "name": ref.key} for ref in refs],
        }
        return self.runner.process(delivery(body, receive_count=receive_count)).fate

    def job(self, job_id: str = "j-1") -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job


def refused_before_any_call(world: World, fate: Fate) -> str:
    job = world.job()
    assert fate is Fate.FAILED
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code is ErrorCode.ATTACHMENT_INVALID
    assert "\n" not in job.error.message
    assert world.provider.calls == 0
    assert (job.claim_count, job.attempt_count) == (1, 1)  # its first claim ended it
    return job.error.message


def test_a_job_reads_its_attachments_from_both_buckets_and_records_what_it_read() -> None:
    world = World()
    document, scan = pdf(2, "Invoice 4711"), image(MediaType.PNG, 120, 80)
    refs = [world.objects.put(PAYLOADS, "invoice.pdf", document), world.objects.put(OTHER, "scan.png", scan)]

    assert world.run(refs) is Fate.SUCCEEDED

    job = world.job()
    assert job.output == ANSWER
    assert [(info.media_type, info.bytes, info.pages, info.width) for info in job.attachments_read] == [
        (MediaType.PDF, len(document), 2, None),
        (MediaType.PNG, len(scan), None, 120),
    ]
    [request] = world.provider.requests
    assert [attachment.data for attachment in request.attachments] == [document, scan]


def test_a_job_whose_object_is_gone_at_its_retry_fails_the_retry_with_no_second_call() -> None:
    calls = iter([ProviderUnavailableError("try again")])

    def flaky(_: CompletionRequest) -> Any:
        return next(calls, ANSWER)

    world = World(FakeProvider(flaky))
    ref = world.objects.put(PAYLOADS, "invoice.pdf", pdf(1))

    assert world.run([ref]) is Fate.RETRIED
    world.objects.delete(PAYLOADS, "invoice.pdf")
    world.clock.advance(3_600)

    assert world.run([ref], receive_count=2) is Fate.FAILED
    job = world.job()
    assert job.error is not None
    assert (job.error.code, job.error.message) == (
        ErrorCode.ATTACHMENT_INVALID,
        "attachment invoice.pdf: s3://payloads/invoice.pdf is gone",
    )
    assert world.provider.calls == 1


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (png_header(100_000, 100_000), "attachment f: an image past any provider's pixel limit"),
        (png_header(8_001, 10), "attachment f: 8001 x 10 pixels; the provider takes at most 8000 a side"),
        (encrypted(pdf(1)), "attachment f: an encrypted PDF (it needs a password)"),
        (pdf(2)[:-300], "attachment f: a truncated PDF (no end-of-file marker)"),
        (pdf(101), "attachment f: 101 pages; the provider takes at most 100"),
        (
            b"notes\n",
            "attachment f: text/plain is not a type read_files takes (application/pdf, image/gif, "
            "image/jpeg, image/png, image/webp)",
        ),
    ],
    ids=["huge-header", "too-wide", "encrypted", "truncated", "too-many-pages", "text"],
)
def test_a_file_that_cannot_be_sent_fails_the_job_at_its_first_claim_with_no_call(data: bytes, line: str) -> None:
    world = World()

    fate = world.run([world.objects.put(PAYLOADS, "f", data)])

    assert refused_before_any_call(world, fate) == line


# --- whatever the bytes ------------------------------------------------------------------------------

SEEDS = [pdf(1, "Invoice"), image(MediaType.PNG), image(MediaType.JPEG), image(MediaType.GIF), image(MediaType.WEBP)]


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, a valid file cut short, a PNG header claiming any size, or an encrypted PDF."""
    match draw(st.sampled_from(["bytes", "cut", "header", "encrypted", "prefixed"])):
        case "bytes":
            return draw(st.binary(min_size=1, max_size=512))
        case "cut":
            seed = draw(st.sampled_from(SEEDS))
            return seed[: draw(st.integers(1, len(seed) - 1))]
        case "header":
            side = st.integers(1, 2**31 - 1)
            return png_header(draw(side), draw(side), valid_crc=draw(st.booleans()))
        case "encrypted":
            return encrypted(pdf(1), algorithm=draw(st.sampled_from(["AES-256", "AES-128", "RC4-128"])))
        case _:
            signature = draw(st.sampled_from([b"%PDF-1.7\n", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a"]))
            return signature + draw(st.binary(max_size=256))


def sendable(data: bytes) -> bool:
    try:
        attachment = inspect(AttachmentRef(PAYLOADS, "f"), data)
    except AttachmentInvalidError:
        return False
    return (
        attachment.media_type is not MediaType.TEXT
        and max(attachment.info.width or 0, attachment.info.height or 0) <= 8_000
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile(), name=st.sampled_from(["scan.pdf", "photo.png"]))
def test_whatever_a_job_names_it_runs_or_fails_attachment_invalid_at_its_first_claim_with_no_call(
    data: bytes, name: str
) -> None:
    world = World()

    fate = world.run([world.objects.put(PAYLOADS, name, data)])

    if sendable(data):
        assert fate is Fate.SUCCEEDED
        assert world.provider.calls == 1
    else:
        assert refused_before_any_call(world, fate).startswith(("attachment ", "attachments: "))
