"""The engine's types at each boundary: the SQS message, the domain job, the public view.

Models here do no I/O; the store maps items to `Job`, the runner maps messages to requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine.errors import ErrorCode

JobId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
UserId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")]
JobTypeName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]

MaxAttempts = Annotated[int, Field(ge=1, le=10)]
# Bounded so that every number a message carries fits a DynamoDB number.
SchemaVersion = Annotated[int, Field(ge=1, le=1_000_000)]

MIN_DEADLINE_SECONDS = 60
MAX_DEADLINE_SECONDS = 604_800


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

# The state machine of SPEC section 3. `failed -> queued` is the explicit retry.
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset(
        {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED}),
    JobStatus.CANCELLED: frozenset(),
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in ALLOWED_TRANSITIONS[current]


class JobMessage(BaseModel):
    """The body of a message on the jobs queue (SPEC section 2)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    job_id: JobId | None = None
    job_type: JobTypeName | None = None
    user_id: UserId | None = None
    input: dict[str, Any] | None = None
    schema_version: SchemaVersion | None = None
    max_attempts: MaxAttempts | None = None
    deadline_seconds: Annotated[int, Field(ge=MIN_DEADLINE_SECONDS, le=MAX_DEADLINE_SECONDS)] | None = None

    @property
    def is_reference(self) -> bool:
        """A body of only a job id refers to a job created beforehand."""
        return self.model_fields_set == {"job_id"}


@dataclass(frozen=True, slots=True)
class JobErrorInfo:
    code: ErrorCode
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the store holds it. Times are epoch milliseconds."""

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
    outcome: str
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


def iso_timestamp(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ErrorView(BaseModel):
    code: ErrorCode
    message: str
    retryable: bool


class UsageView(BaseModel):
    input_tokens: int
    output_tokens: int
    cost_usd: float
    attempts: int


class JobView(BaseModel):
    """The public view of a job (`aijobs status ID --json`, SPEC section 9)."""

    job_id: str
    job_type: str | None
    user_id: str | None
    status: JobStatus
    attempt_count: int
    max_attempts: int
    created_at: str | None
    updated_at: str | None
    started_at: str | None
    finished_at: str | None
    output: dict[str, Any] | None
    output_hash: str | None
    error: ErrorView | None
    cancel_requested: bool
    usage: UsageView

    @classmethod
    def from_job(cls, job: Job) -> JobView:
        error = job.error
        return cls(
            job_id=job.job_id,
            job_type=job.job_type,
            user_id=job.user_id,
            status=job.status,
            attempt_count=job.attempt_count,
            max_attempts=job.max_attempts,
            created_at=iso_timestamp(job.created_at),
            updated_at=iso_timestamp(job.updated_at),
            started_at=iso_timestamp(job.started_at),
            finished_at=iso_timestamp(job.finished_at),
            output=job.output,
            output_hash=job.output_hash,
            error=ErrorView(code=error.code, message=error.message, retryable=error.retryable) if error else None,
            cancel_requested=job.cancel_requested,
            usage=UsageView(
                input_tokens=job.usage.input_tokens,
                output_tokens=job.usage.output_tokens,
                cost_usd=float(job.usage.cost_usd),
                attempts=job.usage.attempts,
            ),
        )
