"""Data job types in the jobs table (engine.core.ports.JobTypeStore; docs/jobtypes.md).

- Heads: `pk = JOBTYPES, sk = <name>`, one partition, so that one Query reads every name's labels.
  A head carries `hashes` (sha256 -> version) too: a file pushed again makes no new version.
- Versions: `pk = JOBTYPE#<name>, sk = V#<000001>`, immutable, their file as canonical JSON text
  (a string: no float-to-Decimal conversion of schemas' numbers).
- Stats: `pk = JOBTYPE#<name>, sk = STATS#<000001>`, counters the events function ADDs to; the
  duration histogram is flat attributes `d00`..`d22` (ADD cannot reach into a map that is absent).

Label moves (engine.core.job_type_labels) read the head strongly, compute the head to write, and put
it fenced on the revision read, trying again (bounded) when another write came between. A tally is
one UpdateItem fenced on the canary it counts for, and bumps the revision too, so that no put made
from an older read overwrites its counts. None of these items expires.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from engine.aws_errors import CONDITION_FAILED, cancellation_codes
from engine.core.job_type_labels import (
    MAX_HISTORY,
    first_head,
    lost_race,
    promoted,
    pushed,
    rolled_back,
)
from engine.core.job_types import (
    DURATION_BUCKETS_MS,
    Canary,
    Guard,
    JobTypeHead,
    LabelAction,
    LabelEvent,
    StoredVersion,
    VersionStats,
)
from engine.store.items import Item, from_item, serialize, to_item
from engine.store.retries import Backoff, transact
from engine.store.table import default_client, is_condition_failure

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

HEADS_PK = "JOBTYPES"
VERSION_PREFIX = "V#"
STATS_PREFIX = "STATS#"
# How many times a label move reads the head again after another write came between.
MOVE_TRIES = 5
_COUNTERS = ("jobs", "succeeded", "validation_failures", "reasks")


def head_key(name: str) -> Item:
    return {"pk": {"S": HEADS_PK}, "sk": {"S": name}}


def name_partition(name: str) -> str:
    return f"JOBTYPE#{name}"


def version_key(name: str, version: int) -> Item:
    return {"pk": {"S": name_partition(name)}, "sk": {"S": f"{VERSION_PREFIX}{version:06d}"}}


def stats_key(name: str, version: int) -> Item:
    return {"pk": {"S": name_partition(name)}, "sk": {"S": f"{STATS_PREFIX}{version:06d}"}}


def duration_attribute(bucket: int) -> str:
    return f"d{bucket:02d}"


# --- items <-> the core's types ----------------------------------------------------------------


def head_item(head: JobTypeHead, hashes: dict[str, int]) -> Item:
    attributes: dict[str, Any] = {
        "name": head.name,
        "latest": head.latest,
        "production": head.production,
        "canary": canary_attribute(head.canary) if head.canary else None,
        "previous": list(head.previous),
        "history": [event_attribute(event) for event in head.history],
        "revision": head.revision,
        "hashes": hashes,
    }
    return head_key(head.name) | to_item(attributes)


def canary_attribute(canary: Canary) -> dict[str, Any]:
    attribute: dict[str, Any] = {
        "version": canary.version,
        "percent": canary.percent,
        "started_at": canary.started_at,
        "canary_jobs": canary.canary_jobs,
        "canary_invalid": canary.canary_invalid,
        "production_jobs": canary.production_jobs,
        "production_invalid": canary.production_invalid,
    }
    if canary.guard is not None:
        attribute["guard"] = {
            "min_jobs": canary.guard.min_jobs,
            "max_regression": Decimal(str(canary.guard.max_regression)),
        }
    return attribute


def event_attribute(event: LabelEvent) -> dict[str, Any]:
    attribute: dict[str, Any] = {"at": event.at, "action": event.action.value, "version": event.version}
    if event.reason is not None:
        attribute["reason"] = event.reason
    if event.by is not None:
        attribute["by"] = event.by
    return attribute


def head_from_item(item: Item) -> JobTypeHead:
    data = from_item(item)
    canary = data.get("canary")
    return JobTypeHead(
        name=data["name"],
        latest=int(data["latest"]),
        production=int(data["production"]),
        canary=canary_from_attribute(canary) if canary else None,
        previous=tuple(int(version) for version in data.get("previous", ())),
        # A guard's rollback appends to the history without trimming it; the next put trims it.
        history=tuple(event_from_attribute(event) for event in data.get("history", ()))[-MAX_HISTORY:],
        revision=int(data.get("revision", 0)),
    )


def hashes_from_item(item: Item) -> dict[str, int]:
    return {sha: int(version) for sha, version in from_item(item).get("hashes", {}).items()}


def canary_from_attribute(data: dict[str, Any]) -> Canary:
    guard = data.get("guard")
    return Canary(
        version=int(data["version"]),
        percent=int(data["percent"]),
        started_at=int(data["started_at"]),
        guard=Guard(min_jobs=int(guard["min_jobs"]), max_regression=float(guard["max_regression"])) if guard else None,
        canary_jobs=int(data.get("canary_jobs", 0)),
        canary_invalid=int(data.get("canary_invalid", 0)),
        production_jobs=int(data.get("production_jobs", 0)),
        production_invalid=int(data.get("production_invalid", 0)),
    )


def event_from_attribute(data: dict[str, Any]) -> LabelEvent:
    return LabelEvent(
        at=int(data["at"]),
        action=LabelAction(data["action"]),
        version=int(data["version"]),
        reason=data.get("reason"),
        by=data.get("by"),
    )


def document_text(document: dict[str, Any]) -> str:
    """A file as stored: canonical JSON (sorted keys, no spaces), so that it reads back as pushed."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def version_item(version: StoredVersion) -> Item:
    attributes = {
        "name": version.name,
        "version": version.version,
        "document": document_text(version.document),
        "sha256": version.sha256,
        "pushed_at": version.pushed_at,
        "pushed_by": version.pushed_by,
    }
    return version_key(version.name, version.version) | to_item(attributes)


def version_from_item(item: Item) -> StoredVersion:
    data = from_item(item)
    return StoredVersion(
        name=data["name"],
        version=int(data["version"]),
        document=json.loads(data["document"]),
        sha256=data["sha256"],
        pushed_at=int(data["pushed_at"]),
        pushed_by=data.get("pushed_by"),
    )


def stats_from_item(item: Item) -> VersionStats:
    data = from_item(item)
    durations = {
        bucket: int(data[duration_attribute(bucket)])
        for bucket in range(len(DURATION_BUCKETS_MS) + 1)
        if int(data.get(duration_attribute(bucket), 0))
    }
    return VersionStats(
        version=int(data["version"]),
        jobs=int(data.get("jobs", 0)),
        succeeded=int(data.get("succeeded", 0)),
        validation_failures=int(data.get("validation_failures", 0)),
        reasks=int(data.get("reasks", 0)),
        cost_usd=Decimal(data.get("cost_usd", 0)),
        durations=durations,
    )


# --- the store ---------------------------------------------------------------------------------


class JobTypeTable:
    """engine.core.ports.JobTypeStore on the jobs table."""

    def __init__(self, table_name: str, client: DynamoDBClient | None = None, backoff: Backoff | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._backoff = backoff or Backoff()

    # --- reads ---------------------------------------------------------------------------------

    def head(self, name: str) -> JobTypeHead | None:
        item = self._head_item(name)
        return head_from_item(item) if item else None

    def heads(self) -> list[JobTypeHead]:
        return [head_from_item(item) for item in self._query(HEADS_PK, None, consistent=False)]

    def version(self, name: str, version: int) -> StoredVersion | None:
        item = self._client.get_item(
            TableName=self.table_name, Key=version_key(name, version), ConsistentRead=True
        ).get("Item")
        return version_from_item(item) if item else None

    def versions(self, name: str) -> list[StoredVersion]:
        return [version_from_item(item) for item in self._query(name_partition(name), VERSION_PREFIX)]

    def stats(self, name: str) -> list[VersionStats]:
        return [stats_from_item(item) for item in self._query(name_partition(name), STATS_PREFIX)]

    # --- label moves ---------------------------------------------------------------------------

    def push(
        self, name: str, document: dict[str, Any], sha256: str, now_ms: int, by: str | None = None
    ) -> tuple[int, bool]:
        for _ in range(MOVE_TRIES):
            item = self._head_item(name)
            old = head_from_item(item) if item else None
            hashes = hashes_from_item(item) if item else {}
            if sha256 in hashes:
                return hashes[sha256], False
            head = first_head(name, now_ms, by) if old is None else pushed(old, now_ms, by)
            stored = StoredVersion(name, head.latest, document, sha256, now_ms, by)
            written = head_item(head, hashes | {sha256: head.latest})
            items: list[dict[str, Any]] = [
                {
                    "Put": {
                        "TableName": self.table_name,
                        "Item": version_item(stored),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": self.table_name, "Item": written, **_fenced_on(old)}},
            ]
            try:
                transact(self._client, items, self._backoff)
            except ClientError as exc:
                if CONDITION_FAILED not in cancellation_codes(exc):
                    raise
                continue
            return head.latest, True
        raise lost_race(name, MOVE_TRIES)

    def promote(
        self,
        name: str,
        version: int,
        now_ms: int,
        *,
        canary_percent: int | None = None,
        guard: Guard | None = None,
        by: str | None = None,
    ) -> JobTypeHead:
        for _ in range(MOVE_TRIES):
            item = self._head_item(name)
            old = head_from_item(item) if item else None
            head = promoted(old, name, version, now_ms, canary_percent, guard, by)
            if head is old or self._put_head(head, old, item):
                return head
        raise lost_race(name, MOVE_TRIES)

    def rollback(self, name: str, now_ms: int, *, by: str | None = None, reason: str | None = None) -> JobTypeHead:
        for _ in range(MOVE_TRIES):
            item = self._head_item(name)
            old = head_from_item(item) if item else None
            head = rolled_back(old, name, now_ms, by, reason)
            if self._put_head(head, old, item):
                return head
        raise lost_race(name, MOVE_TRIES)

    def end_canary(self, name: str, canary: tuple[int, int], now_ms: int, reason: str) -> bool:
        """One UpdateItem fenced on the canary: of two callers, one ends it."""
        version, started_at = canary
        event = event_attribute(
            LabelEvent(at=now_ms, action=LabelAction.GUARD_ROLLBACK, version=version, reason=reason)
        )
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": head_key(name),
            "UpdateExpression": (
                "SET #history = list_append(if_not_exists(#history, :none), :event), #revision = #revision + :one"
                " REMOVE #canary"
            ),
            "ConditionExpression": "#canary.#version = :version AND #canary.#started_at = :started_at",
            "ExpressionAttributeNames": {
                "#history": "history",
                "#revision": "revision",
                "#canary": "canary",
                "#version": "version",
                "#started_at": "started_at",
            },
            "ExpressionAttributeValues": {
                ":none": serialize([]),
                ":event": serialize([event]),
                ":one": serialize(1),
                ":version": serialize(version),
                ":started_at": serialize(started_at),
            },
        }
        return self._conditional_update(params) is not None

    def tally(self, name: str, canary: tuple[int, int], counts: tuple[int, int, int, int]) -> JobTypeHead | None:
        """SET of the nested counters (ADD reaches top-level attributes only), fenced on the canary."""
        version, started_at = canary
        names = {"#canary": "canary", "#version": "version", "#started_at": "started_at", "#revision": "revision"}
        values: dict[str, Any] = {
            ":version": serialize(version),
            ":started_at": serialize(started_at),
            ":one": serialize(1),
        }
        sets = ["#revision = #revision + :one"]
        fields = ("canary_jobs", "canary_invalid", "production_jobs", "production_invalid")
        for field, count in zip(fields, counts, strict=True):
            names[f"#{field}"] = field
            values[f":{field}"] = serialize(count)
            sets.append(f"#canary.#{field} = #canary.#{field} + :{field}")
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": head_key(name),
            "UpdateExpression": "SET " + ", ".join(sets),
            "ConditionExpression": "#canary.#version = :version AND #canary.#started_at = :started_at",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValues": "ALL_NEW",
        }
        item = self._conditional_update(params)
        return head_from_item(item) if item is not None else None

    def add_stats(self, name: str, delta: VersionStats) -> None:
        names = {"#name": "name", "#version": "version"}
        values: dict[str, Any] = {":name": serialize(name), ":version": serialize(delta.version)}
        adds = []
        amounts: list[tuple[str, Any]] = [(counter, getattr(delta, counter)) for counter in _COUNTERS]
        amounts.append(("cost_usd", Decimal(delta.cost_usd)))
        amounts += [(duration_attribute(bucket), count) for bucket, count in sorted(delta.durations.items()) if count]
        for attribute, amount in amounts:
            names[f"#{attribute}"] = attribute
            values[f":{attribute}"] = serialize(amount)
            adds.append(f"#{attribute} :{attribute}")
        self._client.update_item(
            TableName=self.table_name,
            Key=stats_key(name, delta.version),
            UpdateExpression="SET #name = :name, #version = :version ADD " + ", ".join(adds),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    # --- requests ------------------------------------------------------------------------------

    def _head_item(self, name: str) -> Item | None:
        item: Item | None = self._client.get_item(
            TableName=self.table_name, Key=head_key(name), ConsistentRead=True
        ).get("Item")
        return item

    def _put_head(self, head: JobTypeHead, old: JobTypeHead | None, item: Item | None) -> bool:
        """Put `head` fenced on `old`'s revision (or on there being none); False when another write came between."""
        hashes = hashes_from_item(item) if item else {}
        try:
            self._client.put_item(TableName=self.table_name, Item=head_item(head, hashes), **_fenced_on(old))
        except ClientError as exc:
            if is_condition_failure(exc):
                return False
            raise
        return True

    def _conditional_update(self, params: dict[str, Any]) -> Item | None:
        """One conditional UpdateItem: the item after (ALL_NEW), or None when its condition failed."""
        try:
            response: Any = self._client.update_item(**params | {"ReturnValues": "ALL_NEW"})
        except ClientError as exc:
            if is_condition_failure(exc):
                return None
            raise
        attributes: Item = response["Attributes"]
        return attributes

    def _query(self, pk: str, prefix: str | None, consistent: bool = True) -> list[Item]:
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": consistent,
        }
        if prefix is not None:
            params["KeyConditionExpression"] += " AND begins_with(sk, :prefix)"
            params["ExpressionAttributeValues"][":prefix"] = {"S": prefix}
        pages = self._client.get_paginator("query").paginate(**params)
        return [item for page in pages for item in page.get("Items", [])]


def _fenced_on(old: JobTypeHead | None) -> dict[str, Any]:
    """The condition of a head's put: its revision as read, or its absence."""
    if old is None:
        return {"ConditionExpression": "attribute_not_exists(pk)"}
    return {
        "ConditionExpression": "#revision = :revision",
        "ExpressionAttributeNames": {"#revision": "revision"},
        "ExpressionAttributeValues": {":revision": serialize(old.revision)},
    }
