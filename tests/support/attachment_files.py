"""Attachments for the tests, made as the test needs them: PDFs built object by object (with a text
layer, a page tree that may lie, junk before the header), images of every type Pillow writes, image
headers alone (a PNG whose header claims any size, with a valid CRC or not), and a job type that
reads them."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Annotated

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field
from pypdf import PdfReader, PdfWriter

from engine.core.attachments import AttachmentPolicy, MediaType
from engine.definitions import JobDefinition, Prompt
from engine.definitions.summarize import SummarizeOutput

LETTER = (612, 792)  # points
IMAGE_FORMATS = {MediaType.PNG: "PNG", MediaType.JPEG: "JPEG", MediaType.WEBP: "WEBP", MediaType.GIF: "GIF"}


def pdf(
    pages: int = 1,
    text: str = "",
    *,
    count: int | None = None,
    size: tuple[float, float] = LETTER,
    rotate: int = 0,
    junk: bytes = b"",
) -> bytes:
    """A PDF of `pages` pages of `size` points, each showing `text` in Helvetica, its page tree's
    /Count saying `count` (its true number by default), after `junk` bytes; its xref table exact."""
    first_page = 4
    kids = " ".join(f"{first_page + 2 * n} 0 R" for n in range(pages))
    stated = pages if count is None else count
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {stated} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode() if text else b""
    width, height = size
    for n in range(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] /Rotate {rotate} "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {first_page + 2 * n + 1} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    out = io.BytesIO()
    out.write(junk + b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def encrypted(document: bytes, user_password: str = "secret", algorithm: str = "AES-256") -> bytes:
    """`document` encrypted by pypdf's writer (an empty user password opens it without one)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(document)))
    writer.encrypt(user_password, "owner", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def image(media_type: MediaType, width: int = 40, height: int = 30) -> bytes:
    """A still image of that type and size, as Pillow writes it."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(out, IMAGE_FORMATS[media_type])
    return out.getvalue()


def animated(media_type: MediaType) -> bytes:
    """An image of two frames (GIF, WebP, or APNG for PNG)."""
    first, second = (Image.new("RGB", (10, 10), color) for color in ((255, 0, 0), (0, 0, 255)))
    out = io.BytesIO()
    first.save(out, IMAGE_FORMATS[media_type], save_all=True, append_images=[second])
    return out.getvalue()


def png_header(width: int, height: int, *, valid_crc: bool = True) -> bytes:
    """A PNG of its signature, its IHDR chunk (8-bit RGB, of `width` x `height`), an IDAT chunk holding
    no pixel (an empty zlib stream) and IEND: every chunk whole, a few dozen bytes whatever the size."""
    fields = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    ihdr = _png_chunk(b"IHDR", fields, crc_offset=0 if valid_crc else 1)
    return b"\x89PNG\r\n\x1a\n" + ihdr + _png_chunk(b"IDAT", zlib.compress(b"")) + _png_chunk(b"IEND", b"")


def _png_chunk(kind: bytes, body: bytes, crc_offset: int = 0) -> bytes:
    crc = zlib.crc32(kind + body) ^ crc_offset
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


class ReadFilesInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, Field(min_length=1, max_length=1000)]


# A job type that reads documents and images (and no text file), as a job type declares what it takes.
READ_FILES = JobDefinition(
    name="read_files",
    input_model=ReadFilesInput,
    output_model=SummarizeOutput,
    prompt=Prompt(
        key="read_files",
        version="1",
        system='You read the attached files. Answer with a JSON object {"summary": "..."} and nothing else.',
        user="Question: {question}",
    ),
    max_tokens=512,
    attachments=AttachmentPolicy(max_count=20, media_types=frozenset({MediaType.PDF, *IMAGE_FORMATS})),
)
