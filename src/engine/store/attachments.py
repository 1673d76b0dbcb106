"""Attachments' objects in S3 (engine.attachments.loader.AttachmentObjects): asked their size first,
then read whole, fenced on the version the size was asked of (IfMatch its ETag); and streamed, for a
person who downloads one (the dashboard)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from engine.attachments.loader import changed, denied, gone
from engine.core.attachments import AttachmentRef, ObjectHead

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# What S3 answers for an object that is gone, one the stack may not read, and one that changed
# between the size asked and the read.
_GONE = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})
_DENIED = frozenset({"403", "AccessDenied", "AllAccessDisabled"})
_CHANGED = frozenset({"412", "PreconditionFailed", "416", "InvalidRange"})
# A download is streamed in pieces of this size: an object is never held whole.
STREAM_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ObjectStream:
    """An object being read: its size, and its bytes in pieces (the connection closed after the last)."""

    size: int
    chunks: Iterator[bytes]


class S3Attachments:
    def __init__(self, connect: Callable[[], S3Client]) -> None:
        self._connect = connect
        self._s3: S3Client | None = None

    def head(self, ref: AttachmentRef) -> ObjectHead:
        try:
            head = self._client().head_object(Bucket=ref.bucket, Key=ref.key)
        except ClientError as exc:
            raise _refused(ref, exc) from exc
        return ObjectHead(int(head.get("ContentLength", 0)), str(head.get("ETag", "")))

    def read(self, ref: AttachmentRef, head: ObjectHead) -> bytes:
        try:
            response = self._client().get_object(
                Bucket=ref.bucket, Key=ref.key, Range=f"bytes=0-{head.size - 1}", IfMatch=head.etag
            )
            # (At most what was asked: a larger object cannot be read into memory past it.)
            return response["Body"].read(head.size + 1)
        except ClientError as exc:
            raise _refused(ref, exc) from exc

    def stream(self, ref: AttachmentRef) -> ObjectStream:
        """The object as it is now, in pieces; AttachmentInvalidError when it is gone or may not be read."""
        try:
            response = self._client().get_object(Bucket=ref.bucket, Key=ref.key)
        except ClientError as exc:
            raise _refused(ref, exc) from exc
        body = response["Body"]

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(STREAM_CHUNK_BYTES)
            finally:
                body.close()

        return ObjectStream(int(response.get("ContentLength", 0)), chunks())

    def _client(self) -> S3Client:
        if self._s3 is None:  # connected on first use: most jobs read no attachment
            self._s3 = self._connect()
        return self._s3


def _refused(ref: AttachmentRef, exc: ClientError) -> Exception:
    """AttachmentInvalidError for an object gone, denied or changed; the error itself otherwise (it may
    pass: the job is tried again)."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in _GONE:
        return gone(ref)
    if code in _DENIED:
        return denied(ref)
    if code in _CHANGED:
        return changed(ref)
    return exc
