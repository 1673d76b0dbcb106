"""A job's attachments on the dashboard: listed on its page as text, each offered only as a download of
bytes (never rendered, never an <img>), and only those the job names. Attacks: an SVG with script, an
HTML page named as a PNG, and a name that is markup."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from aijobs.attachments import NamedAttachment
from aijobs.client import AiJobsClient
from aijobs.local.devstack import local_session
from aijobs.ui.guard import CONTENT_SECURITY_POLICY
from aijobs.ui.server import DashboardServer
from engine.config import Settings
from engine.core import Delivery, JobStatus
from engine.definitions import JobRegistry
from engine.gateway import ModelGateway, ModelTiers
from engine.wiring import Aws, build_runner, build_store
from tests.support.documents import HOSTILE_SVG, HTML_AS_PNG, MODULE, image, pdf
from tests.support.providers import FakeProvider
from tests.ui.conftest import Watched
from tests.ui.test_attacks import assert_nothing_ran

QUESTION = {"question": "What do these say?"}
# A name that is markup, meaning to run where it is shown.
MARKUP_NAME = '<img src=x onerror="window.__pwned = 1">.txt'
# A name of no ASCII letter: its download is named in safe characters.
FOREIGN_NAME = "請求書.pdf"


@dataclass
class Documents:
    client: AiJobsClient
    # The AWS requests the client sent, by "<service> <Operation>".
    requests: Counter[str]
    bucket: str
    # The stack's S3, on a client of its own (its requests not counted).
    s3: Any
    # A job that read its five attachments (in this order), and one that names none.
    read: str
    plain: str
    files: list[tuple[str, bytes]]


@pytest.fixture(scope="module")
def documents(settings: Settings) -> Documents:
    """A job with a PDF, a PNG, an SVG with script and an HTML page named as a PNG, run by the engine's
    runner (which reads them from the bucket); and a job without any."""
    settings = settings.model_copy(update={"aijobs_job_modules": (MODULE,)})
    session = local_session()
    requests: Counter[str] = Counter()
    session.events.register(
        "before-call.*.*", lambda event_name, **_: requests.update([" ".join(event_name.split(".")[1:3])])
    )
    client = AiJobsClient.from_settings(settings, session)
    tag = uuid.uuid4().hex[:6]
    files = [
        ("invoice.pdf", pdf(2)),
        ("photo.png", image(320, 200)),
        ("drawing.svg", HOSTILE_SVG),
        ("innocent.png", HTML_AS_PNG),
    ]
    read = client.submit(
        "read_documents",
        f"ui-docs-{tag}",
        QUESTION,
        job_id=f"docs-{tag}",
        attachments=[NamedAttachment(data, name) for name, data in files],
    ).job_id
    aws = Aws(settings, local_session())
    store = build_store(settings, aws)
    gateway = ModelGateway(FakeProvider(lambda _: {"answer": "Totals."}), ModelTiers("gpt-4o-mini"))
    runner = build_runner(settings, store, gateway, JobRegistry.from_settings(settings), aws)
    runner.process(Delivery(uuid.uuid4().hex, json.dumps({"job_id": read})))
    assert client.get(read).status is JobStatus.SUCCEEDED
    plain = client.submit("summarize", f"ui-docs-{tag}", {"text": "No files at all.", "max_words": 10}).job_id
    return Documents(client, requests, settings.jobs_payload_bucket, aws.client("s3"), read, plain, files)


@pytest.fixture(scope="module")
def board(documents: Documents) -> Iterator[DashboardServer]:
    with DashboardServer(documents.client, port=0) as server:
        yield server


def test_the_job_page_lists_each_attachment_as_the_worker_read_it(
    page: Page, board: DashboardServer, documents: Documents, screenshots: Path
) -> None:
    watched = Watched(page)

    page.goto(f"{board.url}jobs/{documents.read}")

    rows = page.locator("table.attachments tbody tr")
    expect(rows).to_have_count(4)
    expected = [
        ("invoice.pdf", "application/pdf", "2 pages"),
        ("photo.png", "image/png", "320 x 200"),
        ("drawing.svg", "text/plain", "-"),  # its content is text: its name never decides
        ("innocent.png", "text/plain", "-"),
    ]
    for row, (name, data), (shown, media_type, extent) in zip(rows.all(), documents.files, expected, strict=True):
        cells = row.locator("td").all_inner_texts()
        assert cells[1:] == [shown, media_type, f"{len(data):,}", extent, hashlib.sha256(data).hexdigest()]
        assert name == shown
    assert_nothing_ran(watched)
    page.screenshot(path=screenshots / "job-attachments.png", full_page=True)


def test_an_attachment_is_a_download_of_bytes_and_nothing_of_it_runs(
    page: Page, board: DashboardServer, documents: Documents
) -> None:
    watched = Watched(page)
    page.goto(f"{board.url}jobs/{documents.read}")

    for number, (name, data) in enumerate(documents.files, 1):
        # Clicked, each is saved as a file of its bytes, under its name
        with page.expect_download() as download:
            page.get_by_role("link", name=name, exact=True).click()
        assert download.value.suggested_filename == name
        assert Path(download.value.path()).read_bytes() == data
        # and answered as bytes to save, whatever it holds or is named
        answer = httpx.get(f"{board.url}jobs/{documents.read}/attachments/{number}")
        assert answer.status_code == 200
        assert answer.content == data
        assert answer.headers["content-type"] == "application/octet-stream"
        assert answer.headers["content-disposition"] == f'attachment; filename="{name}"'
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert_nothing_ran(watched)


def test_opening_an_attachment_s_address_downloads_it_and_renders_nothing(
    page: Page, board: DashboardServer, documents: Documents
) -> None:
    watched = Watched(page)
    page.goto(f"{board.url}jobs/{documents.read}")

    for number in (3, 4):  # the SVG with script, the HTML page named .png
        with page.expect_download():
            page.evaluate(
                "url => { window.location.href = url }", f"{board.url}jobs/{documents.read}/attachments/{number}"
            )
        assert page.url == f"{board.url}jobs/{documents.read}"
        assert_nothing_ran(watched)


def test_a_name_that_is_markup_shows_as_text(
    page: Page, board: DashboardServer, documents: Documents, screenshots: Path
) -> None:
    job_id = documents.client.submit(
        "read_documents", "ui-docs-markup", QUESTION, attachments=[NamedAttachment(b"plain notes\n", MARKUP_NAME)]
    ).job_id
    watched = Watched(page)

    page.goto(f"{board.url}jobs/{job_id}")

    link = page.locator("table.attachments tbody a")
    expect(link).to_have_text(MARKUP_NAME)
    assert link.get_attribute("download") is not None
    assert_nothing_ran(watched)
    page.locator("table.attachments").screenshot(path=screenshots / "job-attachment-markup.png")
    answer = httpx.get(f"{board.url}jobs/{job_id}/attachments/1")
    assert (
        answer.headers["content-disposition"] == 'attachment; filename="_img_src_x_onerror__window.__pwned___1__.txt"'
    )


def test_a_name_of_other_letters_downloads_under_safe_characters(board: DashboardServer, documents: Documents) -> None:
    job_id = documents.client.submit(
        "read_documents", "ui-docs-foreign", QUESTION, attachments=[NamedAttachment(pdf(), FOREIGN_NAME)]
    ).job_id

    answer = httpx.get(f"{board.url}jobs/{job_id}/attachments/1")

    assert answer.status_code == 200
    assert answer.headers["content-disposition"] == 'attachment; filename="___.pdf"'
    assert answer.content == pdf()


def test_only_an_attachment_the_job_names_can_be_downloaded(board: DashboardServer, documents: Documents) -> None:
    base = f"{board.url}jobs/{documents.read}/attachments"

    for path in (f"{base}/0", f"{base}/5", f"{board.url}jobs/{documents.plain}/attachments/1"):
        answer = httpx.get(path)
        assert answer.status_code == 404, path
        assert "names no attachment" in answer.text
    # nor is there any address that takes a key or a bucket
    for path in (f"{base}/1/../../../inputs", f"{base}/x", f"{base}/s3:%2F%2F{documents.bucket}%2Finputs%2Fx.json"):
        assert httpx.get(path).status_code == 404, path
    assert httpx.get(f"{board.url}jobs/no-such-job/attachments/1").status_code == 404


def test_a_download_is_a_read_of_the_job_and_of_the_object(board: DashboardServer, documents: Documents) -> None:
    documents.requests.clear()

    assert httpx.get(f"{board.url}jobs/{documents.read}/attachments/1").status_code == 200

    assert dict(documents.requests) == {"dynamodb GetItem": 1, "s3 GetObject": 1}


def test_an_attachment_gone_from_its_bucket_is_a_page_saying_so(board: DashboardServer, documents: Documents) -> None:
    job_id = documents.client.submit(
        "read_documents", "ui-docs-gone", QUESTION, attachments=[NamedAttachment(pdf(), "gone.pdf")]
    ).job_id
    (attachment,) = documents.client.get(job_id).attachments
    documents.s3.delete_object(Bucket=documents.bucket, Key=attachment.s3.removeprefix(f"s3://{documents.bucket}/"))

    answer = httpx.get(f"{board.url}jobs/{job_id}/attachments/1")

    assert answer.status_code == 404
    assert "attachment gone.pdf: " in answer.text
    assert "is gone" in answer.text
