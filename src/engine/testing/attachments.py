"""Attachments' buckets in memory (engine.attachments.loader.AttachmentObjects), for tests of the loader and
of the jobs that read them; tests/contract holds them to engine.store.attachments.S3Attachments.

Each object's ETag is the MD5 of its content, as S3's of an object put whole; `calls` records what was asked of which
object, in order, so that a test can say what was read (nothing from a bucket not allowed, the size
before the bytes, nothing past a limit).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable

from engine.attachments.loader import changed, denied, gone
from engine.core.attachments import AttachmentRef, ObjectHead

HEAD, READ = "head", "read"


class MemoryAttachments:
    def __init__(self, denied_buckets: Iterable[str] = ()) -> None:
        # Buckets this stack may not read (its role has no s3:GetObject on them).
        self.denied_buckets = set(denied_buckets)
        # (HEAD or READ, the object's URI), in the order they were asked.
        self.calls: list[tuple[str, str]] = []
        self._objects: dict[tuple[str, str], tuple[bytes, str]] = {}
        self._lock = threading.Lock()

    def put(self, bucket: str, key: str, data: bytes) -> AttachmentRef:
        """Write an object (a new version of it, if it exists): the reference a message names it by."""
        etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
        with self._lock:
            self._objects[(bucket, key)] = (data, etag)
        return AttachmentRef(bucket, key)

    def delete(self, bucket: str, key: str) -> None:
        with self._lock:
            self._objects.pop((bucket, key), None)

    def head(self, ref: AttachmentRef) -> ObjectHead:
        data, etag = self._found(HEAD, ref)
        return ObjectHead(len(data), etag)

    def read(self, ref: AttachmentRef, head: ObjectHead) -> bytes:
        data, etag = self._found(READ, ref)
        if etag != head.etag:
            raise changed(ref)
        return data[: head.size]

    def reads(self) -> list[str]:
        """The objects whose bytes were read, in order."""
        return [uri for call, uri in self.calls if call == READ]

    def _found(self, call: str, ref: AttachmentRef) -> tuple[bytes, str]:
        with self._lock:
            self.calls.append((call, ref.uri))
            if ref.bucket in self.denied_buckets:
                raise denied(ref)
            found = self._objects.get((ref.bucket, ref.key))
        if found is None:
            raise gone(ref)
        return found
