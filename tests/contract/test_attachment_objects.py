"""Attachments' buckets: engine.testing.MemoryAttachments held to engine.store.attachments.S3Attachments on
moto (the template's payload bucket and another): the size and version asked, the bytes read, an object
gone, one that changed between its size and its read, one the stack may not read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import boto3
import pytest
from botocore.exceptions import ClientError

from engine.attachments.loader import AttachmentObjects
from engine.core.attachments import AttachmentRef, ObjectHead
from engine.core.errors import AttachmentInvalidError
from engine.store.attachments import S3Attachments
from engine.testing import MemoryAttachments
from tests.support.attachment_files import pdf

OTHER = "aijobs-contract-scans"


class Buckets(Protocol):
    @property
    def objects(self) -> AttachmentObjects: ...

    def put(self, bucket: str, key: str, data: bytes) -> AttachmentRef: ...

    def delete(self, bucket: str, key: str) -> None: ...

    def deny(self, bucket: str) -> None: ...


class InMemory:
    def __init__(self) -> None:
        self._memory = MemoryAttachments()
        self.objects: AttachmentObjects = self._memory

    def put(self, bucket: str, key: str, data: bytes) -> AttachmentRef:
        return self._memory.put(bucket, key, data)

    def delete(self, bucket: str, key: str) -> None:
        self._memory.delete(bucket, key)

    def deny(self, bucket: str) -> None:
        self._memory.denied_buckets.add(bucket)


class OnS3:
    def __init__(self) -> None:
        self._s3: Any = boto3.client("s3")
        self._s3.create_bucket(Bucket=OTHER)
        self.objects: AttachmentObjects = S3Attachments(lambda: self._s3)
        self._denied: set[str] = set()
        # moto grants every request; S3's answer to a role without s3:GetObject on a bucket is a 403
        # AccessDenied, given here before the request is sent.
        self._s3.meta.events.register("before-parameter-build.s3.*", self._refuse_denied)

    def put(self, bucket: str, key: str, data: bytes) -> AttachmentRef:
        self._s3.put_object(Bucket=bucket, Key=key, Body=data)
        return AttachmentRef(bucket, key)

    def delete(self, bucket: str, key: str) -> None:
        self._s3.delete_object(Bucket=bucket, Key=key)

    def deny(self, bucket: str) -> None:
        self._denied.add(bucket)

    def _refuse_denied(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if params.get("Bucket") in self._denied:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, model.name)


@pytest.fixture(params=["memory", "s3"])
def buckets(request: pytest.FixtureRequest) -> Buckets:
    if request.param == "memory":
        return InMemory()
    request.getfixturevalue("stack")  # the template's bucket on moto
    return OnS3()


@pytest.fixture
def bucket(request: pytest.FixtureRequest, buckets: Buckets) -> str:
    if isinstance(buckets, OnS3):
        payload_bucket: str = request.getfixturevalue("stack").payload_bucket
        return payload_bucket
    return "payloads"


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(AttachmentInvalidError) as refused:
        call()
    return refused.value.message


@pytest.mark.parametrize("where", ["payloads", "other"])
def test_an_object_s_size_and_version_are_asked_then_its_bytes_read(buckets: Buckets, bucket: str, where: str) -> None:
    data = pdf(2, "Invoice 4711")
    ref = buckets.put(bucket if where == "payloads" else OTHER, "attachments/j1/invoice.pdf", data)

    head = buckets.objects.head(ref)

    assert head.size == len(data)
    assert head.etag.startswith('"')
    assert head.etag.endswith('"')
    assert buckets.objects.read(ref, head) == data


def test_a_read_takes_no_more_than_the_size_asked(buckets: Buckets, bucket: str) -> None:
    data = pdf(1)
    ref = buckets.put(bucket, "a.pdf", data)
    head = buckets.objects.head(ref)

    assert buckets.objects.read(ref, ObjectHead(100, head.etag)) == data[:100]


def test_an_object_gone_is_refused_at_its_head_and_at_its_read(buckets: Buckets, bucket: str) -> None:
    ref = buckets.put(bucket, "attachments/a.pdf", pdf())
    head = buckets.objects.head(ref)
    buckets.delete(bucket, "attachments/a.pdf")
    gone = f"attachment a.pdf: s3://{bucket}/attachments/a.pdf is gone"

    assert refusal(lambda: buckets.objects.read(ref, head)) == gone
    assert refusal(lambda: buckets.objects.head(ref)) == gone


def test_an_object_of_a_bucket_that_does_not_exist_is_gone(buckets: Buckets) -> None:
    ref = AttachmentRef("aijobs-no-such-bucket", "a.pdf")

    assert refusal(lambda: buckets.objects.head(ref)) == "attachment a.pdf: s3://aijobs-no-such-bucket/a.pdf is gone"


def test_an_object_replaced_after_its_size_was_asked_is_refused(buckets: Buckets, bucket: str) -> None:
    ref = buckets.put(bucket, "a.pdf", pdf(1))
    head = buckets.objects.head(ref)
    buckets.put(bucket, "a.pdf", pdf(3))

    assert refusal(lambda: buckets.objects.read(ref, head)) == "attachment a.pdf: it changed while it was read"


def test_an_object_the_stack_may_not_read_is_refused(buckets: Buckets) -> None:
    ref = buckets.put(OTHER, "a.pdf", pdf())
    buckets.deny(OTHER)

    assert refusal(lambda: buckets.objects.head(ref)) == f"attachment a.pdf: this stack may not read s3://{OTHER}/a.pdf"
