"""JobRunner: claim -> admit -> call -> decide -> finish, for one delivery of a message.

The spine, one named step each:
- claim: parse the message and claim its job (one conditional write), or say at once what becomes
  of the delivery (a duplicate, a bad message, a refused claim, or an answer already paid for: a job
  of a job type with `reuse_seconds` whose request was answered within them is finished with that
  answer, no call made; engine.reuse);
- admit: a hold of the shared limits or budgets (engine.fleet), or too little of the invocation left
  for the call, decides without a call;
- call: now (`run`, at the service tier engine.decisions.decide_tier picks: a background job's at the
  flex tier when flex is on), or from a provider's batch's answer (`answer`): siblings behind the gateway;
- decide: engine.decisions, a pure function of the job, the call's execution and the moment;
- finish: the one place a decision is written (fenced on the lease: a cancel requested meanwhile
  ends the job cancelled, a lost lease discards the result and keeps its usage).
The runner says what to do with the message (engine.core.deliveries); it never touches SQS, and it
knows no store in particular. docs/architecture.md walks through it.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel

from engine.attachments.loader import AttachmentLoader
from engine.core import (
    Ack,
    AttemptRecord,
    BatchTerms,
    Cancelled,
    ChildOf,
    ClaimRefusal,
    Delivery,
    Disposition,
    ErrorCode,
    Failed,
    Fate,
    Job,
    JobStatus,
    Lane,
    Outcome,
    Retry,
    Settlement,
    outcome_error,
    target_status,
)
from engine.core.attachments import Attachment, AttachmentInfo, AttachmentRef
from engine.core.errors import (
    AttachmentInvalidError,
    CancelRequestedError,
    ClaimRefusedError,
    InputValidationError,
    InternalError,
    JobError,
    JobNotFoundError,
    LeaseLostError,
    MaxAttemptsExceededError,
    PermanentError,
    SchemaVersionMismatchError,
    deadline_error,
)
from engine.core.ports import DeadLetters, WorkerStore
from engine.decisions import (
    RETRY_SOON_SECONDS,
    Decision,
    Moment,
    attempt_record,
    decide,
    decide_deferral,
    decide_hand_back,
    decide_hold,
    decide_retry,
    decide_reused,
    decide_tier,
    flex_seconds_left,
)
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.pipelines import PipelineDefinition
from engine.fleet.admission import Hold, Pass, Verdict
from engine.gateway import Answered, Execution, ModelGateway
from engine.intake import BadMessageError, JobRequest, parse_message, sha256_hex
from engine.observability import genai_usage, log_unexpected, logger
from engine.pipelines import Pipelines
from engine.retry import DEFAULT_MAX_RECEIVES, MAX_DELAY_SECONDS, backoff_seconds
from engine.reuse import AnswerReuse
from engine.telemetry import count_ended, count_latency, count_outcome, count_retry

# Time kept back from the provider call for the finishing write.
FINISH_MARGIN_MS = 5_000
# A message that meets an unexpected error that is not transient (a bug, a request AWS refuses)
# on its third receive or later is given up on: kept as a dead letter, its job failed with
# internal_error. Transient errors (throttling, outages) are retried until the redrive.
GIVE_UP_RECEIVES = 3


RemainingMs = Callable[[], int]
# Whether an unexpected exception may pass by itself (engine.aws_errors.is_transient in Lambda).
TransientCheck = Callable[[Exception], bool]


def _never_transient(_: Exception) -> bool:
    return False


def _time_left(remaining_ms: RemainingMs | None) -> Callable[[], float] | None:
    """Seconds the gateway may still spend on model calls: the invocation's time less the finish."""
    if remaining_ms is None:
        return None
    return lambda: (remaining_ms() - FINISH_MARGIN_MS) / 1000


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job this worker holds, with what it runs: a delivery's claim, before the provider call."""

    job: Job
    request: JobRequest
    definition: JobDefinition
    job_input: BaseModel
    delivery: Delivery
    # The input as it was given (the message's, or the one stored), before it was parsed.
    raw_input: dict[str, Any] | None = None
    # Its documents and images, read and checked (engine.attachments).
    attachments: tuple[Attachment, ...] = ()

    @property
    def attachments_read(self) -> tuple[AttachmentInfo, ...]:
        return tuple(attachment.info for attachment in self.attachments)


_Result = TypeVar("_Result", bound="Claimed | Disposition")


class JobRunner:
    def __init__(
        self,
        store: WorkerStore,
        gateway: ModelGateway,
        registry: JobRegistry,
        dead_letters: DeadLetters,
        *,
        default_lease_ms: int = 300_000,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        is_transient: TransientCheck = _never_transient,
        sleep: Callable[[float], None] = time.sleep,
        max_receives: int = DEFAULT_MAX_RECEIVES,
        attachments: AttachmentLoader | None = None,
        pipelines: Pipelines | None = None,
        flex: bool = False,
    ) -> None:
        self._store = store
        self._gateway = gateway
        self._registry = registry
        self._dead_letters = dead_letters
        self._default_lease_ms = default_lease_ms
        self._clock = clock
        self._rng = rng or random.Random()
        self._is_transient = is_transient
        self._sleep = sleep
        self._max_receives = max_receives
        self._attachments = attachments
        self._pipelines = pipelines
        self._reuse = AnswerReuse(store, gateway.first_call)
        # Background jobs at the provider's flex tier (AIJOBS_FLEX, docs/cost.md).
        self._flex = flex

    # --- the spine ----------------------------------------------------------------------------

    def process(self, delivery: Delivery, remaining_ms: RemainingMs | None = None) -> Disposition:
        """Claim and run one delivery's job, with no shared limit or budget to ask."""
        claimed = self.claim(delivery, remaining_ms)
        return self.run(claimed, remaining_ms) if isinstance(claimed, Claimed) else claimed

    def claim(
        self, delivery: Delivery, remaining_ms: RemainingMs | None = None, batch: BatchTerms | None = None
    ) -> Claimed | Disposition:
        """Parse the message and claim its job: what to run, or already what becomes of the delivery.

        With `batch`, a background job whose deadline is far enough is claimed into a provider's
        batch (its `job.batch` set: docs/batches.md); any other job is claimed to run now.
        """
        return self._guarded(delivery, lambda: self._claim(delivery, remaining_ms, batch))

    def run(
        self, claimed: Claimed, remaining_ms: RemainingMs | None = None, verdict: Verdict | None = None
    ) -> Disposition:
        """Admit, call now, decide and finish a claimed job (at its Pass's call time, or held back by its
        Hold: engine.fleet.admission)."""
        return self._guarded(claimed.delivery, lambda: self._run(claimed, remaining_ms, verdict))

    def answer(self, claimed: Claimed, answered: Answered) -> Decision:
        """What a provider's batch's answer to a claimed job decides: the answer goes the way a real-time
        call's does (validation, re-asks and fallback in real time). Nothing is written: the caller
        gives the job its message first when the decision queues it again, then `finish`es it."""
        started = self._now_ms()
        execution: Execution | None = None
        try:
            execution = self._gateway.execute_answer(
                claimed.definition, claimed.job_input, answered, attachments=claimed.attachments
            )
            return self._decide(claimed, execution, started)
        except Exception as exc:
            log_unexpected("a batch's answer could not be decided", exc, job_id=claimed.job.job_id)
            attempt = attempt_record(claimed.job, execution, started, self._now_ms()) if execution else None
            internal = InternalError(f"internal error: {type(exc).__name__}")
            return decide_retry(claimed.job, internal, attempt, self._moment(claimed.delivery.receive_count))

    def finish(
        self,
        job: Job,
        request: JobRequest,
        decision: Decision,
        settlement: Settlement | None = None,
        read: tuple[AttachmentInfo, ...] = (),
    ) -> Disposition:
        """Write a decision: what then becomes of the delivery. A cancel requested meanwhile ends the job
        `cancelled`; a lost lease discards the result and keeps its usage (with `settlement`, a batched
        claim's budget settles with the write that ends the claim; with `read`, what the attempt read of
        its attachments is kept). Store errors propagate."""
        written = self._write(job, request, decision.outcome, decision.attempt, settlement, read)
        return decision.then if written is None else written

    def hand_back(self, job: Job, why: JobError, settlement: Settlement | None = None) -> Disposition:
        """Queue again, its attempt refunded, a job its batch holds but did not answer: it runs in real
        time with its next message (sent by the caller before this). A Retry when it was queued again;
        else what became of it instead. Store errors propagate."""
        return self.finish(job, JobRequest(job.job_id), decide_hand_back(why), settlement)

    def price_unused(self, claimed: Claimed, answered: Answered) -> AttemptRecord:
        """The attempt a batch's answer to a job it no longer holds (finished meanwhile, cancelled,
        handed back to real time) makes of the claim it answered: validated and priced, not used."""
        started = self._now_ms()
        count = len(claimed.attachments) or len(claimed.job.attachments)
        execution = self._gateway.price_answer(claimed.definition, claimed.job_input, answered, count)
        return attempt_record(claimed.job, execution, started, self._now_ms())

    def record_unused(
        self, attempt: AttemptRecord, settlement: Settlement | None = None, parent: ChildOf | None = None
    ) -> bool:
        """Keep an unused answer's attempt as usage (and a pipeline's child's on its parent too, when it
        has ended), once: False when it was recorded already."""
        return self._store.record_orphan_attempt(attempt, self._now_ms(), settlement, parent)

    def give_back(self, job_id: str, settlement: Settlement) -> bool:
        """Give back a batched claim's reservation that no write of its job gave back, once."""
        return self._store.settle_reservation(job_id, settlement, self._now_ms())

    # --- claim ---------------------------------------------------------------------------------

    def _claim(
        self, delivery: Delivery, remaining_ms: RemainingMs | None, batch: BatchTerms | None
    ) -> Claimed | Disposition:
        try:
            request = parse_message(delivery.body, delivery.message_id, self._registry, delivery.lane)
        except BadMessageError as bad:
            return self._reject(delivery, bad)
        owner = uuid.uuid4().hex
        lease_ms = remaining_ms() if remaining_ms else self._default_lease_ms
        terms = self._batch_terms(request, delivery, batch)
        try:
            try:
                job = self._store.claim_job(request.job_id, owner, lease_ms, self._now_ms(), request.new_job, terms)
            except ClaimRefusedError as refused:
                if terms is None or refused.reason is not ClaimRefusal.NOT_BATCHABLE:
                    raise
                # Its deadline is too near for a batch: it runs now.
                job = self._store.claim_job(request.job_id, owner, lease_ms, self._now_ms(), request.new_job)
        except JobNotFoundError:
            reason = f"job {request.job_id} does not exist and the message carries no job_type, user_id and input"
            return self._dead_letter(delivery, reason)
        except ClaimRefusedError as refused:
            return self._on_refusal(delivery, request, refused)
        try:
            definition, job_input, raw_input = self._resolve(job, request)
            if job.job_type_version is None and definition.job_type_version is not None:
                # The version its labels served now: the finishing write records it on the job.
                job = replace(job, job_type_version=definition.job_type_version)
            attachments = self._load_attachments(job, definition)
        except PermanentError as exc:
            return self.finish(job, request, Decision(Failed(exc.info()), Ack(Fate.FAILED)))
        except Exception as exc:
            log_unexpected("the claimed job could not be resolved", exc, job_id=job.job_id)
            internal = InternalError(f"internal error: {type(exc).__name__}")
            return self.finish(job, request, decide_retry(job, internal, None, self._moment(delivery.receive_count)))
        claimed = Claimed(job, request, definition, job_input, delivery, raw_input, attachments)
        reused = self._reused(claimed)
        return claimed if reused is None else reused

    def _reused(self, claimed: Claimed) -> Disposition | None:
        """Finish a job with the answer its request was given within its job type's reuse_seconds, no call
        made; None when there is none to take (engine.reuse: never an error)."""
        started = self._now_ms()
        reused = self._reuse.find(claimed.definition, claimed.job_input, claimed.attachments_read, started)
        if reused is None:
            return None
        decision = decide_reused(claimed.job, reused, started, self._now_ms())
        return self.finish(claimed.job, claimed.request, decision, read=claimed.attachments_read)

    def load_attachments(self, refs: Sequence[AttachmentRef], definition: JobDefinition) -> tuple[Attachment, ...]:
        """Attachments read and checked (AttachmentInvalidError when one cannot go), for a claim that is
        not this runner's own (a batch's line to make, its answer to conclude)."""
        if not refs:
            return ()
        if self._attachments is None:
            raise AttachmentInvalidError("this stack reads no attachments")
        return self._attachments.load(refs, definition.attachments, definition.name)

    def _load_attachments(self, job: Job, definition: JobDefinition) -> tuple[Attachment, ...]:
        if isinstance(definition, PipelineDefinition):
            return ()  # a pipeline calls no model: its map cuts a PDF into its children's (engine.pipelines)
        return self.load_attachments(job.attachments, definition)

    def _batch_terms(self, request: JobRequest, delivery: Delivery, batch: BatchTerms | None) -> BatchTerms | None:
        """The batch's terms, for a job that may join it: none for a message a batch handed back, nor for a
        new job of the interactive lane or whose deadline is too near (an existing job's, the claim checks)."""
        if batch is None or delivery.realtime or isinstance(request.definition, PipelineDefinition):
            return None
        new_job = request.new_job
        if new_job is not None and (
            new_job.lane is not Lane.BACKGROUND
            or self._now_ms() + new_job.deadline_seconds * 1000 < batch.eligible_at_ms
        ):
            return None
        return batch

    def _reject(self, delivery: Delivery, bad: BadMessageError) -> Disposition:
        if bad.job_id is None:
            return self._dead_letter(delivery, bad.error.message)
        existing = self._dead_letters.fail_bad_message(bad, delivery.body, self._now_ms(), delivery.lane)
        if existing is not None:
            if existing.request_hash == sha256_hex(delivery.body):
                return Ack(Fate.DUPLICATE)
            # The job exists from another message; this one must not overwrite it.
            return self._dead_letter(delivery, f"job {bad.job_id} exists; this message is invalid: {bad.error.message}")
        logger.warning("bad message failed its job", extra={"job_id": bad.job_id, "code": bad.error.code.value})
        return Ack(Fate.FAILED)

    def _dead_letter(self, delivery: Delivery, reason: str) -> Ack:
        self._dead_letters.keep(
            delivery.message_id, delivery.body, dict(delivery.attributes), delivery.receive_count, reason
        )
        # The reason may quote the message (a field's name); it is stored, never logged.
        logger.warning("message kept as a dead letter", extra={"message_id": delivery.message_id})
        return Ack(Fate.DEAD_LETTERED)

    def _on_refusal(self, delivery: Delivery, request: JobRequest, refused: ClaimRefusedError) -> Disposition:
        job = refused.refused_job
        match refused.reason:
            case ClaimRefusal.FINISHED:
                return Ack(Fate.DUPLICATE)
            case ClaimRefusal.WAITING:
                return self._pipelines.on_waiting(job) if self._pipelines is not None else Ack(Fate.DUPLICATE)
            case ClaimRefusal.HELD:
                count_retry(job.job_type, "held")
                return Retry(Fate.HELD, self._until_lease_ends(job, 1), f"job {job.job_id} is held by another worker")
            case ClaimRefusal.RACED | ClaimRefusal.NOT_BATCHABLE:  # (a claim without terms is never the latter)
                return Retry(Fate.RACED, RETRY_SOON_SECONDS, f"job {job.job_id} changed while it was being claimed")
            case ClaimRefusal.CONFLICT:
                reason = f"job {job.job_id} exists with a different job type, user or input"
                return self._dead_letter(delivery, reason)
            case ClaimRefusal.CANCEL_REQUESTED:
                return self._end(job, request, JobStatus.CANCELLED, None)
            case ClaimRefusal.DEADLINE_PASSED:
                return self._end(job, request, JobStatus.FAILED, deadline_error(job, "the job's deadline passed"))
            case ClaimRefusal.ATTEMPTS_SPENT:
                spent = MaxAttemptsExceededError(f"attempt budget spent ({job.attempt_count} of {job.max_attempts})")
                return self._end(job, request, JobStatus.FAILED, spent)

    def _end(self, job: Job, request: JobRequest, status: JobStatus, error: PermanentError | None) -> Disposition:
        """End a job a refused claim found spent, past its deadline or cancel-requested."""
        store_input = request.raw_input if status is JobStatus.FAILED and not job.input_stored else None
        if self._store.end_job(job, status, error.info() if error else None, self._now_ms(), store_input):
            count_ended(job.job_type, status)
            return Ack(Fate.CANCELLED if status is JobStatus.CANCELLED else Fate.FAILED)
        return Retry(Fate.RACED, RETRY_SOON_SECONDS, f"job {job.job_id} changed while it was being ended")

    def _resolve(self, job: Job, request: JobRequest) -> tuple[JobDefinition, BaseModel, dict[str, Any] | None]:
        """What the claimed job runs: the message's definition and input when the message carries them
        (unless the job already records another version of its data job type: a retry runs the version
        its first claim ran), else the job's own definition and stored input."""
        recorded = job.job_type_version
        if request.definition is not None and request.job_input is not None:
            if recorded is None or request.definition.job_type_version == recorded:
                return request.definition, request.job_input, request.raw_input
            definition = self._registry.definition(job.job_type or "", recorded)
            assert request.raw_input is not None  # (a message that carries a parsed input carries it raw)
            return definition, definition.parse_input(request.raw_input), request.raw_input
        name = job.job_type or ""
        if recorded is not None:
            definition = self._registry.definition(name, recorded)
        else:
            # A job created without a version (a code job type, or a submission of a data one): its labels'.
            definition = self._registry.resolve(name, job.user_id or "")
        if job.schema_version != definition.schema_version:
            expected = definition.schema_version
            raise SchemaVersionMismatchError(
                f"job schema_version {job.schema_version} != {definition.name} schema version {expected}"
            )
        # Only a job that records its input as stored has one of its own: an input item left by
        # another request under the same id (a submission refused as a conflict) is not its input.
        stored = self._store.get_input(job.job_id) if job.input_stored else None
        if stored is None:
            raise InputValidationError(f"job {job.job_id} has no stored input")
        return definition, definition.parse_input(stored), stored

    # --- admit, call, decide --------------------------------------------------------------------

    def _run(self, claimed: Claimed, remaining_ms: RemainingMs | None, verdict: Verdict | None) -> Disposition:
        job, request = claimed.job, claimed.request
        if isinstance(claimed.definition, PipelineDefinition):
            return self._pipeline(claimed)
        receive_count = claimed.delivery.receive_count
        started = self._now_ms()
        execution: Execution | None = None
        try:
            held = self._admit(claimed, remaining_ms, verdict)
            if held is not None:
                return self.finish(job, request, held)
            started = self._now_ms()
            time_left = _time_left(remaining_ms)
            tier = decide_tier(job, claimed.definition, self._flex, started)
            execution = self._gateway.execute(
                claimed.definition, claimed.job_input, time_left, claimed.attachments, tier, self._flex_left(claimed)
            )
            if isinstance(verdict, Pass):
                verdict.record(execution)
            decision = self._decide(claimed, execution, started)
            return self.finish(job, request, decision, read=claimed.attachments_read)
        except Exception as exc:
            # The job is still this worker's: hand it back (its usage kept) rather than wait for the lease.
            log_unexpected("job attempt failed unexpectedly", exc, job_id=job.job_id)
            attempt = attempt_record(job, execution, started, self._now_ms()) if execution else None
            internal = InternalError(f"internal error: {type(exc).__name__}")
            retry = decide_retry(job, internal, attempt, self._moment(receive_count))
            return self.finish(job, request, retry, read=claimed.attachments_read)

    def _flex_left(self, claimed: Claimed) -> Callable[[], float] | None:
        """How long a flex call of the job may still take, by its deadline (None: it has none)."""
        deadline_at, definition = claimed.job.deadline_at, claimed.definition
        if deadline_at is None:
            return None
        return lambda: flex_seconds_left(deadline_at, definition, self._now_ms())

    def _pipeline(self, claimed: Claimed) -> Disposition:
        """A pipeline calls no model: its next step starts (engine.pipelines)."""
        assert isinstance(claimed.definition, PipelineDefinition)
        if self._pipelines is None:
            unserved = InternalError("this worker runs no pipelines")
            return self.finish(claimed.job, claimed.request, Decision(Failed(unserved.info()), Ack(Fate.FAILED)))
        raw = claimed.raw_input if claimed.raw_input is not None else claimed.job_input.model_dump(mode="json")
        return self._pipelines.advance(claimed.job, claimed.definition, claimed.job_input, raw)

    def _admit(self, claimed: Claimed, remaining_ms: RemainingMs | None, verdict: Verdict | None) -> Decision | None:
        """A decision without a call (held, or too little time left), or None once the job may call: it
        has waited for its Pass's call time, and that pass still stands."""
        moment = self._moment(claimed.delivery.receive_count)
        if isinstance(verdict, Hold):
            return self._held(claimed.job, verdict, moment)
        wait_ms = max(verdict.call_at_ms - moment.now_ms, 0) if verdict else 0
        timeout_ms = int(claimed.definition.timeout_seconds * 1000)
        if remaining_ms and remaining_ms() < wait_ms + timeout_ms + FINISH_MARGIN_MS:
            return decide_deferral()
        if wait_ms:
            self._sleep(wait_ms / 1000)  # until the call time the shared limit gave
        revoked = verdict.revoked() if isinstance(verdict, Pass) else None
        if revoked is not None:
            return self._held(claimed.job, revoked, self._moment(claimed.delivery.receive_count))
        return None

    def _held(self, job: Job, hold: Hold, moment: Moment) -> Decision:
        decision = decide_hold(job, hold, moment)
        if isinstance(decision.then, Retry):
            count_retry(job.job_type, decision.then.fate.value)
        return decision

    def _decide(self, claimed: Claimed, execution: Execution, started_ms: int) -> Decision:
        attempt = attempt_record(claimed.job, execution, started_ms, self._now_ms())
        kept = self._reuse.kept(claimed.definition, claimed.job_input, claimed.attachments_read, execution)
        moment = self._moment(claimed.delivery.receive_count)
        return decide(claimed.job, claimed.definition, execution, attempt, moment, kept)

    # --- finish -------------------------------------------------------------------------------

    def _write(
        self,
        job: Job,
        request: JobRequest,
        outcome: Outcome,
        attempt: AttemptRecord | None,
        settlement: Settlement | None,
        read: tuple[AttachmentInfo, ...] = (),
    ) -> Disposition | None:
        """Write `outcome`: None when it was written as asked, else what became of the delivery instead."""
        store_input = request.raw_input if isinstance(outcome, Failed) and not job.input_stored else None
        try:
            self._store.finish_job(job, outcome, self._now_ms(), attempt, store_input, settlement, read)
        except CancelRequestedError:
            return self._write(job, request, Cancelled(), attempt, settlement, read) or Ack(Fate.CANCELLED)
        except LeaseLostError as lost:
            return self._on_lease_lost(job, lost, attempt, settlement)
        self._log_outcome(job, outcome, attempt)
        return None

    def _on_lease_lost(
        self, job: Job, lost: LeaseLostError, attempt: AttemptRecord | None, settlement: Settlement | None
    ) -> Disposition:
        current = lost.job
        if attempt is not None and current is not None:
            if settlement is not None and settlement.claim in current.batch_settled:
                settlement = replace(settlement, returned_usd=Decimal(0))  # given back by the write that ended it
            self._store.record_orphan_attempt(attempt, self._now_ms(), settlement, job.parent)
        logger.warning("lease lost; result discarded, usage kept", extra={"job_id": job.job_id})
        if current is None or current.status.is_terminal:
            return Ack(Fate.LEASE_LOST)
        seconds = self._until_lease_ends(current, RETRY_SOON_SECONDS)
        return Retry(Fate.LEASE_LOST, seconds, f"job {job.job_id} is held by another worker")

    def _log_outcome(self, job: Job, outcome: Outcome, attempt: AttemptRecord | None) -> None:
        error = outcome_error(outcome)
        count_outcome(job.job_type, outcome, attempt)
        if target_status(outcome) is JobStatus.SUCCEEDED:
            count_latency(job.lane, max(self._now_ms() - job.created_at, 0) / 1000)
        logger.info(
            "job attempt finished",
            extra={
                "job_id": job.job_id,
                "job_type": job.job_type,
                "attempt": job.attempt_count,
                "outcome": target_status(outcome).value,
                "error_code": error.code.value if error else None,
                # The OpenTelemetry GenAI names of the attempt's usage.
                **genai_usage(attempt),
            },
        )

    # --- when something unexpected happens --------------------------------------------------------

    def _guarded(self, delivery: Delivery, step: Callable[[], _Result]) -> _Result | Disposition:
        try:
            return step()
        except Exception as exc:
            log_unexpected(
                "delivery failed before its outcome was recorded",
                exc,
                message_id=delivery.message_id,
                receive_count=delivery.receive_count,
            )
            if not self._is_transient(exc) and delivery.receive_count >= GIVE_UP_RECEIVES:
                return self._give_up(delivery, exc)
            # Nothing was recorded: the message comes back after a backoff and is tried again.
            return Retry(Fate.ERROR, backoff_seconds(delivery.receive_count, self._rng), "internal error")

    def _give_up(self, delivery: Delivery, exc: Exception) -> Disposition:
        """Keep a message that fails the same unexpected way on every receive, and end its job."""
        reason = f"internal error ({type(exc).__name__}) on receive {delivery.receive_count}; given up"
        try:
            fate = self._dead_letters.record(
                delivery.message_id,
                delivery.body,
                dict(delivery.attributes),
                delivery.receive_count,
                reason,
                ErrorCode.INTERNAL_ERROR,
            )
        except Exception as again:
            log_unexpected("a message given up on could not be recorded", again, message_id=delivery.message_id)
            return Retry(Fate.ERROR, backoff_seconds(delivery.receive_count, self._rng), "internal error")
        logger.warning("message given up on", extra={"message_id": delivery.message_id, "job_fate": fate})
        return Ack(Fate.DEAD_LETTERED)  # a dead letter like any other: DeadLetterAlarm sees it

    # --- time -----------------------------------------------------------------------------------

    def _moment(self, receive_count: int) -> Moment:
        return Moment(self._now_ms(), receive_count, self._max_receives, self._rng)

    def _until_lease_ends(self, job: Job, at_least: int) -> int:
        """Seconds to hide a message until `job`'s current lease ends (within SQS's bounds)."""
        seconds = math.ceil(job.lease_remaining_ms(self._now_ms()) / 1000)
        return min(max(at_least, seconds), MAX_DELAY_SECONDS)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
