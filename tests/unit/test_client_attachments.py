"""What a submission attaches, checked by the client before anything is uploaded (aijobs.attachments):
each refusal one line naming the attachment, the keys a function of the job, the place and the content."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aijobs.arguments import InvalidArgumentError
from aijobs.attachments import NamedAttachment, Prepared, SizeLimits, prepare, upload_key
from engine.attachments.inspection import media_type_of
from engine.core.attachments import AttachmentRef, MediaType
from engine.definitions.answer_with_citations import ANSWER_WITH_CITATIONS
from tests.support.documents import HTML_AS_PNG, READ_DOCUMENTS, READ_PDFS, image, pdf

BUCKET = "payloads-bucket"
LIMITS = SizeLimits.of()


def prepared(items: list[object], job_id: str = "job-1", definition: object = READ_DOCUMENTS) -> Prepared:
    return prepare(items, job_id, definition, BUCKET, LIMITS)  # type: ignore[arg-type]


def refusal(items: list[object], definition: object = READ_DOCUMENTS, limits: SizeLimits = LIMITS) -> str:
    with pytest.raises(InvalidArgumentError) as caught:
        prepare(items, "job-1", definition, BUCKET, limits)  # type: ignore[arg-type]
    assert caught.value.argument == "attachments"
    return str(caught.value)


def test_a_file_bytes_and_an_s3_object_become_references_in_order(tmp_path: Path) -> None:
    # Given a PDF on disk, an image as bytes, and an object already in a bucket
    invoice = tmp_path / "invoice.pdf"
    invoice.write_bytes(pdf(2))
    photo = image()

    # When they are prepared for job-1
    result = prepared([str(invoice), photo, "s3://other-bucket/scans/receipt.jpg"])

    # Then each is a reference in the order given; the local two are uploads to the payload bucket
    first, second, third = result.refs
    assert first == AttachmentRef(
        BUCKET, f"attachments/job-1/1-{hashlib.sha256(pdf(2)).hexdigest()}/invoice.pdf", "invoice.pdf"
    )
    assert second == AttachmentRef(
        BUCKET, f"attachments/job-1/2-{hashlib.sha256(photo).hexdigest()}/attachment-2.png", "attachment-2.png"
    )
    assert third == AttachmentRef("other-bucket", "scans/receipt.jpg")
    assert [(upload.ref, upload.media_type) for upload in result.uploads] == [
        (first, MediaType.PDF),
        (second, MediaType.PNG),
    ]
    assert result.uploads[0].data == invoice.read_bytes()


def test_the_same_files_make_the_same_keys_and_other_content_another(tmp_path: Path) -> None:
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(pdf(1))
    once = prepared([scan]).refs

    assert prepared([scan]).refs == once
    scan.write_bytes(pdf(3))
    assert prepared([scan]).refs != once
    assert prepared([scan], job_id="job-2").refs[0].key.startswith("attachments/job-2/1-")


def test_a_name_of_its_own_is_kept_and_its_key_made_safe() -> None:
    named = NamedAttachment(pdf(), "Rechnung März 2026 (final).pdf")

    (ref,) = prepared([named]).refs

    assert ref.name == "Rechnung März 2026 (final).pdf"
    assert ref.key.endswith("/Rechnung_M_rz_2026__final_.pdf")
    assert prepared([NamedAttachment("s3://b-1/k/x.bin", "x.pdf")]).refs == (AttachmentRef("b-1", "k/x.bin", "x.pdf"),)


def test_a_key_never_holds_a_path_segment_of_dots() -> None:
    assert upload_key("job-1", 1, "ab", "..").endswith("/1-ab/attachment")
    assert upload_key("job-1", 1, "ab", "a/../b").endswith("/1-ab/a_.._b")


@pytest.mark.parametrize(
    ("items", "definition", "line"),
    [
        (
            [b"%PDF-1.4 x"],
            ANSWER_WITH_CITATIONS,
            "attachments: answer_with_citations takes no attachments; the message names 1",
        ),
        ([pdf()] * 6, READ_DOCUMENTS, "attachments: read_documents takes at most 5 attachments, not 6"),
        ([], READ_DOCUMENTS, "attachments: read_documents takes at least 1 attachment, not 0"),
        ([image()], READ_PDFS, "attachments #1: image/png is not a type read_pdfs takes (application/pdf)"),
        ([b"\x00\x01binary"], READ_DOCUMENTS, "attachments #1: not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"),
        ([b""], READ_DOCUMENTS, "attachments #1: an empty file"),
        ([NamedAttachment(pdf(), "a\\b.pdf")], READ_DOCUMENTS, "attachments a\\b.pdf: a name is 1-255 characters"),
        (["s3://B/key"], READ_DOCUMENTS, "attachments s3://B/key: not s3://BUCKET/KEY (a bucket's name of 3-63"),
        ([42], READ_DOCUMENTS, "attachments #1: a int, not a path, bytes or s3://BUCKET/KEY"),
    ],
)
def test_each_refusal_is_one_line_naming_the_attachment(items: list[object], definition: object, line: str) -> None:
    refused = refusal(items, definition)

    assert refused.startswith(line)
    assert "\n" not in refused


def test_a_file_is_named_as_it_was_given_and_its_type_comes_from_its_content(tmp_path: Path) -> None:
    # Given an HTML page named as a PNG, and a Word file
    disguised = tmp_path / "photo.png"
    disguised.write_bytes(HTML_AS_PNG)
    docx = tmp_path / "invoice.docx"
    docx.write_bytes(b"PK\x03\x04\x14\x00\x06\x00" + bytes(range(256)))

    # Then the page is text (which only a job type that takes text accepts), the Word file no type at all
    assert refusal([str(disguised)], READ_PDFS) == (
        f"attachments {disguised}: text/plain is not a type read_pdfs takes (application/pdf)"
    )
    assert refusal([str(docx)]) == f"attachments {docx}: not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"


def test_a_path_that_cannot_be_read_says_why(tmp_path: Path) -> None:
    assert refusal([str(tmp_path / "missing.pdf")]) == (
        f"attachments {tmp_path / 'missing.pdf'}: cannot read it: no such file or directory"
    )
    assert refusal([tmp_path]) == f"attachments {tmp_path}: cannot read it: is a directory"


def test_a_file_larger_than_any_provider_takes_is_refused_unread(tmp_path: Path) -> None:
    # Given limits of 1 KB a file (as AIJOBS_ATTACHMENT_LIMITS could make them) and a 2 KB file
    small = SizeLimits(file_bytes=1_000, image_bytes=500, total_bytes=1_500)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 2_000)

    # Then it is refused by its size, and an image past the image limit by its own
    assert refusal([big], limits=small) == f"attachments {big}: 2000 bytes; no provider takes a file of more than 1000"
    photo = image() + b"\x00" * 600  # (still a PNG by its signature)
    assert refusal([photo], limits=small) == (
        f"attachments #1: {len(photo)} bytes; no provider takes an image of more than 500"
    )
    assert refusal([b"b" * 800, b"c" * 800], limits=small) == (
        "attachments: 1600 bytes in all; no provider takes more than 1500 in one request"
    )


def test_the_size_limits_are_the_largest_of_every_provider_and_follow_the_settings() -> None:
    assert SizeLimits.of() == SizeLimits(file_bytes=32_000_000, image_bytes=20_000_000, total_bytes=32_000_000)
    assert SizeLimits.of({"max_file_bytes": 50_000_000}).file_bytes == 50_000_000


@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_are_taken_as_their_content_says_or_refused_in_one_line(data: bytes) -> None:
    media_type = media_type_of(data)
    if data and media_type is not None:
        (upload,) = prepared([data]).uploads
        assert upload.media_type is media_type
        assert upload.ref.name == f"attachment-1.{media_type.extension}"
    else:
        assert refusal([data]).startswith("attachments #1: ")
