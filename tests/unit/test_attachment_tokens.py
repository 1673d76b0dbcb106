"""Token estimates of attachments (engine.gateway.attachment_tokens): the providers' documented examples
computed by hand, and a property that the estimate is never below a reference implementation of each
provider's formula, for any rounding the formula leaves open (floor or round at each resize)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.gateway.attachment_tokens import image_tokens

Rounding = Callable[[float], int]
ROUNDINGS: tuple[Rounding, ...] = (math.floor, round, math.ceil)


@pytest.mark.parametrize(
    ("model", "size", "tokens"),
    [
        # OpenAI's tile models: 85 + 170 a tile at detail high
        ("gpt-4o", (1024, 1024), 85 + 170 * 4),  # 768 x 768: 2 x 2 tiles
        ("gpt-4o", (2048, 4096), 85 + 170 * 6),  # 1024 x 2048, then 768 x 1536: 2 x 3 tiles
        ("gpt-4o", (512, 512), 85 + 170),
        ("gpt-4o-mini", (1024, 1024), 2833 + 5667 * 4),
        # OpenAI's patch models: 32-px patches (at most 1536) times the model's multiplier
        ("gpt-4.1-mini", (1024, 1024), math.ceil(32 * 32 * 1.62)),
        ("gpt-4.1-nano", (64, 64), math.ceil(4 * 2.46)),
    ],
)
def test_openai_images_cost_what_its_documents_compute(model: str, size: tuple[int, int], tokens: int) -> None:
    assert image_tokens("openai", model, *size) == tokens


def test_an_openai_patch_image_past_1536_patches_costs_at_least_the_documented_1452_patches() -> None:
    # OpenAI's own example: 1800 x 2400 is resized to 1056 x 1408, 33 x 44 = 1452 patches
    assert image_tokens("openai", "gpt-4.1-mini", 1800, 2400) >= math.ceil(1452 * 1.62)
    assert image_tokens("openai", "gpt-4.1-mini", 1800, 2400) <= math.ceil(1536 * 1.62)


@pytest.mark.parametrize(
    ("size", "tokens"),
    [
        ((200, 200), 54),  # 200 x 200 / 750 = 53.3
        ((1000, 1000), 1334),  # 1,000,000 / 750 = 1333.3
        ((1092, 1092), 1590),  # Anthropic's table: about 1,590 for 1092 x 1092
    ],
)
def test_claude_images_cost_what_anthropic_s_documents_compute(size: tuple[int, int], tokens: int) -> None:
    assert image_tokens("bedrock", "anthropic.claude-3-5-sonnet-20241022-v2:0", *size) >= tokens
    assert image_tokens("anthropic", "claude-sonnet-4-5", *size) >= tokens


def test_nova_images_cost_their_pixels_over_500_of_the_image_resized_to_1_69_megapixels() -> None:
    assert image_tokens("bedrock", "amazon.nova-lite-v1:0", 1000, 1000) == 2000
    assert image_tokens("bedrock", "amazon.nova-lite-v1:0", 1300, 1300) == 3380  # 1,690,000 / 500


# --- reference implementations, for any rounding ---------------------------------------------------


def openai_tiles(width: int, height: int, rounded: Rounding) -> int:
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        w, h = rounded(w * 2048 / max(w, h)), rounded(h * 2048 / max(w, h))
    if min(w, h) > 768:
        w, h = rounded(w * 768 / min(w, h)), rounded(h * 768 / min(w, h))
    return math.ceil(w / 512) * math.ceil(h / 512)


def openai_patches(width: int, height: int, rounded: Rounding) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches > 1536:
        shrink = math.sqrt(32 * 32 * 1536 / (width * height))
        w, h = width * shrink, height * shrink
        fit = math.floor(w / 32) / (w / 32)  # whole patches across
        w, h = rounded(w * fit), rounded(h * fit)
        patches = math.ceil(w / 32) * math.ceil(h / 32)
    return min(patches, 1536)


def claude(width: int, height: int, rounded: Rounding) -> int:
    """Anthropic's: resized to 1568 px a side and to the largest of its table's unresized sizes (784 x 1568)."""
    scale = min(1.0, 1568 / max(width, height), math.sqrt(784 * 1568 / (width * height)))
    w, h = max(rounded(width * scale), 1), max(rounded(height * scale), 1)
    return math.ceil(w * h / 750)


def nova(width: int, height: int, rounded: Rounding) -> int:
    scale = min(1.0, math.sqrt(1_690_000 / (width * height)))
    w, h = max(rounded(width * scale), 1), max(rounded(height * scale), 1)
    return math.ceil(w * h / 500)


SIDE = st.integers(1, 20_000)


@given(width=SIDE, height=SIDE)
def test_an_openai_image_estimate_is_never_below_what_its_formula_bills(width: int, height: int) -> None:
    for rounded in ROUNDINGS:
        assert image_tokens("openai", "gpt-4o", width, height) >= 85 + 170 * openai_tiles(width, height, rounded)
        tiles = openai_tiles(width, height, rounded)
        assert image_tokens("openai", "gpt-4o-mini", width, height) >= 2833 + 5667 * tiles
        for model, multiplier in (("gpt-4.1-mini", 1.62), ("gpt-4.1-nano", 2.46), ("o4-mini", 1.72)):
            billed = math.ceil(openai_patches(width, height, rounded) * multiplier)
            assert image_tokens("openai", model, width, height) >= billed


@given(width=SIDE, height=SIDE)
def test_a_claude_or_nova_image_estimate_is_never_below_what_its_formula_bills(width: int, height: int) -> None:
    for rounded in ROUNDINGS:
        assert image_tokens("bedrock", "anthropic.claude-sonnet-4", width, height) >= claude(width, height, rounded)
        assert image_tokens("anthropic", "claude-sonnet-4-5", width, height) >= claude(width, height, rounded)
        assert image_tokens("bedrock", "amazon.nova-pro-v1:0", width, height) >= nova(width, height, rounded)
