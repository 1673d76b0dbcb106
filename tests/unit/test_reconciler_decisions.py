"""The reconciler's decision table on the in-memory store: each open job is ended, re-enqueued or left.

The same behaviours as tests/integration/test_reconciler.py, without moto: a recording queue, a
clock the test sets.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.core import ErrorCode, Job, JobErrorInfo, JobStatus, NewJob, Released, Succeeded
from engine.core.open_jobs import OpenJobKey, OpenJobsWalk
from engine.intake import request_hash
from engine.reconciler import STOP_MARGIN_MS, Reconciler
from engine.testing import InMemoryJobStore, MemoryOpenJobs
from tests.support.events import job_message
from tests.support.providers import VALID_OUTPUTS

T0 = 1_800_000_000_000  # epoch ms, a whole second
STALE_SECONDS = 600
MESSAGE = job_message("classify")
UNAVAILABLE = JobErrorInfo(ErrorCode.PROVIDER_UNAVAILABLE, "provider unavailable (HTTP 503)", retryable=True)


class RecordingQueue:
    """Where re-enqueued jobs' reference messages go: remembered, never sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.groups: list[str | None] = []

    def send(self, body: dict[str, Any], group_id: str | None = None) -> str:
        self.sent.append(body)
        self.groups.append(group_id)
        return f"sent-{len(self.sent)}"


@pytest.fixture
def store() -> InMemoryJobStore:
    return InMemoryJobStore()


@pytest.fixture
def queue() -> RecordingQueue:
    return RecordingQueue()


def reconciler(store: InMemoryJobStore, queue: RecordingQueue, at_ms: int, **options: Any) -> Reconciler:
    """A reconciler whose clock reads `at_ms` (a whole second, so that it reads back exactly)."""
    assert at_ms % 1000 == 0
    return Reconciler(store, queue, stale_seconds=STALE_SECONDS, clock=lambda: float(at_ms // 1000), **options)


def new_job(**overrides: Any) -> NewJob:
    fields: dict[str, Any] = {
        "job_type": "classify",
        "user_id": "user-1",
        "schema_version": 1,
        "max_attempts": 3,
        "deadline_seconds": 86_400,
        "request_hash": request_hash("classify", "user-1", MESSAGE["input"]),
    }
    fields.update(overrides)
    return NewJob(**fields)


def submitted(store: InMemoryJobStore, job_id: str, at_ms: int = T0, **overrides: Any) -> Job:
    """A job created beforehand with its input stored (a submission), queued."""
    job, created = store.create_job(job_id, new_job(**overrides), MESSAGE["input"], at_ms)
    assert created
    return job


def job_of(store: InMemoryJobStore, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None, f"job {job_id} does not exist"
    return job


# --- deadlines ----------------------------------------------------------------------------------


def test_jobs_past_their_deadline_that_no_worker_holds_fail_with_deadline_exceeded(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given two jobs with a 60 s deadline: one queued, one whose worker died (a 30 s lease)
    submitted(store, "late-queued", deadline_seconds=60)
    store.claim_job("late-orphan", "dead-worker", 30_000, T0, new_job(deadline_seconds=60))

    # When the reconciler runs two minutes later
    at = T0 + 120_000
    report = reconciler(store, queue, at).run()

    # Then both fail with deadline_exceeded, their leases let go
    assert report == {"examined": 2, "deadline_exceeded": 2}
    for job_id in ("late-queued", "late-orphan"):
        job = job_of(store, job_id)
        assert job.error is not None
        assert (job.status, job.error.code, job.error.retryable) == (
            JobStatus.FAILED,
            ErrorCode.DEADLINE_EXCEEDED,
            False,
        )
        assert (job.lease_owner, job.lease_expires_at, job.finished_at) == (None, None, at)
    assert queue.sent == []


def test_a_job_waiting_for_its_users_budget_past_its_deadline_fails_with_budget_exceeded(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a job a worker handed back to wait for its user's budget
    claimed = store.claim_job("waits-budget", "worker", 30_000, T0, new_job(deadline_seconds=60))
    waiting = JobErrorInfo(ErrorCode.BUDGET_EXCEEDED, "waiting: user user-1 has spent its budget", retryable=True)
    store.finish_job(claimed, Released(waiting, refund_attempt=True), T0)

    # When the reconciler runs past its deadline
    report = reconciler(store, queue, T0 + 120_000).run()

    # Then it fails with budget_exceeded, for good
    assert report == {"examined": 1, "budget_exceeded": 1}
    job = job_of(store, "waits-budget")
    assert job.error is not None
    assert (job.status, job.error.code, job.error.retryable) == (JobStatus.FAILED, ErrorCode.BUDGET_EXCEEDED, False)


def test_a_job_a_worker_holds_is_left_to_it_even_past_its_deadline(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a job with a 60 s deadline held by a live worker for 10 minutes, and one held with a cancel requested
    store.claim_job("late-held", "live-worker", 600_000, T0, new_job(deadline_seconds=60))
    store.claim_job("cancel-held", "live-worker", 600_000, T0, new_job())
    store.request_cancel("cancel-held", T0)
    before = {job_id: job_of(store, job_id) for job_id in ("late-held", "cancel-held")}

    # When the reconciler runs two minutes later
    report = reconciler(store, queue, T0 + 120_000).run()

    # Then both are left to their worker (its finish, or its finishing fence)
    assert report == {"examined": 2}
    assert {job_id: job_of(store, job_id) for job_id in before} == before
    assert queue.sent == []


# --- cancels ------------------------------------------------------------------------------------


def test_a_cancel_requested_while_no_worker_holds_the_job_ends_it_cancelled(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a running job whose worker died (a 30 s lease), whose cancel was then requested
    store.claim_job("cancel-orphan", "dead-worker", 30_000, T0, new_job())
    store.request_cancel("cancel-orphan", T0)

    # When the reconciler runs two minutes later
    at = T0 + 120_000
    report = reconciler(store, queue, at).run()

    # Then the job is cancelled, without an error
    assert report == {"examined": 1, "cancelled": 1}
    job = job_of(store, "cancel-orphan")
    assert (job.status, job.cancel_requested, job.error) == (JobStatus.CANCELLED, True, None)
    assert (job.lease_owner, job.finished_at) == (None, at)


def test_a_cancel_wins_over_a_passed_deadline(store: InMemoryJobStore, queue: RecordingQueue) -> None:
    # Given a job with a 60 s deadline whose worker died, and whose cancel was then requested
    store.claim_job("cancel-late", "dead-worker", 30_000, T0, new_job(deadline_seconds=60))
    store.request_cancel("cancel-late", T0)

    # When the reconciler runs after the deadline
    report = reconciler(store, queue, T0 + 120_000).run()

    # Then the job ends cancelled, as a delivery of its message would end it
    assert report == {"examined": 1, "cancelled": 1}
    job = job_of(store, "cancel-late")
    assert (job.status, job.error) == (JobStatus.CANCELLED, None)


# --- stale jobs ---------------------------------------------------------------------------------


def test_a_stale_queued_job_with_its_input_stored_is_re_enqueued_once(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a submitted job untouched for longer than the stale time, and one touched recently
    submitted(store, "stale-1")
    submitted(store, "fresh-1", at_ms=T0 + 200_000)
    fresh = job_of(store, "fresh-1")

    # When the reconciler runs past the stale time
    at = T0 + (STALE_SECONDS + 100) * 1000
    report = reconciler(store, queue, at).run()

    # Then the stale job gets a reference message and is marked as touched; the fresh one is left
    assert report == {"examined": 2, "requeued": 1}
    assert queue.sent == [{"job_id": "stale-1"}]
    assert queue.groups == ["user-1"]
    job = job_of(store, "stale-1")
    assert (job.status, job.updated_at) == (JobStatus.QUEUED, at)
    assert job_of(store, "fresh-1") == fresh

    # When it runs again right after, Then nothing is sent again
    assert reconciler(store, queue, at).run() == {"examined": 2}
    assert queue.sent == [{"job_id": "stale-1"}]


def test_a_stale_running_job_whose_lease_expired_is_re_enqueued_and_can_be_taken_over(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a submitted job claimed by a worker that died (a 60 s lease), whose message is gone
    submitted(store, "orphan-1")
    store.claim_job("orphan-1", "dead-worker", 60_000, T0, None)

    # When the reconciler runs past the stale time
    at = T0 + (STALE_SECONDS + 100) * 1000
    report = reconciler(store, queue, at).run()

    # Then a reference message is enqueued, and the job is left to the next claim
    assert report == {"examined": 1, "requeued": 1}
    assert queue.sent == [{"job_id": "orphan-1"}]
    assert (job_of(store, "orphan-1").status, job_of(store, "orphan-1").updated_at) == (JobStatus.RUNNING, at)
    taken = store.claim_job("orphan-1", "next-worker", 60_000, at + 1, None)
    assert (taken.lease_owner, taken.attempt_count) == ("next-worker", 2)


def test_a_stale_job_whose_input_only_its_message_carried_is_left_to_its_deadline(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a message-carried job with a 1 h deadline, released after a 503 (its input is not stored)
    carried = store.claim_job("carried-1", "worker", 60_000, T0, new_job(deadline_seconds=3_600))
    store.finish_job(carried, Released(UNAVAILABLE), T0)
    released = job_of(store, "carried-1")
    assert (released.status, released.input_stored) == (JobStatus.QUEUED, False)

    # When the reconciler runs past the stale time, Then it is left alone (no reference could run it)
    stale = T0 + (STALE_SECONDS + 100) * 1000
    assert reconciler(store, queue, stale).run() == {"examined": 1}
    assert job_of(store, "carried-1") == released
    assert queue.sent == []

    # And when it runs past the deadline, Then the job fails with deadline_exceeded
    assert reconciler(store, queue, T0 + 3_700_000).run() == {"examined": 1, "deadline_exceeded": 1}
    job = job_of(store, "carried-1")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED)
    assert queue.sent == []


# --- a pass that meets ended jobs, broken jobs, its limit and its own timeout -------------------


class LaggingIndex(InMemoryJobStore):
    """An OpenJobs index that still lists jobs that ended (it is eventually consistent)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[str] = []

    def open_jobs(self, limit: int) -> OpenJobsWalk:
        return OpenJobsWalk(LaggingSegment(self), limit)


class LaggingSegment(MemoryOpenJobs):
    def __init__(self, store: LaggingIndex) -> None:
        super().__init__(store)
        self._ended = store.ended

    def keys(self, segment: int, after: OpenJobKey | None, count: int) -> tuple[list[OpenJobKey], bool]:
        keys, to_end = super().keys(segment, after, count)
        return [OpenJobKey(0, job_id) for job_id in self._ended] + keys, to_end


def test_a_job_that_ended_after_the_index_was_read_is_counted_already_finished(queue: RecordingQueue) -> None:
    # Given an index that still lists a job that succeeded, next to a job past its deadline
    store = LaggingIndex()
    done = store.claim_job("done-1", "worker", 60_000, T0, new_job())
    store.finish_job(done, Succeeded(VALID_OUTPUTS["classify"], "hash"), T0)
    store.ended.append("done-1")
    finished = job_of(store, "done-1")
    submitted(store, "late-1", deadline_seconds=60)

    # When the reconciler runs after the deadline
    report = reconciler(store, queue, T0 + 120_000).run()

    # Then the ended job is seen as it is and left alone, and the next one is still handled
    assert report == {"examined": 2, "already_finished": 1, "deadline_exceeded": 1}
    assert job_of(store, "done-1") == finished
    assert job_of(store, "late-1").status is JobStatus.FAILED


class OneBrokenJob(InMemoryJobStore):
    """A store whose end_job of one job fails in a way nothing expects."""

    def end_job(self, job: Job, *args: Any, **kwargs: Any) -> bool:
        if job.job_id == "late-2":
            raise RuntimeError("a fault on this one job")
        return super().end_job(job, *args, **kwargs)


def test_one_job_that_cannot_be_reconciled_is_counted_and_the_others_are_handled(queue: RecordingQueue) -> None:
    # Given three jobs past their deadline, the second of which cannot be written
    store = OneBrokenJob()
    for job_id in ("late-1", "late-2", "late-3"):
        submitted(store, job_id, deadline_seconds=60)

    # When the reconciler runs after the deadline
    report = reconciler(store, queue, T0 + 120_000).run()

    # Then the broken one is counted as an error and the pass goes on
    assert report == {"examined": 3, "deadline_exceeded": 2, "errors": 1}
    assert [job_of(store, job_id).status for job_id in ("late-1", "late-2", "late-3")] == [
        JobStatus.FAILED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
    ]


def test_a_pass_examines_no_more_jobs_than_its_limit(store: InMemoryJobStore, queue: RecordingQueue) -> None:
    # Given five jobs past their deadline and a reconciler that handles two a pass
    for index in range(5):
        submitted(store, f"late-{index}", deadline_seconds=60)

    # When it runs after the deadline
    report = reconciler(store, queue, T0 + 120_000, max_jobs=2).run()

    # Then it handles two, and leaves the others to the next pass
    assert report == {"examined": 2, "deadline_exceeded": 2}
    statuses = [job_of(store, f"late-{index}").status for index in range(5)]
    assert statuses.count(JobStatus.FAILED) == 2


def test_a_stale_job_beyond_a_passs_reach_is_re_enqueued_by_a_later_pass(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a stale queued job with a 7-day deadline behind 25 jobs touched recently whose deadlines
    # come first, and a reconciler that examines 10 jobs a pass
    submitted(store, "stale-late", deadline_seconds=604_800)
    at = T0 + (STALE_SECONDS + 100) * 1000
    for index in range(25):
        submitted(store, f"fresh-{index:02d}", at_ms=at - 1_000, deadline_seconds=3_600)
    fresh = {f"fresh-{index:02d}": job_of(store, f"fresh-{index:02d}") for index in range(25)}

    # When it runs pass after pass
    reports = [reconciler(store, queue, at, max_jobs=10).run() for _ in range(3)]

    # Then the first two passes examine the earlier deadlines, and the third reaches the stale job
    # (26 open jobs, 10 a pass) and re-enqueues it, once; the others are left as they were
    assert reports == [{"examined": 10}, {"examined": 10}, {"examined": 10, "requeued": 1}]
    assert queue.sent == [{"job_id": "stale-late"}]
    assert {job_id: job_of(store, job_id) for job_id in fresh} == fresh


def test_a_pass_with_too_little_time_left_stops_before_touching_a_job(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given a job past its deadline
    submitted(store, "late-1", deadline_seconds=60)
    before = job_of(store, "late-1")

    # When a pass starts with less time left than its stop margin
    report = reconciler(store, queue, T0 + 120_000).run(remaining_ms=lambda: STOP_MARGIN_MS - 1)

    # Then it stops at once and the job is untouched
    assert report == {"stopped_early": 1}
    assert job_of(store, "late-1") == before


def test_a_pass_that_runs_out_of_time_midway_stops_after_the_jobs_it_handled(
    store: InMemoryJobStore, queue: RecordingQueue
) -> None:
    # Given two jobs past their deadline, and an invocation whose time runs out after the first
    submitted(store, "late-1", deadline_seconds=60)
    submitted(store, "late-2", deadline_seconds=60)
    left = iter([STOP_MARGIN_MS + 1_000, STOP_MARGIN_MS - 1])

    # When a pass runs
    report = reconciler(store, queue, T0 + 120_000).run(remaining_ms=lambda: next(left))

    # Then it handles the first and stops before the second
    assert report == {"examined": 1, "deadline_exceeded": 1, "stopped_early": 1}
    assert [job_of(store, job_id).status for job_id in ("late-1", "late-2")] == [JobStatus.FAILED, JobStatus.QUEUED]
