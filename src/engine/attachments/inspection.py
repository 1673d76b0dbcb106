"""What an attachment is, from its bytes: never from its name, never by decoding a pixel.

The media type comes from the content's signature (a PDF may have up to 1 KiB of junk before its
`%PDF-` header, as readers allow); a PDF is opened with pypdf to count its pages (walking the page
tree, not trusting its `/Count`), refusing one that is encrypted, truncated or corrupt; an image's
header is read with Pillow (lazily: `Image.open` reads the header and decodes nothing) for its pixel
size, refusing one whose header is broken or animated, and its structure walked to its end
(engine.attachments.structure), refusing one cut short; text must be UTF-8 without NUL bytes.
Whatever either library raises on a file is the file's fault: it is refused, never retried.
"""

from __future__ import annotations

import hashlib
import io
import logging
import warnings
from typing import Any

from engine.attachments.structure import is_whole
from engine.core.attachments import Attachment, AttachmentInfo, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError

# A PDF's header may follow up to this much junk (as PDF readers accept).
PDF_HEADER_WITHIN = 1024
# Its end-of-file marker must be within this much of its end: a cut file has none.
PDF_EOF_WITHIN = 1024

_SIGNATURES: tuple[tuple[bytes, MediaType], ...] = (
    (b"\x89PNG\r\n\x1a\n", MediaType.PNG),
    (b"\xff\xd8\xff", MediaType.JPEG),
    (b"GIF87a", MediaType.GIF),
    (b"GIF89a", MediaType.GIF),
)


def media_type_of(data: bytes) -> MediaType | None:
    """The media type its content says, or None for content of no type the engine sends."""
    for signature, media_type in _SIGNATURES:
        if data.startswith(signature):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return MediaType.WEBP
    if b"%PDF-" in data[:PDF_HEADER_WITHIN]:
        return MediaType.PDF
    if _is_text(data):
        return MediaType.TEXT
    return None


def inspect(ref: AttachmentRef, data: bytes, max_pages: int | None = None) -> Attachment:
    """What the attachment is, with its content; AttachmentInvalidError (one line naming it) when it
    cannot be sent. A PDF of more than `max_pages` pages (it will be refused) has its pages counted
    but its text not read: reading the text of tens of thousands of pages takes minutes."""
    media_type = media_type_of(data)
    if media_type is None:
        raise AttachmentInvalidError(f"attachment {ref.label}: not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text")
    digest = hashlib.sha256(data).hexdigest()
    if media_type is MediaType.PDF:
        sizes, text_bytes = _pdf_pages(ref, data, max_pages)
        info = AttachmentInfo(ref, media_type, len(data), digest, pages=len(sizes))
        return Attachment(info, data, text_bytes, sizes)
    if media_type.is_image:
        width, height = _image_size(ref, data, media_type)
        return Attachment(AttachmentInfo(ref, media_type, len(data), digest, width=width, height=height), data)
    return Attachment(AttachmentInfo(ref, media_type, len(data), digest), data, len(data))


def _is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _pdf_pages(ref: AttachmentRef, data: bytes, max_pages: int | None) -> tuple[tuple[tuple[float, float], ...], int]:
    """The sizes of the pages a PDF has (walking its page tree), and the UTF-8 bytes of its text layer
    (none read past `max_pages` pages)."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError

    if b"%%EOF" not in data[-PDF_EOF_WITHIN:]:
        raise AttachmentInvalidError(f"attachment {ref.label}: a truncated PDF (no end-of-file marker)")
    # pypdf warns of what it repairs through its logger: quiet here, since a repaired file still counts.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise AttachmentInvalidError(f"attachment {ref.label}: an encrypted PDF (it needs a password)")
        sizes = tuple(_displayed_size(page) for page in reader.pages)
        text_bytes = 0
        if max_pages is None or len(sizes) <= max_pages:
            text_bytes = sum(len((page.extract_text() or "").encode("utf-8", "surrogatepass")) for page in reader.pages)
    except AttachmentInvalidError:
        raise
    except (DependencyError, FileNotDecryptedError) as exc:
        raise AttachmentInvalidError(f"attachment {ref.label}: an encrypted PDF") from exc
    except Exception as exc:  # pypdf's own errors, and whatever else a hostile file drives it to
        raise AttachmentInvalidError(f"attachment {ref.label}: a corrupt PDF ({type(exc).__name__})") from exc
    if not sizes:
        raise AttachmentInvalidError(f"attachment {ref.label}: a PDF with no pages")
    return sizes, text_bytes


def _displayed_size(page: Any) -> tuple[float, float]:
    """A page's width and height in points, as it is displayed (turned by its /Rotate)."""
    width, height = abs(float(page.mediabox.width)), abs(float(page.mediabox.height))
    if not (width > 0 and height > 0):
        raise ValueError("a page of no size")
    return (height, width) if int(page.get("/Rotate", 0) or 0) % 180 else (width, height)


def _image_size(ref: AttachmentRef, data: bytes, media_type: MediaType) -> tuple[int, int]:
    """An image's pixel size from its header (nothing is decoded)."""
    from PIL import Image

    try:
        # Pillow warns of an image past 89 megapixels and raises past twice that; both are past any
        # provider's 8,000 px a side (64 megapixels): refused alike, nothing logged.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
        with opened as image:
            width, height = image.size
            animated: Any = getattr(image, "is_animated", False)
            if image.format is None or image.format.lower() != media_type.extension:
                raise AttachmentInvalidError(f"attachment {ref.label}: its header is not a {media_type.extension}")
            if animated:
                raise AttachmentInvalidError(f"attachment {ref.label}: an animated image (providers take still ones)")
            whole = is_whole(media_type, data, image)
    except AttachmentInvalidError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise AttachmentInvalidError(f"attachment {ref.label}: an image past any provider's pixel limit") from exc
    except Exception as exc:  # Pillow's own errors, and whatever else a hostile header drives it to
        raise AttachmentInvalidError(f"attachment {ref.label}: a broken {media_type.extension} file") from exc
    if not whole:
        raise AttachmentInvalidError(
            f"attachment {ref.label}: a truncated {media_type.extension} (it stops before its end marker)"
        )
    if width < 1 or height < 1:
        raise AttachmentInvalidError(f"attachment {ref.label}: an image of {width} x {height} pixels")
    return width, height
