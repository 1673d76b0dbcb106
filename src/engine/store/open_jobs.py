"""The OpenJobs index as the reconciler walks it (engine.core.open_jobs): its shards are the segments.

- `OpenJobs` (template.yaml): a sparse index of non-terminal jobs, `open_shard` (`OPEN#0`..`OPEN#7`)
  then `deadline_at`, keys only. A shard's keys are read page by page from a position
  (`ExclusiveStartKey`), then the jobs with strongly consistent BatchGetItems of up to 100, as
  they are used: the index lags the table, so a job may have ended since it was indexed.
- `pk = RECONCILER, sk = CURSOR`: where each shard's next pass begins (`positions`: shard ->
  `deadline_at` and `job_id`); one GetItem when a pass begins, one UpdateItem when it ends and only
  when a position moved.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.core import Job
from engine.core.open_jobs import OpenJobKey
from engine.store.expressions import Expression
from engine.store.items import JOB_PREFIX, JOB_SK, OPEN_SHARD, OPEN_SHARDS, Item, from_item, job_key, open_shard_key
from engine.store.retries import BATCH_GET_KEYS, Backoff, batch_get_jobs

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

OPEN_JOBS_INDEX = "OpenJobs"
CURSOR_KEY: Item = {"pk": {"S": "RECONCILER"}, "sk": {"S": "CURSOR"}}


class OpenJobsIndex:
    segments = OPEN_SHARDS

    def __init__(self, client: DynamoDBClient, table_name: str, backoff: Backoff) -> None:
        self._client = client
        self._table_name = table_name
        self._backoff = backoff

    def keys(self, segment: int, after: OpenJobKey | None, count: int) -> tuple[list[OpenJobKey], bool]:
        shard = open_shard_key(segment)
        params: dict[str, Any] = {
            "TableName": self._table_name,
            "IndexName": OPEN_JOBS_INDEX,
            "KeyConditionExpression": "#shard = :shard",
            "ExpressionAttributeNames": {"#shard": OPEN_SHARD},
            "ExpressionAttributeValues": {":shard": {"S": shard}},
        }
        if after is not None:
            params["ExclusiveStartKey"] = job_key(after.job_id) | {
                OPEN_SHARD: {"S": shard},
                "deadline_at": {"N": str(after.deadline_at)},
            }
        keys: list[OpenJobKey] = []
        while len(keys) < count:
            page = self._client.query(**params, Limit=count - len(keys))
            keys.extend(
                OpenJobKey(int(item["deadline_at"]["N"]), item["pk"]["S"].removeprefix(JOB_PREFIX))
                for item in page.get("Items", [])
            )
            if "LastEvaluatedKey" not in page:
                return keys, True
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return keys, False

    def jobs(self, keys: Sequence[OpenJobKey]) -> Iterator[Job | None]:
        for start in range(0, len(keys), BATCH_GET_KEYS):
            batch = [job_key(key.job_id, JOB_SK) for key in keys[start : start + BATCH_GET_KEYS]]
            yield from batch_get_jobs(self._client, self._table_name, batch, True, self._backoff)

    def positions(self) -> dict[int, OpenJobKey]:
        item = self._client.get_item(TableName=self._table_name, Key=CURSOR_KEY).get("Item")
        stored: dict[str, dict[str, Any]] = from_item(item).get("positions", {}) if item else {}
        return {int(shard): OpenJobKey(int(at["deadline_at"]), at["job_id"]) for shard, at in stored.items()}

    def keep_positions(self, positions: Mapping[int, OpenJobKey]) -> None:
        expr = Expression().set(
            "positions",
            {str(shard): {"deadline_at": key.deadline_at, "job_id": key.job_id} for shard, key in positions.items()},
        )
        self._client.update_item(**expr.update_params(self._table_name, CURSOR_KEY))
