"""What an attachment is, from its bytes (engine.attachments.inspection): its type from its content and
never its name, a PDF's pages from its page tree and never its /Count, an image's size from its header
with no pixel decoded, and every file that cannot be sent refused in one line naming it, whatever the
file does to the libraries that read it.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import ImageFile

from engine.attachments.inspection import inspect, media_type_of
from engine.core.attachments import Attachment, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError
from tests.support.attachment_files import LETTER, animated, encrypted, image, pdf, png_header

IMAGES = [MediaType.PNG, MediaType.JPEG, MediaType.WEBP, MediaType.GIF]


def ref(name: str = "scan.bin") -> AttachmentRef:
    return AttachmentRef("payloads", f"attachments/{name}", name)


def refusal(data: bytes, name: str = "scan.bin") -> str:
    """The one line an attachment of `data` is refused with."""
    with pytest.raises(AttachmentInvalidError) as refused:
        inspect(ref(name), data)
    line = refused.value.message
    assert "\n" not in line
    assert line.startswith(f"attachment {name}: ")
    return line.removeprefix(f"attachment {name}: ")


@pytest.fixture(autouse=True)
def no_pixel_is_ever_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test of this module fails if Pillow decodes an image's data."""

    def load(self: ImageFile.ImageFile) -> None:
        raise AssertionError(f"a {self.format} image was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


# --- the media type, from the content --------------------------------------------------------------


@pytest.mark.parametrize("media_type", IMAGES)
def test_an_image_s_type_and_size_come_from_its_bytes_never_its_name(media_type: MediaType) -> None:
    data = image(media_type, 40, 30)

    attachment = inspect(ref("invoice.pdf"), data)

    assert attachment.media_type is media_type
    info = attachment.info
    assert (info.width, info.height, info.pages) == (40, 30, None)
    assert (info.bytes, info.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert attachment.data == data


def test_a_pdf_s_pages_their_sizes_and_its_text_layer_are_read() -> None:
    data = pdf(3, "Invoice 4711")

    attachment = inspect(ref("photo.png"), data)

    assert attachment.media_type is MediaType.PDF
    assert attachment.info.pages == 3
    assert attachment.page_sizes == (LETTER,) * 3
    assert attachment.text_bytes == 3 * len("Invoice 4711")


def test_a_page_turned_by_its_rotate_is_sized_as_it_is_displayed() -> None:
    assert inspect(ref(), pdf(1, rotate=90)).page_sizes == ((792.0, 612.0),)


def test_utf8_text_is_text_and_its_bytes_are_its_text_layer() -> None:
    data = "Rechnung Nr. 4711, Betrag: 1.234,56 €\n請求書".encode()

    attachment = inspect(ref("notes.pdf"), data)

    assert attachment.media_type is MediaType.TEXT
    assert attachment.text_bytes == len(data)
    assert attachment.text.endswith("請求書")


@pytest.mark.parametrize(
    "data",
    [b"plain text\x00with a NUL", b"Latin-1: caf\xe9", b"\xff\xfe\x00\x00", b"\x80\x81\x82"],
    ids=["nul", "latin-1", "utf-32-bom", "continuation-bytes"],
)
def test_bytes_of_no_type_the_engine_sends_are_refused(data: bytes) -> None:
    assert media_type_of(data) is None
    assert refusal(data, "notes.txt") == "not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"


def test_a_pdf_header_may_follow_up_to_1_kib_of_junk_and_no_more() -> None:
    # its header "%PDF-" ends at the 1024th byte: within the first KiB
    assert inspect(ref(), pdf(1, junk=b"J" * 1019)).info.pages == 1
    assert media_type_of(pdf(1, junk=b"\x00" * 1020)) is None


# --- PDFs that cannot be sent ------------------------------------------------------------------------


def test_a_truncated_pdf_is_refused() -> None:
    data = pdf(2, "Invoice 4711")

    assert refusal(data[: len(data) // 2]) == "a truncated PDF (no end-of-file marker)"
    # Cut, and given an end-of-file marker: its objects and table are gone all the same
    assert refusal(data[: len(data) // 2] + b"\n%%EOF\n") == "a corrupt PDF (PdfReadError)"


@pytest.mark.parametrize("algorithm", ["AES-256", "AES-128", "RC4-128"])
def test_an_encrypted_pdf_is_refused(algorithm: str) -> None:
    assert refusal(encrypted(pdf(2, "secret"), algorithm=algorithm)) == "an encrypted PDF (it needs a password)"


def test_a_pdf_encrypted_with_an_empty_user_password_opens_without_one_and_is_read() -> None:
    attachment = inspect(ref(), encrypted(pdf(2, "Invoice"), user_password=""))

    assert attachment.info.pages == 2
    assert attachment.text_bytes == 2 * len("Invoice")


def test_a_pdf_whose_xref_offsets_are_wrong_is_read_from_its_objects() -> None:
    data = pdf(2, "Invoice")
    broken = re.sub(rb"\d{10} 00000 n", b"0000000001 00000 n", data)
    assert broken != data

    assert inspect(ref(), broken).info.pages == 2


def test_a_pdf_whose_xref_and_objects_are_garbage_is_refused_as_corrupt() -> None:
    data = b"%PDF-1.7\n" + b"\x00garbage obj << /Kids [9 0 R" * 40 + b"\nstartxref\n12\n%%EOF\n"

    assert refusal(data) == "a corrupt PDF (PdfReadError)"


@pytest.mark.parametrize(("pages", "count"), [(2, 500), (3, 1), (1, 2_000_000_000), (2, -1)])
def test_a_lying_page_count_does_not_decide_how_many_pages_a_pdf_has(pages: int, count: int) -> None:
    assert inspect(ref(), pdf(pages, count=count)).info.pages == pages


def test_a_page_tree_that_loops_is_refused_as_corrupt() -> None:
    looping = pdf(1).replace(b"/Kids [4 0 R]", b"/Kids [4 0 R 2 0 R]")

    assert refusal(looping).startswith("a corrupt PDF")


def test_a_pdf_with_no_page_is_refused() -> None:
    assert refusal(pdf(0)) == "a PDF with no pages"


def test_a_pdf_past_the_pages_the_request_may_take_has_its_pages_counted_but_no_text_read() -> None:
    data = pdf(5, "Invoice")

    assert inspect(ref(), data, max_pages=5).text_bytes == 5 * len("Invoice")
    past = inspect(ref(), data, max_pages=4)
    assert (past.info.pages, past.text_bytes) == (5, 0)


# --- images that cannot be sent ----------------------------------------------------------------------


def test_a_100000_by_100000_png_is_refused_from_its_header() -> None:
    header = png_header(100_000, 100_000)
    assert len(header) < 100  # its signature, IHDR, an empty IDAT and IEND: not a pixel in it

    assert refusal(header, "huge.png") == "an image past any provider's pixel limit"


def test_a_png_header_past_pillow_s_warning_but_below_its_error_is_refused_from_its_header_too() -> None:
    assert refusal(png_header(10_000, 10_000)) == "an image past any provider's pixel limit"  # 100 megapixels


def test_a_png_header_of_a_size_below_pillow_s_bomb_limit_is_read_for_the_limits_to_refuse() -> None:
    attachment = inspect(ref(), png_header(9_000, 1))

    assert (attachment.info.width, attachment.info.height) == (9_000, 1)


def test_a_png_whose_header_checksum_is_wrong_is_refused() -> None:
    assert refusal(png_header(40, 30, valid_crc=False)) == "a broken png file"


@pytest.mark.parametrize("media_type", [MediaType.GIF, MediaType.WEBP, MediaType.PNG])
def test_an_animated_image_is_refused(media_type: MediaType) -> None:
    assert refusal(animated(media_type)) == "an animated image (providers take still ones)"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff\xd8\xff\xe0" + b"\x00" * 20, "a broken jpeg file"),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 10, "a broken webp file"),
        (b"GIF89a" + b"\xff" * 3, "a broken gif file"),
    ],
    ids=["jpeg", "webp", "gif"],
)
def test_a_signature_followed_by_no_valid_header_is_refused(data: bytes, why: str) -> None:
    assert refusal(data) == why


def test_a_gif_whose_trailer_is_an_extension_cut_short_is_refused() -> None:
    # (Pillow raises IndexError reading it: the file's fault, refused like any broken file)
    data = image(MediaType.GIF)[:-1] + b"!"

    assert refusal(data) == "a broken gif file"


@pytest.mark.parametrize("media_type", IMAGES)
def test_no_image_cut_short_is_taken_for_an_image(media_type: MediaType) -> None:
    data = image(media_type, 64, 48)

    for size in range(1, len(data)):
        try:
            kept = inspect(ref(), data[:size])
        except AttachmentInvalidError:
            continue
        # (its first bytes may be text: "GIF8", "RIFF")
        assert kept.media_type is MediaType.TEXT, f"{media_type.value} cut at {size} of {len(data)} bytes"


def test_a_truncated_image_says_so() -> None:
    data = image(MediaType.JPEG, 64, 48)

    assert refusal(data[:-2]) == "a truncated jpeg (it stops before its end marker)"
    assert refusal(image(MediaType.GIF)[:-1]) == "a truncated gif (it stops before its end marker)"
    assert refusal(image(MediaType.PNG)[:-1]) == "a truncated png (it stops before its end marker)"


def test_a_png_with_bytes_after_its_end_is_still_whole() -> None:
    assert inspect(ref(), image(MediaType.PNG) + b"\x00" * 100).media_type is MediaType.PNG


# --- whatever the bytes ------------------------------------------------------------------------------

SEEDS = [pdf(2, "Invoice 4711"), *(image(media_type) for media_type in IMAGES), animated(MediaType.GIF)]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid file with a few bytes changed, cut out or put in."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data) - 1))
        match draw(st.sampled_from(["set", "cut", "insert"])):
            case "set":
                data[at] = draw(st.integers(0, 255))
            case "cut":
                del data[at : at + draw(st.integers(1, 20))]
            case "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=8))
        if not data:
            data = bytearray(b"%")
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(data=st.one_of(mutated(), st.binary(max_size=2048)))
def test_whatever_the_bytes_an_attachment_is_read_or_refused_in_one_line(data: bytes) -> None:
    refusal_line = ""
    try:
        attachment: Attachment | None = inspect(ref(), data)
    except AttachmentInvalidError as refused:
        refusal_line, attachment = refused.message, None
    assert "\n" not in refusal_line
    if attachment is not None:
        assert attachment.info.bytes == len(data)
        assert attachment.media_type is media_type_of(data)
