"""Job listings, newest first, from the JobsByDay index and BatchGetItem."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from engine.models import Job, JobStatus
from engine.store.expressions import index_query
from engine.store.items import Item, utc_day
from engine.store.jobs import batch_get_jobs, default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

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
        """Up to `limit` jobs created in the last `days` days, newest first; one user's, or everyone's."""
        jobs: list[Job] = []
        keys = self._keys(now_ms, days, user_id)
        while len(jobs) < limit:
            # Unfiltered, read just what is missing; filtered, full batches until enough match.
            wanted = _BATCH if status else min(_BATCH, limit - len(jobs))
            batch = list(islice(keys, wanted))
            if not batch:
                break
            found = batch_get_jobs(self._client, self.table_name, batch)
            jobs.extend(job for job in found if job is not None and (status is None or job.status is status))
        return jobs[:limit]

    def _keys(self, now_ms: int, days: int, user_id: str | None) -> Iterator[Item]:
        for offset in range(days):
            yield from self._query(utc_day(now_ms - offset * DAY_MS), user_id)

    def _query(self, day: str, user_id: str | None) -> Iterator[Item]:
        params = index_query(
            self.table_name,
            BY_DAY_INDEX,
            "#day = :day",
            {"#day": "list_day"},
            {":day": {"S": day}},
            user_id,
            ScanIndexForward=False,
        )
        pages = self._client.get_paginator("query").paginate(**params)
        for page in pages:
            for item in page.get("Items", []):
                yield {"pk": item["pk"], "sk": item["sk"]}
