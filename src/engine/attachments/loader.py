"""The loader the runner calls: a job's attachments read, told apart and checked, before any paid call.

For each attachment, in order: its bucket must be the payload bucket or one of
AIJOBS_ATTACHMENT_BUCKETS (nothing is read from any other); its size is asked first (HeadObject), so
that nothing past the provider's limits is read into memory; then its bytes are read (fenced on the
version the size was asked of), its type told from its content, its pages or pixel size read from
its structure; last, the whole set is checked against the job type and the provider's limits. Any
refusal is `attachment_invalid`, one line naming the attachment and the limit. An object that is gone
is refused the same way, at a retry too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from engine.attachments.inspection import inspect
from engine.attachments.limits import AttachmentLimits, check
from engine.core.attachments import Attachment, AttachmentPolicy, AttachmentRef, ObjectHead
from engine.core.errors import AttachmentInvalidError


class AttachmentObjects(Protocol):
    """The buckets attachments are read from (engine.store.attachments.S3Attachments; in memory,
    engine.testing.MemoryAttachments). Each raises AttachmentInvalidError for an object that is gone
    (`gone`), that the stack may not read (`denied`) or that changed since its size was asked
    (`changed`), and lets any other error through (it may pass by itself: the job is tried again)."""

    def head(self, ref: AttachmentRef) -> ObjectHead: ...

    def read(self, ref: AttachmentRef, head: ObjectHead) -> bytes:
        """The object's bytes, exactly `head.size` of them, of the version `head` names."""
        ...


def gone(ref: AttachmentRef) -> AttachmentInvalidError:
    return AttachmentInvalidError(f"attachment {ref.label}: {ref.uri} is gone")


def denied(ref: AttachmentRef) -> AttachmentInvalidError:
    return AttachmentInvalidError(f"attachment {ref.label}: this stack may not read {ref.uri}")


def changed(ref: AttachmentRef) -> AttachmentInvalidError:
    return AttachmentInvalidError(f"attachment {ref.label}: it changed while it was read")


class AttachmentLoader:
    def __init__(self, objects: AttachmentObjects, buckets: Iterable[str], limits: AttachmentLimits) -> None:
        self._objects = objects
        self._buckets = frozenset(buckets)
        self._limits = limits

    @property
    def limits(self) -> AttachmentLimits:
        return self._limits

    def load(self, refs: Sequence[AttachmentRef], policy: AttachmentPolicy, job_type: str) -> tuple[Attachment, ...]:
        """The attachments, read and checked; AttachmentInvalidError for the first that cannot go."""
        if not refs:
            return ()
        if len(refs) > policy.max_count or len(refs) < policy.min_count:
            takes = f"{policy.min_count} to {policy.max_count}" if policy.min_count else f"at most {policy.max_count}"
            raise AttachmentInvalidError(f"{job_type} takes {takes} attachments, not {len(refs)}")
        for ref in refs:
            if ref.bucket not in self._buckets:
                raise AttachmentInvalidError(
                    f"attachment {ref.label}: bucket {ref.bucket} is not one this stack reads "
                    "(the payload bucket, or one of AIJOBS_ATTACHMENT_BUCKETS)"
                )
        heads = [self._head(ref) for ref in refs]
        total = sum(head.size for head in heads)
        if total > self._limits.max_total_bytes:
            most = self._limits.max_total_bytes
            raise AttachmentInvalidError(f"attachments: {total} bytes in all; the provider takes at most {most}")
        attachments = []
        # The PDF pages the request may still take: no text is read of a PDF past them (it is refused).
        pages_left = self._limits.max_pdf_pages
        for ref, head in zip(refs, heads, strict=True):
            data = self._objects.read(ref, head)
            if len(data) != head.size:
                raise changed(ref)
            attachment = inspect(ref, data, pages_left)
            pages_left -= attachment.info.pages or 0
            attachments.append(attachment)
        check([attachment.info for attachment in attachments], policy, self._limits, job_type)
        return tuple(attachments)

    def _head(self, ref: AttachmentRef) -> ObjectHead:
        head = self._objects.head(ref)
        most = max(self._limits.max_file_bytes, self._limits.max_image_bytes)
        if head.size == 0:
            raise AttachmentInvalidError(f"attachment {ref.label}: an empty object")
        if head.size > most:
            raise AttachmentInvalidError(
                f"attachment {ref.label}: {head.size} bytes; the provider takes at most {most}"
            )
        return head
