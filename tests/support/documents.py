"""Small documents and images made for a test, and a job type that reads them.

`read_documents` takes one to five attachments of every type the engine sends; no built-in job type
is needed for the client's, the CLI's and the dashboard's tests of attachments. The embedded stack
loads it as any job type of your own: AIJOBS_JOB_MODULES=tests.support.documents.
"""

from __future__ import annotations

import io
from typing import Annotated

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field
from pypdf import PdfWriter

from engine.core.attachments import ALL_TYPES, AttachmentPolicy, MediaType
from engine.definitions import JobDefinition, Prompt

MODULE = __name__
# An SVG that means to run when shown, and an HTML page named as a PNG: UTF-8 text to the engine.
HOSTILE_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned = \'svg\'">'
    b"<script>window.__pwned = 'svg-script'; alert(1)</script></svg>"
)
HTML_AS_PNG = b"<!doctype html><html><body><script>window.__pwned = 'html'; alert(2)</script></body></html>"


def pdf(pages: int = 1, width: float = 612, height: float = 792) -> bytes:
    """A PDF of `pages` blank pages (US Letter unless told)."""
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width, height)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def image(width: int = 64, height: int = 48, kind: str = "PNG") -> bytes:
    """A still image of one colour, `kind` as Pillow names the format (PNG, JPEG, WEBP, GIF)."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(buffer, kind)
    return buffer.getvalue()


class ReadDocumentsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, Field(min_length=1, max_length=2_000)]


class ReadDocumentsOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: Annotated[str, Field(min_length=1, max_length=2_000)]


READ_DOCUMENTS = JobDefinition(
    name="read_documents",
    input_model=ReadDocumentsInput,
    output_model=ReadDocumentsOutput,
    prompt=Prompt(
        key="read_documents",
        version="1",
        system='Answer the question from the attached documents. Answer with a JSON object {"answer": ...}.',
        user="Question: {question}",
    ),
    max_tokens=256,
    attachments=AttachmentPolicy(max_count=5, media_types=ALL_TYPES, min_count=1),
)
# Only PDFs: a type that refuses images.
READ_PDFS = JobDefinition(
    name="read_pdfs",
    input_model=ReadDocumentsInput,
    output_model=ReadDocumentsOutput,
    prompt=READ_DOCUMENTS.prompt,
    max_tokens=256,
    attachments=AttachmentPolicy(max_count=2, media_types=frozenset({MediaType.PDF})),
)
JOB_DEFINITIONS = [READ_DOCUMENTS, READ_PDFS]
