"""What gives up on a message, in DynamoDB: dead letters, and the jobs they fail or create."""

from __future__ import annotations

import hashlib
from typing import Any

from botocore.exceptions import ClientError

from engine.aws_errors import CONDITION_FAILED, cancellation_codes
from engine.core import Job, JobErrorInfo, JobStatus, Lane, NewJob
from engine.store.items import (
    OPEN_SHARD,
    Item,
    dead_letter_key,
    dead_letter_listing_key,
    dead_letter_pointer_key,
    error_attribute,
    input_item,
    job_from_item,
    job_key,
    listing_keys,
    to_item,
)
from engine.store.payloads import INLINE_BYTES, dead_letter_body_key, unrecorded_dead_letter_key
from engine.store.retries import transact
from engine.store.table import JobTable, creation_attributes
from engine.text import MAX_REASON_CHARS, bounded, one_line, valid_text


class DeadLetterWrites(JobTable):
    def record_dead_letter(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, str],
        receive_count: int,
        reason: str,
        now_ms: int,
        job_id: str | None = None,
    ) -> None:
        """Keep a message the engine gives up on, so that acknowledging it loses nothing.

        One TransactWriteItems: the dead letter, its entry in the day's listing and, when the body
        names a job (`job_id`), a pointer in the job's partition. The first recording of a message
        stands: recording it again writes nothing. A body past INLINE_BYTES is kept in the payload
        bucket and referenced (`body_key`).
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
        summary = to_item(
            {
                "message_id": message_id,
                "job_id": job_id,
                "receive_count": receive_count,
                "reason": one_line(reason),
                "recorded_at": now_ms,
                "expires_at": self._expiry(now_ms),
            }
        )
        letter = (
            dead_letter_key(message_id)
            | summary
            | to_item(
                {
                    **kept,
                    "body_bytes": len(data),
                    "body_sha256": hashlib.sha256(data).hexdigest(),
                    "attributes": {
                        bounded(name, MAX_REASON_CHARS): bounded(str(value), MAX_REASON_CHARS)
                        for name, value in attributes.items()
                    },
                }
            )
        )
        table = self.table_name
        transaction: list[dict[str, Any]] = [
            {"Put": {"TableName": table, "Item": letter, "ConditionExpression": "attribute_not_exists(pk)"}},
            {"Put": {"TableName": table, "Item": dead_letter_listing_key(now_ms, message_id) | summary}},
        ]
        if job_id is not None:
            transaction.append(
                {"Put": {"TableName": table, "Item": dead_letter_pointer_key(job_id, message_id) | summary}}
            )
        try:
            transact(self._client, transaction, self._backoff)
        except ClientError as exc:
            if cancellation_codes(exc)[:1] == [CONDITION_FAILED]:
                return  # recorded before
            raise

    def keep_unrecorded(self, message_id: str, document: bytes) -> str:
        """Keep a dead letter the table could not take in the payload bucket; returns its key."""
        key = unrecorded_dead_letter_key(message_id)
        self._payload_store().put(key, document)
        return key

    def create_failed_job(
        self,
        job_id: str,
        error: JobErrorInfo,
        now_ms: int,
        job_type: str | None = None,
        user_id: str | None = None,
        max_attempts: int = 0,
        message_hash: str | None = None,
        lane: Lane = Lane.INTERACTIVE,
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
                "lane": lane.value,
                "attempt_count": 0,
                "claim_count": 0,
                "cancel_requested": False,
                "created_at": now_ms,
                "updated_at": now_ms,
                "finished_at": now_ms,
                "expires_at": self._expiry(now_ms),
                **listing_keys(job_id, now_ms),
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
        attributes = creation_attributes(job_id, new_job, now_ms)
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
            transact(
                self._client,
                [
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
                ],
                self._backoff,
            )
        except ClientError as exc:
            # Only a refused condition is an answer: the job, or an input without its job, is there.
            if CONDITION_FAILED not in cancellation_codes(exc):
                raise
            existing: Item | None = exc.response["CancellationReasons"][0].get("Item")  # type: ignore[assignment]
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
