"""The client API: what the CLI uses and what applications can import.

Submitting stores the job (`queued`, input stored once) and enqueues a message that refers to it
by id, so the message stays small whatever the input's size; the files it attaches are uploaded to
the payload bucket first (aijobs.attachments).
"""

from __future__ import annotations

import getpass
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import TypeAdapter, ValidationError

from aijobs.arguments import InvalidArgumentError, quoted
from aijobs.attachments import Attachable, AttachmentBucket, SizeLimits, prepare
from aijobs.deployed import load_stack_settings
from aijobs.job_types import documents_diff, read_job_type
from aijobs.target import StackTarget
from engine.config import Settings, load_settings
from engine.core import DeadLetter, Job, JobStatus, Lane
from engine.core.attachments import AttachmentRef
from engine.core.batches import BatchRecords
from engine.core.errors import (
    AiJobsError,
    ConfigurationError,
    InputValidationError,
    JobNotFailedError,
    JobNotFoundError,
    JobStateError,
    JobTypeLabelError,
    PipelineStateError,
)
from engine.core.job_types import Canary, Guard, JobTypeHead, StoredVersion, VersionStats
from engine.core.ports import AdminStore, JobTypeStore, PipelineStore
from engine.decisions import output_hash
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.base import one_line_error
from engine.definitions.data_steps import StepTarget
from engine.definitions.pipelines import PipelineDefinition
from engine.fleet.budgets import BudgetDay
from engine.intake import BadMessageError, parse_message
from engine.messages import JobMessage, UserId
from engine.pipelines import children_ids, decided_review
from engine.queue import JobQueue, JobQueues, QueueDepth
from engine.store import JobListing, UsageLedger, UsageReport, UsageRow
from engine.store.attachments import ObjectStream
from engine.store.batches import BatchTable
from engine.store.budgets import BudgetTable
from engine.store.listing import MAX_OUTLINED, JobFilter, JobOutlines, ListingCursor
from engine.views import (
    AttachmentView,
    BatchView,
    DeadLetterView,
    JobDetailsView,
    JobInspection,
    JobView,
    iso_timestamp,
)
from engine.wiring import Aws, build_queues, build_store

# The most a daily budget may be (as AIJOBS_DEFAULT_DAILY_BUDGET_USD).
MAX_DAILY_BUDGET_USD = Decimal(1_000_000_000)
_USER_ID: TypeAdapter[str] = TypeAdapter(UserId)
# What makes an id, said in the words of a person who wrote a bad one (engine.messages.UserId, JobId).
_ID_RULES = {
    "user_id": "a user id: 1-128 characters of A-Z a-z 0-9 . _ : @ -",
    "job_id": "a job id: 1-128 characters of A-Z a-z 0-9 . _ : -",
}


def check_user_id(user_id: str) -> str:
    """`user_id` when it is a user id; else InvalidArgumentError saying what one is."""
    try:
        return _USER_ID.validate_python(user_id, strict=True)
    except ValidationError as exc:
        raise InvalidArgumentError("user_id", f"{quoted(user_id)} is not {_ID_RULES['user_id']}") from exc


def _check_message(message: dict[str, Any]) -> None:
    """The submission's fields as a message (engine.messages.JobMessage), each refused by its name."""
    try:
        JobMessage.model_validate(message)
    except ValidationError as exc:
        first = exc.errors()[0]
        argument = str(first["loc"][0]) if first["loc"] else "message"
        if argument in _ID_RULES:
            raise InvalidArgumentError(argument, f"{quoted(message[argument])} is not {_ID_RULES[argument]}") from exc
        raise InvalidArgumentError(argument, first["msg"]) from exc


def input_problem(definition: JobDefinition, job_input: Any) -> str | None:
    """What is wrong with an input for a job type, naming the fields written and the fields it takes:
    a field it does not take first (a misspelt name also shows as a missing one), then a missing
    field, then any other; None when the input model accepts it."""
    if not isinstance(job_input, dict):
        return f"must be a JSON object, not {type(job_input).__name__}"
    if definition.job_type_version is not None:
        # A data job type validates with its file's JSON schema: its input model is no pydantic model
        # of named fields, and its parse_input's message already names the field.
        try:
            definition.parse_input(job_input)
        except InputValidationError as exc:
            return str(exc).removeprefix("input: ").removeprefix("input.")
        return None
    try:
        definition.input_model.model_validate(job_input)
    except ValidationError as exc:
        errors = exc.errors()
        model_fields = definition.input_model.model_fields
        takes = f"{definition.name} takes {', '.join(field.alias or name for name, field in model_fields.items())}"
        for kind, word in (("extra_forbidden", "unknown"), ("missing", "missing")):
            for error in errors:
                if error["type"] == kind:
                    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"][:-1])
                    name = quoted(str(error["loc"][-1]))
                    where = f" in {path.removeprefix('.')}" if path else f" ({takes})"
                    return f"{word} field {name}{where}"
        return one_line_error(exc, "")
    return None


@dataclass(frozen=True, slots=True)
class PushResult:
    """A pushed job type file: the version it is, and whether the push stored it (False: a version
    of the name already had that content)."""

    name: str
    version: int
    created: bool


@dataclass(frozen=True, slots=True)
class JobTypeListing:
    """One job type as `aijobs types list` has it: `code` (deployed with the functions, no versions)
    or `data` (a file pushed: its newest version, production and any canary)."""

    name: str
    kind: str
    latest: int | None = None
    production: int | None = None
    canary: Canary | None = None


@dataclass(frozen=True, slots=True)
class SubmitResult:
    job_id: str
    created: bool
    status: JobStatus


class RedriveOutcome(StrEnum):
    REQUEUED = "requeued"  # the job it names was failed: it is queued again, its message sent
    SKIPPED = "skipped"  # the job it names is not failed (queued, running, or ended otherwise)
    NO_JOB = "no_job"  # its body names no job: nothing is re-sent
    ERROR = "error"  # no such dead letter or job, or the job cannot run again (no stored input)


@dataclass(frozen=True, slots=True)
class RedriveResult:
    message_id: str
    job_id: str | None
    outcome: RedriveOutcome
    detail: str

    @property
    def redriven(self) -> bool:
        """Whether nothing is left to do: its job is queued again, or was not failed."""
        return self.outcome in {RedriveOutcome.REQUEUED, RedriveOutcome.SKIPPED}


@dataclass(frozen=True, slots=True)
class AttachmentDownload:
    """An attachment a job names, and its object's bytes as they are now, in pieces."""

    attachment: AttachmentView
    content: ObjectStream


@dataclass(frozen=True, slots=True)
class JobViewPage:
    """A page of a job listing (engine.store.listing.JobPage) as views; `next_cursor` None at the end."""

    jobs: list[JobView]
    read: int
    newest_at: str | None
    oldest_at: str | None
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Health:
    """The queues' depths by name, the dead-letter queue's (when known), and the dead letters recorded
    in the last day (counted up to DEAD_LETTERS_COUNTED)."""

    queues: dict[str, QueueDepth]
    dead_letter_queue: QueueDepth | None
    dead_letters_today: int


# The health strip counts the last day's dead letters up to this many ("100+").
DEAD_LETTERS_COUNTED = 100
DAY_SECONDS = 86_400


def os_user() -> str | None:
    """This machine's user, when known: who acts through a client of the embedded stack. The login name
    the environment gives (LOGNAME, USER, LNAME, USERNAME), else the account of this process's uid: a
    shell without USER (a container, cron, CI) still has one; None only for a uid with no account."""
    try:
        return getpass.getuser() or None
    except (ImportError, KeyError, OSError):
        return None


def caller_arn(aws: Aws) -> str | None:
    """The ARN of the identity the client's credentials are (STS GetCallerIdentity); the OS user when
    STS cannot say."""
    try:
        arn: str = aws.client("sts").get_caller_identity()["Arn"]
    except (BotoCoreError, ClientError):
        return os_user()
    return arn


class AiJobsClient:
    def __init__(
        self,
        store: AdminStore,
        queue: JobQueue | JobQueues,
        registry: JobRegistry,
        *,
        listing: JobListing,
        ledger: UsageLedger,
        budgets: BudgetTable | None = None,
        default_budget_usd: Decimal | None = None,
        clock: Callable[[], float] = time.time,
        dead_letter_queue: JobQueue | None = None,
        target: StackTarget | None = None,
        batches: BatchRecords | None = None,
        attachments: AttachmentBucket | None = None,
        job_types: JobTypeStore | None = None,
        pipelines: PipelineStore | None = None,
        caller: Callable[[], str | None] = os_user,
    ) -> None:
        self._store = store
        # Who this client acts as, as a review records it (docs/pipelines.md): asked once, when first needed.
        self._caller = caller
        self._caller_known: tuple[str | None] | None = None
        # The pipelines' writes (a review decided: docs/pipelines.md); the same table as `store`.
        self._pipelines = pipelines
        # Each lane's queue: jobs are sent to their own lane's, and the health strip shows each.
        self._queues = JobQueues.of(queue)
        self._dead_letter_queue = dead_letter_queue
        self.target = target
        self._registry = registry
        self._listing = listing
        self._ledger = ledger
        self._budgets = budgets
        self._batches = batches
        # Where the files a submission attaches are uploaded, and attachments are read from.
        self._attachments = attachments
        # The cap of users without their own, as the workers have it (AIJOBS_DEFAULT_DAILY_BUDGET_USD).
        self._default_budget = default_budget_usd
        # The data job types' versions, labels and stats (docs/jobtypes.md, "Job types as data").
        self._job_types = job_types
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Settings | None = None, session: boto3.Session | None = None) -> AiJobsClient:
        """The client of the stack the settings name (the environment's when none are given)."""
        settings = settings or load_settings()
        from engine.store.job_types import JobTypeTable

        aws = Aws(settings, session)
        dynamodb, sqs = aws.client("dynamodb"), aws.client("sqs")
        return cls(
            store := build_store(settings, aws),
            build_queues(settings, aws),
            JobRegistry.from_settings(settings),
            listing=JobListing(settings.jobs_table_name, dynamodb),
            ledger=UsageLedger(settings.jobs_table_name, dynamodb),
            budgets=BudgetTable(settings.jobs_table_name, dynamodb, settings.aijobs_retention_days),
            default_budget_usd=settings.default_daily_budget_usd,
            dead_letter_queue=JobQueue(settings.jobs_dlq_url, sqs) if settings.jobs_dlq_url else None,
            target=StackTarget.from_settings(settings, region=sqs.meta.region_name),
            batches=BatchTable(settings.jobs_table_name, dynamodb),
            pipelines=store,
            attachments=AttachmentBucket.connected(
                settings.jobs_payload_bucket,
                lambda: aws.client("s3"),
                SizeLimits.of(settings.aijobs_attachment_limits),
            ),
            job_types=JobTypeTable(settings.jobs_table_name, dynamodb),
            caller=os_user if settings.local_endpoint else partial(caller_arn, aws),
        )

    @classmethod
    def from_stack(cls, name: str, session: boto3.Session | None = None) -> AiJobsClient:
        """The client of a stack deployed with `sam deploy`, from its outputs (CloudFormation
        DescribeStacks); other settings come from the environment."""
        return cls.from_settings(load_stack_settings(name, session), session)

    def submit(
        self,
        job_type: str,
        user_id: str,
        job_input: dict[str, Any],
        *,
        job_id: str | None = None,
        max_attempts: int | None = None,
        deadline_seconds: int | None = None,
        lane: Lane | str = Lane.INTERACTIVE,
        attachments: Sequence[Attachable] = (),
        job_type_version: int | None = None,
    ) -> SubmitResult:
        """Create the job and enqueue it on its lane's queue; idempotent on `job_id` (a new id is made
        when absent). `lane`: interactive (someone waits for it) or background (docs/lanes.md).
        `attachments`: each a local file's path, bytes, or "s3://BUCKET/KEY" (an object the stack
        reads), or a NamedAttachment of one of those with a name of its own; the files and bytes are
        uploaded to the payload bucket (a PutObject each) before the job is created
        (docs/attachments.md, "Submitting").

        `job_type_version` pins a data job type's version (docs/jobtypes.md, "Job types as data");
        without it the job runs the version its labels serve the user now (production, or the user's
        side of a canary), checked against it here and recorded with the job.

        Raises UnknownJobTypeError for a job type this client does not know, InvalidArgumentError
        (an InputValidationError) naming the argument of a job that could never run (and the
        attachment at fault), and JobConflictError when the id is taken by a different job.
        """
        message: dict[str, Any] = {
            "job_id": uuid.uuid4().hex if job_id is None else job_id,
            "job_type": job_type,
            "user_id": user_id,
            "input": job_input,
        }
        if max_attempts is not None:
            message["max_attempts"] = max_attempts
        if deadline_seconds is not None:
            message["deadline_seconds"] = deadline_seconds
        message["lane"] = str(lane)
        if job_type_version is not None:
            message["job_type_version"] = job_type_version
        # The worker's own checks, before anything is written; each refusal names what it refuses.
        definition = self._definition(job_type, user_id, job_type_version)
        _check_message(message)
        if problem := input_problem(definition, job_input):
            raise InvalidArgumentError("input", problem)
        bucket = self._attachments.bucket if self._attachments is not None else None
        limits = self._attachments.limits if self._attachments is not None else SizeLimits.of()
        prepared = prepare(attachments, message["job_id"], definition, bucket, limits)
        if prepared.refs:
            message["attachments"] = [ref.document() for ref in prepared.refs]
        try:
            registry = self._registry if definition.job_type_version is None else JobRegistry([definition])
            request = parse_message(json.dumps(message), message["job_id"], registry)
        except BadMessageError as bad:
            # The fields are checked above: what the worker's checks still refuse is in the input
            # (its size, a value no store can hold).
            raise InvalidArgumentError("input", bad.error.message) from bad
        if request.new_job is None or request.raw_input is None:
            raise InputValidationError("a submission needs a job type, a user and an input")
        if prepared.uploads and self._attachments is not None:
            self._attachments.upload(prepared.uploads)
        job, created = self._store.create_job(request.job_id, request.new_job, request.raw_input, self._now_ms())
        if job.status is JobStatus.QUEUED:
            # Also for an existing queued job: its first submission may have stopped before this.
            self._queues[job.lane].send({"job_id": job.job_id}, group_id=job.user_id)
        return SubmitResult(job.job_id, created, job.status)

    def job_types(self) -> list[str]:
        """The job types this client submits and validates, by name (the code ones: `job_types_listed`
        has the data ones too)."""
        return self._registry.names

    def _definition(self, job_type: str, user_id: str, pinned: int | None) -> JobDefinition:
        """The definition a submission is checked with: a code job type's, or the data job type's
        version it pins, else the one the user would be served now (two reads: head, version)."""
        if job_type in self._registry.names or self._job_types is None:
            if pinned is not None and job_type in self._registry.names:
                raise InvalidArgumentError("job_type_version", f"{job_type} is a code job type: it has no versions")
            return self._registry.get(job_type)
        head = self._job_types.head(job_type)
        if head is None:
            # The registry's own refusal, naming the known ones.
            return self._registry.get(job_type)
        version = head.serves(user_id) if pinned is None else pinned
        stored = self._job_types.version(job_type, version) if 1 <= version <= head.latest else None
        if stored is None:
            raise InvalidArgumentError("job_type_version", f"{job_type} has no version {version} (v1-v{head.latest})")
        from engine.definitions.data import compile_job_type

        return compile_job_type(stored.document, version)

    # --- job types as data (docs/jobtypes.md) ---

    def push_job_type(self, path_or_text: str | Path, by: str | None = None) -> PushResult:
        """Check a job type file (a path, or its YAML or JSON text) whole and store it as its name's next
        version; the same content again makes none. JobTypeFileError (one line) for a file refused."""
        from engine.definitions.data import check_job_type

        document = read_job_type(path_or_text)
        checked = check_job_type(document, code_names=self._registry.names, job_types=self._step_target)
        version, created = self._job_type_store().push(
            checked.name, checked.document(), checked.sha256, self._now_ms(), by=by
        )
        return PushResult(checked.name, version, created)

    def _step_target(self, name: str) -> StepTarget | None:
        """What a pipeline file's step may run (a push checks it): a code job type, or a data job type's
        production version; None for a name the stack does not know."""
        if name in self._registry.names:
            definition = self._registry.get(name)
            known = definition.output_model_for is None and definition.output_schema_for is None
            return StepTarget(
                isinstance(definition, PipelineDefinition), definition.output_json_schema if known else None
            )
        store = self._job_type_store()
        head = store.head(name)
        stored = store.version(name, head.production) if head is not None else None
        if stored is None:
            return None
        return StepTarget("steps" in stored.document, stored.document.get("output_schema"))

    def promote_job_type(
        self,
        name: str,
        version: int,
        canary_percent: int | None = None,
        guard: Guard | None = None,
        by: str | None = None,
    ) -> JobTypeHead:
        """Make `version` production, or with `canary_percent` (1-99) serve it to that share of users
        (sticky per user), guarded by `guard` when given. JobTypeLabelError when it cannot be done."""
        if canary_percent is not None and not 1 <= canary_percent <= 99:
            raise InvalidArgumentError("canary_percent", f"a canary serves 1-99% of users, not {canary_percent}")
        if guard is not None and canary_percent is None:
            raise InvalidArgumentError("guard", "a guard watches a canary: give a canary percent too")
        if guard is not None and (guard.min_jobs < 1 or not 0 <= guard.max_regression <= 100):
            raise InvalidArgumentError("guard", "a guard needs at least 1 job and 0-100 points of regression")
        self._refuse_code_type(name)
        return self._job_type_store().promote(
            name, version, self._now_ms(), canary_percent=canary_percent, guard=guard, by=by
        )

    def rollback_job_type(self, name: str, reason: str | None = None, by: str | None = None) -> JobTypeHead:
        """End the canary, or move production back to the version before it; JobTypeLabelError when
        there is nothing to roll back to."""
        self._refuse_code_type(name)
        return self._job_type_store().rollback(name, self._now_ms(), by=by, reason=reason)

    def job_type(self, name: str) -> tuple[JobTypeHead, list[StoredVersion]]:
        """A data job type's head (labels, history) and every version, oldest first."""
        store = self._job_type_store()
        head = store.head(name)
        if head is None:
            raise JobTypeLabelError(self._no_data_type(name))
        return head, store.versions(name)

    def job_type_version(self, name: str, version: int) -> StoredVersion:
        """One stored version of a data job type."""
        stored = self._job_type_store().version(name, version)
        if stored is None:
            head = self._job_type_store().head(name)
            if head is None:
                raise JobTypeLabelError(self._no_data_type(name))
            raise JobTypeLabelError(f"{name} has no version {version} (v1-v{head.latest})")
        return stored

    def job_types_listed(self) -> list[JobTypeListing]:
        """Every job type by name: the code ones (`code`) and the data ones with their labels (one Query)."""
        listed = [JobTypeListing(name, "code") for name in self._registry.names]
        if self._job_types is not None:
            heads = self._job_types.heads()
            listed += [JobTypeListing(h.name, "data", h.latest, h.production, h.canary) for h in heads]
        return sorted(listed, key=lambda listing: listing.name)

    def job_type_stats(self, name: str) -> list[VersionStats]:
        """What each version's finished jobs did, by version (versions without jobs are left out)."""
        self.job_type(name)
        return self._job_type_store().stats(name)

    def job_type_diff(self, name: str, old: int, new: int) -> str:
        """A unified diff of two versions' documents as YAML ("" when they are the same)."""
        before, after = self.job_type_version(name, old), self.job_type_version(name, new)
        return documents_diff(name, (old, before.document), (new, after.document))

    def _job_type_store(self) -> JobTypeStore:
        if self._job_types is None:
            raise ConfigurationError("this client has no job type store")
        return self._job_types

    def _refuse_code_type(self, name: str) -> None:
        """A code job type has no labels to move: said so, rather than that no such job type exists."""
        if name in self._registry.names:
            raise JobTypeLabelError(self._no_data_type(name))

    def _no_data_type(self, name: str) -> str:
        if name in self._registry.names:
            return f"{name} is a code job type: it has no versions or labels (deploy it to change it)"
        return f"no data job type {name!r} was pushed"

    def get(self, job_id: str) -> JobView:
        job = self._store.get_job(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return JobView.from_job(job)

    def attachment(self, job_id: str, number: int) -> AttachmentDownload | None:
        """The job's attachment `number` (from 1, in the order the job names them) with its object's
        bytes, streamed (a GetItem, then a GetObject); None when the job names no such attachment.
        Only what a job names can be read so: AttachmentInvalidError when its object is gone or may
        not be read."""
        attachments = self.get(job_id).attachments
        if not 1 <= number <= len(attachments):
            return None
        if self._attachments is None:
            raise ConfigurationError("this client reads no attachments")
        attachment = attachments[number - 1]
        return AttachmentDownload(
            attachment, self._attachments.stream(AttachmentRef.parse(attachment.s3, attachment.name))
        )

    def cancel(self, job_id: str) -> JobView:
        """Cancel: a queued job ends at once, a running one at its finishing fence; a finished one stays."""
        return JobView.from_job(self._store.request_cancel(job_id, self._now_ms()))

    def review(
        self,
        job_id: str,
        *,
        approve: bool,
        output: dict[str, Any] | None = None,
        reason: str | None = None,
        by: str | None = None,
    ) -> JobView:
        """Decide a pipeline's review (docs/pipelines.md): approve its proposed output (or an edited one,
        checked by its output schema), or reject it with a reason (`review_rejected`). The decision is
        kept on the job: who (`by`; this client's caller when not given), when, and whether the output
        was changed, and the events function sends it as a `Job Reviewed` event."""
        if self._pipelines is None:
            raise PipelineStateError("this client has no pipelines store")
        job = self._pipelines.get_job(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        by = by or self.caller()
        definition = self._definition(job.job_type or "", job.user_id or "", job.job_type_version)
        job_input = definition.parse_input(self._pipelines.get_input(job_id) or {})
        now = self._now_ms()
        review, kept, error = decided_review(job, definition, job_input, approve, output, reason, by, now)
        written = self._pipelines.decide_review(
            job, review, kept, output_hash(kept) if kept is not None else None, error, now
        )
        return JobView.from_job(written)

    def caller(self) -> str | None:
        """Who this client acts as: against a deployed stack, the ARN of the credentials' identity (STS
        GetCallerIdentity, which needs no permission); locally, the OS user; None when neither is known."""
        if self._caller_known is None:
            self._caller_known = (self._caller(),)
        return self._caller_known[0]

    def retry(self, job_id: str) -> JobView:
        """Put a failed job back in the queue with a fresh attempt budget and deadline. A failed pipeline
        runs again only what did not succeed (docs/pipelines.md): refused while a child of its step has
        not ended yet (a cancel reaches a running child at its finishing fence). A pipeline's failed child
        is retried by its pipeline's retry, never alone."""
        self._check_pipeline_retry(job_id)
        job = self._store.requeue_failed_job(job_id, self._now_ms())
        self._queues[job.lane].send({"job_id": job.job_id}, group_id=job.user_id)
        return JobView.from_job(job)

    def _check_pipeline_retry(self, job_id: str) -> None:
        job = self._store.get_job(job_id) if self._pipelines is not None else None
        if job is None or job.status is not JobStatus.FAILED or self._pipelines is None:
            return
        if job.parent is not None:
            # Its pipeline counted its end once (and failed, or tolerated it): an end of a retry alone
            # would never be counted, its usage missing from the pipeline's sum. The pipeline's retry runs
            # it again and counts it.
            parent = job.parent.parent_id
            raise PipelineStateError(
                f"job {job_id} is a child of pipeline {parent}: retry the pipeline (aijobs retry {parent}), "
                "which runs again its children that did not succeed"
            )
        if job.pipeline is None:
            return
        steps = children_ids(job)
        ids = steps[job.pipeline.step] if job.pipeline.step < len(steps) else []
        for child in self._pipelines.get_jobs(ids).values():
            if not child.status.is_terminal:
                raise JobStateError(
                    f"job {job_id}: its child {child.job_id} has not ended yet ({child.status.value}); "
                    "retry once it has"
                )

    def inspect(self, job_id: str) -> JobInspection:
        """The job, its attempts, the dead letters that name it, and its lease: two reads."""
        job = self._store.get_job(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return JobInspection.of(job, self._store.job_history(job_id), self._now_ms(), self._children(job))

    def details(self, job_id: str) -> JobDetailsView:
        """The job, its attempts, the dead letters that name it, its lease and its input: one read."""
        details = self._store.job_details(job_id)
        if details is None:
            raise JobNotFoundError(job_id)
        return JobDetailsView.of_details(details, self._now_ms(), self._children(details.job))

    def _children(self, job: Job) -> list[Job]:
        """A pipeline's children, step by step (none for another job): read by their ids, 100 a request."""
        ids = [job_id for step in children_ids(job) for job_id in step]
        if not ids or self._pipelines is None:
            return []
        found = self._pipelines.get_jobs(ids)
        return [found[job_id] for job_id in ids if job_id in found]

    def dead_letters(self, since_seconds: int, limit: int | None = 50) -> list[DeadLetterView]:
        """Dead letters of the last `since_seconds`, newest first."""
        now = self._now_ms()
        entries = self._store.dead_letters(now - since_seconds * 1000, now, limit)
        return [DeadLetterView.from_entry(entry) for entry in entries]

    def redrive(self, message_ids: Sequence[str]) -> list[RedriveResult]:
        """Retry the job each dead letter names, as `retry` does; a body that names no job is never re-sent."""
        results = []
        for message_id in message_ids:
            letter = self._store.dead_letter(message_id)
            if letter is None:
                results.append(RedriveResult(message_id, None, RedriveOutcome.ERROR, "no such dead letter"))
            else:
                results.append(self._redrive(message_id, letter.job_id))
        return results

    def redrive_all(self, since_seconds: int) -> list[RedriveResult]:
        """`redrive` of every dead letter of the last `since_seconds`, newest first."""
        return [self._redrive(letter.message_id, letter.job_id) for letter in self.dead_letters(since_seconds, None)]

    def _redrive(self, message_id: str, job_id: str | None) -> RedriveResult:
        if job_id is None:
            return RedriveResult(message_id, None, RedriveOutcome.NO_JOB, "names no job; not re-sent")
        try:
            self.retry(job_id)
        except JobNotFailedError as exc:
            return RedriveResult(message_id, job_id, RedriveOutcome.SKIPPED, str(exc))
        except AiJobsError as exc:
            return RedriveResult(message_id, job_id, RedriveOutcome.ERROR, str(exc))
        return RedriveResult(message_id, job_id, RedriveOutcome.REQUEUED, f"job {job_id} queued again")

    def list_jobs(
        self,
        user_id: str | None = None,
        status: JobStatus | None = None,
        limit: int = 50,
        lane: Lane | None = None,
    ) -> list[JobView]:
        """Jobs newest first: one user's, or everyone's of the last 30 days; of one status or lane."""
        jobs = self._listing.list_jobs(user_id=user_id, status=status, lane=lane, limit=limit, now_ms=self._now_ms())
        return [JobView.from_job(job) for job in jobs]

    def list_page(
        self,
        where: JobFilter,
        since_seconds: int,
        until_ms: int | None = None,
        size: int = 100,
        cursor: str | None = None,
    ) -> JobViewPage:
        """A page of the jobs created in the `since_seconds` before `until_ms` (now when None), newest
        first, from `cursor` (a page's `next_cursor`) on. ValueError for a bad cursor or range."""
        until = self._now_ms() if until_ms is None else until_ms
        start = ListingCursor.from_token(cursor) if cursor else None
        page = self._listing.page(where, until - since_seconds * 1000, until, size, start)
        return JobViewPage(
            jobs=[JobView.from_job(job) for job in page.jobs],
            read=page.read,
            newest_at=iso_timestamp(page.newest_ms),
            oldest_at=iso_timestamp(page.oldest_ms),
            next_cursor=page.next.token() if page.next else None,
        )

    def batches(self, in_flight_only: bool = True) -> list[BatchView]:
        """The provider batches in flight, oldest first; with `in_flight_only` False, also the ended ones
        still kept (ENDED_RETENTION_DAYS after they end). One Query of the batch records' partition."""
        if self._batches is None:
            raise ConfigurationError("this client has no batch records")
        return [BatchView.from_record(record) for record in self._batches.listed(in_flight_only)]

    def health(self) -> Health:
        """Each queue's depth (one GetQueueAttributes each) and the last day's dead letters (a Query a day)."""
        dead_letter_queue = self._dead_letter_queue.depth() if self._dead_letter_queue else None
        today = len(self.dead_letters(DAY_SECONDS, DEAD_LETTERS_COUNTED))
        depths = {lane.value: queue.depth() for lane, queue in self._queues.own()}
        return Health(depths, dead_letter_queue, today)

    def usage_report(self, since_seconds: int, user_id: str | None = None) -> UsageReport:
        """`usage`, and the same attempts by UTC day, in one pass."""
        now = self._now_ms()
        return self._ledger.report(now - since_seconds * 1000, now, user_id=user_id)

    def usage(self, since_seconds: int, user_id: str | None = None) -> list[UsageRow]:
        """Tokens and cost of the attempts of the last `since_seconds`, by user, job type and model."""
        now = self._now_ms()
        return self._ledger.summarize(now - since_seconds * 1000, now, user_id=user_id)

    def set_budget(self, user_id: str, daily_usd: Decimal) -> BudgetDay:
        """Give a user a daily cap of their own (UTC days); today's headroom moves by the change."""
        if not daily_usd.is_finite() or not 0 <= daily_usd <= MAX_DAILY_BUDGET_USD:
            amounts = f"an amount from 0 to {MAX_DAILY_BUDGET_USD} US dollars"
            raise InvalidArgumentError("daily_usd", f"a daily budget is {amounts}")
        check_user_id(user_id)
        budgets, now = self._budget_table(), self._now_ms()
        budgets.set_cap(user_id, daily_usd, now)
        return budgets.day(user_id, daily_usd, now)

    def budget(self, user_id: str) -> BudgetDay | None:
        """A user's today: cap, spent, reserved by attempts in flight, left; None when they have no cap."""
        budgets = self._budget_table()
        cap = budgets.caps([user_id]).get(user_id, self._default_budget)
        return None if cap is None else budgets.day(user_id, cap, self._now_ms())

    def budgets(self) -> list[BudgetDay]:
        """Today's budget of every user with a cap of their own, and of every capped user with usage today."""
        budgets, now = self._budget_table(), self._now_ms()
        caps: dict[str, Decimal | None] = dict(budgets.own_caps())
        midnight = now - now % 86_400_000
        for row in self._ledger.summarize(midnight, now):
            if row.user_id is not None:
                caps.setdefault(row.user_id, self._default_budget)
        return budgets.days({user: cap for user, cap in sorted(caps.items()) if cap is not None}, now)

    def _budget_table(self) -> BudgetTable:
        if self._budgets is None:
            raise ConfigurationError("this client has no budget table")
        return self._budgets

    def wait(self, job_id: str, timeout_seconds: float = 300.0, poll_seconds: float = 1.0) -> JobView:
        """Poll until the job is terminal; TimeoutError after `timeout_seconds`."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            view = self.get(job_id)
            if view.status.is_terminal:
                return view
            if time.monotonic() >= deadline:
                pipeline = view.pipeline
                waits_for = (
                    f": it waits for a review (aijobs review {job_id} --approve | --reject --reason TEXT)"
                    if view.status is JobStatus.WAITING
                    and pipeline
                    and pipeline.review
                    and not pipeline.review.decision
                    else ""
                )
                raise TimeoutError(f"job {job_id} is still {view.status.value} after {timeout_seconds:g}s{waits_for}")
            time.sleep(poll_seconds)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def dead_letter(self, message_id: str) -> DeadLetter | None:
        """A dead letter with its body (one GetItem; an S3 GetObject for a body kept in the payload
        bucket); None when there is none of that message id."""
        return self._store.dead_letter(message_id)

    def outline(
        self, where: JobFilter, since_seconds: int, until_ms: int | None = None, limit: int = MAX_OUTLINED
    ) -> JobOutlines:
        """The newest `limit` jobs created in the `since_seconds` before `until_ms` (now when None) that
        match `where`, in outline (state, error code, times), and whether they are all the range holds:
        what the dashboard counts (engine.store.listing.JobListing.outlines)."""
        until = self._now_ms() if until_ms is None else until_ms
        return self._listing.outlines(where, until - since_seconds * 1000, until, limit)
