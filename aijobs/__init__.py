"""aijobs: the client API and the `aijobs` command for the aijobs engine.

`from aijobs import AiJobsClient, JobNotFoundError, ...`: the client, what its calls return, and
every error they raise on purpose, each a subclass of `AiJobsError` (docs/errors.md); `wait` also
raises the built-in `TimeoutError`. Each is imported on first use, so that a program importing only a
submodule (the local stack's Lambda event builders, say) does not load the client and the engine
with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # each name as its own alias: what this module exports (PEP 484)
    from aijobs.arguments import InvalidArgumentError as InvalidArgumentError
    from aijobs.attachments import NamedAttachment as NamedAttachment
    from aijobs.client import AiJobsClient as AiJobsClient
    from aijobs.client import RedriveOutcome as RedriveOutcome
    from aijobs.client import RedriveResult as RedriveResult
    from aijobs.client import SubmitResult as SubmitResult
    from engine.core.errors import AiJobsError as AiJobsError
    from engine.core.errors import AttachmentInvalidError as AttachmentInvalidError
    from engine.core.errors import ConditionRefusedError as ConditionRefusedError
    from engine.core.errors import ConfigurationError as ConfigurationError
    from engine.core.errors import InputValidationError as InputValidationError
    from engine.core.errors import JobConflictError as JobConflictError
    from engine.core.errors import JobError as JobError
    from engine.core.errors import JobNotFailedError as JobNotFailedError
    from engine.core.errors import JobNotFoundError as JobNotFoundError
    from engine.core.errors import JobStateError as JobStateError
    from engine.core.errors import JobTypeError as JobTypeError
    from engine.core.errors import JobTypeFileError as JobTypeFileError
    from engine.core.errors import JobTypeLabelError as JobTypeLabelError
    from engine.core.errors import MissingSettingsError as MissingSettingsError
    from engine.core.errors import PayloadMissingError as PayloadMissingError
    from engine.core.errors import PipelineStateError as PipelineStateError
    from engine.core.errors import SchemaVersionMismatchError as SchemaVersionMismatchError
    from engine.core.errors import UnknownJobTypeError as UnknownJobTypeError
    from engine.core.errors import UnreadKeysError as UnreadKeysError

# Each name, and the module that defines it.
_EXPORTS = {
    "AiJobsClient": "aijobs.client",
    "SubmitResult": "aijobs.client",
    "RedriveOutcome": "aijobs.client",
    "RedriveResult": "aijobs.client",
    # An attachment of `submit` with a name of its own.
    "NamedAttachment": "aijobs.attachments",
    # The root of every error below.
    "AiJobsError": "engine.core.errors",
    # No stack configured, a setting missing or malformed, a deployed stack unusable.
    "ConfigurationError": "engine.core.errors",
    "MissingSettingsError": "engine.core.errors",
    # `submit`: a job that could never run (each a JobError carrying the code a job would record).
    "JobError": "engine.core.errors",
    "InputValidationError": "engine.core.errors",
    "InvalidArgumentError": "aijobs.arguments",
    "UnknownJobTypeError": "engine.core.errors",
    "SchemaVersionMismatchError": "engine.core.errors",
    "AttachmentInvalidError": "engine.core.errors",
    # `submit` of a job id taken by another job; `get`, `inspect`, `cancel`, `retry` of no such job.
    "JobConflictError": "engine.core.errors",
    "JobNotFoundError": "engine.core.errors",
    # `retry` of a job that is not failed, or has no stored input.
    "JobStateError": "engine.core.errors",
    "JobNotFailedError": "engine.core.errors",
    # `cancel` of a job that kept changing while it was cancelled.
    "ConditionRefusedError": "engine.core.errors",
    # A read the table throttled on every try (it passes by itself), an input gone from the bucket.
    "UnreadKeysError": "engine.core.errors",
    "PayloadMissingError": "engine.core.errors",
    # Data job types: a file `push_job_type` refuses; a label move, a name or a version there is not.
    "JobTypeError": "engine.core.errors",
    "JobTypeFileError": "engine.core.errors",
    "JobTypeLabelError": "engine.core.errors",
    "PipelineStateError": "engine.core.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'aijobs' has no attribute {name!r}")
