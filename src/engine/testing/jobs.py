"""InMemoryJobStore: every store Protocol of engine.core.ports, in memory, one write at a time.

It enforces the same conditions as the DynamoDB store (docs/protocol.md) and answers refusals the
same way, so that the runner's, the reconciler's and the dead-letter recorder's decisions can be
tested in milliseconds; tests/contract runs one suite against both stores so that this one cannot
lie. It keeps no expiry (TTL), no retention (an answer kept for reuse lasts its job type's time) and
no index shards: open jobs are walked in one segment, oldest deadline first, from where the last
saved walk stopped.
Inputs and outputs are kept as their JSON, as DynamoDB keeps them, so that they read back the same.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any, Protocol

from engine.core.attachments import AttachmentInfo
from engine.core.codes import ClaimRefusal
from engine.core.errors import (
    CancelRequestedError,
    ClaimRefusedError,
    ConditionRefusedError,
    JobConflictError,
    JobNotFailedError,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    PipelineStateError,
)
from engine.core.job import (
    DEFAULT_DEADLINE_SECONDS,
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
    PipelineState,
    Review,
    Settlement,
    Usage,
    can_transition,
    claimable,
    explain_claim_refusal,
)
from engine.core.open_jobs import OpenJobKey, OpenJobsWalk
from engine.core.outcomes import Cancelled, Outcome, Released, Succeeded, Waits, outcome_error, target_status
from engine.core.reuse import PaidAnswer
from engine.text import MAX_REASON_CHARS, bounded, one_line, valid_text

# What the DynamoDB store (engine.store, which the fakes do not import) does with sizes:
# a dead-letter body past PAYLOAD_INLINE_BYTES is kept in the payload bucket and referenced by key
# (engine.store.payloads.INLINE_BYTES), and the names an attempt records (provider, tier, model,
# prompt key and version) are cut to MAX_NAME_CHARS (engine.store.items.MAX_NAME_CHARS).
PAYLOAD_INLINE_BYTES = 256 * 1024
MAX_NAME_CHARS = 256


class BudgetBook(Protocol):
    """Users' days of budget, as a settlement writes them (engine.testing.InMemoryBudgetStore)."""

    def settle(self, user_id: str, day: str, returned: Decimal, spent: Decimal) -> None: ...


class InMemoryJobStore:
    def __init__(self, budgets: BudgetBook | None = None) -> None:
        """`budgets`: where settlements of batched claims go (the same table's items, in DynamoDB)."""
        self._budgets = budgets
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        # job id -> (the input's JSON, the request hash it was stored with)
        self._inputs: dict[str, tuple[str, str | None]] = {}
        self._attempts: dict[str, dict[int, AttemptRecord]] = {}
        self._dead_letters: dict[str, DeadLetter] = {}
        self._open_jobs_positions: dict[int, OpenJobKey] = {}
        # request key -> the answer last kept under it (docs/reuse.md)
        self._answers: dict[str, PaidAnswer] = {}
        # key -> document: dead letters the table could not take, as the payload bucket keeps them
        self.unrecorded: dict[str, bytes] = {}

    # --- reads -------------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        with self._lock:
            return {job_id: self._jobs[job_id] for job_id in job_ids if job_id in self._jobs}

    def get_input(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self._inputs.get(job_id)
        if stored is None:
            return None
        job_input: dict[str, Any] = json.loads(stored[0])
        return job_input

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        with self._lock:
            return [record for _, record in sorted(self._attempts.get(job_id, {}).items())]

    def job_history(self, job_id: str) -> JobHistory:
        with self._lock:
            letters = [letter for letter in self._dead_letters.values() if letter.job_id == job_id]
        letters.sort(key=lambda letter: (letter.recorded_at, letter.message_id))
        return JobHistory(self.attempts(job_id), [_entry(letter) for letter in letters])

    def job_details(self, job_id: str) -> JobDetails | None:
        with self._lock:
            job = self._jobs.get(job_id)
            stored = self._inputs.get(job_id)
            history = self.job_history(job_id)
        return None if job is None else JobDetails(job, history, stored[0] if stored else None)

    def dead_letter(self, message_id: str) -> DeadLetter | None:
        with self._lock:
            return self._dead_letters.get(message_id)

    def dead_letters(self, since_ms: int, until_ms: int, limit: int | None = None) -> list[DeadLetterEntry]:
        with self._lock:
            letters = [letter for letter in self._dead_letters.values() if since_ms <= letter.recorded_at <= until_ms]
        letters.sort(key=lambda letter: (letter.recorded_at, letter.message_id), reverse=True)
        return [_entry(letter) for letter in letters[:limit]]

    def open_jobs(self, limit: int) -> OpenJobsWalk:
        return OpenJobsWalk(MemoryOpenJobs(self), limit)

    def paid_answer(self, key: str) -> PaidAnswer | None:
        with self._lock:
            return self._answers.get(key)

    # --- the worker's path -------------------------------------------------------------------

    def claim_job(
        self,
        job_id: str,
        owner: str,
        lease_ms: int,
        now_ms: int,
        new_job: NewJob | None,
        batch: BatchTerms | None = None,
    ) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                if new_job is None:
                    raise JobNotFoundError(job_id)
                job = _created(job_id, new_job, now_ms, JobStatus.QUEUED)
            else:
                request_hash = new_job.request_hash if new_job else None
                same_request = request_hash is None or job.request_hash == request_hash
                if not (same_request and claimable(job, now_ms)):
                    raise ClaimRefusedError(job, explain_claim_refusal(job, now_ms, request_hash))
            deadline_at = job.deadline_at or 0
            if batch is not None and (job.lane is not Lane.BACKGROUND or deadline_at < batch.eligible_at_ms):
                raise ClaimRefusedError(job, ClaimRefusal.NOT_BATCHABLE)
            claimed = replace(
                job,
                status=JobStatus.RUNNING,
                lease_owner=owner,
                lease_expires_at=deadline_at - batch.lease_before_deadline_ms if batch else now_ms + lease_ms,
                batch=batch.window if batch else None,
                updated_at=now_ms,
                started_at=job.started_at if job.started_at is not None else now_ms,
                attempt_count=job.attempt_count + 1,
                claim_count=job.claim_count + 1,
            )
            self._jobs[job_id] = claimed
            return claimed

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
        target = target_status(outcome)
        if not can_transition(job.status, target):
            raise ValueError(f"job {job.job_id}: {job.status} -> {target} is not a transition")
        # Written as JSON before the fenced write, as DynamoDB's store does (a TypeError writes nothing).
        output = _as_json(outcome.output) if isinstance(outcome, Succeeded) else None
        input_text = _json_text(store_input) if store_input is not None else None
        with self._lock:
            current = self._jobs.get(job.job_id)
            held = current is not None and current.lease_owner == job.lease_owner
            cancelled = current is not None and current.cancel_requested
            if (
                current is None
                or not held
                or current.status is not JobStatus.RUNNING
                or (cancelled and not isinstance(outcome, Cancelled))
            ):
                if held and cancelled:
                    raise CancelRequestedError(job.job_id)
                raise LeaseLostError(f"job {job.job_id}: the lease of {job.lease_owner} was lost", current)
            finished = _transition(current, target, outcome_error(outcome), now_ms)
            match outcome:
                case Succeeded(output_hash=output_hash, reused_from=reused_from):
                    finished = replace(finished, output=output, output_hash=output_hash, error=None)
                    if reused_from is not None:
                        finished = replace(finished, reused_from=reused_from)
                case Released(refund_attempt=True):
                    finished = replace(finished, attempt_count=finished.attempt_count - 1)
                case Waits():
                    finished = _waiting(finished, outcome)
            if finished.pipeline is not None and finished.pipeline.rerun:
                finished = replace(finished, pipeline=replace(finished.pipeline, rerun=False))
            if settlement is not None:  # first: a budget that refuses it leaves the job as it was
                finished = self._settle(finished, settlement)
            if attachments_read:
                finished = replace(finished, attachments_read=attachments_read)
            if finished.job_type_version is None:  # recorded when the job lacks one, as DynamoDB's store does
                finished = replace(finished, job_type_version=job.job_type_version)
            if attempt is not None:
                finished = self._record_attempt(finished, attempt)
            self._keep_input(finished, input_text)
            if isinstance(outcome, Succeeded) and (kept := outcome.kept) is not None:
                until = now_ms + kept.seconds * 1000
                self._answers[kept.key] = PaidAnswer(kept.key, job.job_id, kept.answer, now_ms, until)

    def end_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool:
        if not can_transition(job.status, status):
            raise ValueError(f"job {job.job_id}: {job.status} -> {status} is not a transition")
        input_text = _json_text(store_input) if store_input is not None else None
        with self._lock:
            current = self._jobs.get(job.job_id)
            if current is None or (current.status, current.claim_count) != (job.status, job.claim_count):
                return False
            self._keep_input(_transition(current, status, error, now_ms), input_text)
            return True

    def record_orphan_attempt(
        self,
        attempt: AttemptRecord,
        now_ms: int,
        settlement: Settlement | None = None,
        parent: ChildOf | None = None,
    ) -> bool:
        with self._lock:
            current = self._jobs.get(attempt.job_id)
            if current is None or (settlement is not None and _settled_twice(current, settlement)):
                raise ConditionRefusedError("the job's condition failed", current)
            if attempt.attempt in self._attempts.get(attempt.job_id, {}):
                return False
            settled = self._settle(current, settlement) if settlement else current
            self._record_attempt(settled, attempt)
            counted = self._jobs.get(parent.parent_id) if parent is not None else None
            if counted is not None and current.status.is_terminal:
                self._jobs[counted.job_id] = replace(
                    counted, usage=counted.usage.add(Usage().plus(attempt)), updated_at=now_ms
                )
            return True

    def settle_reservation(self, job_id: str, settlement: Settlement, now_ms: int) -> bool:
        if not settlement.returned_usd:
            raise ValueError("a settlement of a reservation gives something back")
        with self._lock:
            current = self._jobs.get(job_id)
            if current is None or _settled_twice(current, settlement):
                return False
            self._jobs[job_id] = self._settle(current, settlement)
            return True

    # --- dead letters ------------------------------------------------------------------------

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
        text = valid_text(body)
        data = text.encode()
        # Past PAYLOAD_INLINE_BYTES DynamoDB's store references the body by a payload key; it still reads back whole.
        body_key = f"dead-letters/{message_id}" if len(data) > PAYLOAD_INLINE_BYTES else None
        with self._lock:
            if message_id in self._dead_letters:
                return  # the first recording stands
            self._dead_letters[message_id] = DeadLetter(
                message_id=message_id,
                body=text,
                body_key=body_key,
                body_bytes=len(data),
                body_sha256=hashlib.sha256(data).hexdigest(),
                attributes={
                    bounded(name, MAX_REASON_CHARS): bounded(str(value), MAX_REASON_CHARS)
                    for name, value in attributes.items()
                },
                receive_count=receive_count,
                reason=one_line(reason),
                recorded_at=now_ms,
                job_id=job_id,
            )

    def keep_unrecorded(self, message_id: str, document: bytes) -> str:
        key = f"dead-letters/unrecorded/{message_id}.json"
        with self._lock:
            self.unrecorded[key] = document
        return key

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
        with self._lock:
            existing = self._jobs.get(job_id)
            if existing is not None:
                return existing
            self._jobs[job_id] = Job(
                job_id=job_id,
                job_type=job_type,
                user_id=user_id,
                status=JobStatus.FAILED,
                created_at=now_ms,
                updated_at=now_ms,
                max_attempts=max_attempts,
                request_hash=message_hash,
                finished_at=now_ms,
                lane=lane,
                error=_kept(error),
            )
            return None

    def create_dead_lettered_job(
        self, job_id: str, new_job: NewJob, job_input: dict[str, Any], error: JobErrorInfo, now_ms: int
    ) -> Job | None:
        input_text = _json_text(job_input)
        with self._lock:
            existing = self._jobs.get(job_id)
            if existing is not None:
                return existing
            if job_id in self._inputs:
                # An input without its job (a submission that stopped half-way) is another request's.
                return self.create_failed_job(
                    job_id,
                    error,
                    now_ms,
                    job_type=new_job.job_type,
                    user_id=new_job.user_id,
                    max_attempts=new_job.max_attempts,
                    message_hash=new_job.request_hash,
                )
            created = _created(job_id, new_job, now_ms, JobStatus.FAILED)
            self._jobs[job_id] = replace(created, finished_at=now_ms, error=_kept(error), input_stored=True)
            self._inputs[job_id] = (input_text, new_job.request_hash)
            return None

    # --- administration ----------------------------------------------------------------------

    def create_job(self, job_id: str, new_job: NewJob, job_input: dict[str, Any], now_ms: int) -> tuple[Job, bool]:
        input_text = _json_text(job_input)
        with self._lock:
            stored = self._inputs.get(job_id)
            if stored is not None and stored[1] != new_job.request_hash:
                raise JobConflictError(job_id)
            self._inputs[job_id] = (input_text, new_job.request_hash)
            existing = self._jobs.get(job_id)
            if existing is None:
                created = replace(_created(job_id, new_job, now_ms, JobStatus.QUEUED), input_stored=True)
                self._jobs[job_id] = created
                return created, True
            if existing.request_hash != new_job.request_hash:
                raise JobConflictError(job_id)
            return existing, False

    def request_cancel(self, job_id: str, now_ms: int) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            if job.status in (JobStatus.QUEUED, JobStatus.WAITING) or (
                job.status is JobStatus.RUNNING and job.batch is not None
            ):
                cancelled = _transition(job, JobStatus.CANCELLED, None, now_ms)
                job = replace(cancelled, cancel_requested=True)
            elif job.status is JobStatus.RUNNING:
                job = replace(job, cancel_requested=True, updated_at=now_ms)
            self._jobs[job_id] = job
            return job

    def requeue_failed_job(self, job_id: str, now_ms: int) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            if job.status is not JobStatus.FAILED:
                raise JobNotFailedError(f"job {job_id} is {job.status.value}; only a failed job can be retried")
            if not job.input_stored:
                raise JobStateError(f"job {job_id} has no stored input to run again")
            requeued = replace(
                job,
                status=JobStatus.QUEUED,
                updated_at=now_ms,
                attempt_count=0,
                cancel_requested=False,
                deadline_at=now_ms + (job.deadline_seconds or DEFAULT_DEADLINE_SECONDS) * 1000,
                error=None,
                finished_at=None,
                pipeline=replace(job.pipeline, rerun=True) if job.pipeline is not None else None,
            )
            self._jobs[job_id] = requeued
            return requeued

    def touch_job(self, job: Job, now_ms: int) -> bool:
        with self._lock:
            current = self._jobs.get(job.job_id)
            if current is None or (current.status, current.claim_count) != (job.status, job.claim_count):
                return False
            self._jobs[job.job_id] = replace(current, updated_at=now_ms)
            return True

    # --- pipelines (engine.store.pipeline_writes) ----------------------------------------------

    def count_child(self, child: Job, now_ms: int) -> Counted:
        assert child.parent is not None
        assert child.status.is_terminal
        of = child.parent
        with self._lock:
            parent = self._jobs.get(of.parent_id)
            state = parent.pipeline if parent is not None else None
            # Whatever the parent's status: a child that ends after its step failed (or its parent was
            # cancelled) still adds its usage, so that the parent's usage stays its children's sum.
            if parent is None or state is None or state.step != of.step_index or of.part in state.ended:
                return Counted(parent, False)
            failed = state.failed | ({of.part} if child.status is not JobStatus.SUCCEEDED else set())
            counted = replace(
                parent,
                pipeline=replace(state, ended=state.ended | {of.part}, failed=frozenset(failed)),
                usage=parent.usage.add(child.usage),
                updated_at=now_ms,
            )
            self._jobs[parent.job_id] = counted
            return Counted(counted, True)

    def make_ready(self, parent: Job, now_ms: int) -> bool:
        assert parent.pipeline is not None
        with self._lock:
            current = self._jobs.get(parent.job_id)
            if (
                current is None
                or current.status is not JobStatus.WAITING
                or current.pipeline is None
                or current.pipeline.step != parent.pipeline.step
            ):
                return False
            self._jobs[parent.job_id] = _transition(current, JobStatus.QUEUED, None, now_ms)
            return True

    def decide_review(
        self,
        job: Job,
        review: Review,
        output: dict[str, Any] | None,
        output_hash: str | None,
        error: JobErrorInfo | None,
        now_ms: int,
    ) -> Job:
        status = JobStatus.SUCCEEDED if error is None else JobStatus.FAILED
        kept = _as_json(output) if output is not None and output_hash is not None else None
        with self._lock:
            current = self._jobs.get(job.job_id)
            if (
                current is None
                or (current.status, current.claim_count) != (job.status, job.claim_count)
                or current.pipeline is None
                or current.pipeline.review is None
            ):
                now = current.status.value if current else "gone"
                raise PipelineStateError(f"job {job.job_id} changed while its review was decided (now {now})")
            decided = _transition(current, status, error, now_ms)
            decided = replace(decided, pipeline=replace(current.pipeline, review=review))
            if kept is not None:
                decided = replace(decided, output=kept, output_hash=output_hash)
            self._jobs[job.job_id] = decided
            return decided

    def rerun_child(self, child: Job, deadline_at: int, now_ms: int) -> bool:
        assert child.status in (JobStatus.FAILED, JobStatus.CANCELLED)
        with self._lock:
            current = self._jobs.get(child.job_id)
            if (
                current is None
                or (current.status, current.claim_count) != (child.status, child.claim_count)
                or not current.input_stored
            ):
                return False
            self._jobs[child.job_id] = replace(
                current,
                status=JobStatus.QUEUED,
                updated_at=now_ms,
                attempt_count=0,
                cancel_requested=False,
                deadline_at=deadline_at,
                error=None,
                finished_at=None,
            )
            return True

    # --- parts -------------------------------------------------------------------------------

    def _record_attempt(self, job: Job, attempt: AttemptRecord) -> Job:
        """The job with the attempt's usage added, and the attempt kept (replacing one of its number)."""
        self._attempts.setdefault(attempt.job_id, {})[attempt.attempt] = replace(
            attempt,
            provider=_name(attempt.provider),
            tier=_name(attempt.tier),
            model=_name(attempt.model),
            prompt_key=_name(attempt.prompt_key),
            prompt_version=_name(attempt.prompt_version),
        )
        added = replace(job, usage=job.usage.plus(attempt))
        self._jobs[job.job_id] = added
        return added

    def _settle(self, job: Job, settlement: Settlement) -> Job:
        """The budget moved, and the job with its claim marked settled when the reservation is given back
        (the job is not written: the caller writes it)."""
        if self._budgets is None:
            raise ValueError("this store was made without budgets to settle")
        returned, spent = settlement.returned_usd, settlement.spent_usd
        self._budgets.settle(settlement.user_id, settlement.day, returned - spent, spent)
        if not returned:
            return job
        return replace(job, batch_settled=job.batch_settled | {settlement.claim})

    def _keep_input(self, job: Job, input_text: str | None) -> None:
        """Write the job, with the input (its JSON) stored alongside when there is one."""
        if input_text is not None:
            job = replace(job, input_stored=True)
            self._inputs[job.job_id] = (input_text, job.request_hash)
        self._jobs[job.job_id] = job


class MemoryOpenJobs:
    """A store's open jobs as one segment, oldest deadline first, and where the last walk stopped."""

    segments = 1

    def __init__(self, store: InMemoryJobStore) -> None:
        self._store = store

    def keys(self, segment: int, after: OpenJobKey | None, count: int) -> tuple[list[OpenJobKey], bool]:
        with self._store._lock:
            jobs = [job for job in self._store._jobs.values() if not job.status.is_terminal]
        ordered = sorted(OpenJobKey(job.deadline_at or 0, job.job_id) for job in jobs)
        later = [key for key in ordered if after is None or key > after]
        return later[:count], len(later) <= count

    def jobs(self, keys: Sequence[OpenJobKey]) -> Iterator[Job | None]:
        for key in keys:
            yield self._store.get_job(key.job_id)

    def positions(self) -> dict[int, OpenJobKey]:
        with self._store._lock:
            return dict(self._store._open_jobs_positions)

    def keep_positions(self, positions: Mapping[int, OpenJobKey]) -> None:
        with self._store._lock:
            self._store._open_jobs_positions = dict(positions)


def _created(job_id: str, new_job: NewJob, now_ms: int, status: JobStatus) -> Job:
    """A job as a message's claim or a submission creates it."""
    return Job(
        job_id=job_id,
        job_type=new_job.job_type,
        user_id=new_job.user_id,
        status=status,
        created_at=now_ms,
        updated_at=now_ms,
        max_attempts=new_job.max_attempts,
        schema_version=new_job.schema_version,
        deadline_seconds=new_job.deadline_seconds,
        deadline_at=now_ms + new_job.deadline_seconds * 1000,
        request_hash=new_job.request_hash,
        lane=new_job.lane,
        attachments=new_job.attachments,
        job_type_version=new_job.job_type_version,
        parent=new_job.parent,
    )


def _entry(letter: DeadLetter) -> DeadLetterEntry:
    """A dead letter as listings and job histories show it."""
    return DeadLetterEntry(letter.message_id, letter.recorded_at, letter.receive_count, letter.reason, letter.job_id)


def _json_text(value: dict[str, Any]) -> str:
    """A JSON object as the DynamoDB store writes it (a TypeError for what JSON cannot hold, as there)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON object as it reads back from the DynamoDB store: tuples become lists, keys strings."""
    read: dict[str, Any] = json.loads(_json_text(value))
    return read


def _name(value: str | None) -> str | None:
    return None if value is None else bounded(value, MAX_NAME_CHARS)


def _kept(error: JobErrorInfo) -> JobErrorInfo:
    return replace(error, message=one_line(error.message))


def _settled_twice(job: Job, settlement: Settlement) -> bool:
    """Whether a settlement would give back a reservation that was given back already."""
    return bool(settlement.returned_usd) and settlement.claim in job.batch_settled


def _transition(job: Job, status: JobStatus, error: JobErrorInfo | None, now_ms: int) -> Job:
    """What every state change writes: status and time, the error if any, the lease (and batch) let go."""
    changed = replace(job, status=status, updated_at=now_ms, lease_owner=None, lease_expires_at=None, batch=None)
    if error is not None:
        changed = replace(changed, error=_kept(error))
    if status.is_terminal:
        changed = replace(changed, finished_at=now_ms)
    return changed


def _waiting(job: Job, waits: Waits) -> Job:
    """A pipeline whose step started: where it is, the claim refunded, its children's usage adjusted."""
    state = PipelineState(waits.step, waits.children, waits.ended, frozenset(), waits.counts, waits.review)
    return replace(job, pipeline=state, attempt_count=job.attempt_count - 1, usage=job.usage.add(waits.usage))
