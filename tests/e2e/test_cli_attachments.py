"""`aijobs submit --attach` through the embedded stack: files uploaded and read by the worker, which the
local provider is sent; `status` and `inspect` listing what was read; refusals naming the flag and the
file, with nothing written."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import Result

from aijobs.local.devstack import DevStack, DevStackOptions
from tests.support.cli import run
from tests.support.contract import ATTACHMENT_FIELDS, VIEW_FIELDS
from tests.support.documents import MODULE, image, pdf

BOUND = 60.0
QUESTION = json.dumps({"question": "What is the total?"})


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    """The embedded stack, its functions knowing the job types of tests.support.documents."""
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=0,
        quiet=True,
        function_environment={"AIJOBS_JOB_MODULES": MODULE},
    )
    stack = DevStack(options)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder to work in, holding an invoice (a PDF of 2 pages), a photo (a PNG) and a Word file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "invoice.pdf").write_bytes(pdf(2))
    (tmp_path / "photo.png").write_bytes(image(800, 600))
    (tmp_path / "invoice.docx").write_bytes(b"PK\x03\x04\x14\x00\x06\x00" + bytes(range(256)))
    return tmp_path


def uploads(stack: DevStack, job_id: str) -> dict[str, bytes]:
    s3 = boto3.client("s3")
    bucket = stack.environment["JOBS_PAYLOAD_BUCKET"]
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"attachments/{job_id}/").get("Contents", [])
    return {item["Key"]: s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read() for item in listed}


def submitted(job_id: str, *attach: str, job_type: str = "read_documents", wait: bool = True) -> Result:
    flags = [flag for path in attach for flag in ("--attach", path)]
    waiting = ["--wait", "--timeout", str(BOUND)] if wait else []
    return run("submit", "--type", job_type, "--user", "u-att", "--input", QUESTION, "--job-id", job_id, *flags,
               *waiting, "--json")  # fmt: skip


def test_submit_attach_uploads_the_files_and_the_job_reads_them(dev_env: DevStack, files: Path) -> None:
    job_id = f"att-{uuid.uuid4().hex[:8]}"

    # When a job is submitted with a PDF and a PNG, waiting for it
    result = submitted(job_id, "invoice.pdf", "photo.png")

    # Then it succeeds, and its view lists both as the worker read them
    assert result.exit_code == 0, result.output
    view: dict[str, Any] = json.loads(result.stdout)
    assert list(view) == VIEW_FIELDS
    assert view["status"] == "succeeded"
    invoice, photo = view["attachments"]
    assert list(invoice) == ATTACHMENT_FIELDS
    assert (invoice["name"], invoice["media_type"], invoice["pages"]) == ("invoice.pdf", "application/pdf", 2)
    assert invoice["sha256"] == hashlib.sha256(pdf(2)).hexdigest()
    assert (photo["name"], photo["media_type"], photo["width"], photo["height"]) == ("photo.png", "image/png", 800, 600)
    assert photo["bytes"] == len(image(800, 600))
    # and the files are in the payload bucket under the job's id, as they were
    stored = uploads(dev_env, job_id)
    assert sorted(stored.values()) == sorted([pdf(2), image(800, 600)])
    assert {f"s3://{dev_env.environment['JOBS_PAYLOAD_BUCKET']}/{key}" for key in stored} == {
        invoice["s3"],
        photo["s3"],
    }


def test_status_and_inspect_list_the_attachments(dev_env: DevStack, files: Path) -> None:
    job_id = f"att-{uuid.uuid4().hex[:8]}"
    assert submitted(job_id, "invoice.pdf").exit_code == 0

    status = run("status", job_id)
    inspected = json.loads(run("inspect", job_id, "--json").stdout)

    assert status.exit_code == 0, status.output
    assert "attachments" in status.stdout
    assert "invoice.pdf" in status.stdout
    assert "application/pdf" in status.stdout
    assert "2 pages" in status.stdout
    assert hashlib.sha256(pdf(2)).hexdigest() in status.stdout
    (listed,) = inspected["job"]["attachments"]
    assert (listed["name"], listed["pages"]) == ("invoice.pdf", 2)


def test_an_object_already_in_a_bucket_is_referenced_not_uploaded(dev_env: DevStack, files: Path) -> None:
    job_id = f"att-{uuid.uuid4().hex[:8]}"
    bucket = dev_env.environment["JOBS_PAYLOAD_BUCKET"]
    boto3.client("s3").put_object(Bucket=bucket, Key=f"inbox/{job_id}.pdf", Body=pdf(1))

    result = submitted(job_id, f"s3://{bucket}/inbox/{job_id}.pdf")

    assert result.exit_code == 0, result.output
    (attachment,) = json.loads(result.stdout)["attachments"]
    assert (attachment["s3"], attachment["name"], attachment["pages"]) == (
        f"s3://{bucket}/inbox/{job_id}.pdf",
        f"{job_id}.pdf",
        1,
    )
    assert uploads(dev_env, job_id) == {}


NOT_A_BUCKET = "not s3://BUCKET/KEY (a bucket's name of 3-63 characters of a-z 0-9 . -, a key of 1-1024)"


@pytest.mark.parametrize(
    ("attach", "job_type", "line"),
    [
        (["invoice.docx"], "read_documents", "--attach invoice.docx: not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"),
        (["photo.png"], "read_pdfs", "--attach photo.png: image/png is not a type read_pdfs takes (application/pdf)"),
        (["missing.pdf"], "read_documents", "--attach missing.pdf: cannot read it: no such file or directory"),
        (["s3://Not_A_Bucket/x"], "read_documents", f"--attach s3://Not_A_Bucket/x: {NOT_A_BUCKET}"),
        (["invoice.pdf"] * 3, "read_pdfs", "--attach: read_pdfs takes at most 2 attachments, not 3"),
        ([], "read_documents", "--attach: read_documents takes at least 1 attachment, not 0"),
    ],
)
def test_a_refused_attachment_is_one_line_naming_the_flag_and_nothing_is_written(
    dev_env: DevStack, files: Path, attach: list[str], job_type: str, line: str
) -> None:
    job_id = f"att-{uuid.uuid4().hex[:8]}"

    result = submitted(job_id, *attach, job_type=job_type, wait=False)

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"error: {line}"]
    assert uploads(dev_env, job_id) == {}
    assert run("status", job_id).stderr.strip() == f"error: job {job_id} does not exist"
