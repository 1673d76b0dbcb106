"""The inbound edge: the SQS message that asks for a job, and the field types it is made of.

The message does no I/O; engine.intake parses a body into it and maps it to a request. The job
itself, its states and rules are in engine.core; what the client shows of a job, in engine.views.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

JobId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
UserId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")]
JobTypeName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]

MaxAttempts = Annotated[int, Field(ge=1, le=10)]
# A lane as a message names it (engine.core.Lane).
LaneName = Literal["interactive", "background"]
# Bounded so that every number a message carries fits a DynamoDB number.
SchemaVersion = Annotated[int, Field(ge=1, le=1_000_000)]
JobTypeVersion = Annotated[int, Field(ge=1, le=1_000_000)]

MIN_DEADLINE_SECONDS = 60
MAX_DEADLINE_SECONDS = 604_800
# The most attachments a message names (engine.core.attachments.MAX_ATTACHMENTS).
MAX_ATTACHMENTS = 20
# s3://BUCKET/KEY: a bucket's name (S3's rules: 3-63 of a-z 0-9 . -) and a key of 1-1024 characters.
AttachmentUri = Annotated[
    str, StringConstraints(max_length=1100, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.{1,1024}$")
]
# The name it goes by: 1-255 characters, no path separators.
AttachmentName = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^/\\]+$")]


class AttachmentSpec(BaseModel):
    """One attachment a message names (docs/attachments.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    s3: AttachmentUri
    name: AttachmentName | None = None


class JobMessage(BaseModel):
    """The body of a message on the jobs queue (docs/messages.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    job_id: JobId | None = None
    job_type: JobTypeName | None = None
    user_id: UserId | None = None
    input: dict[str, Any] | None = None
    schema_version: SchemaVersion | None = None
    max_attempts: MaxAttempts | None = None
    deadline_seconds: Annotated[int, Field(ge=MIN_DEADLINE_SECONDS, le=MAX_DEADLINE_SECONDS)] | None = None
    # Absent: the lane of the queue the message was sent to.
    lane: LaneName | None = None
    attachments: Annotated[list[AttachmentSpec], Field(max_length=MAX_ATTACHMENTS)] | None = None
    # A data job type's version to run (docs/jobtypes.md); absent: its label's at the first claim.
    job_type_version: JobTypeVersion | None = None

    @property
    def is_reference(self) -> bool:
        """A body of only a job id refers to a job created beforehand."""
        return self.model_fields_set == {"job_id"}
