"""Reads of jobs in DynamoDB: one job, its input, attempts and history, dead letters, the open jobs, and
an answer already paid for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.core import AttemptRecord, DeadLetter, DeadLetterEntry, Job, JobDetails, JobHistory, PaidAnswer
from engine.core.days import bounded_utc_days
from engine.core.open_jobs import OpenJobsWalk
from engine.store.items import (
    ATTEMPT_PREFIX,
    DEAD_LETTER_POINTER_PREFIX,
    INPUT_SK,
    JOB_HISTORY_END,
    JOB_SK,
    Item,
    attempt_from_item,
    dead_letter_day_partition,
    dead_letter_entry_from_item,
    dead_letter_from_item,
    dead_letter_key,
    dead_letter_listing_range,
    job_from_item,
    job_key,
    paid_answer_from_item,
    reuse_key,
)
from engine.store.open_jobs import OpenJobsIndex
from engine.store.retries import BATCH_GET_KEYS, batch_get_jobs
from engine.store.table import JobTable

# A dead-letter listing reads one partition a day; a longer range is refused (as a usage range is).
MAX_DEAD_LETTER_DAYS = 400


class JobReads(JobTable):
    def get_job(self, job_id: str) -> Job | None:
        response = self._client.get_item(TableName=self.table_name, Key=job_key(job_id), ConsistentRead=True)
        item = response.get("Item")
        return job_from_item(item) if item else None

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        jobs: dict[str, Job] = {}
        for start in range(0, len(job_ids), BATCH_GET_KEYS):
            keys = [job_key(job_id) for job_id in dict.fromkeys(job_ids[start : start + BATCH_GET_KEYS])]
            jobs |= {
                job.job_id: job
                for job in batch_get_jobs(self._client, self.table_name, keys, True, self._backoff)
                if job is not None
            }
        return jobs

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

    def paid_answer(self, key: str) -> PaidAnswer | None:
        """The answer last kept under a request's key: one GetItem, strongly consistent (a job that starts
        after another's end finds that job's answer), and an S3 GetObject for an answer kept in the
        payload bucket."""
        item = self._client.get_item(TableName=self.table_name, Key=reuse_key(key), ConsistentRead=True).get("Item")
        if not item:
            return None
        if "answer_key" in item:
            return paid_answer_from_item(item, self._payload_store().get(item["answer_key"]["S"]).decode())
        return paid_answer_from_item(item)

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """The job's attempt records, oldest first: one Query of its partition."""
        items = self._partition(job_id, "#pk = :pk AND begins_with(#sk, :prefix)", {":prefix": {"S": ATTEMPT_PREFIX}})
        return [attempt_from_item(item) for item in items]

    def job_history(self, job_id: str) -> JobHistory:
        """The job's attempt records and the dead letters that name it, oldest first.

        One Query of its partition (strongly consistent) between ATTEMPT# and the last DEADLETTER#:
        the attempts and the pointers, never the input.
        """
        return _history(
            self._partition(
                job_id,
                "#pk = :pk AND #sk BETWEEN :first AND :last",
                {":first": {"S": ATTEMPT_PREFIX}, ":last": {"S": JOB_HISTORY_END}},
            )
        )

    def job_details(self, job_id: str) -> JobDetails | None:
        """The job, its history and its input: one Query of its whole partition (strongly consistent).

        An input kept in the payload bucket (past 256 KiB) is read from there too.
        """
        items = self._partition(job_id, "#pk = :pk", {})
        by_sk = {item["sk"]["S"]: item for item in items}
        if JOB_SK not in by_sk:
            return None
        stored = by_sk.get(INPUT_SK)
        input_json = None
        if stored is not None:
            input_json = (
                self._payload_store().get(stored["input_key"]["S"]).decode()
                if "input_key" in stored
                else stored["input"]["S"]
            )
        return JobDetails(job_from_item(by_sk[JOB_SK]), _history(items), input_json)

    def _partition(self, job_id: str, key_condition: str, values: dict[str, Any]) -> list[Item]:
        """The items of a job's partition the key condition selects, in sort-key order: one Query, paged."""
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression=key_condition,
            ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"} if "#sk" in key_condition else {"#pk": "pk"},
            ExpressionAttributeValues={":pk": job_key(job_id)["pk"], **values},
            ConsistentRead=True,
        )
        return [item for page in pages for item in page.get("Items", [])]

    def dead_letters(self, since_ms: int, until_ms: int, limit: int | None = None) -> list[DeadLetterEntry]:
        """Dead letters recorded in [since, until], newest first, at most `limit`.

        A Query of each UTC day's listing partition, from `until`'s day back to `since`'s, newest
        first (`ScanIndexForward=false`), until the limit is reached or the range is read.
        """
        days = bounded_utc_days(since_ms, until_ms, MAX_DEAD_LETTER_DAYS, "a dead-letter range")
        first, last = dead_letter_listing_range(since_ms, until_ms)
        entries: list[DeadLetterEntry] = []
        for day in reversed(days):
            params: dict[str, Any] = {
                "TableName": self.table_name,
                "KeyConditionExpression": "#pk = :day AND #sk BETWEEN :first AND :last",
                "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
                "ExpressionAttributeValues": {
                    ":day": {"S": dead_letter_day_partition(day)},
                    ":first": {"S": first},
                    ":last": {"S": last},
                },
                "ScanIndexForward": False,
            }
            while limit is None or len(entries) < limit:
                if limit is not None:
                    params["Limit"] = limit - len(entries)
                page = self._client.query(**params)
                entries.extend(dead_letter_entry_from_item(item) for item in page.get("Items", []))
                if "LastEvaluatedKey" not in page:
                    break
                params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            if limit is not None and len(entries) >= limit:
                break
        return entries

    def dead_letter(self, message_id: str) -> DeadLetter | None:
        response = self._client.get_item(
            TableName=self.table_name, Key=dead_letter_key(message_id), ConsistentRead=True
        )
        item = response.get("Item")
        if not item:
            return None
        letter = dead_letter_from_item(item)
        if letter.body_key is not None:
            return dead_letter_from_item(item, body=self._payload_store().get(letter.body_key).decode())
        return letter

    def open_jobs(self, limit: int) -> OpenJobsWalk:
        """A pass over the OpenJobs index from where the last saved one stopped (engine.store.open_jobs)."""
        return OpenJobsWalk(OpenJobsIndex(self._client, self.table_name, self._backoff), limit)


def _history(items: list[Item]) -> JobHistory:
    """A job's history from the items of its partition: attempts in order, dead letters by time."""
    attempts = [attempt_from_item(item) for item in items if item["sk"]["S"].startswith(ATTEMPT_PREFIX)]
    # Pointers sort by message id; a history reads by time.
    letters = [
        dead_letter_entry_from_item(item) for item in items if item["sk"]["S"].startswith(DEAD_LETTER_POINTER_PREFIX)
    ]
    letters.sort(key=lambda entry: (entry.recorded_at, entry.message_id))
    return JobHistory(attempts, letters)
