"""The attachment figures of `make bench` (bench/attachments.py): what they measure, against hand-computed
counts, and a figure met only when every file's estimate stays within the target."""

from __future__ import annotations

from bench.attachments import (
    LONG_PDF_PAGES,
    Measured,
    blank_pdf,
    estimates,
    long_job_requests,
    made_image,
    mix,
    ratio_figure,
)
from engine.attachments.inspection import media_type_of
from engine.core import JobStatus
from engine.core.attachments import MediaType
from engine.gateway.attachment_tokens import FRAMING_TOKENS


def test_a_photo_is_billed_one_tile_and_estimated_one_tile_and_its_framing() -> None:
    # 1024 x 768 fits 2048, its short side is 768: 2 x 2 tiles of 512 px.
    [gpt4o] = estimates("gpt-4o", [("photo.jpeg", made_image(1024, 768, "JPEG"))])
    [mini] = estimates("gpt-4o-mini", [("photo.jpeg", made_image(1024, 768, "JPEG"))])

    assert (gpt4o.billed, gpt4o.estimate) == (85 + 4 * 170, 85 + 4 * 170 + FRAMING_TOKENS)
    assert (mini.billed, mini.estimate) == (2833 + 4 * 5667, 2833 + 4 * 5667 + FRAMING_TOKENS)


def test_a_blank_pdf_is_billed_an_image_a_page_and_no_text() -> None:
    # An A4 page at 150 DPI: 1240 x 1754 px, its short side down to 768 (768 x 1086): 2 x 3 tiles.
    [measured] = estimates("gpt-4o", [("blank.pdf", blank_pdf(3))])

    assert measured.is_pdf
    assert measured.billed == 3 * (85 + 6 * 170)
    assert measured.billed <= measured.estimate


def test_the_mix_has_pdfs_and_images_of_every_kind_the_samples_give() -> None:
    kinds = {media_type_of(data) for _, data in mix()}

    assert kinds == {MediaType.PDF, MediaType.PNG, MediaType.JPEG, MediaType.WEBP}


def test_a_ratio_figure_is_met_only_when_each_file_is_within_the_target() -> None:
    near = [Measured("a.png", False, 110, 100), Measured("b.png", False, 100, 100)]
    above = [*near, Measured("c.png", False, 140, 100)]
    below = [*near, Measured("d.png", False, 99, 100)]

    assert ratio_figure("gpt-4o", "images", near).met is True
    assert ratio_figure("gpt-4o", "images", above).met is False
    assert ratio_figure("gpt-4o", "images", below).met is False
    assert ratio_figure("gpt-4o", "images", near).value.startswith("1.050")


def test_a_job_with_a_long_pdf_and_three_images_makes_two_dynamodb_requests_and_two_s3_reads_a_file() -> None:
    requests = long_job_requests()

    assert requests.status is JobStatus.SUCCEEDED
    assert sum(requests.dynamodb.values()) == 2
    assert requests.s3 == {"HeadObject": 4, "GetObject": 4}
    assert LONG_PDF_PAGES == 40
