"""Job listings, newest first, from the JobsByUser and JobsByDay indexes (keys only) + BatchGetItem."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from engine.models import Job, JobStatus
from engine.store.items import Item, job_from_item, utc_day
from engine.store.jobs import default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BY_USER_INDEX = "JobsByUser"
BY_DAY_INDEX = "JobsByDay"
# BatchGetItem reads at most 100 items a request.
_BATCH = 100
DAY_MS = 86_400_000


class JobListing:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()

    def list_jobs(
        self,
        *,
        user_id: str | None = None,
        status: JobStatus | None = None,
        limit: int = 50,
        days: int = 30,
        now_ms: int,
    ) -> list[Job]:
        """Up to `limit` jobs, newest first: one user's, or everyone's created in the last `days` days."""
        jobs: list[Job] = []
        keys = self._keys_by_user(user_id) if user_id else self._keys_by_day(now_ms, days)
        while len(jobs) < limit:
            # Unfiltered, read just what is missing; filtered, full batches until enough match.
            wanted = _BATCH if status else min(_BATCH, limit - len(jobs))
            batch = list(islice(keys, wanted))
            if not batch:
                break
            jobs.extend(self._read(batch, status))
        return jobs[:limit]

    def _keys_by_user(self, user_id: str) -> Iterator[Item]:
        yield from self._query(BY_USER_INDEX, "list_user", user_id)

    def _keys_by_day(self, now_ms: int, days: int) -> Iterator[Item]:
        for offset in range(days):
            yield from self._query(BY_DAY_INDEX, "list_day", utc_day(now_ms - offset * DAY_MS))

    def _query(self, index: str, key: str, value: str) -> Iterator[Item]:
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table_name,
            IndexName=index,
            KeyConditionExpression="#key = :value",
            ExpressionAttributeNames={"#key": key},
            ExpressionAttributeValues={":value": {"S": value}},
            ScanIndexForward=False,
        )
        for page in pages:
            for item in page.get("Items", []):
                yield {"pk": item["pk"], "sk": item["sk"]}

    def _read(self, keys: list[Item], status: JobStatus | None) -> list[Job]:
        """The jobs of `keys`, in the order of `keys`, keeping those of `status`."""
        found: dict[str, Job] = {}
        request: dict[str, Any] = {self.table_name: {"Keys": keys}}
        while request:
            response = self._client.batch_get_item(RequestItems=request)
            for item in response.get("Responses", {}).get(self.table_name, []):
                found[item["pk"]["S"]] = job_from_item(item)
            request = dict(response.get("UnprocessedKeys") or {})
        ordered = (found.get(key["pk"]["S"]) for key in keys)
        return [job for job in ordered if job is not None and (status is None or job.status is status)]
