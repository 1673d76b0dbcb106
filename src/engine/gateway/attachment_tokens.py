"""How many input tokens an attachment costs, estimated before the call from what was read of it.

The estimate reserves budgets and shared token limits, so it must never fall below what the
provider then bills; every ambiguous step is rounded up (docs/attachments.md gives the formulas and
their sources). Images are priced from their pixel size by the provider's own formula for the model;
a PDF as each provider bills one, an image of every page and the text on it; text as its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.core.attachments import Attachment, MediaType

# No tokenizer in use makes a token of less than two UTF-8 bytes of prose in any script it was
# trained on (English runs near four; CJK, three a character and one or two tokens a character).
TEXT_BYTES_PER_TOKEN = 2
# What each attachment's framing adds (its part's type, a name, separators).
FRAMING_TOKENS = 16

# OpenAI's tile models (gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3...): base and per-512-px-tile tokens at
# detail high; gpt-4o-mini bills its images at its own (higher) counts. Checked in order: the first
# family a model's id contains wins.
_OPENAI_TILES: tuple[tuple[str, int, int], ...] = (
    ("gpt-4o-mini", 2833, 5667),
    ("o1", 75, 150),
    ("o3", 75, 150),
    ("computer-use", 65, 129),
)
_OPENAI_DEFAULT_TILES = (85, 170)
# OpenAI's patch models: 32-px patches, at most 1536 of them, times the model's multiplier.
_OPENAI_PATCHES: tuple[tuple[str, float], ...] = (
    ("gpt-4.1-mini", 1.62),
    ("gpt-4.1-nano", 2.46),
    ("gpt-5-mini", 1.62),
    ("gpt-5-nano", 2.46),
    ("o4-mini", 1.72),
)
PATCH_PX, MAX_PATCHES = 32, 1536
TILE_PX, TILE_FIT_PX, TILE_SHORT_PX = 512, 2048, 768
# A PDF page is priced as an image of its shape whose long side is this many pixels (a provider's
# image of a page, resized to its own bounds, costs no more).
PAGE_PX = 2048
# Anthropic's models (and Claude on Bedrock): 28-px patches of the image resized to at most 1568 px a
# side and "about 1.15 megapixels", or w x h / 750, whichever is more. Its table of sizes it does not
# resize goes up to 784 x 1568 (1.23 megapixels; 1092 x 1092 is billed about 1,590 tokens), so the
# estimate resizes only past that. Nova bills about w x h / 500 of the image resized to 1.69 megapixels.
CLAUDE_LONG_EDGE, CLAUDE_PIXELS, CLAUDE_PATCH_PX, CLAUDE_PIXELS_PER_TOKEN = 1568, 784 * 1568, 28, 750
NOVA_PIXELS, NOVA_PIXELS_PER_TOKEN = 1_690_000, 500


def attachment_tokens(provider: str, model: str, attachments: Sequence[Attachment]) -> int:
    """The input tokens `attachments` add to a request to `model` of `provider`, at most."""
    return sum(_tokens(provider, model, attachment) + FRAMING_TOKENS for attachment in attachments)


def _tokens(provider: str, model: str, attachment: Attachment) -> int:
    info = attachment.info
    if info.media_type is MediaType.TEXT:
        return _text_tokens(info.bytes)
    if info.media_type is MediaType.PDF:
        sizes = attachment.page_sizes or ((PAGE_PX, PAGE_PX),) * (info.pages or 1)
        pages = sum(image_tokens(provider, model, *_rendered(width, height)) for width, height in sizes)
        return pages + _text_tokens(attachment.text_bytes)
    return image_tokens(provider, model, info.width or 1, info.height or 1)


def _rendered(width_pt: float, height_pt: float) -> tuple[int, int]:
    """A page as the provider's image of it, at its largest: its long side PAGE_PX pixels (no provider
    prices a page's image past what fitting it in 2048 px leaves)."""
    scale = PAGE_PX / max(width_pt, height_pt)
    return max(math.ceil(width_pt * scale), 1), max(math.ceil(height_pt * scale), 1)


def image_tokens(provider: str, model: str, width: int, height: int) -> int:
    """An image's tokens by the provider's formula for the model, rounded up where the formula is vague."""
    if provider == "openai":
        multiplier = _patch_multiplier(model)
        if multiplier is not None:
            return _openai_patches(width, height, multiplier)
        base, tile = _tiles(model)
        return base + tile * _openai_tile_count(width, height)
    if "nova" in model:
        return _nova(width, height)
    return _claude(width, height)


def _text_tokens(text_bytes: int) -> int:
    return math.ceil(text_bytes / TEXT_BYTES_PER_TOKEN)


def _patch_multiplier(model: str) -> float | None:
    return next((multiplier for family, multiplier in _OPENAI_PATCHES if family in model), None)


def _tiles(model: str) -> tuple[int, int]:
    return next(((base, tile) for family, base, tile in _OPENAI_TILES if family in model), _OPENAI_DEFAULT_TILES)


def _openai_tile_count(width: int, height: int) -> int:
    """Fit in 2048 x 2048, then scale the short side down to 768, then count 512-px tiles; each scaled
    side is taken at its largest rounding (the documents do not say how they round)."""
    scale = min(1.0, TILE_FIT_PX / max(width, height))
    w, h = width * scale, height * scale
    short = min(w, h)
    if short > TILE_SHORT_PX:
        w, h = w * TILE_SHORT_PX / short, h * TILE_SHORT_PX / short
    return math.ceil(math.ceil(w) / TILE_PX) * math.ceil(math.ceil(h) / TILE_PX)


def _openai_patches(width: int, height: int, multiplier: float) -> int:
    raw = math.ceil(width / PATCH_PX) * math.ceil(height / PATCH_PX)
    if raw > MAX_PATCHES:
        scale = math.sqrt(PATCH_PX * PATCH_PX * MAX_PATCHES / (width * height))
        raw = math.ceil(width * scale / PATCH_PX) * math.ceil(height * scale / PATCH_PX)
    return math.ceil(min(raw, MAX_PATCHES) * multiplier)


def _claude(width: int, height: int) -> int:
    scale = min(1.0, CLAUDE_LONG_EDGE / max(width, height), math.sqrt(CLAUDE_PIXELS / (width * height)))
    w, h = math.ceil(width * scale), math.ceil(height * scale)
    patches = math.ceil(w / CLAUDE_PATCH_PX) * math.ceil(h / CLAUDE_PATCH_PX)
    return max(patches, math.ceil(w * h / CLAUDE_PIXELS_PER_TOKEN))


def _nova(width: int, height: int) -> int:
    scale = min(1.0, math.sqrt(NOVA_PIXELS / (width * height)))
    return math.ceil(math.ceil(width * scale) * math.ceil(height * scale) / NOVA_PIXELS_PER_TOKEN)
