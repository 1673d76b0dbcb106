"""The public job view and the message (docs/messages.md), the state machine (docs/architecture.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from engine.core import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATUSES,
    ErrorCode,
    Job,
    JobErrorInfo,
    JobStatus,
    Usage,
    can_transition,
)
from engine.messages import JobMessage
from engine.views import JobView, iso_timestamp
from tests.support.contract import USAGE_FIELDS, VIEW_FIELDS

CREATED = int(datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC).timestamp() * 1000)


def succeeded_job() -> Job:
    return Job(
        job_id="job-1",
        job_type="classify",
        user_id="user-1",
        status=JobStatus.SUCCEEDED,
        created_at=CREATED,
        updated_at=CREATED + 2_500,
        started_at=CREATED + 1_000,
        finished_at=CREATED + 2_999,
        max_attempts=3,
        attempt_count=1,
        claim_count=1,
        request_hash="r" * 64,
        lease_owner=None,
        output={"label": "spam", "confidence": 0.93},
        output_hash="a" * 64,
        usage=Usage(
            input_tokens=812,
            output_tokens=40,
            cost_usd=Decimal("0.00021"),
            attempts=1,
            cached_input_tokens=512,
            reasoning_tokens=16,
            standard_cost_usd=Decimal("0.00021"),
        ),
    )


# --- the job view -----------------------------------------------------------------------------


def test_the_view_has_the_spec_fields_in_the_spec_order() -> None:
    dumped = json.loads(JobView.from_job(succeeded_job()).model_dump_json())

    assert list(dumped) == VIEW_FIELDS
    assert list(dumped["usage"]) == USAGE_FIELDS


def test_the_view_of_a_succeeded_job_matches_the_spec_example() -> None:
    dumped = json.loads(JobView.from_job(succeeded_job()).model_dump_json())

    assert dumped == {
        "job_id": "job-1",
        "job_type": "classify",
        "user_id": "user-1",
        "status": "succeeded",
        "attempt_count": 1,
        "max_attempts": 3,
        "created_at": "2026-12-02T10:00:00Z",
        "updated_at": "2026-12-02T10:00:02Z",
        "started_at": "2026-12-02T10:00:01Z",
        "finished_at": "2026-12-02T10:00:02Z",
        "output": {"label": "spam", "confidence": 0.93},
        "output_hash": "a" * 64,
        "error": None,
        "cancel_requested": False,
        "lane": "interactive",
        "usage": {
            "input_tokens": 812,
            "output_tokens": 40,
            "cost_usd": 0.00021,
            "attempts": 1,
            "cached_input_tokens": 512,
            "cache_write_input_tokens": 0,
            "reasoning_tokens": 16,
            "standard_cost_usd": 0.00021,
        },
        "via": None,
        "batch": None,
        "took_ms": 2_999,
        "attachments": [],
        "job_type_version": None,
        "parent_id": None,
        "step": None,
        "pipeline": None,
        "reused_from": None,
    }


def test_the_view_of_a_job_that_took_a_paid_answer_says_so_without_its_attempts() -> None:
    # Given a job that took the answer job-0 paid for (its attempts not read, as `aijobs status` shows it)
    job = replace(succeeded_job(), usage=Usage(attempts=1), reused_from="job-0")

    # When it is viewed
    dumped = json.loads(JobView.from_job(job).model_dump_json())

    # Then it says how it got its answer, from whom, and that it cost nothing
    assert (dumped["via"], dumped["batch"], dumped["reused_from"]) == ("reuse", None, "job-0")
    assert (dumped["usage"]["input_tokens"], dumped["usage"]["output_tokens"], dumped["usage"]["cost_usd"]) == (0, 0, 0)


def test_the_view_leaves_internal_fields_out() -> None:
    dumped = JobView.from_job(succeeded_job()).model_dump()

    for internal in ("request_hash", "lease_owner", "lease_expires_at", "claim_count", "deadline_at", "input_stored"):
        assert internal not in dumped


def test_the_view_of_a_failed_job_carries_its_error() -> None:
    job = Job(
        job_id="job-2",
        job_type="summarize",
        user_id="user-1",
        status=JobStatus.FAILED,
        created_at=CREATED,
        updated_at=CREATED,
        max_attempts=3,
        error=JobErrorInfo(ErrorCode.PROVIDER_REJECTED, "provider rejected the request (HTTP 401)", False),
    )

    dumped = json.loads(JobView.from_job(job).model_dump_json())

    assert dumped["error"] == {
        "code": "provider_rejected",
        "message": "provider rejected the request (HTTP 401)",
        "retryable": False,
    }
    assert dumped["output"] is None
    assert dumped["started_at"] is None
    assert dumped["finished_at"] is None
    assert dumped["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "attempts": 0,
        "cached_input_tokens": 0,
        "cache_write_input_tokens": 0,
        "reasoning_tokens": 0,
        "standard_cost_usd": 0.0,
    }


@pytest.mark.parametrize(
    ("epoch_ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (CREATED, "2026-12-02T10:00:00Z"),
        (CREATED + 999, "2026-12-02T10:00:00Z"),
        (CREATED + 61_000, "2026-12-02T10:01:01Z"),
        (None, None),
    ],
)
def test_timestamps_are_utc_seconds_with_a_z(epoch_ms: int | None, text: str | None) -> None:
    assert iso_timestamp(epoch_ms) == text


# --- the state machine --------------------------------------------------------------------------

DOCUMENTED_EDGES = {
    (JobStatus.QUEUED, JobStatus.RUNNING),
    (JobStatus.QUEUED, JobStatus.CANCELLED),
    (JobStatus.RUNNING, JobStatus.SUCCEEDED),
    (JobStatus.RUNNING, JobStatus.FAILED),
    (JobStatus.RUNNING, JobStatus.CANCELLED),
    (JobStatus.RUNNING, JobStatus.QUEUED),
    (JobStatus.FAILED, JobStatus.QUEUED),
    # A pipeline (docs/pipelines.md): a step started, then moved on, decided or cancelled.
    (JobStatus.RUNNING, JobStatus.WAITING),
    (JobStatus.WAITING, JobStatus.QUEUED),
    (JobStatus.WAITING, JobStatus.SUCCEEDED),
    (JobStatus.WAITING, JobStatus.FAILED),
    (JobStatus.WAITING, JobStatus.CANCELLED),
}


@pytest.mark.parametrize(("current", "target"), sorted(DOCUMENTED_EDGES))
def test_the_spec_transitions_are_allowed(current: JobStatus, target: JobStatus) -> None:
    assert can_transition(current, target)


@pytest.mark.parametrize("current", sorted(TERMINAL_STATUSES))
@pytest.mark.parametrize("target", list(JobStatus))
def test_terminal_states_never_change_except_back_to_queued_by_a_retry(current: JobStatus, target: JobStatus) -> None:
    # `aijobs retry` of a failed job; a pipeline's cancelled child run again by its parent's retry.
    expected = (current, target) in {(JobStatus.FAILED, JobStatus.QUEUED), (JobStatus.CANCELLED, JobStatus.QUEUED)}

    assert can_transition(current, target) is expected


@pytest.mark.parametrize("target", [JobStatus.SUCCEEDED, JobStatus.QUEUED])
def test_a_queued_job_cannot_succeed_or_requeue_without_running(target: JobStatus) -> None:
    assert not can_transition(JobStatus.QUEUED, target)


def test_every_status_has_a_row_in_the_transition_table() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(JobStatus)


def test_exactly_succeeded_failed_and_cancelled_are_terminal() -> None:
    assert {status for status in JobStatus if status.is_terminal} == {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
    }


# --- the message and the job --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "is_reference"),
    [
        ({"job_id": "x"}, True),
        ({"job_id": "x", "max_attempts": 3}, False),
        ({"job_id": "x", "job_type": None}, False),
        ({"job_id": "x", "job_type": "classify", "user_id": "u", "input": {}}, False),
        ({}, False),
    ],
)
def test_only_a_lone_job_id_is_a_reference(body: dict[str, object], is_reference: bool) -> None:
    assert JobMessage.model_validate(body).is_reference is is_reference


def test_attempts_left_never_goes_negative() -> None:
    job = succeeded_job()

    assert Job(**{**_fields(job), "attempt_count": 1, "max_attempts": 3}).attempts_left == 2
    assert Job(**{**_fields(job), "attempt_count": 5, "max_attempts": 3}).attempts_left == 0


@pytest.mark.parametrize(
    ("status", "lease_expires_at", "now", "remaining"),
    [
        (JobStatus.RUNNING, 10_000, 4_000, 6_000),
        (JobStatus.RUNNING, 10_000, 10_000, 0),
        (JobStatus.RUNNING, 10_000, 12_000, 0),
        (JobStatus.RUNNING, None, 0, 0),
        (JobStatus.QUEUED, 10_000, 4_000, 0),
    ],
)
def test_lease_remaining_counts_only_a_running_jobs_live_lease(
    status: JobStatus, lease_expires_at: int | None, now: int, remaining: int
) -> None:
    job = Job(**{**_fields(succeeded_job()), "status": status, "lease_expires_at": lease_expires_at})

    assert job.lease_remaining_ms(now) == remaining


def _fields(job: Job) -> dict[str, object]:
    return {name: getattr(job, name) for name in Job.__slots__}  # type: ignore[attr-defined]
