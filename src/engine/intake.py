"""Parse at the edge: an SQS body becomes a `JobRequest`, or a `BadMessageError` with one clear reason."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from engine.core import Lane, NewJob
from engine.core.attachments import AttachmentRef, ref_documents
from engine.core.errors import (
    AiJobsError,
    AttachmentInvalidError,
    InputValidationError,
    JobError,
    SchemaVersionMismatchError,
)
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.base import one_line_error
from engine.messages import JobId, JobMessage, JobTypeName, LaneName, MaxAttempts, UserId
from engine.text import json_integer, json_value_problem

_job_id_adapter: TypeAdapter[str] = TypeAdapter(JobId)
# The fields of a bad message worth keeping on its failed job, each kept only when valid: a value
# that breaks its own rule (a 600 KB job_type, a max_attempts of 10**200) is not stored.
_KEPT_FIELDS: dict[str, TypeAdapter[Any]] = {
    "job_type": TypeAdapter(JobTypeName),
    "user_id": TypeAdapter(UserId),
    "max_attempts": TypeAdapter(MaxAttempts),
    "lane": TypeAdapter(LaneName),
}


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A message that can be claimed: a new job in full, or a reference to an existing one."""

    job_id: str
    new_job: NewJob | None = None
    definition: JobDefinition | None = None
    job_input: BaseModel | None = None
    raw_input: dict[str, Any] | None = None


class BadMessageError(AiJobsError):
    """A message that cannot run. With a job id it becomes a failed job, else a dead letter."""

    def __init__(self, error: JobError, job_id: str | None = None, fields: dict[str, Any] | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.job_id = job_id
        self.fields = fields or {}

    def known(self, name: str) -> Any:
        """A field of the message worth keeping on the failed job, when it is valid; else None."""
        if name not in self.fields:
            return None
        try:
            return _KEPT_FIELDS[name].validate_python(self.fields[name], strict=True)
        except ValidationError:
            return None


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    # surrogatepass: a hash needs the same bytes for the same text, not valid UTF-8.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_hash(
    job_type: str, user_id: str, job_input: dict[str, Any], attachments: tuple[AttachmentRef, ...] = ()
) -> str:
    """What makes two submissions of one job id the same job (its attachments included, when it has some)."""
    request: dict[str, Any] = {"job_type": job_type, "user_id": user_id, "input": job_input}
    if attachments:
        request["attachments"] = ref_documents(attachments)
    return sha256_hex(canonical_json(request))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_message(body: str, message_id: str, registry: JobRegistry, lane: Lane = Lane.INTERACTIVE) -> JobRequest:
    """The request a body makes; a new job runs in the lane it names, else in `lane` (its queue's)."""
    try:
        # Strict JSON: NaN and Infinity are JavaScript, not JSON, and no store can hold them. An
        # integer too long to convert is refused below, once the job id is known, as any bad value.
        raw = json.loads(body, parse_constant=_refuse_constant, parse_int=json_integer)
    except (ValueError, RecursionError) as exc:
        raise BadMessageError(InputValidationError(f"message body is not JSON: {exc}")) from exc
    if not isinstance(raw, dict):
        raise BadMessageError(InputValidationError(f"message body is a JSON {type(raw).__name__}, not an object"))
    job_id = _job_id(raw, message_id)
    if problem := json_value_problem(raw, "message"):
        raise BadMessageError(InputValidationError(problem), job_id, raw)
    try:
        message = JobMessage.model_validate(raw)
    except ValidationError as exc:
        raise BadMessageError(InputValidationError(one_line_error(exc, "message")), job_id, raw) from exc
    if message.is_reference:
        return JobRequest(job_id=job_id)
    if message.job_type is None or message.user_id is None or message.input is None:
        missing = [name for name in ("job_type", "user_id", "input") if getattr(message, name) is None]
        reason = f"message lacks {', '.join(missing)} (a message of only a job_id refers to an existing job)"
        raise BadMessageError(InputValidationError(reason), job_id, raw)
    try:
        return _new_job_request(
            job_id, message, message.job_type, message.user_id, message.input, registry, Lane(message.lane or lane)
        )
    except JobError as exc:
        raise BadMessageError(exc, job_id, raw) from exc


def _job_id(raw: dict[str, Any], message_id: str) -> str:
    if "job_id" not in raw:
        return message_id
    try:
        return _job_id_adapter.validate_python(raw["job_id"], strict=True)
    except ValidationError as exc:
        # A job id we cannot use names no job: the message is kept as a dead letter instead.
        raise BadMessageError(InputValidationError(one_line_error(exc, "message.job_id"))) from exc


def _new_job_request(
    job_id: str,
    message: JobMessage,
    job_type: str,
    user_id: str,
    raw_input: dict[str, Any],
    registry: JobRegistry,
    lane: Lane,
) -> JobRequest:
    # A data job type's version is fixed here, once: the pinned one, or the one its labels serve this user.
    definition = registry.resolve(job_type, user_id, message.job_type_version)
    if message.schema_version is not None and message.schema_version != definition.schema_version:
        raise SchemaVersionMismatchError(
            f"message schema_version {message.schema_version} != {job_type} schema version {definition.schema_version}"
        )
    job_input = definition.parse_input(raw_input)
    attachments = tuple(AttachmentRef.parse(spec.s3, spec.name) for spec in message.attachments or ())
    check_attachment_count(definition, len(attachments))
    check_something_to_read(definition, job_input, len(attachments))
    new_job = NewJob(
        job_type=job_type,
        user_id=user_id,
        schema_version=definition.schema_version,
        max_attempts=message.max_attempts or definition.max_attempts,
        deadline_seconds=message.deadline_seconds or definition.deadline_seconds,
        request_hash=request_hash(job_type, user_id, raw_input, attachments),
        lane=lane,
        attachments=attachments,
        job_type_version=definition.job_type_version,
    )
    return JobRequest(job_id, new_job, definition, job_input, raw_input)


def check_attachment_count(definition: JobDefinition, count: int) -> None:
    """A job type that takes no attachments, or fewer (or more) than a message names, refuses them."""
    policy = definition.attachments
    if count and not policy.takes_any:
        raise AttachmentInvalidError(f"{definition.name} takes no attachments; the message names {count}")
    if count > policy.max_count:
        raise AttachmentInvalidError(f"{definition.name} takes at most {_attachments(policy.max_count)}, not {count}")
    if count < policy.min_count:
        raise AttachmentInvalidError(f"{definition.name} takes at least {_attachments(policy.min_count)}, not {count}")


def _attachments(count: int) -> str:
    return f"{count} attachment" if count == 1 else f"{count} attachments"


def check_something_to_read(definition: JobDefinition, job_input: BaseModel, count: int) -> None:
    """A job type that reads a text or attachments (its policy's `required_unless`) refuses a job that
    has neither: the field is empty and the message names no attachment (input_validation_failed,
    since the input is what lacks it)."""
    instead = definition.attachments.required_unless
    if instead is not None and not count and not getattr(job_input, instead):
        raise InputValidationError(
            f"input.{instead}: {definition.name} needs a {instead} or at least one attachment, and has neither"
        )
