"""What becomes of an attempt: a pure function of the job, how its call went, and the moment.

The runner claims a job, admits it, asks here at which service tier to call (`decide_tier`: the flex
tier for background jobs, docs/cost.md), calls the model (now, or from a batch's answer), then asks
here what to write and what becomes of the message, and only then writes it. Nothing here does I/O, so
that every rule (retries and their delays, the attempt budget, the deadline, holds of the shared
limits and budgets) is a table a unit test reads in microseconds. docs/architecture.md walks through it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from engine.core import (
    Ack,
    AttemptOutcome,
    AttemptRecord,
    Disposition,
    ErrorCode,
    Failed,
    Fate,
    Job,
    JobErrorInfo,
    Lane,
    Outcome,
    Released,
    Retry,
    Reusable,
    Succeeded,
    Via,
)
from engine.core.errors import (
    BudgetExceededError,
    DeadlineExceededError,
    FlexUnavailableError,
    InternalError,
    JobError,
    MaxAttemptsExceededError,
    PermanentError,
    RetryableError,
)
from engine.definitions import JobDefinition
from engine.fleet.admission import Hold
from engine.gateway import CallTier, Execution
from engine.intake import canonical_json, sha256_hex
from engine.retry import MAX_DELAY_SECONDS, reach_floor_seconds, retry_delay_seconds
from engine.reuse import Reused

# How soon a message comes back when it was put back for a reason that passes quickly.
RETRY_SOON_SECONDS = 2
# The longest a try at the flex tier takes: what is left of an invocation, at most the worker's 300 s
# Timeout (template.yaml).
FLEX_TRY_SECONDS = 300
# Calls at the standard tier that a job near its deadline keeps time for, each of its type's timeout.
FLEX_STANDARD_CALLS = 4


@dataclass(frozen=True, slots=True)
class Decision:
    """An attempt's outcome as the store is to write it, its record, and what then becomes of the
    delivery (when the outcome is written as decided)."""

    outcome: Outcome
    then: Disposition
    attempt: AttemptRecord | None = None

    @property
    def requeues(self) -> bool:
        """Whether the job goes back to `queued`: something must bring it back (its message)."""
        return isinstance(self.outcome, Released)


@dataclass(frozen=True, slots=True)
class Moment:
    """What a decision reads besides the job: the time, the message's receives so far and the queue's
    most (its maxReceiveCount), and the jitter of backoffs."""

    now_ms: int
    receive_count: int
    max_receives: int
    jitter: random.Random


def output_hash(output: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(output))


def attempt_record(job: Job, execution: Execution, started_ms: int, finished_ms: int) -> AttemptRecord:
    """The record of one attempt of `job`'s claim, numbered by the claim (never reused by a refund)."""
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
        started_at=started_ms,
        finished_at=finished_ms,
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
        via=execution.via,
        batch_id=execution.batch_id,
        standard_cost_usd=execution.standard_cost_usd,
        service_tier=execution.service_tier,
        job_type_version=job.job_type_version,
        reasks=execution.reasks,
        refused_answer=execution.refused_answer,
        prompt_sha256=execution.prompt.sha256 if execution.refused_answer is not None else None,
    )


def reused_attempt(job: Job, reused: Reused, started_ms: int, finished_ms: int) -> AttemptRecord:
    """The record of an attempt that took another job's answer: an execution of no call (no tokens, no
    cost) by the answer's provider and model, for the prompt it answers, naming the job that paid."""
    answered = Execution(reused.prompt, reused.provider, tier="", model=reused.model)
    record = attempt_record(job, answered, started_ms, finished_ms)
    return replace(record, tier=None, via=Via.REUSE, reused_from=reused.paid.job_id)


def flex_margin_ms(definition: JobDefinition) -> int:
    """How near its deadline a background job stops waiting for the flex tier (docs/cost.md): time for a
    flex try as long as an invocation, then FLEX_STANDARD_CALLS calls at the standard tier (the one
    that follows a flex refusal at once, and retries of it should the provider fail it)."""
    return int((FLEX_TRY_SECONDS + FLEX_STANDARD_CALLS * definition.timeout_seconds) * 1000)


def flex_seconds_left(deadline_at: int, definition: JobDefinition, now_ms: int) -> float:
    """How long a flex call may still take at `now_ms` for a job due at `deadline_at`: until its deadline
    less one call at the standard tier, so that a flex call that never answers leaves the standard call
    that follows it its own timeout before the deadline (docs/cost.md). The gateway makes no flex call
    given less than the job type's timeout: none within twice that of the deadline."""
    return (deadline_at - now_ms) / 1000 - definition.timeout_seconds


def decide_tier(job: Job, definition: JobDefinition, flex: bool, now_ms: int) -> CallTier:
    """The service tier an attempt of `job` asks for. With flex on (`flex`), a background job asks the
    flex tier (the gateway asks it of a model that has one): while its deadline is far, a flex refusal
    ends the attempt and the job waits for flex; within flex_margin_ms of it, the standard tier is
    called at once instead. Interactive jobs, and every job with flex off, use the standard tier."""
    if not flex or job.lane is not Lane.BACKGROUND:
        return CallTier.STANDARD
    if job.deadline_at is None or job.deadline_at - now_ms < flex_margin_ms(definition):
        return CallTier.FLEX_OR_STANDARD
    return CallTier.FLEX


def decide(
    job: Job,
    definition: JobDefinition,
    execution: Execution,
    attempt: AttemptRecord,
    at: Moment,
    kept: Reusable | None = None,
) -> Decision:
    """From an attempt's execution: its output kept (within the stored bound; with `kept`, its answer for
    later jobs of the same request too), or its error ended or retried."""
    if execution.output is not None:
        try:
            output = definition.stored_output(execution.output)
        except PermanentError as exc:
            refused = replace(attempt, outcome=AttemptOutcome.FAILED, error_code=exc.code)
            return Decision(Failed(exc.info()), Ack(Fate.FAILED), refused)
        return Decision(Succeeded(output, output_hash(output), kept=kept), Ack(Fate.SUCCEEDED), attempt)
    error: JobError = execution.error or InternalError("the gateway returned neither output nor error")
    if isinstance(error, FlexUnavailableError) and job.deadline_at is not None:
        # It waits for the flex tier, but comes back while its deadline still leaves room for the standard one.
        return decide_retry(job, error, attempt, at, back_by_ms=job.deadline_at - flex_margin_ms(definition))
    if isinstance(error, RetryableError):
        return decide_retry(job, error, attempt, at)
    return Decision(Failed(error.info()), Ack(Fate.FAILED), attempt)


def decide_reused(job: Job, reused: Reused, started_ms: int, finished_ms: int) -> Decision:
    """A job that takes the answer another job of the same request paid for (engine.reuse): succeeded
    through the ordinary finish, which records where the answer came from."""
    succeeded = Succeeded(reused.output, output_hash(reused.output), reused_from=reused.paid.job_id)
    return Decision(succeeded, Ack(Fate.SUCCEEDED), reused_attempt(job, reused, started_ms, finished_ms))


def decide_retry(
    job: Job, error: RetryableError, attempt: AttemptRecord | None, at: Moment, back_by_ms: int | None = None
) -> Decision:
    """A later try, or the end when the job's attempts or its deadline are spent; with `back_by_ms`, the
    backoff ends by then at the latest."""
    if error.consumes_attempt and job.attempt_count >= job.max_attempts:
        budget = f"({job.attempt_count} of {job.max_attempts})"
        spent = MaxAttemptsExceededError(f"attempt budget spent {budget}; last error {error.code}: {error.message}")
        return Decision(Failed(spent.info()), Ack(Fate.FAILED), attempt)
    # Backoff grows with the attempts, or with the receives when attempts are refunded (a provider
    # rate-limiting without Retry-After): else a throttled job would come back every second or two
    # and spend the queue's maxReceiveCount in minutes, long before its deadline.
    wanted = retry_delay_seconds(error, max(job.attempt_count, at.receive_count), at.jitter)
    if back_by_ms is not None:
        wanted = min(wanted, max(math.ceil((back_by_ms - at.now_ms) / 1000), 1))
    delay = hide_seconds(job, wanted, at)
    if job.deadline_at is not None and at.now_ms + delay * 1000 >= job.deadline_at:
        late = DeadlineExceededError(
            f"the deadline passes before the next try; last error {error.code}: {error.message}"
        )
        return Decision(Failed(late.info()), Ack(Fate.FAILED), attempt)
    released = Released(error.info(), refund_attempt=not error.consumes_attempt)
    return Decision(released, Retry(Fate.RETRIED, delay, f"{error.code}: {error.message}"), attempt)


def decide_hold(job: Job, hold: Hold, at: Moment) -> Decision:
    """A job its user's budget or its model's shared capacity holds: queued again, its attempt refunded,
    until the hold ends; or ended, when that comes after its deadline."""
    seconds = hide_seconds(job, math.ceil((hold.until_ms - at.now_ms) / 1000), at)
    if job.deadline_at is not None and at.now_ms + seconds * 1000 >= job.deadline_at:
        late: PermanentError
        if hold.code is ErrorCode.BUDGET_EXCEEDED:
            late = BudgetExceededError(f"the deadline passes before the budget allows a call; {hold.reason}")
        else:
            late = DeadlineExceededError(f"the deadline passes before the next try; {hold.reason}")
        return Decision(Failed(late.info()), Ack(Fate.FAILED))
    fate = Fate.OVER_BUDGET if hold.code is ErrorCode.BUDGET_EXCEEDED else Fate.THROTTLED
    waiting = Released(JobErrorInfo(hold.code, hold.reason, retryable=True), refund_attempt=True)
    return Decision(waiting, Retry(fate, seconds, hold.reason))


def decide_deferral() -> Decision:
    """Too little of the invocation is left for the call: queued again at once, its attempt refunded."""
    return Decision(
        Released(None, refund_attempt=True),
        Retry(Fate.DEFERRED, RETRY_SOON_SECONDS, "not enough time left in this invocation"),
    )


def decide_hand_back(why: JobError) -> Decision:
    """A job its batch holds but did not (or will not in time) answer: queued again for real time, its
    attempt refunded; its message is sent again by whoever hands it back."""
    error = JobErrorInfo(why.code, f"its batch did not answer it: {why.message}", retryable=True)
    return Decision(Released(error, refund_attempt=True), Retry(Fate.RETRIED, 0, f"handed back: {why.code}"))


def hide_seconds(job: Job, wanted: int, at: Moment) -> int:
    """How long to hide a job's message: what it waits for, but long enough that the receives the
    message has left reach the job's deadline (engine.retry.reach_floor_seconds)."""
    floor = 0
    if job.deadline_at is not None:
        floor = reach_floor_seconds((job.deadline_at - at.now_ms) / 1000, at.receive_count, at.max_receives)
    return min(max(wanted, floor, 1), MAX_DELAY_SECONDS)
