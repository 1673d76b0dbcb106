"""store.explain_claim_refusal: why a claim's condition failed, read from the item it met."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.core import ClaimRefusal, Job, JobStatus, explain_claim_refusal

NOW = 1_800_000_000_000
HASH = "h" * 64


def job(**overrides: object) -> Job:
    """A queued job that a claim would admit; each test breaks one thing."""
    fields: dict[str, object] = {
        "job_id": "job-1",
        "job_type": "classify",
        "user_id": "user-1",
        "status": JobStatus.QUEUED,
        "created_at": NOW - 60_000,
        "updated_at": NOW - 60_000,
        "max_attempts": 3,
        "attempt_count": 1,
        "claim_count": 1,
        "deadline_at": NOW + 3_600_000,
        "request_hash": HASH,
    }
    fields.update(overrides)
    return Job(**fields)  # type: ignore[arg-type]


def running(lease_expires_at: int, **overrides: object) -> Job:
    return job(status=JobStatus.RUNNING, lease_owner="worker-a", lease_expires_at=lease_expires_at, **overrides)


@pytest.mark.parametrize(
    ("refused", "request_hash", "reason"),
    [
        (job(request_hash="other"), HASH, ClaimRefusal.CONFLICT),
        (job(request_hash=None), HASH, ClaimRefusal.CONFLICT),
        (job(status=JobStatus.SUCCEEDED), HASH, ClaimRefusal.FINISHED),
        (job(status=JobStatus.FAILED), HASH, ClaimRefusal.FINISHED),
        (job(status=JobStatus.CANCELLED), None, ClaimRefusal.FINISHED),
        (running(NOW + 1), HASH, ClaimRefusal.HELD),
        (running(NOW + 300_000), None, ClaimRefusal.HELD),
        (job(cancel_requested=True), HASH, ClaimRefusal.CANCEL_REQUESTED),
        (running(NOW - 1, cancel_requested=True), HASH, ClaimRefusal.CANCEL_REQUESTED),
        (job(deadline_at=NOW), HASH, ClaimRefusal.DEADLINE_PASSED),
        (job(deadline_at=NOW - 1), None, ClaimRefusal.DEADLINE_PASSED),
        (job(attempt_count=3), HASH, ClaimRefusal.ATTEMPTS_SPENT),
        (running(NOW - 1, attempt_count=3), None, ClaimRefusal.ATTEMPTS_SPENT),
    ],
)
def test_each_refusal_is_explained(refused: Job, request_hash: str | None, reason: ClaimRefusal) -> None:
    assert explain_claim_refusal(refused, NOW, request_hash) is reason


def test_a_reference_message_never_conflicts() -> None:
    # A `{"job_id": ...}` message carries no request hash to compare.
    assert (
        explain_claim_refusal(job(request_hash="other", status=JobStatus.SUCCEEDED), NOW, None) is ClaimRefusal.FINISHED
    )


# Precedence: conflict > finished > held > cancel requested > deadline passed > attempts spent.
EVERYTHING_WRONG = running(
    NOW + 60_000, request_hash="other", cancel_requested=True, deadline_at=NOW - 1, attempt_count=3
)


@pytest.mark.parametrize(
    ("refused", "request_hash", "reason"),
    [
        (EVERYTHING_WRONG, HASH, ClaimRefusal.CONFLICT),
        (replace(EVERYTHING_WRONG, status=JobStatus.FAILED), HASH, ClaimRefusal.CONFLICT),
        (replace(EVERYTHING_WRONG, status=JobStatus.FAILED), None, ClaimRefusal.FINISHED),
        (EVERYTHING_WRONG, None, ClaimRefusal.HELD),
        (replace(EVERYTHING_WRONG, lease_expires_at=NOW - 1), None, ClaimRefusal.CANCEL_REQUESTED),
        (
            replace(EVERYTHING_WRONG, lease_expires_at=NOW - 1, cancel_requested=False),
            None,
            ClaimRefusal.DEADLINE_PASSED,
        ),
        (
            replace(EVERYTHING_WRONG, lease_expires_at=NOW - 1, cancel_requested=False, deadline_at=NOW + 1),
            None,
            ClaimRefusal.ATTEMPTS_SPENT,
        ),
    ],
)
def test_refusals_take_precedence_in_order(refused: Job, request_hash: str | None, reason: ClaimRefusal) -> None:
    assert explain_claim_refusal(refused, NOW, request_hash) is reason


def test_a_finished_job_is_finished_even_when_its_budget_and_deadline_are_spent() -> None:
    refused = job(status=JobStatus.SUCCEEDED, attempt_count=3, deadline_at=NOW - 1, cancel_requested=True)

    assert explain_claim_refusal(refused, NOW, HASH) is ClaimRefusal.FINISHED


def test_a_held_job_is_held_even_when_cancel_is_requested() -> None:
    # The holder sees the cancel at its finishing fence; the duplicate must wait, not settle the job.
    assert explain_claim_refusal(running(NOW + 5_000, cancel_requested=True), NOW, HASH) is ClaimRefusal.HELD


def test_a_lease_expiring_at_this_very_millisecond_is_not_explained_as_spent_attempts() -> None:
    # Given a running job with 2 attempts left whose lease ends exactly now
    held = running(NOW)
    assert held.attempts_left == 2

    reason = explain_claim_refusal(held, NOW, HASH)

    assert reason is not ClaimRefusal.ATTEMPTS_SPENT
