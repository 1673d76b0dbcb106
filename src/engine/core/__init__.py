"""The job's lifecycle: its types, states and rules, and what it needs of a store. No AWS in here.

- job.py: the job, its statuses and transitions, attempts, dead letters, the claim's condition
- codes.py: error codes and claim refusals
- errors.py: the error taxonomy
- outcomes.py: how an attempt ends, as a store writes it
- deliveries.py: a delivery of a message and what becomes of it
- reuse.py: answers already paid for, kept and read back for later jobs of the same request
- ports.py: the Protocols the runner, reconciler, recorder and client depend on (stores, dead letters)
- batches.py: a provider batch's record and states, and what keeps the records
- open_jobs.py, days.py: the reconciler's walk of open jobs; UTC days
"""

from engine.core.codes import ClaimRefusal, ErrorCode
from engine.core.deliveries import Ack, DeadLetterFate, Delivery, Disposition, Fate, Retry
from engine.core.job import (
    ALLOWED_TRANSITIONS,
    DEFAULT_DEADLINE_SECONDS,
    TERMINAL_STATUSES,
    AttemptOutcome,
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
    Via,
    can_transition,
    claimable,
    explain_claim_refusal,
)
from engine.core.outcomes import (
    Cancelled,
    Failed,
    Outcome,
    Released,
    Succeeded,
    Waits,
    outcome_error,
    target_status,
)
from engine.core.reuse import PaidAnswer, Reusable

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DEFAULT_DEADLINE_SECONDS",
    "TERMINAL_STATUSES",
    "Ack",
    "AttemptOutcome",
    "AttemptRecord",
    "BatchTerms",
    "Cancelled",
    "ChildOf",
    "ClaimRefusal",
    "Counted",
    "DeadLetter",
    "DeadLetterEntry",
    "DeadLetterFate",
    "Delivery",
    "Disposition",
    "ErrorCode",
    "Failed",
    "Fate",
    "Job",
    "JobDetails",
    "JobErrorInfo",
    "JobHistory",
    "JobStatus",
    "Lane",
    "NewJob",
    "Outcome",
    "PaidAnswer",
    "PipelineState",
    "Released",
    "Retry",
    "Reusable",
    "Review",
    "Settlement",
    "Succeeded",
    "Usage",
    "Via",
    "Waits",
    "can_transition",
    "claimable",
    "explain_claim_refusal",
    "outcome_error",
    "target_status",
]
