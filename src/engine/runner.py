"""JobRunner: claim -> resolve -> execute -> validate -> finish, for one delivery of a message.

Pure orchestration over the store's worker path (engine.core.ports.WorkerStore), the gateway and
the retry delays. The runner says what to do with the message (engine.core.deliveries); it never
touches SQS, and it knows no store in particular. docs/architecture.md walks through it.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import BaseModel

from engine.core import (
    Ack,
    AttemptOutcome,
    AttemptRecord,
    BatchTerms,
    Cancelled,
    ClaimRefusal,
    Delivery,
    Disposition,
    ErrorCode,
    Failed,
    Fate,
    Job,
    JobErrorInfo,
    JobStatus,
    Lane,
    Outcome,
    Released,
    Retry,
    Succeeded,
    Via,
    target_status,
)
from engine.core.errors import (
    BudgetExceededError,
    CancelRequestedError,
    ClaimRefusedError,
    DeadlineExceededError,
    InputValidationError,
    InternalError,
    JobError,
    JobNotFoundError,
    LeaseLostError,
    MaxAttemptsExceededError,
    PermanentError,
    RetryableError,
    SchemaVersionMismatchError,
    deadline_error,
)
from engine.core.ports import WorkerStore
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobDefinition, JobRegistry
from engine.fleet.admission import Hold, Pass, Verdict
from engine.gateway import Answered, Execution, ModelGateway
from engine.intake import BadMessageError, JobRequest, canonical_json, parse_message, sha256_hex
from engine.observability import genai_usage, log_unexpected, logger
from engine.retry import (
    DEFAULT_MAX_RECEIVES,
    MAX_DELAY_SECONDS,
    backoff_seconds,
    reach_floor_seconds,
    retry_delay_seconds,
)
from engine.telemetry import count_ended, count_latency, count_outcome, count_retry

# Time kept back from the provider call for the finishing write.
FINISH_MARGIN_MS = 5_000
# How soon a message comes back when it was put back for a reason that passes quickly.
RETRY_SOON_SECONDS = 2
# A message that meets an unexpected error that is not transient (a bug, a request AWS refuses)
# on its third receive or later is given up on: kept as a dead letter, its job failed with
# internal_error. Transient errors (throttling, outages) are retried until the redrive.
GIVE_UP_RECEIVES = 3


RemainingMs = Callable[[], int]
# Whether an unexpected exception may pass by itself (engine.aws_errors.is_transient in Lambda).
TransientCheck = Callable[[Exception], bool]


def output_hash(output: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(output))


def _never_transient(_: Exception) -> bool:
    return False


def _time_left(remaining_ms: RemainingMs | None) -> Callable[[], float] | None:
    """Seconds the gateway may still spend on model calls: the invocation's time less the finish."""
    if remaining_ms is None:
        return None
    return lambda: (remaining_ms() - FINISH_MARGIN_MS) / 1000


def _input_to_keep(job: Job, request: JobRequest, outcome: Outcome) -> dict[str, Any] | None:
    """A failed job may be retried later, so the input its message carried is stored with it."""
    return request.raw_input if isinstance(outcome, Failed) and not job.input_stored else None


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


_Result = TypeVar("_Result", bound="Claimed | Disposition")


class JobRunner:
    def __init__(
        self,
        store: WorkerStore,
        gateway: ModelGateway,
        registry: JobRegistry,
        recorder: DeadLetterRecorder,
        *,
        default_lease_ms: int = 300_000,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        is_transient: TransientCheck = _never_transient,
        sleep: Callable[[float], None] = time.sleep,
        max_receives: int = DEFAULT_MAX_RECEIVES,
    ) -> None:
        self._store = store
        self._gateway = gateway
        self._registry = registry
        self._recorder = recorder
        self._default_lease_ms = default_lease_ms
        self._clock = clock
        self._rng = rng or random.Random()
        self._is_transient = is_transient
        self._sleep = sleep
        self._max_receives = max_receives

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
        """Run a claimed job: at its Pass's call time, or held back by its Hold (engine.fleet.admission)."""
        return self._guarded(claimed.delivery, lambda: self._run_claimed(claimed, remaining_ms, verdict))

    def conclude(
        self,
        claimed: Claimed,
        answered: Answered,
        remaining_ms: RemainingMs | None = None,
        verdict: Pass | None = None,
    ) -> Disposition:
        """Finish a job its batch answered: the answer goes the way a real-time call's does (validation,
        re-asks and fallback in real time). A Retry means the job was queued again (for a new message);
        `verdict` (its budget's reservation) records what the attempt cost."""
        return self._guarded(claimed.delivery, lambda: self._run_claimed(claimed, remaining_ms, verdict, answered))

    def keep_unused(self, claimed: Claimed, answered: Answered, verdict: Pass | None = None) -> AttemptRecord:
        """Keep the usage of a batch's answer to a job it no longer holds (finished meanwhile, cancelled,
        handed back to real time): recorded as an attempt of the claim it answered, and discarded."""
        started = self._now_ms()
        execution = self._gateway.execute(claimed.definition, claimed.job_input, None, answered, alone=True)
        if verdict is not None:
            verdict.record(execution)
        attempt = self._attempt_record(claimed.job, execution, started)
        self._store.record_orphan_attempt(attempt, self._now_ms())
        return attempt

    def hand_back(self, job: Job, why: JobError) -> Disposition:
        """Queue again, its attempt refunded, a job its batch holds but did not answer: it runs in real
        time with its next message. A Retry when it was queued again; else what became of it instead."""
        error = JobErrorInfo(why.code, f"its batch did not answer it: {why.message}", retryable=True)
        released = Released(error, refund_attempt=True)
        return self._finish(job, JobRequest(job.job_id), released) or Retry(Fate.RETRIED, 0, f"handed back: {why.code}")

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
            fate = self._recorder.record(
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

    # --- before the claim ---------------------------------------------------------------------

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
        except PermanentError as exc:
            return self._finish(job, request, Failed(exc.info())) or Ack(Fate.FAILED)
        except Exception as exc:
            log_unexpected("the claimed job could not be resolved", exc, job_id=job.job_id)
            internal = InternalError(f"internal error: {type(exc).__name__}")
            return self._retry(job, request, internal, None, delivery.receive_count)
        return Claimed(job, request, definition, job_input, delivery, raw_input)

    def _batch_terms(self, request: JobRequest, delivery: Delivery, batch: BatchTerms | None) -> BatchTerms | None:
        """The batch's terms, for a job that may join it: none for a message a batch handed back, nor for a
        new job of the interactive lane or whose deadline is too near (an existing job's, the claim checks)."""
        if batch is None or delivery.realtime:
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
        existing = self._recorder.fail_bad_message(bad, delivery.body, self._now_ms(), delivery.lane)
        if existing is not None:
            if existing.request_hash == sha256_hex(delivery.body):
                return Ack(Fate.DUPLICATE)
            # The job exists from another message; this one must not overwrite it.
            return self._dead_letter(delivery, f"job {bad.job_id} exists; this message is invalid: {bad.error.message}")
        logger.warning("bad message failed its job", extra={"job_id": bad.job_id, "code": bad.error.code.value})
        return Ack(Fate.FAILED)

    def _dead_letter(self, delivery: Delivery, reason: str) -> Ack:
        self._recorder.keep(
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
            case ClaimRefusal.HELD:
                count_retry(job.job_type, "held")
                return Retry(Fate.HELD, self._until_lease_ends(job, 1), f"job {job.job_id} is held by another worker")
            case ClaimRefusal.RACED | ClaimRefusal.NOT_BATCHABLE:  # (a claim without terms is never the latter)
                return Retry(Fate.RACED, RETRY_SOON_SECONDS, f"job {job.job_id} changed while it was being claimed")
            case ClaimRefusal.CONFLICT:
                reason = f"job {job.job_id} exists with a different job type, user or input"
                return self._dead_letter(delivery, reason)
            case ClaimRefusal.CANCEL_REQUESTED:
                return self._settle(job, request, JobStatus.CANCELLED, None)
            case ClaimRefusal.DEADLINE_PASSED:
                return self._settle(job, request, JobStatus.FAILED, deadline_error(job, "the job's deadline passed"))
            case ClaimRefusal.ATTEMPTS_SPENT:
                spent = MaxAttemptsExceededError(f"attempt budget spent ({job.attempt_count} of {job.max_attempts})")
                return self._settle(job, request, JobStatus.FAILED, spent)

    def _settle(self, job: Job, request: JobRequest, status: JobStatus, error: PermanentError | None) -> Disposition:
        """End a job a refused claim found spent, past its deadline or cancel-requested."""
        store_input = request.raw_input if status is JobStatus.FAILED and not job.input_stored else None
        if self._store.settle_job(job, status, error.info() if error else None, self._now_ms(), store_input):
            count_ended(job.job_type, status)
            return Ack(Fate.CANCELLED if status is JobStatus.CANCELLED else Fate.FAILED)
        return Retry(Fate.RACED, RETRY_SOON_SECONDS, f"job {job.job_id} changed while it was being settled")

    # --- after the claim ----------------------------------------------------------------------

    def _run_claimed(
        self,
        claimed: Claimed,
        remaining_ms: RemainingMs | None,
        verdict: Verdict | None,
        answered: Answered | None = None,
    ) -> Disposition:
        job, request, definition, job_input = claimed.job, claimed.request, claimed.definition, claimed.job_input
        receive_count = claimed.delivery.receive_count
        attempt: AttemptRecord | None = None
        try:
            if isinstance(verdict, Hold):
                return self._hold(job, request, verdict, receive_count)
            wait_ms = max(verdict.call_at_ms - self._now_ms(), 0) if verdict else 0
            timeout_ms = int(definition.timeout_seconds * 1000)
            # (An answered job is concluded whatever the time: its answer is paid for already.)
            if answered is None and remaining_ms and remaining_ms() < wait_ms + timeout_ms + FINISH_MARGIN_MS:
                # Too little time left in this invocation: hand the job back without spending an attempt.
                deferred = Retry(Fate.DEFERRED, RETRY_SOON_SECONDS, "not enough time left in this invocation")
                return self._finish(job, request, Released(None, refund_attempt=True)) or deferred
            if wait_ms:
                self._sleep(wait_ms / 1000)  # until the call time the shared limit gave
            revoked = verdict.revoked() if isinstance(verdict, Pass) else None
            if revoked is not None:
                return self._hold(job, request, revoked, receive_count)
            started = self._now_ms()
            execution = self._gateway.execute(definition, job_input, _time_left(remaining_ms), answered)
            if verdict is not None:
                verdict.record(execution)
            attempt = self._attempt_record(job, execution, started)
            if execution.output is not None:
                try:
                    output = definition.stored_output(execution.output)
                except PermanentError as exc:
                    refused = replace(attempt, outcome=AttemptOutcome.FAILED, error_code=exc.code)
                    return self._finish(job, request, Failed(exc.info()), refused) or Ack(Fate.FAILED)
                succeeded = Succeeded(output, output_hash(output))
                return self._finish(job, request, succeeded, attempt) or Ack(Fate.SUCCEEDED)
            error = execution.error or InternalError("the gateway returned neither output nor error")
            if isinstance(error, RetryableError):
                return self._retry(job, request, error, attempt, receive_count)
            return self._finish(job, request, Failed(error.info()), attempt) or Ack(Fate.FAILED)
        except Exception as exc:
            # The job is still this worker's: hand it back (its usage kept) rather than wait for the lease.
            log_unexpected("job attempt failed unexpectedly", exc, job_id=job.job_id)
            internal = InternalError(f"internal error: {type(exc).__name__}")
            return self._retry(job, request, internal, attempt, receive_count)

    def _hold(self, job: Job, request: JobRequest, hold: Hold, receive_count: int) -> Disposition:
        """Hand back a job its user's budget or its model's shared capacity holds, its attempt refunded."""
        now = self._now_ms()
        seconds = self._hide_seconds(job, math.ceil((hold.until_ms - now) / 1000), receive_count)
        if job.deadline_at is not None and now + seconds * 1000 >= job.deadline_at:
            if hold.code is ErrorCode.BUDGET_EXCEEDED:
                late: PermanentError = BudgetExceededError(
                    f"the deadline passes before the budget allows a call; {hold.reason}"
                )
            else:
                late = DeadlineExceededError(f"the deadline passes before the next try; {hold.reason}")
            return self._finish(job, request, Failed(late.info())) or Ack(Fate.FAILED)
        fate = Fate.OVER_BUDGET if hold.code is ErrorCode.BUDGET_EXCEEDED else Fate.THROTTLED
        count_retry(job.job_type, fate.value)
        waiting = Released(JobErrorInfo(hold.code, hold.reason, retryable=True), refund_attempt=True)
        return self._finish(job, request, waiting) or Retry(fate, seconds, hold.reason)

    def _resolve(self, job: Job, request: JobRequest) -> tuple[JobDefinition, BaseModel, dict[str, Any] | None]:
        if request.definition is not None and request.job_input is not None:
            return request.definition, request.job_input, request.raw_input
        definition = self._registry.get(job.job_type or "")
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

    def _retry(
        self, job: Job, request: JobRequest, error: RetryableError, attempt: AttemptRecord | None, receive_count: int
    ) -> Disposition:
        """Hand a job back for a later try, or end it when its attempts or its deadline are spent."""
        if error.consumes_attempt and job.attempt_count >= job.max_attempts:
            budget = f"({job.attempt_count} of {job.max_attempts})"
            spent = MaxAttemptsExceededError(f"attempt budget spent {budget}; last error {error.code}: {error.message}")
            return self._finish(job, request, Failed(spent.info()), attempt) or Ack(Fate.FAILED)
        # Backoff grows with the attempts, or with the receives when attempts are refunded (a provider
        # rate-limiting without Retry-After): else a throttled job would come back every second or two
        # and spend the queue's maxReceiveCount in minutes, long before its deadline.
        delay = self._hide_seconds(
            job, retry_delay_seconds(error, max(job.attempt_count, receive_count), self._rng), receive_count
        )
        if job.deadline_at is not None and self._now_ms() + delay * 1000 >= job.deadline_at:
            late = DeadlineExceededError(
                f"the deadline passes before the next try; last error {error.code}: {error.message}"
            )
            return self._finish(job, request, Failed(late.info()), attempt) or Ack(Fate.FAILED)
        released = Released(error.info(), refund_attempt=not error.consumes_attempt)
        retried = Retry(Fate.RETRIED, delay, f"{error.code}: {error.message}")
        return self._finish(job, request, released, attempt) or retried

    def _finish(
        self, job: Job, request: JobRequest, outcome: Outcome, attempt: AttemptRecord | None = None
    ) -> Disposition | None:
        """Write `outcome`: None when it was written as asked, else what became of the delivery instead.

        A cancel requested meanwhile ends the job `cancelled`; a lost lease discards the result.
        The attempt's usage is kept either way.
        """
        try:
            self._store.finish_job(job, outcome, self._now_ms(), attempt, _input_to_keep(job, request, outcome))
        except CancelRequestedError:
            return self._finish(job, request, Cancelled(), attempt) or Ack(Fate.CANCELLED)
        except LeaseLostError as lost:
            return self._on_lease_lost(job, lost, attempt)
        self._log_outcome(job, outcome, attempt)
        return None

    def _on_lease_lost(self, job: Job, lost: LeaseLostError, attempt: AttemptRecord | None) -> Disposition:
        if attempt is not None:
            self._store.record_orphan_attempt(attempt, self._now_ms())
        logger.warning("lease lost; result discarded, usage kept", extra={"job_id": job.job_id})
        current = lost.job
        if current is None or current.status.is_terminal:
            return Ack(Fate.LEASE_LOST)
        seconds = self._until_lease_ends(current, RETRY_SOON_SECONDS)
        return Retry(Fate.LEASE_LOST, seconds, f"job {job.job_id} is held by another worker")

    def _attempt_record(self, job: Job, execution: Execution, started: int) -> AttemptRecord:
        error = execution.error
        if error is None:
            outcome = AttemptOutcome.SUCCEEDED
        else:
            outcome = AttemptOutcome.RETRYABLE if error.retryable else AttemptOutcome.FAILED
        return AttemptRecord(
            job_id=job.job_id,
            lane=job.lane,
            attempt=job.claim_count,
            user_id=job.user_id,
            job_type=job.job_type,
            started_at=started,
            finished_at=self._now_ms(),
            outcome=outcome,
            error_code=error.code if error else None,
            provider=execution.provider,
            tier=execution.tier,
            model=execution.model,
            calls=execution.calls,
            prompt_key=execution.prompt.key,
            prompt_version=execution.prompt.version,
            input_tokens=execution.input_tokens,
            output_tokens=execution.output_tokens,
            cost_usd=execution.cost_usd,
            latency_ms=execution.latency_ms,
            cached_input_tokens=execution.cached_input_tokens,
            cache_write_input_tokens=execution.cache_write_input_tokens,
            reasoning_tokens=execution.reasoning_tokens,
            cache_savings_usd=execution.cache_savings_usd,
            priced=execution.priced,
            via=Via.BATCH if execution.batch_id else Via.REALTIME,
            batch_id=execution.batch_id,
        )

    def _log_outcome(self, job: Job, outcome: Outcome, attempt: AttemptRecord | None) -> None:
        error = outcome.error if isinstance(outcome, Failed | Released) else None
        count_outcome(job.job_type, outcome, attempt)
        if isinstance(outcome, Succeeded):
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

    def _hide_seconds(self, job: Job, wanted: int, receive_count: int) -> int:
        """How long to hide a job's message: what it waits for, but long enough that the receives the
        message has left reach the job's deadline (engine.retry.reach_floor_seconds)."""
        floor = 0
        if job.deadline_at is not None:
            floor = reach_floor_seconds((job.deadline_at - self._now_ms()) / 1000, receive_count, self._max_receives)
        return min(max(wanted, floor, 1), MAX_DELAY_SECONDS)

    def _until_lease_ends(self, job: Job, at_least: int) -> int:
        """Seconds to hide a message until `job`'s current lease ends (within SQS's bounds)."""
        seconds = math.ceil(job.lease_remaining_ms(self._now_ms()) / 1000)
        return min(max(at_least, seconds), MAX_DELAY_SECONDS)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
