"""What a submission attaches (docs/attachments.md, "Submitting"): local files, bytes, and objects
already in S3.

Every attachment is checked before anything is uploaded, as far as the client can tell what the
worker will refuse: how many the job type takes, each file's type from its content (never its name),
the types the job type takes, and sizes past what any provider takes. Then each local one is uploaded
to the payload bucket under `attachments/<job id>/`, at a key made of its place, its SHA-256 and its
name: the same job id with the same files makes the same keys (the same request), with another
file another key (another request, refused as a conflict), and an object once written is never
replaced (If-None-Match), so a resubmission cannot change what a worker is reading.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from aijobs.arguments import InvalidArgumentError, quoted
from engine.attachments.inspection import media_type_of
from engine.attachments.limits import DEFAULT_LIMITS, limits_for
from engine.core.attachments import S3_SCHEME, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError, ConfigurationError
from engine.definitions import JobDefinition
from engine.intake import check_attachment_count
from engine.messages import AttachmentName, AttachmentUri
from engine.store import PayloadStore
from engine.store.attachments import ObjectStream, S3Attachments

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# A local file (a path), its content, or an object already in a bucket ("s3://BUCKET/KEY").
AttachmentSource = str | os.PathLike[str] | bytes
UPLOAD_PREFIX = "attachments/"
# The name's part of an upload's key: S3-safe characters, cut (the name itself goes in the message).
_KEY_NAME_CHARS = 100
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_NAME: TypeAdapter[str] = TypeAdapter(AttachmentName)
_URI: TypeAdapter[str] = TypeAdapter(AttachmentUri)
_NOT_A_TYPE = "not a PDF, PNG, JPEG, WebP, GIF or UTF-8 text"


@dataclass(frozen=True, slots=True)
class NamedAttachment:
    """An attachment with a name of its own. Without one, a file goes by its base name, bytes by
    `attachment-<n>.<type>` (`attachment-2.pdf`), and an S3 object by its key's last part."""

    source: AttachmentSource
    name: str


# What `AiJobsClient.submit(attachments=[...])` takes, each item.
Attachable = AttachmentSource | NamedAttachment


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """The most any provider takes (with AIJOBS_ATTACHMENT_LIMITS over the documented defaults): a
    document or text file, an image, and one request's attachments in all."""

    file_bytes: int
    image_bytes: int
    total_bytes: int

    @classmethod
    def of(cls, overrides: Mapping[Any, int] | None = None) -> SizeLimits:
        every = [limits_for(provider, overrides) for provider in DEFAULT_LIMITS]
        return cls(
            max(limits.max_file_bytes for limits in every),
            max(limits.max_image_bytes for limits in every),
            max(limits.max_total_bytes for limits in every),
        )

    @property
    def any_file_bytes(self) -> int:
        return max(self.file_bytes, self.image_bytes)


@dataclass(frozen=True, slots=True)
class Upload:
    """A local attachment, read and checked: where it goes, and what it is."""

    ref: AttachmentRef
    data: bytes
    media_type: MediaType


@dataclass(frozen=True, slots=True)
class Prepared:
    """A submission's attachments: every reference, in order, and the uploads among them."""

    refs: tuple[AttachmentRef, ...]
    uploads: tuple[Upload, ...]


def upload_key(job_id: str, number: int, digest: str, name: str) -> str:
    """`attachments/<job id>/<n>-<sha256>/<name>`: its place in the job, its content, its name (made safe)."""
    part = _UNSAFE_KEY_CHARS.sub("_", name)[:_KEY_NAME_CHARS]
    return f"{UPLOAD_PREFIX}{job_id}/{number}-{digest}/{part if part.strip('.') else 'attachment'}"


def prepare(
    items: Sequence[Attachable], job_id: str, definition: JobDefinition, bucket: str | None, limits: SizeLimits
) -> Prepared:
    """The attachments checked (InvalidArgumentError naming the one at fault), nothing uploaded yet."""
    if isinstance(items, str | bytes | os.PathLike | NamedAttachment):
        raise InvalidArgumentError("attachments", "a list of attachments (paths, bytes or s3://BUCKET/KEY), not one")
    try:
        check_attachment_count(definition, len(items))
    except AttachmentInvalidError as exc:
        raise InvalidArgumentError("attachments", exc.message) from exc
    refs: list[AttachmentRef] = []
    uploads: list[Upload] = []
    for number, item in enumerate(items, 1):
        source, name = (item.source, item.name) if isinstance(item, NamedAttachment) else (item, None)
        if name is not None:
            _check_name(name, _given(source, name, number))
        if isinstance(source, str) and source.startswith(S3_SCHEME):
            refs.append(_reference(source, name))
            continue
        upload = _upload(source, name, number, job_id, definition, bucket, limits)
        refs.append(upload.ref)
        uploads.append(upload)
    total = sum(len(upload.data) for upload in uploads)
    if total > limits.total_bytes:
        raise InvalidArgumentError(
            "attachments", f"{total} bytes in all; no provider takes more than {limits.total_bytes} in one request"
        )
    return Prepared(tuple(refs), tuple(uploads))


def _given(source: object, name: str | None, number: int) -> str:
    """How an error names an attachment: as it was given (its path or URI), else its name or place."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return name if name is not None else f"#{number}"


def _check_name(name: str, given: str) -> None:
    try:
        _NAME.validate_python(name, strict=True)
    except ValidationError as exc:
        detail = f"a name is 1-255 characters with no / or \\, not {quoted(name)}"
        raise InvalidArgumentError("attachments", detail, given) from exc


def _reference(uri: str, name: str | None) -> AttachmentRef:
    try:
        _URI.validate_python(uri, strict=True)
    except ValidationError as exc:
        detail = "not s3://BUCKET/KEY (a bucket's name of 3-63 characters of a-z 0-9 . -, a key of 1-1024)"
        raise InvalidArgumentError("attachments", detail, uri) from exc
    return AttachmentRef.parse(uri, name)


def _upload(
    source: object,
    name: str | None,
    number: int,
    job_id: str,
    definition: JobDefinition,
    bucket: str | None,
    limits: SizeLimits,
) -> Upload:
    given = _given(source, name, number)
    if isinstance(source, str | os.PathLike):
        data = _read(Path(source), given, limits.any_file_bytes)
        name = name if name is not None else Path(source).name
    elif isinstance(source, bytes | bytearray):
        data = bytes(source)
    else:
        detail = f"a {type(source).__name__}, not a path, bytes or s3://BUCKET/KEY"
        raise InvalidArgumentError("attachments", detail, given)
    media_type = _checked_content(data, given, definition, limits)
    name = name if name is not None else f"attachment-{number}.{media_type.extension}"
    _check_name(name, given)
    if bucket is None:
        raise ConfigurationError("this client has no payload bucket to upload attachments to")
    digest = hashlib.sha256(data).hexdigest()
    return Upload(AttachmentRef(bucket, upload_key(job_id, number, digest, name), name), data, media_type)


def _read(path: Path, given: str, most: int) -> bytes:
    """A file's bytes, refused unread when it is larger than `most` (and never read past it)."""
    try:
        size = path.stat().st_size
        if size > most:
            raise InvalidArgumentError("attachments", _too_large(size, "a file", most), given)
        with path.open("rb") as file:
            data = file.read(most + 1)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise InvalidArgumentError("attachments", f"cannot read it: {reason}", given) from exc
    if len(data) > most:
        raise InvalidArgumentError("attachments", _too_large(len(data), "a file", most), given)
    return data


def _checked_content(data: bytes, given: str, definition: JobDefinition, limits: SizeLimits) -> MediaType:
    """Its media type, from its content; refused when it has none the engine sends, is one the job type
    does not take, is empty, or is larger than any provider takes one of its kind."""
    if not data:
        raise InvalidArgumentError("attachments", "an empty file", given)
    media_type = media_type_of(data)
    if media_type is None:
        raise InvalidArgumentError("attachments", _NOT_A_TYPE, given)
    taken = definition.attachments.media_types
    if media_type not in taken:
        types = ", ".join(sorted(media.value for media in taken)) or "none"
        detail = f"{media_type.value} is not a type {definition.name} takes ({types})"
        raise InvalidArgumentError("attachments", detail, given)
    kind, most = ("an image", limits.image_bytes) if media_type.is_image else ("a file", limits.file_bytes)
    if len(data) > most:
        raise InvalidArgumentError("attachments", _too_large(len(data), kind, most), given)
    return media_type


def _too_large(size: int, kind: str, most: int) -> str:
    return f"{size} bytes; no provider takes {kind} of more than {most}"


class AttachmentBucket:
    """Where the client puts what it uploads (the payload bucket), and reads the attachments a job names."""

    def __init__(self, payloads: PayloadStore, objects: S3Attachments, limits: SizeLimits) -> None:
        self.payloads = payloads
        self.objects = objects
        self.limits = limits

    @classmethod
    def connected(cls, bucket: str, connect: Callable[[], S3Client], limits: SizeLimits) -> AttachmentBucket:
        """Both on one S3 client, made on first use (most submissions attach nothing)."""
        client = functools.cache(connect)
        return cls(PayloadStore(bucket, client), S3Attachments(client), limits)

    @property
    def bucket(self) -> str:
        return self.payloads.bucket

    def upload(self, uploads: Sequence[Upload]) -> int:
        """Each one not there yet (a PutObject each); how many were written."""
        return sum(self.payloads.put_new(upload.ref.key, upload.data, upload.media_type.value) for upload in uploads)

    def stream(self, ref: AttachmentRef) -> ObjectStream:
        return self.objects.stream(ref)
