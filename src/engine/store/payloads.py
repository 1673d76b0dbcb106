"""PayloadStore: the only code that talks to S3.

It keeps what is too large for a DynamoDB item (which stops at 400 KB): job inputs and raw
dead-letter bodies past `INLINE_BYTES`, answers kept for reuse past `REUSE_INLINE_BYTES`, and the
files of Bedrock batch inference jobs (their input, and the results Bedrock writes back:
engine.gateway.bedrock_batch). The table's items reference them by key; the bucket's lifecycle
expires them with the table's retention. Jobs waiting for a provider's batch are kept there too,
under `batches/` (engine.batching.files).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

import boto3
from botocore.exceptions import ClientError

from engine.core.errors import AiJobsError, PayloadMissingError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Larger inputs and dead-letter bodies go to S3: the item keeps headroom below 400 KB, and each
# write of an item costs a write unit per KB.
INLINE_BYTES = 256 * 1024
# A paid answer kept for reuse (docs/reuse.md) goes to S3 past this: its item is put in the finish's
# transaction, at two write units per KB, where one PUT costs what about 4 KB of it would.
REUSE_INLINE_BYTES = 16 * 1024

# DeleteObjects takes at most this many keys.
DELETE_KEYS = 1000

_SAFE_KEY_PART = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class PayloadDeleteError(AiJobsError):
    """S3 refused to delete some of the payloads asked (`DeleteObjects` reports them one by one)."""


def input_key(job_id: str) -> str:
    return f"inputs/{job_id}.json"


def reused_answer_key(key: str, job_id: str) -> str:
    """Where a paid answer past REUSE_INLINE_BYTES is kept for reuse: by the job that paid for it, so that
    two jobs of one request finishing at once never write each other's."""
    return f"answers/{key}/{job_id}.json"


def refused_answer_key(job_id: str, attempt: int) -> str:
    """Where an attempt's refused answer is kept whole when it is too long for its record."""
    return f"refused-answers/{job_id}/{attempt}.txt"


def dead_letter_body_key(message_id: str) -> str:
    return f"dead-letters/{_message_part(message_id)}"


def unrecorded_dead_letter_key(message_id: str) -> str:
    """Where a dead letter the table could not take is kept whole (engine.dead_letters)."""
    return f"dead-letters/unrecorded/{_message_part(message_id)}.json"


def _message_part(message_id: str) -> str:
    # SQS message ids are UUIDs; anything else is named by its hash rather than trusted as a key.
    return message_id if _SAFE_KEY_PART.match(message_id) else hashlib.sha256(message_id.encode()).hexdigest()


def default_s3_client() -> S3Client:
    return boto3.client("s3")


class PayloadStore:
    def __init__(self, bucket: str, connect: Callable[[], S3Client] = default_s3_client) -> None:
        self.bucket = bucket
        self._connect = connect
        self._s3: S3Client | None = None
        self._lock = threading.Lock()

    @property
    def _client(self) -> S3Client:
        # Connected on first use: most jobs never need the bucket, and an S3 client costs memory and time.
        with self._lock:
            if self._s3 is None:
                self._s3 = self._connect()
            return self._s3

    def put(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)

    def put_new(self, key: str, data: bytes, content_type: str) -> bool:
        """Write the object unless `key` holds one already (If-None-Match: *), so that what a reader may
        be reading is never replaced; whether it was written."""
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"PreconditionFailed", "412"}:
                return False
            raise
        return True

    def keys(self, prefix: str) -> list[str]:
        """The keys under `prefix`, in key order."""
        keys: list[str] = []
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", []) if "Key" in item]
        return keys

    def download(self, key: str, file: IO[bytes]) -> None:
        """Write the object at `key` into `file`, streamed: an object can be larger than memory holds."""
        self._client.download_fileobj(self.bucket, key, file)

    def get(self, key: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                raise PayloadMissingError(f"payload {key} is gone from the payload bucket") from exc
            raise
        return response["Body"].read()

    def delete(self, keys: Sequence[str]) -> None:
        """Delete `keys` (absent ones too), a thousand to a request; raises when S3 refuses any."""
        for start in range(0, len(keys), DELETE_KEYS):
            chunk = keys[start : start + DELETE_KEYS]
            response = self._client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True}
            )
            if errors := response.get("Errors"):
                first = errors[0]
                raise PayloadDeleteError(f"{len(errors)} payloads not deleted: {first.get('Key')}: {first.get('Code')}")

    def refresh(self, key: str) -> None:
        """Restart a payload's lifetime (a retried job runs again): copy it onto itself."""
        self._client.copy_object(
            Bucket=self.bucket,
            Key=key,
            CopySource={"Bucket": self.bucket, "Key": key},
            MetadataDirective="REPLACE",
            ContentType="application/json",
        )
