"""Batched jobs with attachments (tests.support.batch_fleet): the line the batcher submits carries the
job's attachments, read again at the gather; an attachment gone between the claim and the gather hands
the job back, and its real-time run fails attachment_invalid with no call."""

from __future__ import annotations

from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.core import Ack, ErrorCode, Fate, JobStatus
from engine.core.attachments import MediaType
from engine.testing import MemoryAttachments
from tests.support.attachment_files import READ_FILES, image, pdf
from tests.support.batch_fleet import Fleet

PAYLOADS = "payloads"


def fleet_with(objects: MemoryAttachments) -> Fleet:
    fleet = Fleet(attachments=AttachmentLoader(objects, [PAYLOADS], OPENAI))
    fleet.registry.register(READ_FILES)
    return fleet


def message(job_id: str, *uris: str) -> dict[str, object]:
    return {
        "job_id": job_id,
        "job_type": READ_FILES.name,
        "user_id": "user-1",
        "input": {"question": "What is due?"},
        "lane": "background",
        "attachments": [{"s3": uri} for uri in uris],
    }


def test_a_batched_job_s_line_carries_its_attachments() -> None:
    objects = MemoryAttachments()
    document, scan = pdf(2, "Invoice 4711"), image(MediaType.PNG)
    refs = [objects.put(PAYLOADS, "invoice.pdf", document), objects.put(PAYLOADS, "scan.png", scan)]
    fleet = fleet_with(objects)

    assert fleet.deliver(message("bg-1", *(ref.uri for ref in refs))) == Ack(Fate.BATCHED)
    fleet.gather()

    [line] = fleet.batches.only.lines
    assert [attachment.data for attachment in line.request.attachments] == [document, scan]
    assert fleet.realtime.calls == 0


def test_an_attachment_gone_before_the_gather_hands_the_job_back_and_it_fails_in_real_time() -> None:
    objects = MemoryAttachments()
    ref = objects.put(PAYLOADS, "invoice.pdf", pdf(1))
    fleet = fleet_with(objects)
    assert fleet.deliver(message("bg-1", ref.uri)) == Ack(Fate.BATCHED)
    objects.delete(PAYLOADS, "invoice.pdf")

    fleet.gather()
    outcomes = fleet.redeliver()

    assert fleet.batches.batches == {}
    assert [outcome.fate for outcome in outcomes] == [Fate.FAILED]
    job = fleet.job("bg-1")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.message) == (
        ErrorCode.ATTACHMENT_INVALID,
        "attachment invoice.pdf: s3://payloads/invoice.pdf is gone",
    )
    assert fleet.realtime.calls == 0
