"""The reconciler: ends or re-enqueues jobs that no message will move on any more.

Run on a schedule. Each pass walks the OpenJobs index (never a scan) from where the last one
stopped, so that every open job is reached within a bounded number of passes whatever its
deadline (engine.core.open_jobs), reads each job as it is now, and
- skips jobs that ended since the index was written, or that a worker holds with a live lease;
- cancels jobs whose cancel was requested;
- fails jobs past their deadline with `deadline_exceeded` (`budget_exceeded` when they were
  waiting for their user's budget);
- re-enqueues `queued` jobs, and `running` jobs whose worker died, untouched for longer than any
  visibility timeout can hide a message (so their message is gone), when their input is stored;
  the others end at their deadline;
- moves on a `waiting` pipeline whose advance was lost (docs/pipelines.md): untouched for
  `pipeline_stale_seconds`, its step's children not counted yet are read, and each that ended is
  counted with the stream's own conditional write (engine.pipelines.ChildEnds.recount), which moves
  it on once; a review whose time is up sends the pipeline's message again, which ends it.
One job that cannot be reconciled is logged and counted, and the pass goes on; the pass stops
before the function's own timeout, and the next goes on from the last job it examined.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from enum import StrEnum

from engine.core import ErrorCode, Job, JobStatus, Lane
from engine.core.errors import deadline_error
from engine.core.ports import ReconcilerStore
from engine.observability import log_unexpected, logger
from engine.pipelines import ChildEnds
from engine.queue import JobQueue, JobQueues
from engine.retry import MAX_DELAY_SECONDS

# A job untouched for longer than the longest visibility timeout has no message in flight.
DEFAULT_STALE_SECONDS = MAX_DELAY_SECONDS + 3600
DEFAULT_MAX_JOBS = 1000
# A waiting pipeline untouched this long (no child counted on it) has its children read again: a
# child's end is counted within seconds from the stream, so only a lost record leaves it this long.
DEFAULT_PIPELINE_STALE_SECONDS = 900
# A pass stops when its invocation has less than this left.
STOP_MARGIN_MS = 15_000

RemainingMs = Callable[[], int]


class Reconciled(StrEnum):
    """What a pass counts: the jobs it examined, what became of them, and how the pass went. Each is
    the metric `Reconciled_<what>`."""

    EXAMINED = "examined"
    ALREADY_FINISHED = "already_finished"  # it ended after its index entry was read
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"  # past its deadline while its user's budget held it
    REQUEUED = "requeued"
    RECOUNTED = "recounted"  # a waiting pipeline moved on by its children counted again
    ERRORS = "errors"  # jobs that could not be reconciled (logged; the pass goes on)
    STOPPED_EARLY = "stopped_early"  # the invocation's time ran out


class Reconciler:
    def __init__(
        self,
        store: ReconcilerStore,
        queue: JobQueue | JobQueues,
        *,
        stale_seconds: int = DEFAULT_STALE_SECONDS,
        max_jobs: int = DEFAULT_MAX_JOBS,
        clock: Callable[[], float] = time.time,
        pipelines: ChildEnds | None = None,
        pipeline_stale_seconds: int = DEFAULT_PIPELINE_STALE_SECONDS,
    ) -> None:
        self._store = store
        # What recounts a waiting pipeline's children (the events function's own counting).
        self._pipelines = pipelines
        self._pipeline_stale_ms = pipeline_stale_seconds * 1000
        # A re-enqueued job goes back to its own lane's queue.
        self._queues = JobQueues.of(queue)
        self._stale_ms = stale_seconds * 1000
        self._max_jobs = max_jobs
        self._clock = clock

    def run(self, remaining_ms: RemainingMs | None = None) -> Counter[Reconciled]:
        """One pass; returns how many jobs met each fate (examined, deadline_exceeded, errors, ...)."""
        report: Counter[Reconciled] = Counter()
        walk = self._store.open_jobs(self._max_jobs)
        jobs = iter(walk)
        while True:
            # Time is checked before a job is taken: every job the walk hands out is examined.
            if remaining_ms is not None and remaining_ms() < STOP_MARGIN_MS:
                report[Reconciled.STOPPED_EARLY] += 1
                break
            job = next(jobs, None)
            if job is None:
                break
            report[Reconciled.EXAMINED] += 1
            try:
                fate = self._reconcile(job, self._now_ms())
            except Exception as exc:
                log_unexpected("a job could not be reconciled", exc, job_id=job.job_id)
                report[Reconciled.ERRORS] += 1
                continue
            if fate:
                report[fate] += 1
        walk.save()
        logger.info("reconciled open jobs", extra={what.value: count for what, count in report.items()})
        return report

    def _reconcile(self, job: Job, now_ms: int) -> Reconciled | None:
        if job.status.is_terminal:
            return Reconciled.ALREADY_FINISHED
        if job.lease_remaining_ms(now_ms) > 0:
            return None  # a worker holds it and will finish or release it
        # In the order a refused claim is explained (store.explain_claim_refusal): a cancel wins.
        if job.cancel_requested:
            return Reconciled.CANCELLED if self._store.end_job(job, JobStatus.CANCELLED, None, now_ms) else None
        if job.deadline_at is not None and job.deadline_at <= now_ms:
            error = deadline_error(job, "the job's deadline passed with no worker on it")
            if not self._store.end_job(job, JobStatus.FAILED, error.info(), now_ms):
                return None
            return (
                Reconciled.BUDGET_EXCEEDED if error.code is ErrorCode.BUDGET_EXCEEDED else Reconciled.DEADLINE_EXCEEDED
            )
        if job.status is JobStatus.WAITING:
            return self._waiting(job, now_ms)
        stale = now_ms - job.updated_at >= self._stale_ms
        if stale and job.input_stored and self._store.touch_job(job, now_ms):
            self._queues[job.lane].send({"job_id": job.job_id}, group_id=job.user_id)
            return Reconciled.REQUEUED
        return None

    def _waiting(self, job: Job, now_ms: int) -> Reconciled | None:
        """A pipeline is moved on by its children's ends, or its review's own message: the reconciler steps
        in only when those were lost."""
        if now_ms - job.updated_at < self._pipeline_stale_ms:
            return None
        review = job.pipeline.review if job.pipeline is not None else None
        if review is not None:
            lost = review.decision is None and now_ms >= review.expires_at + self._pipeline_stale_ms
            if lost and self._store.touch_job(job, now_ms):
                self._queues[Lane.INTERACTIVE].send({"job_id": job.job_id}, group_id=job.user_id)
                return Reconciled.REQUEUED
            return None
        if self._pipelines is not None and self._pipelines.recount(job):
            return Reconciled.RECOUNTED
        return None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
