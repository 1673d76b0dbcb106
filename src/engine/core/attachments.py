"""Attachments: the documents and images a job reads, as the lifecycle knows them (docs/attachments.md).

A message names each attachment by reference (`s3://BUCKET/KEY`, and a name of its own); the worker
reads it, tells its type from its content, and checks it against the job type and the provider's
limits before any paid call. The job keeps what was read of each (`AttachmentInfo`: the reference,
the media type, the size, the digest, the pages or pixel size), never the content; the content
(`Attachment`) lives only as long as the attempt that sends it. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The most attachments a job carries.
MAX_ATTACHMENTS = 20
S3_SCHEME = "s3://"


class MediaType(StrEnum):
    """What an attachment is, read from its content (its magic bytes), never from its name."""

    PDF = "application/pdf"
    PNG = "image/png"
    JPEG = "image/jpeg"
    WEBP = "image/webp"
    GIF = "image/gif"
    TEXT = "text/plain"

    @property
    def is_image(self) -> bool:
        return self in {MediaType.PNG, MediaType.JPEG, MediaType.WEBP, MediaType.GIF}

    @property
    def is_document(self) -> bool:
        return self is MediaType.PDF

    @property
    def extension(self) -> str:
        return {"application/pdf": "pdf", "text/plain": "txt"}.get(self.value, self.value.removeprefix("image/"))


IMAGE_TYPES = frozenset(media for media in MediaType if media.is_image)
ALL_TYPES = frozenset(MediaType)


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    """An attachment as a message names it: an object of a bucket, and the name it goes by."""

    bucket: str
    key: str
    name: str | None = None

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key}"

    @property
    def label(self) -> str:
        """How one line names it: its name, else its key's last part."""
        return self.name or self.key.rsplit("/", 1)[-1] or self.key

    @classmethod
    def parse(cls, uri: str, name: str | None = None) -> AttachmentRef:
        """`s3://BUCKET/KEY`; ValueError saying what is wrong otherwise."""
        if not uri.startswith(S3_SCHEME):
            raise ValueError(f"an attachment is s3://BUCKET/KEY, not {uri[:40]!r}")
        bucket, _, key = uri.removeprefix(S3_SCHEME).partition("/")
        if not bucket or not key:
            raise ValueError(f"an attachment is s3://BUCKET/KEY with both parts, not {uri[:80]!r}")
        return cls(bucket, key, name)

    def document(self) -> dict[str, Any]:
        """As a message carries it (and the job's item keeps it)."""
        return {"s3": self.uri, **({"name": self.name} if self.name is not None else {})}


@dataclass(frozen=True, slots=True)
class AttachmentInfo:
    """What was read of an attachment: its type, size and digest, and its pages or pixel size."""

    ref: AttachmentRef
    media_type: MediaType
    bytes: int
    sha256: str
    pages: int | None = None
    width: int | None = None
    height: int | None = None

    def document(self) -> dict[str, Any]:
        fields = {"media_type": self.media_type.value, "bytes": self.bytes, "sha256": self.sha256}
        sizes = {"pages": self.pages, "width": self.width, "height": self.height}
        return self.ref.document() | fields | {name: value for name, value in sizes.items() if value is not None}

    @classmethod
    def of(cls, document: dict[str, Any]) -> AttachmentInfo:
        ref = AttachmentRef.parse(document["s3"], document.get("name"))
        return cls(
            ref,
            MediaType(document["media_type"]),
            int(document["bytes"]),
            str(document["sha256"]),
            _number(document.get("pages")),
            _number(document.get("width")),
            _number(document.get("height")),
        )


@dataclass(frozen=True, slots=True)
class Attachment:
    """An attachment read for an attempt: what it is, and its content (the text, for a text one)."""

    info: AttachmentInfo
    data: bytes
    # The UTF-8 bytes of its text: a text attachment's all, a PDF's text layer (what its pages' text
    # costs, besides their images); and a PDF's pages' sizes (width, height, in points, as displayed),
    # which decide what an image of each costs.
    text_bytes: int = 0
    page_sizes: tuple[tuple[float, float], ...] = ()

    @property
    def media_type(self) -> MediaType:
        return self.info.media_type

    @property
    def name(self) -> str:
        return self.info.ref.label

    @property
    def text(self) -> str:
        """A text attachment's content (it was checked to be UTF-8 when it was read)."""
        return self.data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What HeadObject says of an attachment's object: its size, and the version (ETag) that size is of."""

    size: int
    etag: str


@dataclass(frozen=True, slots=True)
class AttachmentPolicy:
    """What a job type takes: how many attachments (at least, at most) and of which types.

    `required_unless` names an input field (a text) that can carry what the job reads instead: a job
    then needs that field not empty, or at least one attachment (engine.intake.check_something_to_read).
    """

    max_count: int = 0
    media_types: frozenset[MediaType] = frozenset()
    min_count: int = 0
    required_unless: str | None = None

    @property
    def takes_any(self) -> bool:
        return self.max_count > 0


NO_ATTACHMENTS = AttachmentPolicy()


def ref_documents(refs: tuple[AttachmentRef, ...]) -> list[dict[str, Any]]:
    return [ref.document() for ref in refs]


def _number(value: Any) -> int | None:
    return None if value is None else int(value)
