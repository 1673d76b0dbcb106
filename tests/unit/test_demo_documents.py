"""The demo's document jobs (aijobs.demo): each runs only for a job type that takes what it carries, a
refusal before any call is meant only when nothing was billed, and the files each carries are read by
the engine as the demo says they are."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest

from aijobs.demo import SampleJob, document_jobs, ended_as_meant, takes_its_attachments
from aijobs.local.samples import INVOICE, PANORAMA, PRODUCT_PHOTO, SCANNED_FORM, sample
from engine.attachments.inspection import inspect
from engine.attachments.limits import OPENAI, check
from engine.core import ErrorCode, JobStatus
from engine.core.attachments import ALL_TYPES, AttachmentPolicy, AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError
from engine.definitions import JobRegistry
from engine.views import ErrorView, JobView, UsageView

CLASSIFY_JOB = SampleJob("demo-x", "classify", {"text": "t", "labels": ["a", "b"]}, JobStatus.SUCCEEDED)


def registry_taking(policy: AttachmentPolicy) -> JobRegistry:
    classify = JobRegistry().get("classify")
    return JobRegistry([replace(classify, attachments=policy)])


def carrying(*names: str) -> SampleJob:
    return replace(CLASSIFY_JOB, attachments=names)


@pytest.mark.parametrize(
    ("policy", "names", "takes"),
    [
        (AttachmentPolicy(max_count=2, media_types=ALL_TYPES), (INVOICE, PRODUCT_PHOTO), True),
        (AttachmentPolicy(max_count=1, media_types=ALL_TYPES), (INVOICE, PRODUCT_PHOTO), False),
        (AttachmentPolicy(max_count=2, media_types=frozenset({MediaType.PDF})), (INVOICE, PRODUCT_PHOTO), False),
        (AttachmentPolicy(max_count=2, media_types=frozenset({MediaType.PNG}), min_count=2), (SCANNED_FORM,), False),
        (AttachmentPolicy(), (SCANNED_FORM,), False),
    ],
)
def test_a_document_job_runs_only_for_a_job_type_that_takes_its_count_and_types(
    policy: AttachmentPolicy, names: tuple[str, ...], takes: bool
) -> None:
    assert takes_its_attachments(registry_taking(policy), carrying(*names)) is takes


def test_the_document_jobs_are_those_their_job_types_take() -> None:
    registry = JobRegistry()
    for job in document_jobs("demo-x"):
        assert job.attachments
        assert takes_its_attachments(registry, job)


def test_each_file_the_demo_sends_is_read_as_meant_the_panorama_past_the_openai_limit() -> None:
    policy = AttachmentPolicy(max_count=20, media_types=ALL_TYPES)
    for name in (INVOICE, SCANNED_FORM, PRODUCT_PHOTO):
        info = inspect(AttachmentRef("bucket", name, name), sample(name)).info
        check([info], policy, OPENAI, "classify")
    panorama = inspect(AttachmentRef("bucket", PANORAMA, PANORAMA), sample(PANORAMA)).info
    with pytest.raises(AttachmentInvalidError, match="8000"):
        check([panorama], policy, OPENAI, "summarize")


def view(status: JobStatus, code: ErrorCode | None, input_tokens: int) -> JobView:
    """What ended_as_meant reads of a job's view (its other fields differ between versions)."""
    error = ErrorView(code=code, message="m", retryable=False) if code is not None else None
    usage = UsageView(input_tokens=input_tokens, output_tokens=0, cost_usd=0.0, attempts=1)
    return cast(JobView, SimpleNamespace(status=status, error=error, usage=usage))


def test_a_refusal_before_any_call_is_as_meant_only_when_nothing_was_billed() -> None:
    refused = replace(
        CLASSIFY_JOB, expected=JobStatus.FAILED, expected_code=ErrorCode.ATTACHMENT_INVALID, attachments=(PANORAMA,)
    )

    assert ended_as_meant(refused, view(JobStatus.FAILED, ErrorCode.ATTACHMENT_INVALID, 0))
    assert not ended_as_meant(refused, view(JobStatus.FAILED, ErrorCode.ATTACHMENT_INVALID, 1200))
    assert not ended_as_meant(refused, view(JobStatus.FAILED, ErrorCode.INPUT_VALIDATION_FAILED, 0))
    assert not ended_as_meant(refused, None)
