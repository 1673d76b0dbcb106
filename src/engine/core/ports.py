"""What the lifecycle needs of a store, one Protocol per role, and of the dead letters.

The runner, the dead-letter recorder, the reconciler and the client depend on these, never on a
particular store (nor the runner on the dead-letter function's recorder). Two implementations keep
the stores': DynamoDB (engine.store, the one deployed) and memory (engine.testing.InMemoryJobStore,
for tests of the decisions above it); one contract test suite runs against both (tests/contract),
so that the two cannot drift apart. docs/protocol.md gives the conditions each write is fenced on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from engine.core.attachments import AttachmentInfo
from engine.core.codes import ErrorCode
from engine.core.deliveries import DeadLetterFate
from engine.core.errors import JobError
from engine.core.job import (
    AttemptRecord,
    BatchTerms,
    ChildOf,
    Counted,
    DeadLetter,
    DeadLetterEntry,
    Job,
    JobDetails,
    JobErrorInfo,
    JobHistory,
    JobStatus,
    Lane,
    NewJob,
    Review,
    Settlement,
)
from engine.core.job_types import Guard, JobTypeHead, StoredVersion, VersionStats
from engine.core.open_jobs import OpenJobsWalk
from engine.core.outcomes import Outcome
from engine.core.reuse import PaidAnswer


class JobReader(Protocol):
    """Reads of one job and what it recorded, and of the dead letters."""

    def get_job(self, job_id: str) -> Job | None:
        """The job as it is now (a strongly consistent read), or None."""
        ...

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs of `job_ids` that exist, as they are now (strongly consistent, 100 a request)."""
        ...

    def get_input(self, job_id: str) -> dict[str, Any] | None:
        """The input stored for the job (on its item or in the payload bucket), or None."""
        ...

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """The job's attempt records, oldest first."""
        ...

    def job_history(self, job_id: str) -> JobHistory:
        """The job's attempt records and the dead letters that name it, oldest first (one read)."""
        ...

    def job_details(self, job_id: str) -> JobDetails | None:
        """The job, its history and its stored input, in one read of everything it holds; None when absent."""
        ...

    def dead_letter(self, message_id: str) -> DeadLetter | None:
        """The dead letter kept for a message, its body read back, or None."""
        ...

    def dead_letters(self, since_ms: int, until_ms: int, limit: int | None = None) -> list[DeadLetterEntry]:
        """The dead letters recorded in [since, until], newest first, at most `limit`."""
        ...


class PaidAnswers(Protocol):
    """Answers already paid for, kept under their request's key (engine.reuse, docs/reuse.md)."""

    def paid_answer(self, key: str) -> PaidAnswer | None:
        """The answer last kept under a request's key, or None: one read, which sees every write that
        ended before it began."""
        ...


class WorkerStore(PaidAnswers, Protocol):
    """The worker's path: the claim, the read of an answer already paid for, the finish, and ending a job
    a refused claim found spent."""

    def claim_job(
        self,
        job_id: str,
        owner: str,
        lease_ms: int,
        now_ms: int,
        new_job: NewJob | None,
        batch: BatchTerms | None = None,
    ) -> Job:
        """Take the job for `owner` until now + lease and count the attempt; with `new_job`, create it when absent.

        With `batch`, the job joins a provider's batch: claimed only when its deadline is at the
        terms' `eligible_at_ms` or later, held until `lease_before_deadline_ms` before its deadline,
        its `batch` the terms' window (a claim without terms clears it).

        Raises JobNotFoundError (absent, and no `new_job`) or ClaimRefusedError (with the job it
        met and why: NOT_BATCHABLE when only the batch's terms refused it).
        """
        ...

    def finish_job(
        self,
        job: Job,
        outcome: Outcome,
        now_ms: int,
        attempt: AttemptRecord | None = None,
        store_input: dict[str, Any] | None = None,
        settlement: Settlement | None = None,
        attachments_read: tuple[AttachmentInfo, ...] = (),
    ) -> None:
        """Write the attempt's outcome, its record and (for a failed job) its input, fenced on `job`'s lease;
        with `settlement` (a batched claim's), its user's budget in the same write; with
        `attachments_read`, what the attempt read of the job's attachments.

        A `Succeeded` outcome with `reused_from` records the job whose answer it took; one with `kept`
        also keeps its answer for later jobs of the same request (docs/reuse.md), replacing any kept
        under that key, in the same write.

        Raises CancelRequestedError when a cancel was requested meanwhile, LeaseLostError (with the
        job as it is) when this lease ended.
        """
        ...

    def end_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool:
        """End a job no worker holds, fenced on the status and claim count it was read with; False if it changed."""
        ...

    def record_orphan_attempt(
        self,
        attempt: AttemptRecord,
        now_ms: int,
        settlement: Settlement | None = None,
        parent: ChildOf | None = None,
    ) -> bool:
        """Keep the usage of an attempt whose result was discarded (its lease was lost, or its batch
        answered a job it no longer held), with `settlement` in the same write; once: False when the
        attempt was recorded already. A pipeline's child (`parent`) that has ended has the usage added
        to its parent's in the same write (its end was counted without it). Raises
        ConditionRefusedError when the job does not exist."""
        ...

    def settle_reservation(self, job_id: str, settlement: Settlement, now_ms: int) -> bool:
        """Give back a batched claim's reservation that no write of its job gave back (the job was
        cancelled, or taken over, while its batch held it); once: False when it was given back already."""
        ...

    def get_input(self, job_id: str) -> dict[str, Any] | None: ...


class DeadLetterStore(Protocol):
    """What gives up on a message: keep it, and record or end the job it names."""

    def record_dead_letter(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, str],
        receive_count: int,
        reason: str,
        now_ms: int,
        job_id: str | None = None,
    ) -> None:
        """Keep a message durably (its body in the payload bucket past 256 KiB), listed by its day of
        recording and, with `job_id` (the job its body names), in that job's history. One write; the
        first recording of a message stands.
        """
        ...

    def create_failed_job(
        self,
        job_id: str,
        error: JobErrorInfo,
        now_ms: int,
        job_type: str | None = None,
        user_id: str | None = None,
        max_attempts: int = 0,
        message_hash: str | None = None,
        lane: Lane = Lane.INTERACTIVE,
    ) -> Job | None:
        """Record a job whose message could not run; None when recorded, else the job already there."""
        ...

    def keep_unrecorded(self, message_id: str, document: bytes) -> str:
        """Keep, in the payload bucket, a dead letter the table could not take (`document`: the message,
        its attributes and why); returns its key. Keeping it again replaces it."""
        ...

    def create_dead_lettered_job(
        self, job_id: str, new_job: NewJob, job_input: dict[str, Any], error: JobErrorInfo, now_ms: int
    ) -> Job | None:
        """Record a full request whose job was never created as `failed`, its input stored; None when recorded."""
        ...

    def get_job(self, job_id: str) -> Job | None: ...

    def end_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool: ...


class ReconcilerStore(Protocol):
    """What the reconciler reads and writes: open jobs, ended or re-enqueued."""

    def open_jobs(self, limit: int) -> OpenJobsWalk:
        """A pass over the non-terminal jobs, as they are now, at most `limit`: oldest deadline first
        within each segment, from where the last saved pass stopped (engine.core.open_jobs)."""
        ...

    def touch_job(self, job: Job, now_ms: int) -> bool:
        """Mark an open job as just re-enqueued, fenced like end_job; False if it changed."""
        ...

    def end_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool: ...


class AdminStore(Protocol):
    """Administration: what the client and the CLI do to jobs."""

    def create_job(self, job_id: str, new_job: NewJob, job_input: dict[str, Any], now_ms: int) -> tuple[Job, bool]:
        """Create a `queued` job with its input stored once; idempotent on the id: (the job, whether created).

        Raises JobConflictError when the id is taken by a different request.
        """
        ...

    def request_cancel(self, job_id: str, now_ms: int) -> Job:
        """A queued job ends `cancelled` at once, a running one at its finishing fence; a finished one stays."""
        ...

    def requeue_failed_job(self, job_id: str, now_ms: int) -> Job:
        """A failed job with a stored input goes back to `queued` with a fresh budget and deadline.

        Raises JobNotFoundError, JobNotFailedError (the job is not failed), or JobStateError (no input).
        """
        ...

    def get_job(self, job_id: str) -> Job | None: ...

    def job_history(self, job_id: str) -> JobHistory: ...

    def job_details(self, job_id: str) -> JobDetails | None: ...

    def dead_letter(self, message_id: str) -> DeadLetter | None: ...

    def dead_letters(self, since_ms: int, until_ms: int, limit: int | None = None) -> list[DeadLetterEntry]: ...


class PipelineStore(WorkerStore, AdminStore, Protocol):
    """What moving pipelines on needs (engine.pipelines, docs/pipelines.md): a worker's claims and
    finishes and a client's creates and cancels (children made and cancelled), the children read, a
    child's end counted on its parent once, the parent moved on once, a review decided once, and a
    retried pipeline's children that did not succeed run again."""

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]: ...

    def count_child(self, child: Job, now_ms: int) -> Counted:
        """Count an ended child on its parent (its part, whether it failed, its usage), once."""
        ...

    def make_ready(self, parent: Job, now_ms: int) -> bool:
        """`waiting -> queued` for a parent whose step ended, once; False when moved already or changed."""
        ...

    def decide_review(
        self,
        job: Job,
        review: Review,
        output: dict[str, Any] | None,
        output_hash: str | None,
        error: JobErrorInfo | None,
        now_ms: int,
    ) -> Job:
        """End a pipeline waiting for its review, fenced on the job as read (PipelineStateError if it changed)."""
        ...

    def rerun_child(self, child: Job, deadline_at: int, now_ms: int) -> bool:
        """A child that did not succeed back to `queued` with a fresh attempt budget (its parent retried),
        fenced on the child as read; False when it changed."""
        ...


class BadMessage(Protocol):
    """A message that cannot run (engine.intake.BadMessageError), as the dead letters read it."""

    @property
    def job_id(self) -> str | None:
        """The job it names, when its id is usable."""
        ...

    @property
    def error(self) -> JobError:
        """Why it cannot run: what its job records."""
        ...

    def known(self, name: str) -> Any:
        """A field of the message worth keeping on its failed job, when valid; else None."""
        ...


class DeadLetters(Protocol):
    """Where the runner keeps what it cannot run (engine.dead_letters.DeadLetterRecorder)."""

    def keep(self, message_id: str, body: str, attributes: dict[str, str], receive_count: int, reason: str) -> int:
        """Keep a message durably as a dead letter, touching no job; the time it was recorded at."""
        ...

    def record(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, str],
        receive_count: int,
        reason: str | None = None,
        code: ErrorCode = ErrorCode.DEAD_LETTERED,
    ) -> DeadLetterFate:
        """Keep a message given up on, and end the job it names with `code`; what became of that job."""
        ...

    def fail_bad_message(self, bad: BadMessage, body: str, now_ms: int, lane: Lane = Lane.INTERACTIVE) -> Job | None:
        """Fail the job a bad message names; the job already there instead, when there is one."""
        ...


class JobTypeCatalog(Protocol):
    """What a worker reads of the data job types (engine.definitions.catalog): every name's head in
    one read, and a version's file (immutable: read once per execution environment)."""

    def heads(self) -> list[JobTypeHead]:
        """Every data job type's head (labels included): one Query of one partition."""
        ...

    def version(self, name: str, version: int) -> StoredVersion | None:
        """One stored version, or None."""
        ...


class JobTypeStore(JobTypeCatalog, Protocol):
    """The data job types' versions, labels and stats (engine.store.job_types; docs/jobtypes.md).

    Every label move is a conditional write on the head's revision; each refusal is a
    JobTypeLabelError whose message names why in one line.
    """

    def head(self, name: str) -> JobTypeHead | None:
        """One name's head (a strongly consistent read), or None."""
        ...

    def versions(self, name: str) -> list[StoredVersion]:
        """Every stored version of a name, oldest first."""
        ...

    def push(
        self, name: str, document: dict[str, Any], sha256: str, now_ms: int, by: str | None = None
    ) -> tuple[int, bool]:
        """Store a checked file as the name's next version (the first is production at once): (its
        version, True); a file whose sha256 a version of the name already has: (that version, False)."""
        ...

    def promote(
        self,
        name: str,
        version: int,
        now_ms: int,
        *,
        canary_percent: int | None = None,
        guard: Guard | None = None,
        by: str | None = None,
    ) -> JobTypeHead:
        """Make `version` production (ending any canary), or, with `canary_percent`, serve it to that
        share of users instead (replacing any canary, its counts started anew)."""
        ...

    def rollback(self, name: str, now_ms: int, *, by: str | None = None, reason: str | None = None) -> JobTypeHead:
        """End the canary when there is one, else move production back to the version before it."""
        ...

    def tally(self, name: str, canary: tuple[int, int], counts: tuple[int, int, int, int]) -> JobTypeHead | None:
        """Add finished jobs to the canary `(version, started_at)` — `counts` is (canary jobs, canary
        validation failures, production jobs, production validation failures) — and return the head
        after; None when that canary is no longer the name's (ended, replaced)."""
        ...

    def end_canary(self, name: str, canary: tuple[int, int], now_ms: int, reason: str) -> bool:
        """End the canary `(version, started_at)` by its guard, recording why: True once; False when it
        ended or changed meanwhile."""
        ...

    def add_stats(self, name: str, delta: VersionStats) -> None:
        """Add finished jobs' figures to a version's stats."""
        ...

    def stats(self, name: str) -> list[VersionStats]:
        """Every version's stats that has any, by version."""
        ...
