"""DynamoDB write units, computed from item images the way DynamoDB bills them.

An item's size is the length of its attribute names plus their values (strings in UTF-8,
numbers about one byte per two digits, maps and lists with their overhead). A standard write
costs one unit per KB of the larger of the item's old and new image, a transactional write
twice that. A global secondary index costs a write of its projected item (+100 bytes) when the
item enters, leaves, or changes what the index holds; two when its index key changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KB = 1024
INDEX_OVERHEAD = 100


def value_size(value: dict[str, Any]) -> int:
    ((kind, inner),) = value.items()
    if kind in {"S"}:
        return len(inner.encode())
    if kind == "N":
        digits = len(inner.replace("-", "").replace(".", "").lstrip("0")) or 1
        return 1 + math.ceil(digits / 2)
    if kind == "B":
        return len(inner)
    if kind in {"BOOL", "NULL"}:
        return 1
    if kind == "M":
        return 3 + sum(len(name.encode()) + value_size(item) + 1 for name, item in inner.items())
    if kind == "L":
        return 3 + sum(value_size(item) + 1 for item in inner)
    if kind in {"SS", "NS", "BS"}:
        return sum(value_size({kind[0]: item}) for item in inner)
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict[str, Any] | None) -> int:
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


@dataclass(frozen=True, slots=True)
class Index:
    name: str
    keys: tuple[str, ...]
    projected: tuple[str, ...] | None  # None: ALL

    @classmethod
    def from_template(cls, spec: dict[str, Any]) -> Index:
        keys = tuple(key["AttributeName"] for key in spec["KeySchema"])
        projection = spec["Projection"]
        kind = projection["ProjectionType"]
        extra = tuple(projection.get("NonKeyAttributes", ())) if kind == "INCLUDE" else ()
        return cls(spec["IndexName"], keys, None if kind == "ALL" else extra)

    def image(self, item: dict[str, Any] | None, table_keys: tuple[str, ...]) -> dict[str, Any] | None:
        if not item or any(key not in item for key in self.keys):
            return None
        if self.projected is None:
            return item
        names = set(self.keys) | set(table_keys) | set(self.projected)
        return {name: value for name, value in item.items() if name in names}


def units(size: int) -> int:
    return max(1, math.ceil(size / KB))


def write_units(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    indexes: list[Index],
    table_keys: tuple[str, ...],
    transactional: bool = False,
) -> tuple[int, int]:
    """(table units, index units) of one item's write from `before` to `after`."""
    table = units(max(item_size(before), item_size(after))) * (2 if transactional else 1)
    index_units = 0
    for index in indexes:
        old, new = index.image(before, table_keys), index.image(after, table_keys)
        if old == new:
            continue
        key_changed = old is not None and new is not None and any(old[k] != new[k] for k in index.keys)
        writes = 2 if key_changed else 1
        index_units += writes * units(max(item_size(old), item_size(new)) + INDEX_OVERHEAD)
    return table, index_units


class WriteMeter:
    """Watches a DynamoDB client's writes and adds up their units from the items' images.

    `reader` is another client: it reads each written item before and after the write.
    """

    def __init__(self, client: Any, reader: Any, table_name: str, indexes: list[Index]) -> None:
        self._reader = reader
        self._table = table_name
        self._indexes = indexes
        self._before: list[tuple[dict[str, Any], bool, dict[str, Any] | None]] = []
        self.table_units = 0
        self.index_units = 0
        self.requests = 0
        client.meta.events.register("provide-client-params.dynamodb.*", self._before_call)
        client.meta.events.register("after-call.dynamodb.*", self._after_call)

    def _keys(self, operation: str, params: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
        if operation == "PutItem":
            return [(_key(params["Item"]), False)]
        if operation == "UpdateItem":
            return [(params["Key"], False)]
        if operation == "TransactWriteItems":
            found = []
            for entry in params["TransactItems"]:
                ((kind, body),) = entry.items()
                found.append((_key(body["Item"]) if kind == "Put" else body["Key"], True))
            return found
        return []

    def _read(self, key: dict[str, Any]) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._reader.get_item(TableName=self._table, Key=key, ConsistentRead=True).get(
            "Item"
        )
        return item

    def _before_call(self, event_name: str, params: dict[str, Any], **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        self._before = [(key, transactional, self._read(key)) for key, transactional in self._keys(operation, params)]

    def _after_call(self, event_name: str, **_: Any) -> None:
        if not self._before:
            return
        self.requests += 1
        for key, transactional, before in self._before:
            table, index = write_units(before, self._read(key), self._indexes, ("pk", "sk"), transactional)
            self.table_units += table
            self.index_units += index
        self._before = []

    @property
    def total(self) -> int:
        return self.table_units + self.index_units


def _key(item: dict[str, Any]) -> dict[str, Any]:
    return {"pk": item["pk"], "sk": item["sk"]}
