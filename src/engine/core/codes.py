"""The codes a job's error carries, and why a claim was refused: enums, shared by every layer."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """What a failed or retried job records (docs/errors.md)."""

    PROVIDER_RATE_LIMITED = "provider_rate_limited"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    PROVIDER_REJECTED = "provider_rejected"
    SCHEMA_VALIDATION_FAILED = "schema_validation_failed"
    BUSINESS_VALIDATION_FAILED = "business_validation_failed"
    REFERENCE_VALIDATION_FAILED = "reference_validation_failed"
    INPUT_VALIDATION_FAILED = "input_validation_failed"
    UNKNOWN_JOB_TYPE = "unknown_job_type"
    SCHEMA_VERSION_MISMATCH = "schema_version_mismatch"
    MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DEAD_LETTERED = "dead_lettered"
    OUTPUT_TOO_LARGE = "output_too_large"
    BUDGET_EXCEEDED = "budget_exceeded"
    INTERNAL_ERROR = "internal_error"
    ATTACHMENT_INVALID = "attachment_invalid"
    STEP_FAILED = "step_failed"
    REVIEW_REJECTED = "review_rejected"
    REVIEW_TIMEOUT = "review_timeout"


class ClaimRefusal(StrEnum):
    """Why a claim's condition failed, read from the job it met."""

    FINISHED = "finished"
    HELD = "held"
    CONFLICT = "conflict"
    CANCEL_REQUESTED = "cancel_requested"
    ATTEMPTS_SPENT = "attempts_spent"
    DEADLINE_PASSED = "deadline_passed"
    RACED = "raced"
    # A pipeline waiting for its children or a review (docs/pipelines.md).
    WAITING = "waiting"
    # Claimable, but not into a provider's batch: its deadline is too near (docs/batches.md).
    NOT_BATCHABLE = "not_batchable"
