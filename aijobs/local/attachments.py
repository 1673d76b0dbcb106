"""What the local provider reads of a request's images and PDFs, and what it bills for them.

The engine sends an image as an `image_url` part whose URL is a `data:` URL of its base64, and a PDF
as a `file` part (`filename`, `file_data` a `data:application/pdf;base64,` URL). Each is decoded and
told apart by its content with the engine's own reader (engine.attachments.inspection). A part that
does not decode to what it claims (no base64, bytes that are not base64, a "data:image/png" that is a
JPEG or no image at all, a broken header, a file part that is no readable PDF) is refused as OpenAI
refuses it: a 400 `invalid_request_error` naming the part (`param`). An image by URL is refused as
OpenAI refuses a URL it cannot download: this provider fetches nothing.

What they cost, as OpenAI bills them (its "Images and vision" and "PDF files" guides), for the model
asked for: an image at detail `low` costs the model's base; at any other detail, its tile models
(gpt-4o 85 + 170 a tile, gpt-4o-mini 2,833 + 5,667, o1 and o3 75 + 150) fit it in 2048 x 2048, scale
its short side down to 768, and add a tile's price for every 512-px tile; its patch models
(gpt-4.1-mini and -nano, gpt-5-mini and -nano, o4-mini) count 32-px patches, at most 1,536 (scaled down
to fit, as the guide's steps say), times the model's multiplier. Each resized side is rounded to the
nearest pixel, as an image scaler does (the engine's estimate rounds up instead: docs/attachments.md).
A PDF costs an image of each page rendered at 150 DPI, priced the same way, and its text (what pypdf
extracts) at four characters a token. The PDFs' text is also read for fault markers, as the prompt is.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from aijobs.local.refusals import InvalidRequestError
from engine.attachments.inspection import inspect, media_type_of
from engine.core.attachments import Attachment, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError

# OpenAI's tile models: (a family the model's id contains, base tokens, tokens a tile), the first
# family that matches wins; any other model is priced as gpt-4o.
TILE_MODELS: tuple[tuple[str, int, int], ...] = (
    ("gpt-4o-mini", 2833, 5667),
    ("o1", 75, 150),
    ("o3", 75, 150),
    ("computer-use", 65, 129),
)
DEFAULT_TILES = (85, 170)
# Its patch models: (family, multiplier).
PATCH_MODELS: tuple[tuple[str, float], ...] = (
    ("gpt-4.1-mini", 1.62),
    ("gpt-4.1-nano", 2.46),
    ("gpt-5-mini", 1.62),
    ("gpt-5-nano", 2.46),
    ("o4-mini", 1.72),
)
FIT_PX, SHORT_PX, TILE_PX = 2048, 768, 512
PATCH_PX, MAX_PATCHES = 32, 1536
# A PDF's pages are rendered at this resolution (points are 1/72 inch).
PAGE_DPI = 150
POINTS_PER_INCH = 72
CHARS_PER_TOKEN = 4
# The MIME types an image's data URL may name, and what each is.
IMAGE_MIMES = {media.value: media for media in MediaType if media.is_image} | {"image/jpg": MediaType.JPEG}
IMAGE_EXAMPLE = "data:image/png;base64,aW1nIGJ5dGVzIGhlcmU="
PDF_EXAMPLE = "data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=="
PDF_MIMES = (MediaType.PDF.value,)
_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<payload>.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ReadAttachments:
    """What a request's images and PDFs are to the provider: their input tokens, and their PDFs' text."""

    tokens: int = 0
    text: str = ""
    count: int = 0


NONE_READ = ReadAttachments()


def read_attachments(messages: list[Any], model: str) -> ReadAttachments:
    """The images and PDFs of the user messages of a request whose structure was checked
    (aijobs.local.refusals); InvalidRequestError for a part whose content is not what it claims."""
    tokens, texts, count = 0, [], 0
    for at, kind, value in _parts(messages):
        if kind == "image_url":
            tokens += _image_part_tokens(value, f"{at}.image_url", model)
        else:
            pages, page_texts = _file_part(value, f"{at}.file", model)
            # Billed for what the pages say; read (for fault markers) a page a line.
            tokens += pages + text_tokens("".join(page_texts))
            texts.append("\n".join(page_texts))
        count += 1
    return ReadAttachments(tokens, "\n".join(texts), count) if count else NONE_READ


def _parts(messages: list[Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, type, the part's object) of each image and file part of the user messages."""
    for index, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for number, part in enumerate(content):
            if part["type"] in ("image_url", "file"):
                yield f"messages[{index}].content[{number}]", part["type"], part[part["type"]]


# --- images ---


def _image_part_tokens(image: dict[str, Any], at: str, model: str) -> int:
    url: str = image["url"]
    where = f"{at}.url"
    if not url.startswith("data:"):
        message = f"Error while downloading {url[:200]}: the local provider fetches no URL (send a data URL)."
        raise InvalidRequestError(message, where, "invalid_image_url")
    mime, data = _decoded(url, where, f"Invalid '{where}'", IMAGE_MIMES, "an image MIME type", IMAGE_EXAMPLE)
    claimed = IMAGE_MIMES[mime]
    found = media_type_of(data)
    if found is not claimed:
        raise InvalidRequestError(
            f"You uploaded an unsupported image: its data URL says {claimed.value}, but its bytes are "
            f"{_described(found)}.",
            where,
            "invalid_image_format",
        )
    try:
        info = inspect(AttachmentRef("request", where), data).info
    except AttachmentInvalidError as exc:
        raise InvalidRequestError(f"You uploaded an unsupported image ({exc}).", where, "invalid_image_format") from exc
    if image.get("detail") == "low":
        return _tile_prices(model)[0]
    return image_tokens(model, info.width or 1, info.height or 1)


def image_tokens(model: str, width: int, height: int) -> int:
    """An image's tokens at detail high, as OpenAI bills `model` for it."""
    multiplier = next((value for family, value in PATCH_MODELS if family in model), None)
    if multiplier is not None:
        return math.ceil(_patches(width, height) * multiplier)
    base, tile = _tile_prices(model)
    return base + tile * _tiles(width, height)


def _tile_prices(model: str) -> tuple[int, int]:
    return next(((base, tile) for family, base, tile in TILE_MODELS if family in model), DEFAULT_TILES)


def _tiles(width: int, height: int) -> int:
    """Fit in 2048 x 2048, the short side down to 768, then 512-px tiles; each side rounded to the pixel."""
    scale = min(1.0, FIT_PX / max(width, height))
    width, height = _pixels(width * scale), _pixels(height * scale)
    short = min(width, height)
    if short > SHORT_PX:
        width, height = _pixels(width * SHORT_PX / short), _pixels(height * SHORT_PX / short)
    return math.ceil(width / TILE_PX) * math.ceil(height / TILE_PX)


def _patches(width: int, height: int) -> int:
    """32-px patches; past 1,536 the image is scaled down to fit, shrunk so that a side fits whole patches."""
    patches = math.ceil(width / PATCH_PX) * math.ceil(height / PATCH_PX)
    if patches <= MAX_PATCHES:
        return patches
    scale = math.sqrt(PATCH_PX * PATCH_PX * MAX_PATCHES / (width * height))
    across, down = width * scale / PATCH_PX, height * scale / PATCH_PX
    scale *= min(math.floor(across) / across, math.floor(down) / down)
    return min(math.ceil(width * scale / PATCH_PX) * math.ceil(height * scale / PATCH_PX), MAX_PATCHES)


def _pixels(size: float) -> int:
    """A resized side, rounded to the nearest pixel (halves up), at least one."""
    return max(1, math.floor(size + 0.5))


# --- PDFs ---


def _file_part(file: dict[str, Any], at: str, model: str) -> tuple[int, list[str]]:
    """A PDF part's page images' tokens, and the text of each page."""
    if not isinstance(file.get("file_data"), str):
        message = f"Invalid '{at}.file_id': the local provider keeps no files for chat; send the file as file_data."
        raise InvalidRequestError(message, f"{at}.file_id", "invalid_value")
    where = f"{at}.file_data"
    prefix = f"Invalid file data: '{where}'"
    data = _decoded(file["file_data"], where, prefix, PDF_MIMES, "an application/pdf MIME type", PDF_EXAMPLE)[1]
    found = media_type_of(data)
    if found is not MediaType.PDF:
        raise InvalidRequestError(f"{prefix}. Its bytes are {_described(found)}, not a PDF.", where, "invalid_value")
    name = file.get("filename")
    try:
        attachment = inspect(AttachmentRef("request", where, name if isinstance(name, str) else None), data)
    except AttachmentInvalidError as exc:
        raise InvalidRequestError(f"{prefix}. The PDF cannot be read ({exc}).", where, "invalid_value") from exc
    return page_tokens(model, attachment), page_texts(data)


def page_tokens(model: str, pdf: Attachment) -> int:
    """The images of a PDF's pages, each rendered at 150 DPI, as OpenAI bills `model` for them."""
    dots = PAGE_DPI / POINTS_PER_INCH
    return sum(image_tokens(model, _pixels(width * dots), _pixels(height * dots)) for width, height in pdf.page_sizes)


def page_texts(data: bytes) -> list[str]:
    """The text of each of a PDF's pages (read once inspect() has taken it as a PDF); "" for a blank one."""
    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    reader = PdfReader(io.BytesIO(data), strict=False)
    if reader.is_encrypted:
        reader.decrypt("")
    return [page.extract_text() or "" for page in reader.pages]


def text_tokens(text: str) -> int:
    """Four characters a token (none for no text)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


# --- data URLs ---


def _decoded(
    url: str, where: str, prefix: str, accepted: Collection[str], expected: str, example: str
) -> tuple[str, bytes]:
    """A base64 data URL's MIME type (one of `accepted`) and bytes; InvalidRequestError, in OpenAI's
    words, for any other value (`expected`: what the MIME type should be)."""
    match = _DATA_URL.fullmatch(url)
    mime = match.group("mime").lower() if match is not None else ""
    if match is None or "base64" not in match.group("params").lower().split(";"):
        got = "a value that is not a base64 data URL"
    elif mime not in accepted:
        got = f"unsupported MIME type '{mime[:100]}'"
    else:
        try:
            return mime, base64.b64decode(match.group("payload"), validate=True)
        except binascii.Error:
            got = "an invalid base64-encoded value"
    message = f"{prefix}. Expected a base64-encoded data URL with {expected} (e.g. '{example}'), but got {got}."
    raise InvalidRequestError(message, where, "invalid_value")


def _described(media: MediaType | None) -> str:
    if media is None:
        return "of no type it takes"
    return "text" if media is MediaType.TEXT else f"a {media.extension.upper()}"
