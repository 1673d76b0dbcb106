"""The reconciler: ends or re-enqueues jobs that no message will move on any more.

Run on a schedule. It reads the OpenJobs index (never a scan) and
- fails jobs past their deadline with `deadline_exceeded` (unless a worker holds a live lease);
- cancels jobs whose cancel was requested while no worker holds them;
- re-enqueues jobs `queued` for longer than any visibility timeout can hide a message (so their
  message is gone), when their input is stored; the others end at their deadline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from engine.config import get_settings
from engine.errors import DeadlineExceededError
from engine.models import Job, JobErrorInfo, JobStatus
from engine.observability import logger
from engine.queue import JobQueue
from engine.retry import MAX_DELAY_SECONDS
from engine.store import JobStore

# A queued job untouched for longer than the longest visibility timeout has no message in flight.
DEFAULT_STALE_SECONDS = MAX_DELAY_SECONDS + 3600
DEFAULT_MAX_JOBS = 1000


class Reconciler:
    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        *,
        stale_seconds: int = DEFAULT_STALE_SECONDS,
        max_jobs: int = DEFAULT_MAX_JOBS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._queue = queue
        self._stale_ms = stale_seconds * 1000
        self._max_jobs = max_jobs
        self._clock = clock

    def run(self) -> Counter[str]:
        """One pass; returns how many jobs met each fate (examined, deadline_exceeded, ...)."""
        report: Counter[str] = Counter()
        for job in self._store.open_jobs(self._max_jobs):
            report["examined"] += 1
            fate = self._reconcile(job, self._now_ms())
            if fate:
                report[fate] += 1
        logger.info("reconciled open jobs", extra=dict(report))
        return report

    def _reconcile(self, job: Job, now_ms: int) -> str | None:
        if job.lease_remaining_ms(now_ms) > 0:
            return None  # a worker holds it and will finish or release it
        # In the order a refused claim is explained (store.explain_claim_refusal): a cancel wins.
        if job.cancel_requested:
            return "cancelled" if self._store.settle_job(job, JobStatus.CANCELLED, None, now_ms) else None
        if job.deadline_at is not None and job.deadline_at <= now_ms:
            error = DeadlineExceededError("the job's deadline passed with no worker on it")
            info = JobErrorInfo(error.code, error.message, retryable=False)
            return "deadline_exceeded" if self._store.settle_job(job, JobStatus.FAILED, info, now_ms) else None
        stale = now_ms - job.updated_at >= self._stale_ms
        if job.status is JobStatus.QUEUED and stale and job.input_stored and self._store.touch_queued_job(job, now_ms):
            self._queue.send({"job_id": job.job_id})
            return "requeued"
        return None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


@lru_cache(maxsize=1)
def get_reconciler() -> Reconciler:
    settings = get_settings()
    return Reconciler(JobStore.from_settings(settings), JobQueue(settings.jobs_queue_url))
