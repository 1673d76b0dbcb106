"""Job listings, newest first, from the JobsByDay index and BatchGetItem."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TYPE_CHECKING, Any

from engine.core import Job, JobStatus, Lane
from engine.core.days import utc_day
from engine.store.expressions import index_query
from engine.store.items import LIST_DAY_SHARDS, Item, list_day_partition
from engine.store.retries import BATCH_GET_KEYS, Backoff, batch_get_jobs
from engine.store.table import default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BY_DAY_INDEX = "JobsByDay"
# Index pages are read in the size of a BatchGetItem.
_BATCH = BATCH_GET_KEYS
DAY_MS = 86_400_000


class JobListing:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None, backoff: Backoff | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._backoff = backoff or Backoff()

    def list_jobs(
        self,
        *,
        user_id: str | None = None,
        status: JobStatus | None = None,
        lane: Lane | None = None,
        limit: int = 50,
        days: int = 30,
        now_ms: int,
    ) -> list[Job]:
        """Up to `limit` jobs created in the last `days` days, newest first; one user's, or everyone's;
        of one status, or one lane."""
        jobs: list[Job] = []
        keys = self._keys(now_ms, days, user_id)
        while len(jobs) < limit:
            # Unfiltered, read just what is missing; filtered, full batches until enough match.
            wanted = _BATCH if status or lane else min(_BATCH, limit - len(jobs))
            batch = list(islice(keys, wanted))
            if not batch:
                break
            found = batch_get_jobs(self._client, self.table_name, batch, False, self._backoff)
            jobs.extend(
                job
                for job in found
                if job is not None and (status is None or job.status is status) and (lane is None or job.lane is lane)
            )
        return jobs[:limit]

    def _keys(self, now_ms: int, days: int, user_id: str | None) -> Iterator[Item]:
        """Job keys, newest first: each day's shards merged by creation time.

        A day's shards are read side by side (their first pages at once), so a listing waits for
        about one query a day, not one per shard.
        """
        with ThreadPoolExecutor(max_workers=LIST_DAY_SHARDS, thread_name_prefix="aijobs-list") as pool:
            for offset in range(days):
                day = utc_day(now_ms - offset * DAY_MS)
                partitions = [list_day_partition(day, shard) for shard in range(LIST_DAY_SHARDS)]
                first_pages = list(pool.map(lambda partition: self._page(partition, user_id, None), partitions))
                shards = [
                    self._shard(partition, user_id, page)
                    for partition, page in zip(partitions, first_pages, strict=True)
                ]
                for _, item in heapq.merge(*shards, key=lambda entry: entry[0], reverse=True):
                    yield item

    def _shard(self, partition: str, user_id: str | None, page: dict[str, Any]) -> Iterator[tuple[int, Item]]:
        """A shard's keys, newest first, from its first page on (the next pages as they are needed)."""
        while True:
            for item in page.get("Items", []):
                yield int(item["created_at"]["N"]), {"pk": item["pk"], "sk": item["sk"]}
            if "LastEvaluatedKey" not in page:
                return
            page = self._page(partition, user_id, page["LastEvaluatedKey"])

    def _page(self, partition: str, user_id: str | None, start: dict[str, Any] | None) -> dict[str, Any]:
        params = index_query(
            self.table_name,
            BY_DAY_INDEX,
            "#day = :day",
            {"#day": "list_day"},
            {":day": {"S": partition}},
            user_id,
            ScanIndexForward=False,
            Limit=_BATCH,
        )
        if start is not None:
            params["ExclusiveStartKey"] = start
        page: dict[str, Any] = self._client.query(**params)  # type: ignore[assignment]
        return page
