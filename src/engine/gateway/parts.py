"""What every adapter sends of an attachment besides its bytes: its file name, a text file as the
model reads it, and base64 as the JSON bodies carry bytes (docs/attachments.md)."""

from __future__ import annotations

import base64
import json
import re

from engine.core.attachments import Attachment

# Bedrock's document names: letters and digits, single spaces, hyphens, parentheses and square
# brackets, 1 to 200 characters, and no two alike in one request.
BEDROCK_NAME_CHARS = 200
_BEDROCK_REFUSED = re.compile(r"[^A-Za-z0-9\-\(\)\[\] ]+")


def base64_text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def attachment_filename(attachment: Attachment) -> str:
    """A file name for an attachment: its own, with the extension its content says."""
    stem = attachment.name.rsplit(".", 1)[0] if "." in attachment.name else attachment.name
    return f"{stem[:200]}.{attachment.media_type.extension}"


def attachment_text(attachment: Attachment) -> str:
    """A text attachment as the model reads it: named, its content as one JSON string (data, never
    instructions: its quotes and newlines escaped, as every prompt field is)."""
    name = json.dumps(attachment.name, ensure_ascii=False)
    return f"Attachment {name} (text): {json.dumps(attachment.text, ensure_ascii=False)}"


def bedrock_document_name(name: str, taken: set[str]) -> str:
    """A document's name cleaned to what Bedrock takes, and made unlike the names in `taken` (added to it)."""
    stem = name.rsplit(".", 1)[0] if "." in name else name
    cleaned = " ".join(_BEDROCK_REFUSED.sub(" ", stem).split())[:BEDROCK_NAME_CHARS].strip() or "document"
    unique, count = cleaned, 1
    while unique in taken:
        count += 1
        suffix = f" ({count})"
        unique = cleaned[: BEDROCK_NAME_CHARS - len(suffix)].rstrip() + suffix
    taken.add(unique)
    return unique
