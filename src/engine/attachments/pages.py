"""A PDF attachment cut into page ranges, each a PDF of its own (docs/pipelines.md, "Map kinds").

A pipeline's map over a PDF (`summarize_long` with a PDF instead of a text) makes one child a page
range: `PageRanges.split` reads the parent's PDF (from a bucket the stack reads, at most
`max_bytes`), counts its pages, and writes each range as a new PDF to the payload bucket under its
child's attachments (`attachments/<child id>/pages-<first>-<last>.pdf`). Each child is then an
ordinary job with one attachment: read, checked against the provider's limits and priced like any
other. A part's key is its child's and its pages', written only when absent, so a parent's advance
run twice writes nothing twice and never replaces what a child may be reading.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable, Iterable
from typing import Protocol

from engine.attachments.inspection import media_type_of
from engine.attachments.loader import AttachmentObjects
from engine.core.attachments import AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError

# A part's key, from its number and its first and last pages (1-based, inclusive).
PartKey = Callable[[int, int, int], str]


def part_key(child_id: str, first: int, last: int) -> str:
    """Where a child's part is kept: beside the attachments a submission uploads for a job."""
    return f"attachments/{child_id}/pages-{first}-{last}.pdf"


class PartsBucket(Protocol):
    """Where the parts are written: the payload bucket (engine.store.payloads.PayloadStore)."""

    bucket: str

    def put_new(self, key: str, data: bytes, content_type: str) -> bool: ...


class PageRanges:
    def __init__(
        self,
        objects: AttachmentObjects,
        parts: PartsBucket,
        buckets: Iterable[str],
        *,
        max_bytes: int,
        max_parts: int,
        max_part_pages: int,
    ) -> None:
        self._objects = objects
        self._parts = parts
        self._buckets = frozenset(buckets)
        self._max_bytes = max_bytes
        self._max_parts = max_parts
        # The pages one request may carry (the provider's): no part is cut larger, so none is refused for it.
        self._max_part_pages = max_part_pages

    def split(self, ref: AttachmentRef, pages_per_part: int, key: PartKey) -> list[AttachmentRef]:
        """The PDF's page ranges of `pages_per_part` pages (more, when that would make more than
        `max_parts` parts, up to the provider's pages a request), each written as a PDF;
        AttachmentInvalidError (one line) when it cannot be, before any part is written."""
        if ref.bucket not in self._buckets:
            raise AttachmentInvalidError(
                f"attachment {ref.label}: bucket {ref.bucket} is not one this stack reads "
                "(the payload bucket, or one of AIJOBS_ATTACHMENT_BUCKETS)"
            )
        head = self._objects.head(ref)
        if head.size > self._max_bytes:
            raise AttachmentInvalidError(
                f"attachment {ref.label}: {head.size} bytes; a map takes at most {self._max_bytes}"
            )
        data = self._objects.read(ref, head)
        if media_type_of(data) is not MediaType.PDF:
            raise AttachmentInvalidError(f"attachment {ref.label}: not a PDF (a map over pages takes a PDF)")
        parts = self._cut(ref, data, pages_per_part)
        refs = []
        for number, (first, last, pdf) in enumerate(parts):
            part_key = key(number, first, last)
            self._parts.put_new(part_key, pdf, MediaType.PDF.value)
            refs.append(AttachmentRef(self._parts.bucket, part_key, f"{ref.label} pages {first}-{last}"))
        return refs

    def _cut(self, ref: AttachmentRef, data: bytes, pages_per_part: int) -> list[tuple[int, int, bytes]]:
        """Each part's first and last pages (1-based) and its PDF."""
        from pypdf import PdfReader, PdfWriter

        # pypdf warns of what it repairs through its logger: quiet here, since a repaired file still reads.
        logging.getLogger("pypdf").setLevel(logging.ERROR)
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
            if reader.is_encrypted and not reader.decrypt(""):
                raise AttachmentInvalidError(f"attachment {ref.label}: an encrypted PDF (it needs a password)")
            pages = len(reader.pages)
            if not pages:
                raise AttachmentInvalidError(f"attachment {ref.label}: a PDF with no pages")
            size = max(min(pages_per_part, self._max_part_pages), math.ceil(pages / self._max_parts))
            if size > self._max_part_pages:
                most = self._max_parts * self._max_part_pages
                raise AttachmentInvalidError(
                    f"attachment {ref.label}: {pages} pages; a map over its pages takes at most {most} "
                    f"({self._max_parts} parts of {self._max_part_pages}, the provider's pages a request)"
                )
            parts = []
            for first in range(0, pages, size):
                end = min(first + size, pages)
                writer = PdfWriter()
                for index in range(first, end):
                    writer.add_page(reader.pages[index])
                out = io.BytesIO()
                writer.write(out)
                parts.append((first + 1, end, out.getvalue()))
        except AttachmentInvalidError:
            raise
        except Exception as exc:  # pypdf's own errors, and whatever else a hostile file drives it to
            raise AttachmentInvalidError(f"attachment {ref.label}: a corrupt PDF ({type(exc).__name__})") from exc
        return parts
