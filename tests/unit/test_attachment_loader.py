"""Attachments read (engine.attachments.loader) and checked (engine.attachments.limits): a bucket not
allowed read not at all, each object's size asked before its bytes, nothing past a limit read, an
object changed or gone refused, and each limit named in the one line a refusal is.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.attachments.limits import ANTHROPIC, BEDROCK, OPENAI, AttachmentLimits, check
from engine.attachments.loader import AttachmentLoader
from engine.core.attachments import ALL_TYPES, AttachmentInfo, AttachmentPolicy, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError
from engine.testing import MemoryAttachments
from engine.testing.attachments import HEAD, READ
from tests.support.attachment_files import image, pdf

PAYLOADS, OTHER, FOREIGN = "payloads", "scans", "someone-elses"
TAKES_ALL = AttachmentPolicy(max_count=20, media_types=ALL_TYPES)
# (A message names at most 20 attachments; check() is held to more, as a job type's own policy may be.)
TAKES_MANY = AttachmentPolicy(max_count=100, media_types=ALL_TYPES)


def loader(objects: MemoryAttachments, limits: AttachmentLimits = OPENAI) -> AttachmentLoader:
    return AttachmentLoader(objects, [PAYLOADS, OTHER], limits)


def refused(objects: MemoryAttachments, refs: list[AttachmentRef], limits: AttachmentLimits = OPENAI) -> str:
    with pytest.raises(AttachmentInvalidError) as refusal:
        loader(objects, limits).load(refs, TAKES_ALL, "read_files")
    assert "\n" not in refusal.value.message
    return refusal.value.message


@pytest.fixture
def objects() -> MemoryAttachments:
    return MemoryAttachments()


def test_each_object_is_asked_its_size_before_any_is_read(objects: MemoryAttachments) -> None:
    refs = [objects.put(PAYLOADS, "a.pdf", pdf(2, "Invoice")), objects.put(OTHER, "b.png", image(MediaType.PNG))]

    attachments = loader(objects).load(refs, TAKES_ALL, "read_files")

    assert [attachment.media_type for attachment in attachments] == [MediaType.PDF, MediaType.PNG]
    uris = [ref.uri for ref in refs]
    assert objects.calls == [(HEAD, uris[0]), (HEAD, uris[1]), (READ, uris[0]), (READ, uris[1])]


def test_a_bucket_not_allowed_is_neither_asked_nor_read(objects: MemoryAttachments) -> None:
    refs = [objects.put(PAYLOADS, "a.pdf", pdf()), objects.put(FOREIGN, "secret.pdf", pdf())]

    line = refused(objects, refs)

    assert line.startswith("attachment secret.pdf: bucket someone-elses is not one this stack reads")
    assert objects.calls == []


def test_an_object_past_the_file_limit_is_never_read(objects: MemoryAttachments) -> None:
    small = replace(OPENAI, max_file_bytes=1_000, max_image_bytes=1_000)
    refs = [objects.put(PAYLOADS, "a.png", image(MediaType.PNG)), objects.put(PAYLOADS, "big.pdf", pdf(40, "x" * 50))]

    line = refused(objects, refs, small)

    assert line.startswith("attachment big.pdf: ")
    assert line.endswith("bytes; the provider takes at most 1000")
    assert objects.reads() == []


def test_objects_past_the_request_s_total_are_never_read(objects: MemoryAttachments) -> None:
    data = pdf(1)
    limits = replace(OPENAI, max_total_bytes=2 * len(data) - 1)
    refs = [objects.put(PAYLOADS, "a.pdf", data), objects.put(PAYLOADS, "b.pdf", data)]

    line = refused(objects, refs, limits)

    assert line == f"attachments: {2 * len(data)} bytes in all; the provider takes at most {2 * len(data) - 1}"
    assert objects.reads() == []


def test_an_empty_object_is_refused_before_it_is_read(objects: MemoryAttachments) -> None:
    assert refused(objects, [objects.put(PAYLOADS, "empty.pdf", b"")]) == "attachment empty.pdf: an empty object"
    assert objects.reads() == []


def test_an_object_gone_is_refused_naming_it(objects: MemoryAttachments) -> None:
    ref = AttachmentRef(PAYLOADS, "attachments/gone.pdf")

    assert refused(objects, [ref]) == "attachment gone.pdf: s3://payloads/attachments/gone.pdf is gone"


def test_an_object_changed_between_its_size_and_its_read_is_refused(objects: MemoryAttachments) -> None:
    ref = objects.put(PAYLOADS, "a.pdf", pdf(1))
    head = objects.head(ref)
    objects.put(PAYLOADS, "a.pdf", pdf(3))

    with pytest.raises(AttachmentInvalidError, match=r"^attachment a.pdf: it changed while it was read$"):
        objects.read(ref, head)


def test_an_object_the_stack_may_not_read_is_refused_naming_it() -> None:
    objects = MemoryAttachments(denied_buckets=[OTHER])

    line = refused(objects, [objects.put(OTHER, "a.pdf", pdf())])

    assert line == "attachment a.pdf: this stack may not read s3://scans/a.pdf"


def test_a_count_outside_the_job_type_s_is_refused_before_anything_is_asked(objects: MemoryAttachments) -> None:
    refs = [objects.put(PAYLOADS, f"{n}.pdf", pdf()) for n in range(3)]
    policy = AttachmentPolicy(max_count=2, media_types=ALL_TYPES)

    with pytest.raises(AttachmentInvalidError, match=r"^read_files takes at most 2 attachments, not 3$"):
        loader(objects).load(refs, policy, "read_files")
    assert objects.calls == []


def test_a_type_the_job_type_does_not_take_is_named_with_those_it_takes(objects: MemoryAttachments) -> None:
    policy = AttachmentPolicy(max_count=2, media_types=frozenset({MediaType.PDF}))

    with pytest.raises(AttachmentInvalidError) as refusal:
        loader(objects).load([objects.put(PAYLOADS, "photo.pdf", image(MediaType.JPEG))], policy, "read_pdfs")

    assert refusal.value.message == "attachment photo.pdf: image/jpeg is not a type read_pdfs takes (application/pdf)"


# --- each limit, named in its line ---------------------------------------------------------------------


def info(name: str, media_type: MediaType, size: int = 1_000, **shape: int) -> AttachmentInfo:
    return AttachmentInfo(AttachmentRef(PAYLOADS, name), media_type, size, "0" * 64, **shape)


def check_line(infos: list[AttachmentInfo], limits: AttachmentLimits) -> str:
    with pytest.raises(AttachmentInvalidError) as refusal:
        check(infos, TAKES_MANY, limits, "read_files")
    assert "\n" not in refusal.value.message
    return refusal.value.message


@pytest.mark.parametrize(
    ("infos", "limits", "line"),
    [
        (
            [info("big.png", MediaType.PNG, 3_750_001, width=10, height=10)],
            BEDROCK,
            "attachment big.png: 3750001 bytes; the provider takes at most 3750000",
        ),
        (
            [info("big.pdf", MediaType.PDF, 4_500_001, pages=1)],
            BEDROCK,
            "attachment big.pdf: 4500001 bytes; the provider takes at most 4500000",
        ),
        (
            [info("long.pdf", MediaType.PDF, pages=101)],
            OPENAI,
            "attachment long.pdf: 101 pages; the provider takes at most 100",
        ),
        (
            [info("a.pdf", MediaType.PDF, pages=60), info("b.pdf", MediaType.PDF, pages=41)],
            OPENAI,
            "attachments: 101 PDF pages in all; the provider takes at most 100 a request",
        ),
        (
            [info("wide.png", MediaType.PNG, width=8_001, height=10)],
            OPENAI,
            "attachment wide.png: 8001 x 10 pixels; the provider takes at most 8000 a side",
        ),
        (
            [info(f"{n}.png", MediaType.PNG, width=10, height=10) for n in range(21)],
            BEDROCK,
            "attachments: 21 images; the provider takes at most 20",
        ),
        (
            [info(f"{n}.pdf", MediaType.PDF, pages=1) for n in range(6)],
            BEDROCK,
            "attachments: 6 documents; the provider takes at most 5",
        ),
        (
            [info(f"{n}.pdf", MediaType.PDF, 4_000_000, pages=1) for n in range(5)] + [info("t.txt", MediaType.TEXT)],
            BEDROCK,
            "attachments: 20001000 bytes in all; the provider takes at most 20000000 a request",
        ),
    ],
    ids=["image-bytes", "file-bytes", "pages", "pages-in-all", "pixels", "images", "documents", "total-bytes"],
)
def test_each_limit_is_named_in_its_one_line(infos: list[AttachmentInfo], limits: AttachmentLimits, line: str) -> None:
    assert check_line(infos, limits) == line


def test_past_twenty_images_anthropic_takes_2000_px_a_side_and_8000_up_to_twenty() -> None:
    wide = [info("0.png", MediaType.PNG, width=2_001, height=10)]
    small = [info(f"{n}.png", MediaType.PNG, width=10, height=10) for n in range(1, 21)]

    check(wide + small[:19], TAKES_MANY, ANTHROPIC, "read_files")  # 20 images: 8,000 px a side
    check([info("0.png", MediaType.PNG, width=8_000, height=10)], TAKES_MANY, ANTHROPIC, "read_files")
    line = check_line(wide + small, ANTHROPIC)  # 21 images

    assert line == "attachment 0.png: 2001 x 10 pixels; the provider takes at most 2000 a side"


def test_a_limit_at_its_value_passes() -> None:
    at_limits = [
        info("a.png", MediaType.PNG, OPENAI.max_image_bytes, width=8_000, height=8_000),
        info("b.pdf", MediaType.PDF, 1_000, pages=100),
    ]

    check(at_limits, TAKES_ALL, OPENAI, "read_files")


def test_pdf_pages_are_counted_across_the_request_s_pdfs(objects: MemoryAttachments) -> None:
    limits = replace(OPENAI, max_pdf_pages=3)
    refs = [objects.put(PAYLOADS, "a.pdf", pdf(2, "Invoice")), objects.put(PAYLOADS, "b.pdf", pdf(2, "Invoice"))]

    line = refused(objects, refs, limits)

    assert line == "attachments: 4 PDF pages in all; the provider takes at most 3 a request"
