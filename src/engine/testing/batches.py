"""Batch records and bucket objects in memory, for tests of the batching decisions; tests/contract
holds them to engine.store.batches.BatchTable and engine.store.payloads.PayloadStore."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from engine.core.batches import BatchRecord
from engine.core.errors import PayloadMissingError


class MemoryBatchRecords:
    def __init__(self) -> None:
        self._records: dict[str, BatchRecord] = {}
        self._lock = threading.Lock()

    def create(self, record: BatchRecord) -> bool:
        with self._lock:
            if record.key in self._records:
                return False
            self._records[record.key] = record
            return True

    def save(self, record: BatchRecord, read: BatchRecord) -> bool:
        with self._lock:
            current = self._records.get(record.key)
            if current is None or current.updated_at != read.updated_at:
                return False
            self._records[record.key] = replace(record)
            return True

    def get(self, key: str) -> BatchRecord | None:
        with self._lock:
            return self._records.get(key)

    def listed(self, in_flight_only: bool = True) -> list[BatchRecord]:
        with self._lock:
            records = [record for record in self._records.values() if record.phase.in_flight or not in_flight_only]
        return sorted(records, key=lambda record: (record.created_at, record.key))


class MemoryObjects:
    """A bucket as a dict of keys to bytes."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = data

    def get(self, key: str) -> bytes:
        with self._lock:
            if key not in self.objects:
                raise PayloadMissingError(f"payload {key} is gone from the payload bucket")
            return self.objects[key]

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key in self.objects if key.startswith(prefix))

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self.objects.pop(key, None)
