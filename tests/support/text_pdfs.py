"""PDFs made for a test: pages of text in a standard font (pypdf's writer), e.g. a fault marker a
page says, or a page of a given size."""

from __future__ import annotations

import io
from collections.abc import Sequence

from pypdf import PdfWriter
from pypdf.generic import DictionaryObject, NameObject, StreamObject

LETTER = (612.0, 792.0)
A4 = (595.0, 842.0)
FONT_SIZE = 11
LINE_POINTS = 15
MARGIN_POINTS = 72


def text_pdf(pages: Sequence[str], size: tuple[float, float] = LETTER, password: str | None = None) -> bytes:
    """A PDF of `pages` pages of `size` points, each showing its text (a line a line), in Helvetica;
    encrypted with `password` when one is given."""
    writer = PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    resources = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    width, height = size
    for text in pages:
        page = writer.add_blank_page(width, height)
        page[NameObject("/Resources")] = resources
        content = StreamObject()
        content.set_data(_shown(text, height))
        page[NameObject("/Contents")] = writer._add_object(content)
        page.compress_content_streams()
    if password is not None:
        writer.encrypt(password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _shown(text: str, height: float) -> bytes:
    """A content stream showing `text`'s lines from the top margin down."""
    lines = [f"BT /F1 {FONT_SIZE} Tf {LINE_POINTS} TL {MARGIN_POINTS} {height - MARGIN_POINTS} Td"]
    for line in text.splitlines():
        escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        lines.append(f"({escaped}) Tj T*")
    lines.append("ET")
    return "\n".join(lines).encode("latin-1")
