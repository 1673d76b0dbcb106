"""The outbound edge: the public views of jobs, their attempts, dead letters and batches.

Views do no I/O; the client and the completion events map the core's records to them. The job
itself, its states and rules are in engine.core; the message that asks for a job, in engine.messages.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    DeadLetterEntry,
    ErrorCode,
    Job,
    JobDetails,
    JobHistory,
    JobStatus,
    Lane,
    PipelineState,
    Via,
)
from engine.core.attachments import AttachmentInfo, AttachmentRef, MediaType
from engine.core.batches import BatchPhase, BatchRecord, BatchState


def iso_timestamp(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_ms(iso: str) -> int:
    """A time as the views write it (iso_timestamp), in epoch milliseconds."""
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


class ErrorView(BaseModel):
    code: ErrorCode
    message: str
    retryable: bool


class UsageView(BaseModel):
    input_tokens: int
    output_tokens: int
    cost_usd: float
    attempts: int
    # Parts of input_tokens and output_tokens (engine.core.Usage).
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    # What the same calls would have cost in real time at the standard tier (docs/cost.md).
    standard_cost_usd: float = 0.0


class ReviewView(BaseModel):
    """A pipeline's review (docs/pipelines.md): the output proposed, until when a person may decide,
    and the decision once given (who, when, why, whether the output was edited)."""

    output: dict[str, Any]
    started_at: str | None
    expires_at: str | None
    decision: str | None
    by: str | None
    at: str | None
    reason: str | None
    changed: bool


class PipelineView(BaseModel):
    """Where a pipeline is: the step it is on (0 first), that step's children and how many ended and
    failed, the children each step made, and its review."""

    step: int
    children: int
    ended: int
    failed: int
    counts: list[int]
    review: ReviewView | None

    @classmethod
    def of(cls, state: PipelineState) -> PipelineView:
        review = state.review
        return cls(
            step=state.step,
            children=state.children,
            ended=len(state.ended),
            failed=len(state.failed),
            counts=list(state.counts),
            review=None
            if review is None
            else ReviewView(
                output=review.output,
                started_at=iso_timestamp(review.started_at),
                expires_at=iso_timestamp(review.expires_at),
                decision=review.decision,
                by=review.by,
                at=iso_timestamp(review.at),
                reason=review.reason,
                changed=review.changed,
            ),
        )


class AttachmentView(BaseModel):
    """An attachment a job names (its reference, and the name it goes by: the one its message gave,
    else its key's last part), and what the job's latest attempt read of it: its media type (from its
    content), bytes, SHA-256, and pages or pixel size. Those are null until an attempt has read it."""

    s3: str
    name: str
    media_type: MediaType | None = None
    bytes: int | None = None
    sha256: str | None = None
    pages: int | None = None
    width: int | None = None
    height: int | None = None

    @classmethod
    def of(cls, ref: AttachmentRef, read: AttachmentInfo | None) -> AttachmentView:
        view = cls(s3=ref.uri, name=ref.label)
        if read is None:
            return view
        return view.model_copy(
            update={
                "media_type": read.media_type,
                "bytes": read.bytes,
                "sha256": read.sha256,
                "pages": read.pages,
                "width": read.width,
                "height": read.height,
            }
        )

    @property
    def extent(self) -> str | None:
        """A PDF's pages ("3 pages"), an image's pixel size ("1024 x 768"); None before it is read."""
        if self.pages is not None:
            return f"{self.pages} page{'s' if self.pages != 1 else ''}"
        if self.width is not None and self.height is not None:
            return f"{self.width} x {self.height}"
        return None


def attachment_views(job: Job) -> list[AttachmentView]:
    """Each attachment the job names, in order, with what its latest attempt read of it."""
    read = {info.ref: info for info in job.attachments_read}
    return [AttachmentView.of(ref, read.get(ref)) for ref in job.attachments]


class JobView(BaseModel):
    """The public view of a job (`aijobs status ID --json`, docs/messages.md). Fields added after the
    first ones come last, so that those keep their places."""

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
    lane: Lane
    usage: UsageView
    # How the job runs: while it runs, `batch` if it waits in a provider's batch (`batch` is then the
    # key of the batch window it joined), else `realtime`; once it has stopped, `reuse` if it took an
    # answer already paid for, else how its latest attempt ran (and that batch's provider id) where its
    # attempts were read, else null (docs/messages.md).
    via: Via | None
    batch: str | None
    # From its creation to its end, in milliseconds as the table keeps them (the times above are
    # written to the second); null while it has not ended.
    took_ms: int | None
    # The documents and images it reads, in order (docs/attachments.md); [] for a job without any.
    attachments: list[AttachmentView]
    # The data job type's version it runs (docs/jobtypes.md); null for a code job type, and for a
    # submitted data job until its first claim has finished.
    job_type_version: int | None = None
    # A pipeline's child: its parent's id and the step it runs for; a pipeline: where it is
    # (docs/pipelines.md). Null otherwise.
    parent_id: str | None = None
    step: str | None = None
    pipeline: PipelineView | None = None
    # A job that took the answer another job of the same request paid for (`via` reuse, no call):
    # that job's id (docs/reuse.md). Null otherwise.
    reused_from: str | None = None

    @classmethod
    def from_job(cls, job: Job, latest: AttemptRecord | None = None) -> JobView:
        """The job's view; `latest`, its latest attempt record when they were read."""
        error = job.error
        via, batch = _how_it_runs(job, latest)
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
            lane=job.lane,
            usage=UsageView(
                input_tokens=job.usage.input_tokens,
                output_tokens=job.usage.output_tokens,
                cost_usd=float(job.usage.cost_usd),
                attempts=job.usage.attempts,
                cached_input_tokens=job.usage.cached_input_tokens,
                cache_write_input_tokens=job.usage.cache_write_input_tokens,
                reasoning_tokens=job.usage.reasoning_tokens,
                standard_cost_usd=float(job.usage.standard_cost_usd),
            ),
            via=via,
            batch=batch,
            took_ms=None if job.finished_at is None else job.finished_at - job.created_at,
            attachments=attachment_views(job),
            job_type_version=job.job_type_version,
            parent_id=job.parent.parent_id if job.parent else None,
            step=job.parent.step if job.parent else None,
            pipeline=PipelineView.of(job.pipeline) if job.pipeline else None,
            reused_from=job.reused_from,
        )

    @property
    def in_batch(self) -> bool:
        """Whether the job waits in a provider's batch now (`batch` is the key of its window)."""
        return self.status is JobStatus.RUNNING and self.via is Via.BATCH

    @property
    def batch_window_at(self) -> str | None:
        """While it waits in a batch, when the window it joined opened (the window's key is that time in
        epoch milliseconds; a key of another form is given as it is)."""
        if not self.in_batch or self.batch is None:
            return None
        return iso_timestamp(int(self.batch)) if self.batch.isdigit() else self.batch


def _how_it_runs(job: Job, latest: AttemptRecord | None) -> tuple[Via | None, str | None]:
    if job.status is JobStatus.RUNNING:
        return (Via.BATCH, job.batch) if job.batch is not None else (Via.REALTIME, None)
    if job.reused_from is not None:
        return Via.REUSE, None
    if latest is not None:
        return latest.via, latest.batch_id
    return None, None


class AttemptView(BaseModel):
    """One attempt record as `aijobs inspect` shows it; token kinds as in UsageView."""

    attempt: int
    started_at: str | None
    finished_at: str | None
    duration_ms: int
    outcome: AttemptOutcome
    error_code: ErrorCode | None
    provider: str | None
    model: str | None
    tier: str | None
    prompt_key: str | None
    prompt_version: str | None
    calls: int
    input_tokens: int
    cached_input_tokens: int
    cache_write_input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cost_usd: float
    cache_savings_usd: float
    latency_ms: int
    # False: a call went to a model with no price, so cost_usd is unknown (recorded as 0).
    priced: bool
    # How its first call was made, and for a batch the provider's batch id.
    via: Via
    batch_id: str | None
    # The data job type's version it ran; null for a code job type.
    job_type_version: int | None = None
    # Re-asks after an answer failed validation; for an attempt whose answer was refused in the end,
    # that answer as the model gave it (its first 16,384 characters) and the sha256 of the prompt;
    # past those characters, where the whole answer is (an s3:// URI in the payload bucket).
    reasks: int = 0
    refused_answer: str | None = None
    prompt_sha256: str | None = None
    refused_answer_s3: str | None = None
    # An attempt that took another job's answer (`via` reuse, no call): that job's id.
    reused_from: str | None = None
    # What the same calls would have cost in real time at the standard tier, and the service tier the
    # provider said served the answer ("flex", "default", ...; null when it said none): docs/cost.md.
    standard_cost_usd: float = 0.0
    service_tier: str | None = None

    @classmethod
    def from_record(cls, record: AttemptRecord) -> AttemptView:
        return cls(
            attempt=record.attempt,
            started_at=iso_timestamp(record.started_at),
            finished_at=iso_timestamp(record.finished_at),
            duration_ms=record.finished_at - record.started_at,
            outcome=record.outcome,
            error_code=record.error_code,
            provider=record.provider,
            model=record.model,
            tier=record.tier,
            prompt_key=record.prompt_key,
            prompt_version=record.prompt_version,
            calls=record.calls,
            input_tokens=record.input_tokens,
            cached_input_tokens=record.cached_input_tokens,
            cache_write_input_tokens=record.cache_write_input_tokens,
            output_tokens=record.output_tokens,
            reasoning_tokens=record.reasoning_tokens,
            cost_usd=float(record.cost_usd),
            cache_savings_usd=float(record.cache_savings_usd),
            latency_ms=record.latency_ms,
            priced=record.priced,
            via=record.via,
            batch_id=record.batch_id,
            job_type_version=record.job_type_version,
            reasks=record.reasks,
            refused_answer=record.refused_answer,
            prompt_sha256=record.prompt_sha256,
            refused_answer_s3=record.refused_answer_s3,
            reused_from=record.reused_from,
            standard_cost_usd=float(record.standard_cost_usd),
            service_tier=record.service_tier,
        )


class DeadLetterView(BaseModel):
    """A dead letter without its body (`aijobs dead-letters`, `aijobs inspect`)."""

    message_id: str
    recorded_at: str | None
    job_id: str | None
    receive_count: int
    reason: str

    @classmethod
    def from_entry(cls, entry: DeadLetterEntry) -> DeadLetterView:
        return cls(
            message_id=entry.message_id,
            recorded_at=iso_timestamp(entry.recorded_at),
            job_id=entry.job_id,
            receive_count=entry.receive_count,
            reason=entry.reason,
        )


class LeaseView(BaseModel):
    """Who holds a running job and until when; `expired`: its worker died, the next delivery takes it over."""

    owner: str | None
    expires_at: str | None
    expired: bool


class JobInspection(BaseModel):
    """What happened to a job and what it cost (`aijobs inspect ID --json`)."""

    job: JobView
    attempts: list[AttemptView]
    dead_letters: list[DeadLetterView]
    lease: LeaseView | None
    # A pipeline's children, step by step in the order each made them (docs/pipelines.md).
    children: list[JobView] = []

    @classmethod
    def of(cls, job: Job, history: JobHistory, now_ms: int, children: list[Job] | None = None) -> JobInspection:
        lease = None
        if job.status is JobStatus.RUNNING:
            lease = LeaseView(
                owner=job.lease_owner,
                expires_at=iso_timestamp(job.lease_expires_at),
                expired=job.lease_remaining_ms(now_ms) == 0,
            )
        return cls(
            job=JobView.from_job(job, history.attempts[-1] if history.attempts else None),
            attempts=[AttemptView.from_record(record) for record in history.attempts],
            dead_letters=[DeadLetterView.from_entry(entry) for entry in history.dead_letters],
            lease=lease,
            children=[JobView.from_job(child) for child in children or ()],
        )


class JobDetailsView(JobInspection):
    """A job's inspection and its stored input, as JSON text (None when it has none stored)."""

    input_json: str | None

    @classmethod
    def of_details(cls, details: JobDetails, now_ms: int, children: list[Job] | None = None) -> JobDetailsView:
        inspection = JobInspection.of(details.job, details.history, now_ms, children)
        return cls(**dict(inspection), input_json=details.input_json)


# The times of a batch record, in epoch milliseconds there and written as ISO in its view.
_BATCH_TIMES = ("created_at", "updated_at", "rescue_at", "abandon_at", "ended_at")


class BatchView(BaseModel):
    """A batch's record (engine.core.batches) as `aijobs batches` shows it (docs/batches.md)."""

    key: str
    model: str
    provider: str
    phase: BatchPhase
    # The provider's state as last read, and what the provider said of it.
    state: BatchState | None
    detail: str
    lines: int
    batch_id: str | None
    created_at: str
    updated_at: str
    # When it is cancelled (the rescue time of its job with the latest deadline), and when its next
    # job it has not answered goes back to real time (each at its own hand-back time).
    rescue_at: str
    abandon_at: str
    ended_at: str | None
    # Lines the provider answered and failed so far.
    answered: int
    failed: int
    # Every job of it reached its hand-back time before it ended (the unanswered ones went back).
    handed_back: bool
    # Of its jobs: finished with its answer, and handed back to real time.
    finished: int
    returned: int

    @classmethod
    def from_record(cls, record: BatchRecord) -> BatchView:
        """The record's fields of the same names (not its bookkeeping), its times written as the views write them."""
        fields = asdict(record)
        return cls.model_validate(fields | {name: iso_timestamp(fields[name]) for name in _BATCH_TIMES})

    @property
    def in_flight(self) -> bool:
        return self.phase.in_flight

    @property
    def provider_status(self) -> str:
        """The provider's state as last read, and what it said when that says more: "pending: in_progress"."""
        state = self.state.value if self.state else "-"
        return f"{state}: {self.detail}" if self.detail and self.detail != state else state

    def age_ms(self, now_ms: int) -> int:
        return max(now_ms - epoch_ms(self.created_at), 0)

    def rescue_in_ms(self, now_ms: int) -> int | None:
        """How long until its rescue time (0 or less: it has passed); None once it has ended."""
        return epoch_ms(self.rescue_at) - now_ms if self.in_flight else None
