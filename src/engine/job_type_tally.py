"""The data job types' stats and canary guards, from the jobs table's stream (docs/jobtypes.md).

The events function hands each batch of stream records here after its completion events: job items
entering succeeded, failed or cancelled. Those of a data job type (their item carries
`job_type_version`) are summed per (name, version) into one `add_stats` each; and, for a name with a
canary, the jobs created since the canary started are counted on its side (the canary's version)
or production's (`tally`). A guarded canary the counts show worse than production by more than its
guard allows is ended (`end_canary`: once, whoever else tries), and the end is sent as an
EventBridge event `Job Type Rolled Back` and counted as the metric `JobTypeRolledBack`.

Delivery is at least once: a batch read again is summed again (stats are figures, not a ledger);
the guard ends a canary once whatever comes twice.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from engine.core import ErrorCode, JobStatus
from engine.core.job_types import JobTypeHead, VersionStats, duration_bucket, guard_breach
from engine.core.ports import JobTypeStore
from engine.events import CompletionEvent, EventPublisher, enters_terminal_status
from engine.observability import MetricUnit, count, job_metrics, log_unexpected, logger
from engine.store.items import from_item, job_from_item

ROLLED_BACK = "Job Type Rolled Back"
ROLLED_BACK_METRIC = "JobTypeRolledBack"
# The errors a version's answers failed validation with: what its stats and its guard count.
VALIDATION_CODES = frozenset(
    {ErrorCode.SCHEMA_VALIDATION_FAILED, ErrorCode.BUSINESS_VALIDATION_FAILED, ErrorCode.REFERENCE_VALIDATION_FAILED}
)


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """What the tally needs of a finished job of a data job type."""

    name: str
    version: int
    created_at: int
    succeeded: bool
    invalid: bool
    reasks: int
    cost_usd: Decimal
    duration_ms: int


def finished_job(record: dict[str, Any]) -> FinishedJob | None:
    """The finished job a stream record shows, when it is one of a data job type entering a terminal
    status; None for any other record (or an item this code cannot read: its event says so)."""
    if not enters_terminal_status(record):
        return None
    image = record["dynamodb"]["NewImage"]
    if "job_type_version" not in image:
        return None
    try:
        job = job_from_item(image)
        # Re-asks after an answer failed validation, when the item records them (else none counted).
        extra = from_item({name: image[name] for name in ("job_type_version", "reasks") if name in image})
        version, reasks = int(extra["job_type_version"]), int(extra.get("reasks", 0))
    except Exception as exc:
        log_unexpected("a finished job's item could not be read; the job type's stats leave it out", exc)
        return None
    if job.job_type is None:
        return None
    return FinishedJob(
        name=job.job_type,
        version=version,
        created_at=job.created_at,
        succeeded=job.status is JobStatus.SUCCEEDED,
        invalid=job.error is not None and job.error.code in VALIDATION_CODES,
        reasks=reasks,
        cost_usd=job.usage.cost_usd,
        duration_ms=max(0, (job.finished_at or job.updated_at) - job.created_at),
    )


def version_stats(jobs: Iterable[FinishedJob]) -> dict[tuple[str, int], VersionStats]:
    """The jobs' figures summed per (name, version)."""
    grouped: dict[tuple[str, int], list[FinishedJob]] = defaultdict(list)
    for job in jobs:
        grouped[(job.name, job.version)].append(job)
    summed = {}
    for (name, version), members in grouped.items():
        durations: dict[int, int] = defaultdict(int)
        for job in members:
            durations[duration_bucket(job.duration_ms)] += 1
        summed[(name, version)] = VersionStats(
            version=version,
            jobs=len(members),
            succeeded=sum(job.succeeded for job in members),
            validation_failures=sum(job.invalid for job in members),
            reasks=sum(job.reasks for job in members),
            cost_usd=sum((job.cost_usd for job in members), Decimal(0)),
            durations=dict(durations),
        )
    return summed


def canary_counts(jobs: Iterable[FinishedJob], head: JobTypeHead) -> tuple[int, int, int, int]:
    """(canary jobs, canary invalid, production jobs, production invalid) of the head's name among
    `jobs`, counting only those created since its canary started (the same period on both sides)."""
    canary = head.canary
    assert canary is not None
    counts = [0, 0, 0, 0]
    for job in jobs:
        if job.name != head.name or job.created_at < canary.started_at:
            continue
        if job.version == canary.version:
            side = 0
        elif job.version == head.production:
            side = 2
        else:
            continue
        counts[side] += 1
        counts[side + 1] += job.invalid
    return counts[0], counts[1], counts[2], counts[3]


def rolled_back_event(head: JobTypeHead, reason: str, now_ms: int) -> CompletionEvent:
    """The `Job Type Rolled Back` event of a canary its guard ended; `head` is as the last tally left it."""
    canary = head.canary
    assert canary is not None
    detail = {
        "job_type": head.name,
        "version": canary.version,
        "production_version": head.production,
        "reason": reason,
        "canary_jobs": canary.canary_jobs,
        "canary_invalid": canary.canary_invalid,
        "production_jobs": canary.production_jobs,
        "production_invalid": canary.production_invalid,
        "at": now_ms,
    }
    return CompletionEvent(ROLLED_BACK, detail, sequence_number="")


class JobTypeTally:
    """The events function's second part: stream records in, stats and canary guards out."""

    def __init__(
        self,
        store: JobTypeStore,
        publisher: EventPublisher,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._clock = clock

    def record(self, records: Sequence[dict[str, Any]]) -> None:
        """Sum a batch's finished jobs of data job types into their versions' stats (one write per
        version), and count them into their names' canaries, ending those their guard condemns."""
        jobs = [job for record in records if (job := finished_job(record)) is not None]
        if not jobs:
            return
        for (name, _), delta in sorted(version_stats(jobs).items()):
            self._store.add_stats(name, delta)
        # Read fresh for every batch that holds such jobs (one Query): a canary's first jobs are
        # counted on both sides from the moment it starts, never against a stale head.
        heads = {head.name: head for head in self._store.heads()}
        for name in sorted({job.name for job in jobs}):
            head = heads.get(name)
            if head is not None and head.canary is not None:
                self._guard(head, jobs)

    def _guard(self, head: JobTypeHead, jobs: Sequence[FinishedJob]) -> None:
        counts = canary_counts(jobs, head)
        if not any(counts):
            return
        assert head.canary is not None
        canary = (head.canary.version, head.canary.started_at)
        after = self._store.tally(head.name, canary, counts)
        if after is None or after.canary is None:
            return  # ended or replaced meanwhile
        reason = guard_breach(after.canary)
        if reason is None:
            return
        now_ms = int(self._clock() * 1000)
        if not self._store.end_canary(head.name, canary, now_ms, reason):
            return
        logger.warning(
            "a guarded canary ended by itself",
            extra={"job_type": head.name, "version": canary[0], "reason": reason},
        )
        count(ROLLED_BACK_METRIC)
        job_metrics.add(head.name, None, ROLLED_BACK_METRIC, 1, MetricUnit.Count)
        if self._publisher.publish([rolled_back_event(after, reason, now_ms)]):
            logger.error("the event of a guarded canary's end was refused by the bus", extra={"job_type": head.name})
