"""The error taxonomy: one root, narrow subclasses that carry their context.

Classification happens where a driver error is caught (the gateway for providers, the store
for DynamoDB), by exception type and HTTP status, never by reading message text.
"""

from __future__ import annotations

from engine.core.codes import ClaimRefusal, ErrorCode
from engine.core.job import Job, JobErrorInfo
from engine.text import one_line


class AiJobsError(Exception):
    """Root of every error the engine raises on purpose."""


class ConfigurationError(AiJobsError):
    """A missing or malformed setting; the message names the variable."""


class MissingSettingsError(ConfigurationError):
    """Required settings are absent; `variables` names every one of them."""

    def __init__(self, message: str, variables: tuple[str, ...]) -> None:
        super().__init__(message)
        self.variables = variables


# --- Job errors: end an attempt, carry the code recorded on the job -------------------------


class JobError(AiJobsError):
    """An error that ends an attempt; `code` is what the job records."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR
    retryable: bool = False

    def __init__(self, message: str) -> None:
        # Reasons are recorded and printed as one bounded line, whatever text (keys, answers) they quote.
        message = one_line(message)
        super().__init__(message)
        self.message = message

    def info(self) -> JobErrorInfo:
        """The error as the job records it."""
        return JobErrorInfo(code=self.code, message=self.message, retryable=self.retryable)


class RetryableError(JobError):
    retryable = True
    # Whether the attempt counts against the job's attempt budget.
    consumes_attempt: bool = True


class PermanentError(JobError):
    retryable = False


class ProviderRateLimitedError(RetryableError):
    code = ErrorCode.PROVIDER_RATE_LIMITED
    consumes_attempt = False

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class FlexUnavailableError(ProviderRateLimitedError):
    """The provider's flex tier did not serve a call (docs/cost.md): a 429 "resource unavailable", or no
    answer within the flex timeout (`later`: capacity may come back, so the job may wait for it); or
    the tier refused the model or the account outright (`later` False: waiting would not help).
    Recorded as the 429 it is: a later try does not spend an attempt, and the deadline bounds it."""

    def __init__(self, message: str, retry_after_seconds: float | None = None, later: bool = True) -> None:
        super().__init__(message, retry_after_seconds)
        self.later = later


class ProviderTimeoutError(RetryableError):
    code = ErrorCode.PROVIDER_TIMEOUT


class ProviderUnavailableError(RetryableError):
    code = ErrorCode.PROVIDER_UNAVAILABLE


class InternalError(RetryableError):
    code = ErrorCode.INTERNAL_ERROR


class ProviderRejectedError(PermanentError):
    code = ErrorCode.PROVIDER_REJECTED

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class SchemaValidationError(PermanentError):
    code = ErrorCode.SCHEMA_VALIDATION_FAILED


class BusinessValidationError(PermanentError):
    code = ErrorCode.BUSINESS_VALIDATION_FAILED


class ReferenceValidationError(PermanentError):
    code = ErrorCode.REFERENCE_VALIDATION_FAILED


class InputValidationError(PermanentError):
    code = ErrorCode.INPUT_VALIDATION_FAILED


class UnknownJobTypeError(PermanentError):
    code = ErrorCode.UNKNOWN_JOB_TYPE


class SchemaVersionMismatchError(PermanentError):
    code = ErrorCode.SCHEMA_VERSION_MISMATCH


class MaxAttemptsExceededError(PermanentError):
    code = ErrorCode.MAX_ATTEMPTS_EXCEEDED


class DeadlineExceededError(PermanentError):
    code = ErrorCode.DEADLINE_EXCEEDED


class OutputTooLargeError(PermanentError):
    """The model's answer is larger than a job can store; its tokens and cost are still recorded."""

    code = ErrorCode.OUTPUT_TOO_LARGE


class BudgetExceededError(PermanentError):
    """The user's daily budget stayed spent until the job's deadline; no provider call was made."""

    code = ErrorCode.BUDGET_EXCEEDED


class AttachmentInvalidError(PermanentError):
    """An attachment is unreadable, of a type the job type does not take, past a provider's limit, gone,
    or in a bucket the stack may not read; no provider call was made (docs/attachments.md)."""

    code = ErrorCode.ATTACHMENT_INVALID


class StepFailedError(PermanentError):
    """A pipeline's child failed, and its step tolerates no more failures (docs/pipelines.md)."""

    code = ErrorCode.STEP_FAILED


class ReviewRejectedError(PermanentError):
    """A person rejected a pipeline's output at its review step, with a reason."""

    code = ErrorCode.REVIEW_REJECTED


class ReviewTimeoutError(PermanentError):
    """A pipeline's review was not given within its step's `timeout_seconds`."""

    code = ErrorCode.REVIEW_TIMEOUT


class PipelineStateError(AiJobsError):
    """A review decision or a pipeline action that the job's state does not allow (not waiting for a
    review, an edited output its schema refuses); the message is one line naming why."""


def deadline_error(job: Job, why: str) -> PermanentError:
    """How a job whose deadline passed (`why`) ends: `budget_exceeded` when it was waiting for its
    user's budget (its error says so), else `deadline_exceeded`."""
    if job.error is not None and job.error.code is ErrorCode.BUDGET_EXCEEDED:
        return BudgetExceededError(f"{why}; the user's daily budget stayed spent until then")
    return DeadlineExceededError(why)


# --- Store errors: a conditional write was refused, explained by the item it met ------------


# --- Job types as data (docs/jobtypes.md): a file refused at push, a label move refused ----------


class JobTypeError(AiJobsError):
    """A job type file or a label move that cannot be done; the message is one line naming why."""


class JobTypeFileError(JobTypeError):
    """A job type file refused at push: an invalid schema, a template field the input lacks, a rule
    that does not compile, an example that fails, a bound passed."""


class JobTypeLabelError(JobTypeError):
    """A promote or rollback refused: no such job type or version, nothing to roll back to, a move raced."""


class ConditionRefusedError(AiJobsError):
    """A conditional write did not apply; `job` is the job as DynamoDB had it (None if absent)."""

    def __init__(self, message: str, job: Job | None) -> None:
        super().__init__(message)
        self.job = job


class ClaimRefusedError(ConditionRefusedError):
    def __init__(self, job: Job, reason: ClaimRefusal) -> None:
        super().__init__(f"job {job.job_id} cannot be claimed: {reason.value}", job)
        self.reason = reason
        self.refused_job = job


class LeaseLostError(ConditionRefusedError):
    """The finishing write met a job this worker no longer holds."""


class UnreadKeysError(AiJobsError):
    """The store was left keys unread on every try of a batch read (throttled): it passes by itself.
    `keys` names them (`pk/sk`)."""

    def __init__(self, table_name: str, keys: list[str], tries: int) -> None:
        shown = ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")
        super().__init__(f"{len(keys)} keys of table {table_name} left unread after {tries} tries: {shown}")
        self.table_name = table_name
        self.keys = keys


class PayloadMissingError(AiJobsError):
    """A referenced payload is gone from the payload bucket (expired with its lifecycle, or deleted)."""


class CancelRequestedError(AiJobsError):
    """The finishing fence met a cancel request: the job ends `cancelled`, its output discarded."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled while it ran")
        self.job_id = job_id


class JobStateError(AiJobsError):
    """An operation the job's current state does not allow (e.g. retrying a job that did not fail)."""


class JobNotFailedError(JobStateError):
    """A retry of a job that is not `failed` (queued, running, or ended otherwise): nothing to run again."""


class JobNotFoundError(AiJobsError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class JobConflictError(AiJobsError):
    """A job id was reused with a different job type, user or input."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} already exists with a different job type, user or input")
        self.job_id = job_id
