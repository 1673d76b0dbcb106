"""docs/attachments.md, "Locally": the samples it lists are the package's, of the sizes it gives."""

from __future__ import annotations

import re
from pathlib import Path

from aijobs.local.samples import SAMPLES, sample
from bench.attachments import IMAGE_SIZES, LONG_PDF_PAGES
from engine.attachments.inspection import inspect
from engine.core.attachments import AttachmentRef

TIMES = "\N{MULTIPLICATION SIGN}"  # as the docs write a pixel size
DOC = Path(__file__).parents[2] / "docs" / "attachments.md"


def locally() -> str:
    text = DOC.read_text()
    return text[text.index("## Locally") :]


def test_the_samples_listed_are_the_packages_each_under_13_kb() -> None:
    section = locally()
    samples = section[section.index("sample files") : section.index("`make demo` runs")]

    listed = re.findall(r"`([a-z-]+\.[a-z]+)`", samples)

    assert listed == list(SAMPLES)
    assert all(len(sample(name)) < 13 * 1024 for name in SAMPLES)


def test_each_sample_is_the_size_the_section_gives() -> None:
    section = " ".join(locally().split())

    for name in SAMPLES:
        info = inspect(AttachmentRef("bucket", name, name), sample(name)).info
        if info.pages is not None:
            assert f"`{name}` (two" in section
            assert info.pages == 2
        else:
            assert f"{info.width} {TIMES} {info.height}" in section, name


def test_the_bench_mix_is_the_one_the_section_gives() -> None:
    section = " ".join(locally().split())
    sizes = [f"{width} {TIMES} {height}" for width, height, _ in IMAGE_SIZES]

    assert f"a {LONG_PDF_PAGES}-page blank PDF and images of five sizes" in section
    assert len(IMAGE_SIZES) == 5
    assert f"({sizes[0]} to {sizes[3]}, one {sizes[4]})" in section
