"""How `aijobs inspect` and `aijobs dead-letters` read to people: what a job is doing now, its
attempts, and dead letters shown as written (their text is never markup)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from rich.console import Console, RenderableType

from aijobs.client import RedriveOutcome, RedriveResult
from aijobs.render import dead_letters_table, inspection_group, job_table, redrive_json, redrive_line
from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    DeadLetterEntry,
    ErrorCode,
    Job,
    JobErrorInfo,
    JobHistory,
    JobStatus,
)
from engine.views import DeadLetterView, JobInspection, JobView

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def text_of(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


QUEUED = Job(
    job_id="job-1",
    job_type="classify",
    user_id="user-1",
    status=JobStatus.QUEUED,
    created_at=NOW - 60_000,
    updated_at=NOW - 1_000,
    max_attempts=3,
)


def job(status: JobStatus, **changes: Any) -> Job:
    return replace(QUEUED, status=status, **changes)


def attempt(number: int, outcome: AttemptOutcome, error_code: ErrorCode | None = None) -> AttemptRecord:
    return AttemptRecord(
        job_id="job-1",
        attempt=number,
        user_id="user-1",
        job_type="classify",
        started_at=NOW - 10_000,
        finished_at=NOW - 8_500,
        outcome=outcome,
        error_code=error_code,
        provider="openai",
        tier="primary",
        model="gpt-4o-mini",
        calls=2,
        input_tokens=812,
        output_tokens=40,
        cost_usd=Decimal("0.00021"),
        cached_input_tokens=512,
        reasoning_tokens=16,
    )


NO_HISTORY = JobHistory(attempts=[], dead_letters=[])


@pytest.mark.parametrize(
    ("state", "now_ms", "shown"),
    [
        (
            job(JobStatus.RUNNING, lease_owner="w-1", lease_expires_at=NOW + 60_000),
            NOW,
            "running: lease held by w-1 until 2027-01-15T08:01:00Z",
        ),
        (
            job(JobStatus.RUNNING, lease_owner="w-1", lease_expires_at=NOW - 1),
            NOW,
            "lease of w-1 expired at 2027-01-15T07:59:59Z",
        ),
        (job(JobStatus.QUEUED), NOW, "queued: waiting for a worker"),
        (
            job(
                JobStatus.QUEUED,
                error=JobErrorInfo(ErrorCode.BUDGET_EXCEEDED, "waiting: user user-1 has spent its budget", True),
            ),
            NOW,
            "queued, waiting: user user-1 has spent its budget (budget_exceeded)",
        ),
        (
            job(
                JobStatus.QUEUED,
                error=JobErrorInfo(ErrorCode.PROVIDER_UNAVAILABLE, "provider unavailable (HTTP 503)", True),
            ),
            NOW,
            "queued: retrying after provider_unavailable: provider unavailable (HTTP 503)",
        ),
    ],
)
def test_inspect_says_what_a_job_that_has_not_ended_is_doing(state: Job, now_ms: int, shown: str) -> None:
    inspection = JobInspection.of(state, NO_HISTORY, now_ms)

    assert shown in text_of(inspection_group(inspection))


def test_inspect_of_a_finished_job_shows_each_attempt_and_the_dead_letters_naming_it() -> None:
    history = JobHistory(
        attempts=[
            attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_TIMEOUT),
            attempt(2, AttemptOutcome.SUCCEEDED),
        ],
        dead_letters=[DeadLetterEntry("m-1", NOW, 100, "reached the dead-letter queue after 100 receives", "job-1")],
    )

    text = text_of(inspection_group(JobInspection.of(job(JobStatus.SUCCEEDED, finished_at=NOW), history, NOW)))

    rows = [line for line in text.splitlines() if "gpt-4o-mini (primary)" in line]
    assert len(rows) == 2
    for cell in ("1.5 s", "812", "512", "40", "16", "$0.000210", "retryable", "provider_timeout"):
        assert cell in rows[0]
    assert "succeeded" in rows[1]
    assert "dead letters naming this job" in text
    assert "reached the dead-letter queue after 100 receives" in text
    assert "waiting" not in text
    assert "lease" not in text


def test_a_job_without_attempts_says_so() -> None:
    assert "no attempt recorded" in text_of(inspection_group(JobInspection.of(job(JobStatus.QUEUED), NO_HISTORY, NOW)))


def test_dead_letters_are_shown_as_written_never_as_markup() -> None:
    letter = DeadLetterView.from_entry(DeadLetterEntry("m-[bold]1", NOW, 1, "message body is [red]not[/] JSON", None))

    text = text_of(dead_letters_table([letter]))

    assert "m-[bold]1" in text
    assert "message body is [red]not[/] JSON" in text


def test_a_job_s_error_and_output_are_shown_as_written_never_as_markup() -> None:
    failed = job(
        JobStatus.FAILED,
        error=JobErrorInfo(ErrorCode.PROVIDER_REJECTED, "model [bold]x[/] refused [/]", False),
        output={"label": "[red]spam[/]"},
    )

    text = text_of(job_table(JobView.from_job(failed)))

    assert "provider_rejected: model [bold]x[/] refused [/]" in text
    assert '{"label": "[red]spam[/]"}' in text


def test_redrive_results_read_as_one_line_each_and_as_json() -> None:
    skipped = RedriveResult(
        "m-1", "job-1", RedriveOutcome.SKIPPED, "job job-1 is running; only a failed job can be retried"
    )
    no_job = RedriveResult("m-2", None, RedriveOutcome.NO_JOB, "names no job; not re-sent")

    assert redrive_line(skipped) == "m-1: skipped, job job-1 is running; only a failed job can be retried"
    assert redrive_line(no_job) == "m-2: names no job; not re-sent"
    assert redrive_json(no_job) == {
        "message_id": "m-2",
        "job_id": None,
        "outcome": "no_job",
        "detail": "names no job; not re-sent",
    }
