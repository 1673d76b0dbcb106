"""A job's attachments as the view, `aijobs status` and `aijobs inspect` show them: each one it names,
in order, with what its latest attempt read of it, and nothing of it read as markup."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from rich.console import Console, RenderableType

from aijobs.render import attachments_table, inspection_group
from engine.core import Job, JobHistory, JobStatus
from engine.core.attachments import AttachmentInfo, AttachmentRef, MediaType
from engine.views import JobInspection, JobView
from tests.support.contract import ATTACHMENT_FIELDS, VIEW_FIELDS

CREATED = int(datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC).timestamp() * 1000)
INVOICE = AttachmentRef("payloads", "attachments/job-1/1-aa/invoice.pdf", "invoice.pdf")
PHOTO = AttachmentRef("photos", "inbox/IMG_0001.png")
# A name that is markup to rich.
MARKUP = AttachmentRef("payloads", "attachments/job-1/3-cc/x.txt", "[bold red]notes[/].txt")
READ = (
    AttachmentInfo(INVOICE, MediaType.PDF, 48_213, "a" * 64, pages=3),
    AttachmentInfo(PHOTO, MediaType.PNG, 1_024, "b" * 64, width=1024, height=768),
    AttachmentInfo(MARKUP, MediaType.TEXT, 12, "c" * 64),
)
JOB = Job(
    job_id="job-1",
    job_type="read_documents",
    user_id="user-1",
    status=JobStatus.QUEUED,
    created_at=CREATED,
    updated_at=CREATED,
    max_attempts=3,
    request_hash="r" * 64,
    attachments=(INVOICE, PHOTO, MARKUP),
)


def text_of(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_job_not_read_yet_lists_its_references_and_names_only() -> None:
    dumped = json.loads(JobView.from_job(JOB).model_dump_json())

    assert list(dumped) == VIEW_FIELDS
    assert [list(attachment) for attachment in dumped["attachments"]] == [ATTACHMENT_FIELDS] * 3
    assert dumped["attachments"][1] == {
        "s3": "s3://photos/inbox/IMG_0001.png",
        "name": "IMG_0001.png",  # no name given: its key's last part
        "media_type": None,
        "bytes": None,
        "sha256": None,
        "pages": None,
        "width": None,
        "height": None,
    }


def test_once_read_each_shows_its_type_size_digest_and_pages_or_pixels() -> None:
    job = replace(JOB, status=JobStatus.SUCCEEDED, attachments_read=READ, finished_at=CREATED + 1)

    invoice, photo, notes = JobView.from_job(job).attachments

    assert invoice.model_dump(mode="json") == {
        "s3": "s3://payloads/attachments/job-1/1-aa/invoice.pdf",
        "name": "invoice.pdf",
        "media_type": "application/pdf",
        "bytes": 48_213,
        "sha256": "a" * 64,
        "pages": 3,
        "width": None,
        "height": None,
    }
    assert (photo.extent, invoice.extent, notes.extent) == ("1024 x 768", "3 pages", None)


def test_a_job_without_attachments_has_an_empty_list() -> None:
    assert JobView.from_job(replace(JOB, attachments=())).attachments == []


def test_status_and_inspect_list_each_attachment_as_text() -> None:
    job = replace(JOB, status=JobStatus.SUCCEEDED, attachments_read=READ, finished_at=CREATED + 1)
    view = JobView.from_job(job)

    table = text_of(attachments_table(view.attachments))
    shown = text_of(inspection_group(JobInspection.of(job, JobHistory([], []), CREATED)))

    for line in (
        "1 │ invoice.pdf",
        "application/pdf │ 48,213 │      3 pages │ s3://payloads/attachments/job-1/1-aa/invoice.pdf",
        "image/png       │  1,024 │   1024 x 768 │ s3://photos/inbox/IMG_0001.png",
        "[bold red]notes[/].txt",
        "a" * 64,
    ):
        assert line in table
    assert table in shown


def test_an_attachment_not_read_yet_says_so() -> None:
    table = text_of(attachments_table(JobView.from_job(JOB).attachments))

    assert table.count("not read yet") == 3
