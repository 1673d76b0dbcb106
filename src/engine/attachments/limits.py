"""What each provider takes in one request, and a job's attachments checked against it and its job type.

The defaults are the providers' documented per-request limits (erring low where their documents
disagree; docs/attachments.md gives the sources), each configurable (AIJOBS_ATTACHMENT_LIMITS). A
job whose attachments pass none of them ends `attachment_invalid` before any call, its message
naming the attachment and the limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from engine.core.attachments import AttachmentInfo, AttachmentPolicy
from engine.core.errors import AttachmentInvalidError, ConfigurationError

MB = 1_000_000


@dataclass(frozen=True, slots=True)
class AttachmentLimits:
    """One request's limits (bytes as the files are, before any encoding)."""

    max_file_bytes: int
    max_image_bytes: int
    max_total_bytes: int
    max_images: int
    max_documents: int
    max_pdf_pages: int
    max_pixels_per_side: int
    # A smaller side for requests of more images than this (Anthropic's: 2,000 px past 20 images).
    many_images: int = 1_000_000
    many_images_pixels_per_side: int = 1_000_000

    def with_overrides(self, overrides: Mapping[Any, int]) -> AttachmentLimits:
        known = {field.name for field in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigurationError(
                f"AIJOBS_ATTACHMENT_LIMITS: unknown limit {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        for name, value in overrides.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"AIJOBS_ATTACHMENT_LIMITS: {name} must be a whole number of at least 1")
        return replace(self, **dict(overrides))


# OpenAI Chat Completions: PDFs of up to 100 pages and 32 MB in all per request; images up to 20 MB
# each (its older guide; the current one gives 50 MB in all and 500 images).
OPENAI = AttachmentLimits(
    max_file_bytes=32 * MB,
    max_image_bytes=20 * MB,
    max_total_bytes=32 * MB,
    max_images=500,
    max_documents=100,
    max_pdf_pages=100,
    max_pixels_per_side=8_000,
)
# Bedrock Converse (its Message API reference): 20 images of 3.75 MB and 8,000 px a side, 5 documents
# of 4.5 MB; its InvokeModel body for Claude is 20 MB.
BEDROCK = AttachmentLimits(
    max_file_bytes=4_500_000,
    max_image_bytes=3_750_000,
    max_total_bytes=20 * MB,
    max_images=20,
    max_documents=5,
    max_pdf_pages=100,
    max_pixels_per_side=8_000,
)
# Anthropic Messages: 5 MB an image (of base64: 3.75 MB of bytes), 8,000 px a side, 100 images, PDFs of
# 100 pages, 32 MB a request (of base64: 24 MB of bytes).
ANTHROPIC = AttachmentLimits(
    max_file_bytes=24 * MB,
    max_image_bytes=3_750_000,
    max_total_bytes=24 * MB,
    max_images=100,
    max_documents=100,
    max_pdf_pages=100,
    max_pixels_per_side=8_000,
    many_images=20,
    many_images_pixels_per_side=2_000,
)
DEFAULT_LIMITS = {"openai": OPENAI, "bedrock": BEDROCK, "anthropic": ANTHROPIC}


def limits_for(provider: str, overrides: Mapping[Any, int] | None = None) -> AttachmentLimits:
    """The configured provider's limits (engine.config's ai_provider), with AIJOBS_ATTACHMENT_LIMITS over them."""
    return DEFAULT_LIMITS[provider].with_overrides(overrides or {})


def check(infos: Sequence[AttachmentInfo], policy: AttachmentPolicy, limits: AttachmentLimits, job_type: str) -> None:
    """AttachmentInvalidError (one line naming the attachment and the limit) for the first one that cannot go."""
    if len(infos) > policy.max_count:
        raise AttachmentInvalidError(f"{job_type} takes at most {policy.max_count} attachments, not {len(infos)}")
    total = 0
    images = [info for info in infos if info.media_type.is_image]
    documents = [info for info in infos if info.media_type.is_document]
    side = limits.max_pixels_per_side
    if len(images) > limits.many_images:
        side = min(side, limits.many_images_pixels_per_side)
    for info in infos:
        name = info.ref.label
        if info.media_type not in policy.media_types:
            taken = ", ".join(sorted(media.value for media in policy.media_types)) or "none"
            raise AttachmentInvalidError(
                f"attachment {name}: {info.media_type.value} is not a type {job_type} takes ({taken})"
            )
        most = limits.max_image_bytes if info.media_type.is_image else limits.max_file_bytes
        if info.bytes > most:
            raise AttachmentInvalidError(f"attachment {name}: {info.bytes} bytes; the provider takes at most {most}")
        if info.pages is not None and info.pages > limits.max_pdf_pages:
            raise AttachmentInvalidError(
                f"attachment {name}: {info.pages} pages; the provider takes at most {limits.max_pdf_pages}"
            )
        if info.width is not None and info.height is not None and max(info.width, info.height) > side:
            raise AttachmentInvalidError(
                f"attachment {name}: {info.width} x {info.height} pixels; the provider takes at most {side} a side"
            )
        total += info.bytes
    if total > limits.max_total_bytes:
        raise AttachmentInvalidError(
            f"attachments: {total} bytes in all; the provider takes at most {limits.max_total_bytes} a request"
        )
    if len(images) > limits.max_images:
        raise AttachmentInvalidError(
            f"attachments: {len(images)} images; the provider takes at most {limits.max_images}"
        )
    if len(documents) > limits.max_documents:
        raise AttachmentInvalidError(
            f"attachments: {len(documents)} documents; the provider takes at most {limits.max_documents}"
        )
    pages = sum(info.pages or 0 for info in documents)
    if pages > limits.max_pdf_pages:
        raise AttachmentInvalidError(
            f"attachments: {pages} PDF pages in all; the provider takes at most {limits.max_pdf_pages} a request"
        )
