"""How an attempt ends, as a store writes it: the four outcomes of a claimed job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.job import JobErrorInfo, JobStatus, Review, Usage
from engine.core.reuse import Reusable


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The answer kept as the job's output. With `reused_from`, it is the answer that job paid for (no
    call was made); with `kept`, one paid for now, kept for later jobs of the same request too."""

    output: dict[str, Any]
    output_hash: str
    reused_from: str | None = None
    kept: Reusable | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    error: JobErrorInfo


@dataclass(frozen=True, slots=True)
class Released:
    """Back to `queued` for a later delivery; `refund_attempt` when the attempt did not count."""

    error: JobErrorInfo | None
    refund_attempt: bool = False


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancel was requested while this worker ran the job: its output is discarded."""


@dataclass(frozen=True, slots=True)
class Waits:
    """A pipeline's step started: `children` children of step `step` run (or, with `review`, a person
    decides). The claim is refunded: moving a pipeline on is not an attempt at a model."""

    step: int
    children: int
    # The children each step so far made, this one's last (what lists a pipeline's children).
    counts: tuple[int, ...] = ()
    review: Review | None = None
    # A step run again (a retried pipeline): the parts that ended already (its succeeded children, kept),
    # and what the parent's usage gains or loses so that it stays its children's sum (engine.pipelines).
    ended: frozenset[int] = frozenset()
    usage: Usage = field(default_factory=Usage)


Outcome = Succeeded | Failed | Released | Cancelled | Waits


def target_status(outcome: Outcome) -> JobStatus:
    match outcome:
        case Succeeded():
            return JobStatus.SUCCEEDED
        case Failed():
            return JobStatus.FAILED
        case Released():
            return JobStatus.QUEUED
        case Cancelled():
            return JobStatus.CANCELLED
        case Waits():
            return JobStatus.WAITING


def outcome_error(outcome: Outcome) -> JobErrorInfo | None:
    return outcome.error if isinstance(outcome, Failed | Released) else None
