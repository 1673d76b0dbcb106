"""A batch's record: written before the batch is created at the provider, kept until it has ended;
and the provider's batch states, in the engine's words.

The record is what makes a paid batch impossible to lose: it exists before the provider's batch
does (`creating`), names it once created (`pending`), is marked when its rescue time came and it
was cancelled (`cancelling`), while its answers are being written (`concluding`), and at the end
(`ended`, kept for `aijobs batches` until its TTL). One batcher writes them (its function runs
one at a time); each write is fenced on the record as the batcher read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class BatchState(StrEnum):
    """Where a provider's batch is, in the engine's words (each adapter of engine.gateway.batches maps
    its provider's)."""

    PENDING = "pending"  # accepted: validating, queued, in progress or finalizing
    COMPLETED = "completed"  # every line answered or failed; results can be read
    EXPIRED = "expired"  # the completion window passed: the lines answered by then can be read
    CANCELLED = "cancelled"  # cancelled (by us): the lines answered before can be read
    FAILED = "failed"  # the batch as a whole was refused (a malformed input file, a quota): no results

    @property
    def ended(self) -> bool:
        return self is not BatchState.PENDING


class BatchPhase(StrEnum):
    CREATING = "creating"  # recorded; the provider's batch not known yet (being created, or to adopt)
    PENDING = "pending"  # the provider has it
    CANCELLING = "cancelling"  # its rescue time came: cancelled, its answers so far to be used
    CONCLUDING = "concluding"  # ended at the provider: its answers are being written to their jobs
    ENDED = "ended"

    @property
    def in_flight(self) -> bool:
        return self is not BatchPhase.ENDED


@dataclass(frozen=True, slots=True)
class BatchRecord:
    key: str
    model: str
    provider: str
    lines: int  # jobs in the batch (entries; those whose request could not be made are in none)
    phase: BatchPhase
    created_at: int
    updated_at: int
    # When the batch is cancelled: the rescue time (deadline less AIJOBS_BATCH_RESCUE_SECONDS) of its
    # job with the latest deadline, so that one job near its deadline never cancels a batch of jobs
    # with time to spare. And when its next job still unanswered goes back to real time (each at two
    # thirds of the rescue time before its own deadline), whatever the provider says or fails to say.
    rescue_at: int
    abandon_at: int
    next_poll_at: int = 0
    batch_id: str | None = None
    state: BatchState | None = None  # the provider's, as last read
    detail: str = ""
    answered: int = 0
    failed: int = 0
    # The provider took the cancel (it is asked again on every pass until it does).
    cancel_sent: bool = False
    # Every job whose hand-back time is at or before this one has been handed back (or was no longer
    # held); `handed_back` once that is every job of the batch, before it ended.
    handed_back_through: int = 0
    handed_back: bool = False
    # No answers will be read: it was never created, the provider refused it, or it never said it
    # ended (docs/batches.md); its jobs are concluded as unanswered.
    unanswerable: bool = False
    # How many entries have been concluded, in the manifest's order (a conclusion may take passes),
    # and the lines of those that met an error while concluded or handed back: gone over again first.
    concluded: int = 0
    redo: tuple[str, ...] = ()
    # Of its jobs: finished with the batch's answer, handed back to real time, and answered after the
    # batch no longer held them (kept as usage).
    finished: int = 0
    returned: int = 0
    discarded: int = 0
    ended_at: int | None = None


class BatchRecords(Protocol):
    """Where batch records are kept (engine.store.batches.BatchTable; engine.testing.MemoryBatchRecords)."""

    def create(self, record: BatchRecord) -> bool:
        """Write a new record; False when one with its key exists already."""
        ...

    def save(self, record: BatchRecord, read: BatchRecord) -> bool:
        """Replace `read` with `record`; False when the record changed since it was read."""
        ...

    def get(self, key: str) -> BatchRecord | None: ...

    def listed(self, in_flight_only: bool = True) -> list[BatchRecord]:
        """The records, oldest first: those in flight, or also the ended ones kept."""
        ...
