"""JobStore: the only code that talks to DynamoDB.

A claim is one UpdateItem; a finish is one fenced write (TransactWriteItems when an attempt record
or the input goes with it). A refused condition is explained from the item it met (ALL_OLD).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from engine.config import Settings
from engine.errors import (
    CancelRequestedError,
    ClaimRefusal,
    ClaimRefusedError,
    ConditionRefusedError,
    ConfigurationError,
    JobConflictError,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
)
from engine.models import AttemptRecord, Job, JobErrorInfo, JobStatus, can_transition
from engine.store.expressions import Expression
from engine.store.items import (
    INPUT_SK,
    OPEN_SHARD,
    OPEN_SHARDS,
    Item,
    attempt_item,
    dead_letter_key,
    error_attribute,
    input_item,
    input_json,
    job_from_item,
    job_key,
    listing_keys,
    open_shard,
    open_shard_key,
    to_item,
)
from engine.store.payloads import INLINE_BYTES, PayloadStore, dead_letter_body_key, input_key
from engine.text import bounded, one_line, valid_text

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

DAY_SECONDS = 86_400
# A dead letter's SQS attributes are short system values; anything longer is cut.
MAX_ATTRIBUTE_CHARS = 1_000
OPEN_JOBS_INDEX = "OpenJobs"
# The deadline a retried job gets when it was created before jobs recorded their own.
DEFAULT_DEADLINE_SECONDS = 86_400


@dataclass(frozen=True, slots=True)
class NewJob:
    """What a full message creates when its job does not exist yet."""

    job_type: str
    user_id: str
    schema_version: int
    max_attempts: int
    deadline_seconds: int
    request_hash: str


@dataclass(frozen=True, slots=True)
class Succeeded:
    output: dict[str, Any]
    output_hash: str


@dataclass(frozen=True, slots=True)
class Failed:
    error: JobErrorInfo


@dataclass(frozen=True, slots=True)
class Released:
    """Back to `queued` for a later delivery; `refund_attempt` when the attempt did not count."""

    error: JobErrorInfo | None
    refund_attempt: bool = False


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancel was requested while this worker ran the job: its output is discarded."""


Outcome = Succeeded | Failed | Released | Cancelled


def default_client() -> DynamoDBClient:
    # Enough pooled connections for a whole batch running concurrently.
    return boto3.client("dynamodb", config=Config(max_pool_connections=32, retries={"mode": "standard"}))


def explain_claim_refusal(job: Job, now_ms: int, request_hash: str | None) -> ClaimRefusal:
    """Why the claim's condition failed, from the item it met. Mirrors `_claimable` below."""
    if request_hash is not None and job.request_hash != request_hash:
        return ClaimRefusal.CONFLICT
    if job.status.is_terminal:
        return ClaimRefusal.FINISHED
    if job.status is JobStatus.RUNNING and (job.lease_expires_at is None or job.lease_expires_at >= now_ms):
        return ClaimRefusal.HELD
    if job.cancel_requested:
        return ClaimRefusal.CANCEL_REQUESTED
    if job.deadline_at is None or job.deadline_at <= now_ms:
        return ClaimRefusal.DEADLINE_PASSED
    if job.attempts_left == 0:
        return ClaimRefusal.ATTEMPTS_SPENT
    # The item satisfies the condition now: it changed between the write and this reading.
    return ClaimRefusal.RACED


class JobStore:
    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        retention_days: int = 90,
        payloads: PayloadStore | None = None,
    ) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._retention_ms = retention_days * DAY_SECONDS * 1000
        self._payloads = payloads

    @classmethod
    def from_settings(cls, settings: Settings) -> JobStore:
        return cls(
            settings.jobs_table_name,
            retention_days=settings.aijobs_retention_days,
            payloads=PayloadStore(settings.jobs_payload_bucket),
        )

    # --- the worker's two round trips ---------------------------------------------------------

    def claim_job(self, job_id: str, owner: str, lease_ms: int, now_ms: int, new_job: NewJob | None) -> Job:
        """Take the job for `owner` until now + lease: one UpdateItem, ALL_NEW on success.

        With `new_job` the item is created when absent; without it the job must exist already.
        """
        expr = Expression()
        expr.set("status", JobStatus.RUNNING.value)
        expr.set("lease_owner", owner)
        expr.set("lease_expires_at", now_ms + lease_ms)
        expr.set("updated_at", now_ms)
        expr.set_if_absent("started_at", now_ms)
        expr.add("attempt_count", 1)
        expr.add("claim_count", 1)
        claimable = self._claimable(expr, now_ms)
        if new_job is None:
            expr.condition = f"attribute_exists({expr.name('pk')}) AND {claimable}"
        else:
            for attribute, value in _creation_attributes(job_id, new_job, now_ms).items():
                expr.set_if_absent(attribute, value)
            expr.set_if_absent("input_stored", False)
            same_request = f"{expr.name('request_hash')} = {expr.value('request_hash', new_job.request_hash)}"
            expr.condition = f"attribute_not_exists({expr.name('pk')}) OR ({same_request} AND {claimable})"
        try:
            return self._update(expr, job_id)
        except ConditionRefusedError as exc:
            if exc.job is None:
                raise JobNotFoundError(job_id) from exc
            request_hash = new_job.request_hash if new_job else None
            raise ClaimRefusedError(exc.job, explain_claim_refusal(exc.job, now_ms, request_hash)) from exc

    def finish_job(
        self,
        job: Job,
        outcome: Outcome,
        now_ms: int,
        attempt: AttemptRecord | None = None,
        store_input: dict[str, Any] | None = None,
    ) -> None:
        """Write the attempt's outcome, fenced on this worker's lease: one request.

        The job update, the attempt record and (for a failed job whose input only the message
        held) the input go together in one TransactWriteItems; alone, the update is an UpdateItem.
        """
        target = _target_status(outcome)
        if not can_transition(job.status, target):
            raise ValueError(f"job {job.job_id}: {job.status} -> {target} is not a transition")
        error = outcome.error if isinstance(outcome, Failed | Released) else None
        expr = self._transition(target, error, now_ms)
        match outcome:
            case Succeeded(output=output, output_hash=output_hash):
                expr.set("output", json.dumps(output, separators=(",", ":"), ensure_ascii=False))
                expr.set("output_hash", output_hash)
                expr.remove("error")
            case Released(refund_attempt=True):
                expr.add("attempt_count", -1)
        if attempt:
            self._add_usage(expr, attempt)
        expr.condition = (
            f"{expr.name('lease_owner')} = {expr.value('owner', job.lease_owner)}"
            f" AND {expr.name('status')} = {expr.value('running', JobStatus.RUNNING.value)}"
        )
        if not isinstance(outcome, Cancelled):
            # A cancel requested meanwhile wins over any other outcome (SPEC section 3).
            expr.condition += f" AND {expr.name('cancel_requested')} = {expr.value('false', False)}"
        puts = [attempt_item(attempt, self._expiry(now_ms))] if attempt else []
        try:
            self._write(expr, job, puts, store_input, now_ms)
        except ConditionRefusedError as exc:
            current = exc.job
            if current and current.lease_owner == job.lease_owner and current.cancel_requested:
                raise CancelRequestedError(job.job_id) from exc
            raise LeaseLostError(f"job {job.job_id}: the lease of {job.lease_owner} was lost", current) from exc

    # --- the rarer writes ---------------------------------------------------------------------

    def request_cancel(self, job_id: str, now_ms: int) -> Job:
        """Cancel a job: a queued one ends at once, a running one at its finishing fence.

        Returns the job after the request; a finished job is returned unchanged.
        """
        for _ in range(3):
            queued = self._transition(JobStatus.CANCELLED, None, now_ms)
            queued.set("cancel_requested", True)
            queued.condition = f"{queued.name('status')} = {queued.value('queued', JobStatus.QUEUED.value)}"
            try:
                return self._update(queued, job_id)
            except ConditionRefusedError as exc:
                if exc.job is None:
                    raise JobNotFoundError(job_id) from exc
                if exc.job.status.is_terminal:
                    return exc.job
            running = Expression()
            running.set("cancel_requested", True)
            running.set("updated_at", now_ms)
            running.condition = f"{running.name('status')} = {running.value('running', JobStatus.RUNNING.value)}"
            try:
                return self._update(running, job_id)
            except ConditionRefusedError:
                continue  # it was released or finished meanwhile: look again
        raise ConditionRefusedError(f"job {job_id} kept changing while it was being cancelled", None)

    def requeue_failed_job(self, job_id: str, now_ms: int) -> Job:
        """Put a failed job back to `queued` with a fresh attempt budget and deadline (`aijobs retry`).

        Only a job whose input is stored can run again; the input's lifetime restarts with the new
        deadline (its item's TTL, and its payload's when it is in the bucket). The caller enqueues
        its message.
        """
        job = self.get_job(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        deadline_at = now_ms + (job.deadline_seconds or DEFAULT_DEADLINE_SECONDS) * 1000
        expr = Expression()
        expr.set("status", JobStatus.QUEUED.value)
        expr.set("updated_at", now_ms)
        expr.set("attempt_count", 0)
        expr.set("cancel_requested", False)
        expr.set("deadline_at", deadline_at)
        expr.set(OPEN_SHARD, open_shard(job_id))
        expr.remove("error", "finished_at", "expires_at")
        expr.condition = (
            f"{expr.name('status')} = {expr.value('failed', JobStatus.FAILED.value)}"
            f" AND {expr.name('input_stored')} = {expr.value('true', True)}"
        )
        try:
            requeued = self._update(expr, job_id)
        except ConditionRefusedError as exc:
            current = exc.job or job
            if current.status is not JobStatus.FAILED:
                raise JobStateError(
                    f"job {job_id} is {current.status.value}; only a failed job can be retried"
                ) from exc
            raise JobStateError(f"job {job_id} has no stored input to run again") from exc
        self._extend_input(job_id, self._expiry(deadline_at))
        return requeued

    def _extend_input(self, job_id: str, expires_at: int) -> None:
        """Keep a requeued job's input until `expires_at`; its payload's lifetime restarts too."""
        expr = Expression()
        expr.set("expires_at", expires_at)
        expr.condition = f"attribute_exists({expr.name('pk')})"
        try:
            response = self._client.update_item(
                **expr.update_params(self.table_name, job_key(job_id, INPUT_SK)), ReturnValues="ALL_NEW"
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return  # no input item: the worker ends the job with a clear error
            raise
        payload_key = response.get("Attributes", {}).get("input_key", {}).get("S")
        if payload_key:
            self._payload_store().refresh(payload_key)

    def record_orphan_attempt(self, attempt: AttemptRecord, now_ms: int) -> None:
        """Keep the usage of an attempt whose result was discarded (its lease was lost)."""
        expr = Expression()
        self._add_usage(expr, attempt)
        expr.condition = f"attribute_exists({expr.name('pk')})"
        self._transact(
            expr.update_params(self.table_name, job_key(attempt.job_id)),
            [attempt_item(attempt, self._expiry(now_ms))],
        )

    def settle_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool:
        """End a job that no worker holds (spent, past its deadline, cancel requested).

        Fenced on the status and claim count it was read with; False when it changed meanwhile.
        """
        if not can_transition(job.status, status):
            raise ValueError(f"job {job.job_id}: {job.status} -> {status} is not a transition")
        expr = self._transition(status, error, now_ms)
        expr.condition = (
            f"{expr.name('status')} = {expr.value('old_status', job.status.value)}"
            f" AND {expr.name('claim_count')} = {expr.value('old_claim_count', job.claim_count)}"
        )
        try:
            self._write(expr, job, [], store_input, now_ms)
        except ConditionRefusedError:
            return False
        return True

    def create_failed_job(
        self,
        job_id: str,
        error: JobErrorInfo,
        now_ms: int,
        job_type: str | None = None,
        user_id: str | None = None,
        max_attempts: int = 0,
        message_hash: str | None = None,
    ) -> Job | None:
        """Record a job whose message could not be run at all.

        Returns None when recorded, or the job that exists already under that id (whose
        `request_hash` is the `message_hash` when it was recorded from the same message).
        """
        item = job_key(job_id) | to_item(
            {
                "job_id": job_id,
                "job_type": job_type,
                "user_id": user_id,
                "request_hash": message_hash,
                "status": JobStatus.FAILED.value,
                "error": error_attribute(error),
                "max_attempts": max_attempts,
                "attempt_count": 0,
                "claim_count": 0,
                "cancel_requested": False,
                "created_at": now_ms,
                "updated_at": now_ms,
                "finished_at": now_ms,
                "expires_at": self._expiry(now_ms),
                **listing_keys(now_ms),
            }
        )
        return self._put_if_absent(item)

    def create_dead_lettered_job(
        self, job_id: str, new_job: NewJob, job_input: dict[str, Any], error: JobErrorInfo, now_ms: int
    ) -> Job | None:
        """Record a full job request that reached the dead-letter queue before any worker created its job.

        The job is written `failed` with its input stored, so that it can be seen and retried.
        Returns None when recorded, or the job that exists already under that id.
        """
        attributes = _creation_attributes(job_id, new_job, now_ms)
        del attributes[OPEN_SHARD]  # a terminal job is not open
        job = job_key(job_id) | to_item(
            attributes
            | {
                "status": JobStatus.FAILED.value,
                "error": error_attribute(error),
                "attempt_count": 0,
                "claim_count": 0,
                "input_stored": True,
                "updated_at": now_ms,
                "finished_at": now_ms,
                "expires_at": self._expiry(now_ms),
            }
        )
        stored_input = input_item(
            job_id, self._stored_input(job_id, job_input), new_job.request_hash, self._expiry(now_ms)
        )
        try:
            self._client.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": job,
                            "ConditionExpression": "attribute_not_exists(pk)",
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": stored_input,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            reasons = exc.response.get("CancellationReasons") or []
            if exc.response["Error"]["Code"] != "TransactionCanceledException" or not reasons:
                raise
            existing: Item | None = reasons[0].get("Item")  # type: ignore[assignment]
            if existing:
                return job_from_item(existing)
            # An input item without its job (a submission that stopped half-way) is another request's.
            return self.create_failed_job(
                job_id,
                error,
                now_ms,
                job_type=new_job.job_type,
                user_id=new_job.user_id,
                max_attempts=new_job.max_attempts,
                message_hash=new_job.request_hash,
            )
        return None

    def create_job(self, job_id: str, new_job: NewJob, job_input: dict[str, Any], now_ms: int) -> tuple[Job, bool]:
        """Create a `queued` job and store its input once; idempotent on the job id.

        Returns the job and whether this call created it. Raises JobConflictError when the id is
        taken by a different request.
        """
        deadline_at = now_ms + new_job.deadline_seconds * 1000
        input_put = Expression()
        input_put.condition = (
            f"attribute_not_exists({input_put.name('pk')})"
            f" OR {input_put.name('request_hash')} = {input_put.value('request_hash', new_job.request_hash)}"
        )
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=input_item(
                    job_id, self._stored_input(job_id, job_input), new_job.request_hash, self._expiry(deadline_at)
                ),
                **input_put.condition_params(),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise JobConflictError(job_id) from exc
            raise
        attributes = _creation_attributes(job_id, new_job, now_ms) | {
            "status": JobStatus.QUEUED.value,
            "attempt_count": 0,
            "claim_count": 0,
            "input_stored": True,
            "updated_at": now_ms,
        }
        item = job_key(job_id) | to_item(attributes)
        existing = self._put_if_absent(item)
        if existing is None:
            return job_from_item(item), True
        if existing.request_hash != new_job.request_hash:
            raise JobConflictError(job_id)
        return existing, False

    def record_dead_letter(
        self, message_id: str, body: str, attributes: dict[str, str], receive_count: int, reason: str, now_ms: int
    ) -> None:
        """Keep a message that names no usable job, so that acknowledging it loses nothing.

        A body past INLINE_BYTES is kept in the payload bucket and referenced (`body_key`).
        """
        # SQS bodies are valid Unicode; valid_text only guards callers that build bodies themselves.
        text = valid_text(body)
        data = text.encode()
        if len(data) > INLINE_BYTES:
            key = dead_letter_body_key(message_id)
            self._payload_store().put(key, data)
            kept: dict[str, Any] = {"body_key": key}
        else:
            kept = {"body": text}
        item = dead_letter_key(message_id) | to_item(
            {
                "message_id": message_id,
                **kept,
                "body_bytes": len(data),
                "body_sha256": hashlib.sha256(data).hexdigest(),
                "attributes": {
                    bounded(name, MAX_ATTRIBUTE_CHARS): bounded(str(value), MAX_ATTRIBUTE_CHARS)
                    for name, value in attributes.items()
                },
                "receive_count": receive_count,
                "reason": one_line(reason),
                "recorded_at": now_ms,
                "expires_at": self._expiry(now_ms),
            }
        )
        self._client.put_item(TableName=self.table_name, Item=item)

    def touch_job(self, job: Job, now_ms: int) -> bool:
        """Mark an open job as just re-enqueued; False when it changed since it was read.

        Fenced on the status and claim count it was read with: a worker that claimed it meanwhile wins.
        """
        expr = Expression()
        expr.set("updated_at", now_ms)
        expr.condition = (
            f"{expr.name('status')} = {expr.value('old_status', job.status.value)}"
            f" AND {expr.name('claim_count')} = {expr.value('old_claim_count', job.claim_count)}"
        )
        try:
            self._update(expr, job.job_id)
        except ConditionRefusedError:
            return False
        return True

    # --- reads ---------------------------------------------------------------------------------

    def open_jobs(self, limit: int) -> Iterator[Job]:
        """Non-terminal jobs from the OpenJobs index: up to limit / shards per shard, oldest deadline first.

        Read as they are used, and no more than that: a shard's keys page by page up to its share,
        then its jobs 100 at a time with strongly consistent reads (the index lags the table, so a
        job may have ended since it was indexed; the caller sees it as it is now).
        """
        per_shard = max(1, limit // OPEN_SHARDS)
        for shard in range(OPEN_SHARDS):
            keys = self._open_keys(shard, per_shard)
            for start in range(0, len(keys), 100):
                found = batch_get_jobs(self._client, self.table_name, keys[start : start + 100], consistent=True)
                yield from (job for job in found if job is not None)

    def _open_keys(self, shard: int, wanted: int) -> list[Item]:
        keys: list[Item] = []
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": OPEN_JOBS_INDEX,
            "KeyConditionExpression": "#shard = :shard",
            "ExpressionAttributeNames": {"#shard": OPEN_SHARD},
            "ExpressionAttributeValues": {":shard": {"S": open_shard_key(shard)}},
        }
        while len(keys) < wanted:
            page = self._client.query(**params, Limit=wanted - len(keys))
            keys.extend({"pk": item["pk"], "sk": item["sk"]} for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return keys

    def get_job(self, job_id: str) -> Job | None:
        response = self._client.get_item(TableName=self.table_name, Key=job_key(job_id), ConsistentRead=True)
        item = response.get("Item")
        return job_from_item(item) if item else None

    def get_input(self, job_id: str) -> dict[str, Any] | None:
        response = self._client.get_item(TableName=self.table_name, Key=job_key(job_id, INPUT_SK), ConsistentRead=True)
        item = response.get("Item")
        if not item:
            return None
        if "input_key" in item:
            loaded: dict[str, Any] = json.loads(self._payload_store().get(item["input_key"]["S"]))
        else:
            loaded = json.loads(item["input"]["S"])
        return loaded

    # --- parts ---------------------------------------------------------------------------------

    def _payload_store(self) -> PayloadStore:
        if self._payloads is None:
            raise ConfigurationError("JOBS_PAYLOAD_BUCKET: not set; large inputs and bodies are kept in that bucket")
        return self._payloads

    def _stored_input(self, job_id: str, job_input: dict[str, Any]) -> dict[str, str]:
        """How an input is stored: its JSON on the item, or past INLINE_BYTES in the bucket by key."""
        text = input_json(job_input)
        data = text.encode()
        if len(data) <= INLINE_BYTES:
            return {"input": text}
        key = input_key(job_id)
        self._payload_store().put(key, data)
        return {"input_key": key}

    def _expiry(self, from_ms: int) -> int:
        """The TTL attribute: retention after `from_ms`, in epoch seconds as DynamoDB's TTL wants it."""
        return (from_ms + self._retention_ms) // 1000

    def _transition(self, status: JobStatus, error: JobErrorInfo | None, now_ms: int) -> Expression:
        """The parts every state change writes: status, times, error, and the lease let go."""
        expr = Expression()
        expr.set("status", status.value)
        expr.set("updated_at", now_ms)
        if error:
            expr.set("error", error_attribute(error))
        if status.is_terminal:
            expr.set("finished_at", now_ms)
            expr.set("expires_at", self._expiry(now_ms))
            expr.remove(OPEN_SHARD)
        expr.remove("lease_owner", "lease_expires_at")
        return expr

    def _update(self, expr: Expression, job_id: str) -> Job:
        """One conditional UpdateItem returning the job as written (ALL_NEW)."""
        try:
            response = self._client.update_item(
                **expr.update_params(self.table_name, job_key(job_id)),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not _is_condition_failure(exc):
                raise
            old = _refused_item(exc)
            raise ConditionRefusedError("the job's condition failed", job_from_item(old) if old else None) from exc
        return job_from_item(response["Attributes"])

    def _write(
        self, expr: Expression, job: Job, puts: list[Item], store_input: dict[str, Any] | None, now_ms: int
    ) -> None:
        """One request: the job's conditional update alone, or in a transaction with the puts.

        `store_input` (the input a message carried) is written as the job's input item too.
        Raises ConditionRefusedError, with the job as it was, when the condition fails.
        """
        if store_input is not None:
            expr.set("input_stored", True)
            stored = self._stored_input(job.job_id, store_input)
            puts = [*puts, input_item(job.job_id, stored, job.request_hash, self._expiry(now_ms))]
        if puts:
            self._transact(expr.update_params(self.table_name, job_key(job.job_id)), puts)
        else:
            self._update(expr, job.job_id)

    @staticmethod
    def _claimable(expr: Expression, now_ms: int) -> str:
        status, lease = expr.name("status"), expr.name("lease_expires_at")
        now = expr.value("now", now_ms)
        return (
            f"({status} = {expr.value('queued', JobStatus.QUEUED.value)}"
            f" OR ({status} = {expr.value('running', JobStatus.RUNNING.value)} AND {lease} < {now}))"
            f" AND {expr.name('cancel_requested')} = {expr.value('false', False)}"
            f" AND {expr.name('attempt_count')} < {expr.name('max_attempts')}"
            f" AND {expr.name('deadline_at')} > {now}"
        )

    @staticmethod
    def _add_usage(expr: Expression, attempt: AttemptRecord) -> None:
        expr.add("input_tokens", attempt.input_tokens)
        expr.add("output_tokens", attempt.output_tokens)
        expr.add("cost_usd", Decimal(attempt.cost_usd))
        expr.add("usage_attempts", 1)

    def _transact(self, update: dict[str, Any], puts: list[Item]) -> None:
        items: list[dict[str, Any]] = [{"Update": update | {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}}]
        items.extend({"Put": {"TableName": self.table_name, "Item": item}} for item in puts)
        try:
            self._client.transact_write_items(TransactItems=items)  # type: ignore[arg-type]
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons = exc.response.get("CancellationReasons") or []
            first = reasons[0] if reasons else {}
            if first.get("Code") != "ConditionalCheckFailed":
                raise
            old: Item | None = first.get("Item")  # type: ignore[assignment]
            raise ConditionRefusedError("the job's condition failed", job_from_item(old) if old else None) from exc

    def _put_if_absent(self, item: Item) -> Job | None:
        """Create a job item; None when created, else the job already there (ALL_OLD)."""
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            old = _refused_item(exc)
            if not _is_condition_failure(exc) or old is None:
                raise
            return job_from_item(old)
        return None


def batch_get_jobs(
    client: DynamoDBClient, table_name: str, keys: list[Item], *, consistent: bool = False
) -> list[Job | None]:
    """The jobs of up to 100 `keys`, in their order (None where a job is gone)."""
    found: dict[str, Job] = {}
    request: dict[str, Any] = {table_name: {"Keys": keys, "ConsistentRead": consistent}}
    while request:
        response = client.batch_get_item(RequestItems=request)
        for item in response.get("Responses", {}).get(table_name, []):
            found[item["pk"]["S"]] = job_from_item(item)
        request = dict(response.get("UnprocessedKeys") or {})
    return [found.get(key["pk"]["S"]) for key in keys]


def _creation_attributes(job_id: str, new_job: NewJob, now_ms: int) -> dict[str, Any]:
    """What a job is made of when it is created, by a message's claim or by a submission."""
    return {
        "job_id": job_id,
        "job_type": new_job.job_type,
        "user_id": new_job.user_id,
        "schema_version": new_job.schema_version,
        "max_attempts": new_job.max_attempts,
        "deadline_seconds": new_job.deadline_seconds,
        "deadline_at": now_ms + new_job.deadline_seconds * 1000,
        "request_hash": new_job.request_hash,
        "created_at": now_ms,
        "cancel_requested": False,
        OPEN_SHARD: open_shard(job_id),
        **listing_keys(now_ms),
    }


def _target_status(outcome: Outcome) -> JobStatus:
    match outcome:
        case Cancelled():
            return JobStatus.CANCELLED
        case Succeeded():
            return JobStatus.SUCCEEDED
        case Failed():
            return JobStatus.FAILED
        case Released():
            return JobStatus.QUEUED


def _is_condition_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _refused_item(exc: ClientError) -> Item | None:
    item: Item | None = exc.response.get("Item")  # type: ignore[assignment]
    return item
