"""Batch records in the jobs table (engine.core.batches): `pk = BATCHES, sk = <batch key>`.

One partition, read with Query (there are few batches in flight at a time). A record is created
with a put fenced on its absence, and replaced with puts fenced on the `updated_at` it was read
with; an ended record carries `expires_at`, and DynamoDB's TTL removes it after the retention.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from engine.core.batches import BatchPhase, BatchRecord, BatchState
from engine.store.items import Item, from_item, to_item
from engine.store.table import DAY_MS, default_client, is_condition_failure

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BATCHES_PK = "BATCHES"
# How long an ended batch's record stays listed (`aijobs batches --all`).
ENDED_RETENTION_DAYS = 7


def batch_key(key: str) -> Item:
    return {"pk": {"S": BATCHES_PK}, "sk": {"S": key}}


class BatchTable:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()

    def create(self, record: BatchRecord) -> bool:
        return self._put(record, "attribute_not_exists(pk)", {})

    def save(self, record: BatchRecord, read: BatchRecord) -> bool:
        return self._put(record, "updated_at = :read", {":read": {"N": str(read.updated_at)}})

    def get(self, key: str) -> BatchRecord | None:
        item = self._client.get_item(TableName=self.table_name, Key=batch_key(key), ConsistentRead=True).get("Item")
        return _record(from_item(item)) if item else None

    def listed(self, in_flight_only: bool = True) -> list[BatchRecord]:
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": BATCHES_PK}},
            "ConsistentRead": True,
        }
        if in_flight_only:
            params["FilterExpression"] = "#phase <> :ended"
            params["ExpressionAttributeNames"] = {"#phase": "phase"}
            params["ExpressionAttributeValues"][":ended"] = {"S": BatchPhase.ENDED.value}
        pages = self._client.get_paginator("query").paginate(**params)
        records = [_record(from_item(item)) for page in pages for item in page.get("Items", [])]
        return sorted(records, key=lambda record: (record.created_at, record.key))

    def _put(self, record: BatchRecord, condition: str, values: dict[str, Any]) -> bool:
        attributes = {name: value for name, value in asdict(record).items() if value is not None}
        attributes["redo"] = list(record.redo)
        attributes["phase"] = record.phase.value
        if record.state is not None:
            attributes["state"] = record.state.value
        if record.ended_at is not None:
            attributes["expires_at"] = (record.ended_at + ENDED_RETENTION_DAYS * DAY_MS) // 1000
        item = batch_key(record.key) | to_item(attributes)
        params: dict[str, Any] = {"TableName": self.table_name, "Item": item, "ConditionExpression": condition}
        if values:
            params["ExpressionAttributeValues"] = values
        try:
            self._client.put_item(**params)
        except ClientError as exc:
            if is_condition_failure(exc):
                return False
            raise
        return True


def _record(data: dict[str, Any]) -> BatchRecord:
    return BatchRecord(
        key=data["key"],
        model=data["model"],
        provider=data["provider"],
        lines=int(data["lines"]),
        phase=BatchPhase(data["phase"]),
        created_at=int(data["created_at"]),
        updated_at=int(data["updated_at"]),
        rescue_at=int(data["rescue_at"]),
        abandon_at=int(data["abandon_at"]),
        next_poll_at=int(data.get("next_poll_at", 0)),
        batch_id=data.get("batch_id"),
        state=BatchState(data["state"]) if data.get("state") else None,
        detail=data.get("detail", ""),
        answered=int(data.get("answered", 0)),
        failed=int(data.get("failed", 0)),
        cancel_sent=bool(data.get("cancel_sent", False)),
        handed_back_through=int(data.get("handed_back_through", 0)),
        handed_back=bool(data.get("handed_back", False)),
        unanswerable=bool(data.get("unanswerable", False)),
        concluded=int(data.get("concluded", 0)),
        redo=tuple(data.get("redo", ())),
        finished=int(data.get("finished", 0)),
        returned=int(data.get("returned", 0)),
        discarded=int(data.get("discarded", 0)),
        ended_at=int(data["ended_at"]) if data.get("ended_at") is not None else None,
    )
