"""JobTable: what every DynamoDB write of the store is made of.

One table holds a job's small state item, its input stored once, one record per attempt and the
dead letters (docs/protocol.md has the layout). Writes are conditional; a refused condition
becomes ConditionRefusedError carrying the job as DynamoDB had it (ALL_OLD), never an extra read.
The role modules (worker_writes, dead_letter_writes, admin_writes, reads) build on this.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from engine.aws_errors import CONDITION_FAILED, cancellation_codes
from engine.core import AttemptRecord, Job, JobErrorInfo, JobStatus, NewJob, Settlement, Usage
from engine.core.attachments import ref_documents
from engine.core.errors import ConditionRefusedError, ConfigurationError
from engine.store.expressions import Expression
from engine.store.items import (
    INPUT_SK,
    OPEN_SHARD,
    Item,
    budget_day_key,
    error_attribute,
    input_item,
    input_json,
    job_from_item,
    job_key,
    listing_keys,
    open_shard,
)
from engine.store.payloads import INLINE_BYTES, PayloadStore, input_key
from engine.store.retries import Backoff, transact

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

DAY_MS = 86_400_000


def default_client() -> DynamoDBClient:
    # Enough pooled connections for a whole batch running concurrently.
    return boto3.client("dynamodb", config=Config(max_pool_connections=32, retries={"mode": "standard"}))


class JobTable:
    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        retention_days: int = 90,
        payloads: PayloadStore | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._retention_ms = retention_days * DAY_MS
        self._payloads = payloads
        # How requests DynamoDB asks to be sent again are (engine.store.retries).
        self._backoff = backoff or Backoff()

    # --- one request -------------------------------------------------------------------------

    def _update(self, expr: Expression, job_id: str) -> Job:
        """One conditional UpdateItem of the job returning it as written (ALL_NEW)."""
        written, item = conditional_update(self._client, self.table_name, job_key(job_id), expr)
        if not written:
            raise ConditionRefusedError("the job's condition failed", job_from_item(item) if item else None)
        assert item is not None
        return job_from_item(item)

    def _transact(self, update: dict[str, Any], puts: list[Item], others: Sequence[dict[str, Any]] = ()) -> None:
        """The job's conditional update, unconditional puts and `others` (whole transaction items, after
        them) in one TransactWriteItems.

        Its condition refused: ConditionRefusedError. Cancelled by a conflict with another write (a
        cancel request, a duplicate's claim) on every try: the cancellation, transient. A condition of
        `others` refused: the ClientError, for the caller to read (engine.aws_errors.cancellation_codes).
        """
        items: list[dict[str, Any]] = [{"Update": update | {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}}]
        items.extend({"Put": {"TableName": self.table_name, "Item": item}} for item in puts)
        items.extend(others)
        try:
            transact(self._client, items, self._backoff)
        except ClientError as exc:
            if cancellation_codes(exc)[:1] != [CONDITION_FAILED]:
                raise
            old: Item | None = exc.response["CancellationReasons"][0].get("Item")  # type: ignore[assignment]
            raise ConditionRefusedError("the job's condition failed", job_from_item(old) if old else None) from exc

    def _write(
        self,
        expr: Expression,
        job: Job,
        puts: list[Item],
        store_input: dict[str, Any] | None,
        now_ms: int,
        settlement: Settlement | None = None,
    ) -> None:
        """One request: the job's conditional update alone, or in a transaction with the puts.

        `store_input` (the input a message carried) is written as the job's input item too, and
        `settlement` (a batched claim's) moves its user's budget in the same transaction.
        Raises ConditionRefusedError, with the job as it was, when the condition fails.
        """
        if store_input is not None:
            expr.set("input_stored", True)
            stored = self._stored_input(job.job_id, store_input)
            puts = [*puts, input_item(job.job_id, stored, job.request_hash, self._expiry(now_ms))]
        others = [self._settled(expr, settlement)] if settlement is not None else []
        if puts or others:
            self._transact(expr.update_params(self.table_name, job_key(job.job_id)), puts, others)
        else:
            self._update(expr, job.job_id)

    def _settled(self, expr: Expression, settlement: Settlement) -> dict[str, Any]:
        """The budget's side of a settlement, as a transaction item; the job's side (its claim marked
        settled, when the reservation is given back: at most once) goes into `expr`."""
        if settlement.returned_usd:
            claims = expr.name("batch_settled")
            claim = expr.value("settled_claim", settlement.claim)
            expr.add("batch_settled", {settlement.claim})
            fence = f"NOT contains({claims}, {claim})"
            expr.condition = f"{expr.condition} AND {fence}" if expr.condition else fence
        day = Expression()
        day.add("headroom", settlement.returned_usd - settlement.spent_usd)
        day.add("spent", settlement.spent_usd)
        day.condition = f"attribute_exists({day.name('pk')})"
        return {"Update": day.update_params(self.table_name, budget_day_key(settlement.user_id, settlement.day))}

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
            old = refused_item(exc)
            if not is_condition_failure(exc) or old is None:
                raise
            return job_from_item(old)
        return None

    # --- parts -------------------------------------------------------------------------------

    def _transition(self, status: JobStatus, error: JobErrorInfo | None, now_ms: int) -> Expression:
        """The parts every state change writes: status, times, error, and the lease (and batch) let go."""
        expr = Expression()
        expr.set("status", status.value)
        expr.set("updated_at", now_ms)
        if error:
            expr.set("error", error_attribute(error))
        if status.is_terminal:
            expr.set("finished_at", now_ms)
            expr.set("expires_at", self._expiry(now_ms))
            expr.remove(OPEN_SHARD)
        expr.remove("lease_owner", "lease_expires_at", "batch")
        return expr

    def _expiry(self, from_ms: int) -> int:
        """The TTL attribute: retention after `from_ms`, in epoch seconds as DynamoDB's TTL wants it."""
        return (from_ms + self._retention_ms) // 1000

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

    @staticmethod
    def _add_usage(expr: Expression, attempt: AttemptRecord) -> None:
        expr.add("input_tokens", attempt.input_tokens)
        expr.add("output_tokens", attempt.output_tokens)
        expr.add("cost_usd", Decimal(attempt.cost_usd))
        expr.add("standard_cost_usd", Decimal(attempt.standard_cost_usd))
        expr.add("usage_attempts", 1)
        # Token kinds that an attempt rarely has are written only when it has them: a smaller item.
        for name in ("cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens", "reasks"):
            if count := getattr(attempt, name):
                expr.add(name, count)

    @staticmethod
    def _add_children_usage(expr: Expression, usage: Usage) -> None:
        """A pipeline's children's usage added to (or, negative, taken from) its own: every kind it has."""
        expr.add("input_tokens", usage.input_tokens)
        expr.add("output_tokens", usage.output_tokens)
        expr.add("cost_usd", Decimal(usage.cost_usd))
        expr.add("standard_cost_usd", Decimal(usage.standard_cost_usd))
        expr.add("usage_attempts", usage.attempts)
        for name in ("cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens"):
            if count := getattr(usage, name):
                expr.add(name, count)

    @staticmethod
    def _requeued(job_id: str, deadline_at: int, now_ms: int) -> Expression:
        """A retry's parts: back to `queued` and open, a fresh attempt budget and deadline, no error."""
        expr = Expression()
        expr.set("status", JobStatus.QUEUED.value)
        expr.set("updated_at", now_ms)
        expr.set("attempt_count", 0)
        expr.set("cancel_requested", False)
        expr.set("deadline_at", deadline_at)
        expr.set(OPEN_SHARD, open_shard(job_id))
        expr.remove("error", "finished_at", "expires_at")
        return expr

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
            if is_condition_failure(exc):
                return  # no input item: the worker ends the job with a clear error
            raise
        payload_key = response.get("Attributes", {}).get("input_key", {}).get("S")
        if payload_key:
            self._payload_store().refresh(payload_key)

    @staticmethod
    def _fenced_on_read(expr: Expression, job: Job) -> str:
        """The condition of a write by a process that holds no lease: the job is as it was read."""
        return (
            f"{expr.name('status')} = {expr.value('old_status', job.status.value)}"
            f" AND {expr.name('claim_count')} = {expr.value('old_claim_count', job.claim_count)}"
        )


def creation_attributes(job_id: str, new_job: NewJob, now_ms: int) -> dict[str, Any]:
    """What a job is made of when it is created, by a message's claim or by a submission."""
    attributes: dict[str, Any] = {
        "job_id": job_id,
        "job_type": new_job.job_type,
        "user_id": new_job.user_id,
        "schema_version": new_job.schema_version,
        "max_attempts": new_job.max_attempts,
        "deadline_seconds": new_job.deadline_seconds,
        "deadline_at": now_ms + new_job.deadline_seconds * 1000,
        "request_hash": new_job.request_hash,
        "lane": new_job.lane.value,
        "created_at": now_ms,
        "cancel_requested": False,
        OPEN_SHARD: open_shard(job_id),
        **listing_keys(job_id, now_ms),
    }
    if new_job.attachments:  # (most jobs read none: their items stay as small)
        attributes["attachments"] = ref_documents(new_job.attachments)
    if new_job.job_type_version is not None:  # a data job type's (docs/jobtypes.md)
        attributes["job_type_version"] = new_job.job_type_version
    if new_job.parent is not None:  # a pipeline's child (docs/pipelines.md)
        attributes |= {
            "parent_id": new_job.parent.parent_id,
            "step": new_job.parent.step,
            "step_index": new_job.parent.step_index,
            "part": new_job.parent.part,
        }
    return attributes


def is_condition_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def refused_item(exc: ClientError) -> Item | None:
    item: Item | None = exc.response.get("Item")  # type: ignore[assignment]
    return item


def conditional_update(
    client: DynamoDBClient, table_name: str, key: Item, expr: Expression, returns: str = "ALL_NEW"
) -> tuple[bool, Item | None]:
    """One conditional UpdateItem: (True, the attributes `returns` names), or, refused, (False, the
    item as the condition met it; None when there was none), with no extra read."""
    try:
        response: Any = client.update_item(
            **expr.update_params(table_name, key),
            ReturnValues=returns,  # type: ignore[arg-type]
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ClientError as exc:
        if not is_condition_failure(exc):
            raise
        return False, refused_item(exc)
    attributes: Item = response["Attributes"]
    return True, attributes
