"""The job: its states and their transitions, what it records, and when it may be claimed.

The rules here are the ones every store enforces with its own conditions (docs/protocol.md);
`claimable` and `explain_claim_refusal` are the claim's condition, read once as a yes and once
as a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from engine.core.attachments import AttachmentInfo, AttachmentRef
from engine.core.codes import ClaimRefusal, ErrorCode

# The deadline a retried job gets when it was created before jobs recorded their own.
DEFAULT_DEADLINE_SECONDS = 86_400


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    # A pipeline between its steps, or waiting for a person's review: no lease, no Lambda (docs/pipelines.md).
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

# The state machine (docs/architecture.md). `failed -> queued` is the explicit retry; `running ->
# waiting` a pipeline's step started, `waiting -> queued` its children ended, `cancelled -> queued` a
# pipeline's child cancelled with its parent, run again by its parent's retry (docs/pipelines.md).
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.QUEUED,
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.WAITING,
        }
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED}),
    JobStatus.CANCELLED: frozenset({JobStatus.QUEUED}),
    JobStatus.WAITING: frozenset({JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}),
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in ALLOWED_TRANSITIONS[current]


class Lane(StrEnum):
    """Who waits for a job: someone (interactive), or no one (background: it should be cheap and done
    by its deadline). Each lane has a queue of its own; docs/lanes.md."""

    INTERACTIVE = "interactive"
    BACKGROUND = "background"


class Via(StrEnum):
    """How an attempt's first call was made: at once, in a provider's batch (docs/batches.md), or at
    once at the provider's flex tier (docs/cost.md); or how an attempt got its answer with no call:
    another job's of the same request (docs/reuse.md)."""

    REALTIME = "realtime"
    BATCH = "batch"
    FLEX = "flex"
    REUSE = "reuse"


class AttemptOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    RETRYABLE = "retryable"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobErrorInfo:
    code: ErrorCode
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class Usage:
    """A job's usage, summed over its attempt records.

    Token kinds follow the OpenTelemetry GenAI conventions: `input_tokens` includes the cached and
    cache-write input tokens, `output_tokens` includes the reasoning tokens.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    attempts: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    # What the same calls would have cost in real time at the standard tier (docs/cost.md).
    standard_cost_usd: Decimal = Decimal(0)

    def plus(self, attempt: AttemptRecord) -> Usage:
        """This usage with one more attempt record's."""
        return Usage(
            input_tokens=self.input_tokens + attempt.input_tokens,
            output_tokens=self.output_tokens + attempt.output_tokens,
            cost_usd=self.cost_usd + attempt.cost_usd,
            attempts=self.attempts + 1,
            cached_input_tokens=self.cached_input_tokens + attempt.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens + attempt.cache_write_input_tokens,
            reasoning_tokens=self.reasoning_tokens + attempt.reasoning_tokens,
            standard_cost_usd=self.standard_cost_usd + attempt.standard_cost_usd,
        )

    def add(self, other: Usage, sign: int = 1) -> Usage:
        """This usage with another's added (sign 1) or taken away (sign -1): a pipeline's children's."""
        return Usage(
            input_tokens=self.input_tokens + sign * other.input_tokens,
            output_tokens=self.output_tokens + sign * other.output_tokens,
            cost_usd=self.cost_usd + sign * other.cost_usd,
            attempts=self.attempts + sign * other.attempts,
            cached_input_tokens=self.cached_input_tokens + sign * other.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens + sign * other.cache_write_input_tokens,
            reasoning_tokens=self.reasoning_tokens + sign * other.reasoning_tokens,
            standard_cost_usd=self.standard_cost_usd + sign * other.standard_cost_usd,
        )


@dataclass(frozen=True, slots=True)
class ChildOf:
    """A pipeline's child job: its parent, the step it runs for (by name and index) and its part."""

    parent_id: str
    step: str
    step_index: int
    part: int


@dataclass(frozen=True, slots=True)
class Review:
    """A pipeline waiting for a person: the output proposed, since when, for how long; then the decision."""

    output: dict[str, Any]
    started_at: int
    timeout_ms: int
    decision: str | None = None  # "approved", "rejected" or "timed_out"
    by: str | None = None
    at: int | None = None
    reason: str | None = None
    changed: bool = False  # the approved output is not the proposed one

    @property
    def expires_at(self) -> int:
        return self.started_at + self.timeout_ms


@dataclass(frozen=True, slots=True)
class PipelineState:
    """Where a pipeline is: the step it waits on, its children (how many, which ended, which failed),
    the children each step so far made, and a review."""

    step: int
    children: int
    ended: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()
    counts: tuple[int, ...] = ()
    review: Review | None = None
    # Set by `aijobs retry` of a failed pipeline: its next claim runs again what did not succeed.
    rerun: bool = False

    @property
    def step_ended(self) -> bool:
        return len(self.ended) >= self.children


@dataclass(frozen=True, slots=True)
class Counted:
    """What counting a pipeline child's end found: the parent after it (None when it does not exist),
    and whether this call counted it (False: counted before, or the parent is no longer on that step)."""

    parent: Job | None
    counted: bool


@dataclass(frozen=True, slots=True)
class NewJob:
    """What a full message (or a submission) creates when its job does not exist yet."""

    job_type: str
    user_id: str
    schema_version: int
    max_attempts: int
    deadline_seconds: int
    request_hash: str
    lane: Lane = Lane.INTERACTIVE
    attachments: tuple[AttachmentRef, ...] = ()
    # The version of a data job type it runs (pinned, or its label's when the request was read);
    # None for a code job type, or for a submission that left it to the first claim.
    job_type_version: int | None = None
    # A pipeline's child (docs/pipelines.md).
    parent: ChildOf | None = None


@dataclass(frozen=True, slots=True)
class BatchTerms:
    """A claim into a provider's batch (docs/batches.md): the job joins `window`, if its deadline is at
    `eligible_at_ms` or later, and is held until `lease_before_deadline_ms` before its deadline."""

    window: str
    eligible_at_ms: int
    lease_before_deadline_ms: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """What ending a batched claim does to its user's budget, once (docs/batches.md): the reservation
    the claim held is given back (`returned_usd`; 0 when an earlier write gave it back) and what its
    answer cost is counted (`spent_usd`). The store writes it with the job's own write, and marks the
    claim as settled when it gives the reservation back, so that no write gives it back twice."""

    claim: int
    user_id: str
    day: str
    returned_usd: Decimal = Decimal(0)
    spent_usd: Decimal = Decimal(0)


@dataclass(frozen=True, slots=True)
class Job:
    """A job as a store holds it. Times are epoch milliseconds."""

    job_id: str
    job_type: str | None
    user_id: str | None
    status: JobStatus
    created_at: int
    updated_at: int
    max_attempts: int = 0
    attempt_count: int = 0
    claim_count: int = 0
    schema_version: int | None = None
    deadline_seconds: int | None = None
    deadline_at: int | None = None
    request_hash: str | None = None
    lease_owner: str | None = None
    lease_expires_at: int | None = None
    cancel_requested: bool = False
    input_stored: bool = False
    started_at: int | None = None
    finished_at: int | None = None
    output: dict[str, Any] | None = None
    output_hash: str | None = None
    error: JobErrorInfo | None = None
    usage: Usage = field(default_factory=Usage)
    lane: Lane = Lane.INTERACTIVE
    # While the job waits in a provider's batch (running, its lease held for the batch): the batch
    # window it joined (docs/batches.md).
    batch: str | None = None
    # The claims into a batch whose budget reservation was given back (engine.core.Settlement).
    batch_settled: frozenset[int] = frozenset()
    # The documents and images it reads (engine.core.attachments), and what its last attempt read of
    # them (their type, size, digest, pages or pixel size: never their content).
    attachments: tuple[AttachmentRef, ...] = ()
    attachments_read: tuple[AttachmentInfo, ...] = ()
    # The data job type's version it runs, fixed by its creation or its first finished claim (every
    # retry runs the same); None for a code job type (docs/jobtypes.md).
    job_type_version: int | None = None
    # A pipeline's child: its parent and step; a pipeline: where it is (docs/pipelines.md).
    parent: ChildOf | None = None
    pipeline: PipelineState | None = None
    # A job that took the answer another job of the same request paid for: that job's id (docs/reuse.md).
    reused_from: str | None = None

    @property
    def attempts_left(self) -> int:
        return max(self.max_attempts - self.attempt_count, 0)

    def lease_remaining_ms(self, now_ms: int) -> int:
        if self.status is not JobStatus.RUNNING or self.lease_expires_at is None:
            return 0
        return max(self.lease_expires_at - now_ms, 0)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """What one attempt cost and how it ended; one per claim that reached the provider."""

    job_id: str
    attempt: int
    user_id: str | None
    job_type: str | None
    started_at: int
    finished_at: int
    outcome: AttemptOutcome
    error_code: ErrorCode | None = None
    provider: str | None = None
    tier: str | None = None
    model: str | None = None
    calls: int = 0
    prompt_key: str | None = None
    prompt_version: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    latency_ms: int = 0
    # Parts of input_tokens and output_tokens (as in Usage), and what prompt caching saved.
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_savings_usd: Decimal = Decimal(0)
    # False when a call went to a model with no price: its cost is unknown, recorded as 0.
    priced: bool = True
    lane: Lane = Lane.INTERACTIVE
    # How the first call was made, and the provider's batch id when it went in a batch.
    via: Via = Via.REALTIME
    batch_id: str | None = None
    # What the same calls would have cost in real time at the standard tier (cost_usd, unless a batch
    # or the flex tier made them cheaper), and the service tier the provider said served the answer
    # ("flex", "default", ...; None when it said none): docs/cost.md.
    standard_cost_usd: Decimal = Decimal(0)
    service_tier: str | None = None
    # The data job type's version the attempt ran; None for a code job type.
    job_type_version: int | None = None
    # Re-asks after an answer failed validation; for an attempt whose answer was refused in the end
    # (schema, business or reference rule), that answer (bounded: engine.store.items) and the sha256
    # of the prompt it answered; past the bound, the whole answer's s3:// URI in the payload bucket.
    reasks: int = 0
    refused_answer: str | None = None
    prompt_sha256: str | None = None
    refused_answer_s3: str | None = None
    # An attempt that took another job's answer (`via` reuse, no call): that job's id.
    reused_from: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message kept because the engine gave up on it; its body, or the key of its payload."""

    message_id: str
    body: str | None
    body_key: str | None
    body_bytes: int
    body_sha256: str
    attributes: dict[str, str]
    receive_count: int
    reason: str
    recorded_at: int
    # The job the body names (engine.dead_letters.DeadLetterRecorder), if any.
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """A dead letter as listings and a job's history show it: what happened, without the body."""

    message_id: str
    recorded_at: int
    receive_count: int
    reason: str
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class JobHistory:
    """What a job recorded besides its state: its attempts and the dead letters that name it, oldest first."""

    attempts: list[AttemptRecord]
    dead_letters: list[DeadLetterEntry]


@dataclass(frozen=True, slots=True)
class JobDetails:
    """Everything a job's partition holds: the job, its history, and its stored input (JSON text, or None)."""

    job: Job
    history: JobHistory
    input_json: str | None


def claimable(job: Job, now_ms: int) -> bool:
    """The claim's condition on a job that exists: waiting (or abandoned), and with budget and time left."""
    waiting = job.status is JobStatus.QUEUED or (
        job.status is JobStatus.RUNNING and job.lease_expires_at is not None and job.lease_expires_at < now_ms
    )
    within_deadline = job.deadline_at is not None and job.deadline_at > now_ms
    return waiting and not job.cancel_requested and job.attempt_count < job.max_attempts and within_deadline


def explain_claim_refusal(
    job: Job, now_ms: int, request_hash: str | None, batch: BatchTerms | None = None
) -> ClaimRefusal:
    """Why a claim's condition failed, from the job it met (no extra read)."""
    if request_hash is not None and job.request_hash != request_hash:
        return ClaimRefusal.CONFLICT
    if job.status.is_terminal:
        return ClaimRefusal.FINISHED
    if job.status is JobStatus.WAITING:
        return ClaimRefusal.WAITING
    if job.status is JobStatus.RUNNING and (job.lease_expires_at is None or job.lease_expires_at >= now_ms):
        return ClaimRefusal.HELD
    if job.cancel_requested:
        return ClaimRefusal.CANCEL_REQUESTED
    if job.deadline_at is None or job.deadline_at <= now_ms:
        return ClaimRefusal.DEADLINE_PASSED
    if job.attempts_left == 0:
        return ClaimRefusal.ATTEMPTS_SPENT
    if batch is not None and (job.lane is not Lane.BACKGROUND or job.deadline_at < batch.eligible_at_ms):
        return ClaimRefusal.NOT_BATCHABLE
    # The job satisfies the condition now: it changed between the write and this reading.
    return ClaimRefusal.RACED
