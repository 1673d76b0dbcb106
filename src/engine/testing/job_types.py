"""Data job types in memory (engine.core.ports.JobTypeStore), for tests of the catalog, the CLI and the
events function's tally; tests/contract holds it to engine.store.job_types.JobTypeTable.

The label moves are engine.core.job_type_labels', as the table's; a lock stands for its conditions.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import replace
from typing import Any

from engine.core.job_type_labels import first_head, guard_ended, promoted, pushed, rolled_back, tallied
from engine.core.job_types import Guard, JobTypeHead, StoredVersion, VersionStats


class InMemoryJobTypes:
    def __init__(self) -> None:
        self.heads_by_name: dict[str, JobTypeHead] = {}
        self._versions: dict[tuple[str, int], StoredVersion] = {}
        self._hashes: dict[str, dict[str, int]] = {}
        self._stats: dict[tuple[str, int], VersionStats] = {}
        # Reads of every head (one Query on the table): what a cache in front of heads() saves.
        self.heads_reads = 0
        self._lock = threading.Lock()

    def head(self, name: str) -> JobTypeHead | None:
        with self._lock:
            return self.heads_by_name.get(name)

    def heads(self) -> list[JobTypeHead]:
        with self._lock:
            self.heads_reads += 1
            return [self.heads_by_name[name] for name in sorted(self.heads_by_name)]

    def version(self, name: str, version: int) -> StoredVersion | None:
        with self._lock:
            stored = self._versions.get((name, version))
            return replace(stored, document=copy.deepcopy(stored.document)) if stored else None

    def versions(self, name: str) -> list[StoredVersion]:
        with self._lock:
            numbers = sorted(version for stored_name, version in self._versions if stored_name == name)
        return [stored for number in numbers if (stored := self.version(name, number)) is not None]

    def push(
        self, name: str, document: dict[str, Any], sha256: str, now_ms: int, by: str | None = None
    ) -> tuple[int, bool]:
        with self._lock:
            hashes = self._hashes.setdefault(name, {})
            if sha256 in hashes:
                return hashes[sha256], False
            old = self.heads_by_name.get(name)
            head = first_head(name, now_ms, by) if old is None else pushed(old, now_ms, by)
            self._versions[(name, head.latest)] = StoredVersion(
                name, head.latest, copy.deepcopy(document), sha256, now_ms, by
            )
            hashes[sha256] = head.latest
            self.heads_by_name[name] = head
            return head.latest, True

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
        with self._lock:
            head = promoted(self.heads_by_name.get(name), name, version, now_ms, canary_percent, guard, by)
            self.heads_by_name[name] = head
            return head

    def rollback(self, name: str, now_ms: int, *, by: str | None = None, reason: str | None = None) -> JobTypeHead:
        with self._lock:
            head = rolled_back(self.heads_by_name.get(name), name, now_ms, by, reason)
            self.heads_by_name[name] = head
            return head

    def tally(self, name: str, canary: tuple[int, int], counts: tuple[int, int, int, int]) -> JobTypeHead | None:
        with self._lock:
            head = tallied(self.heads_by_name.get(name), canary, counts)
            if head is not None:
                self.heads_by_name[name] = head
            return head

    def end_canary(self, name: str, canary: tuple[int, int], now_ms: int, reason: str) -> bool:
        with self._lock:
            head = guard_ended(self.heads_by_name.get(name), canary, now_ms, reason)
            if head is None:
                return False
            self.heads_by_name[name] = head
            return True

    def add_stats(self, name: str, delta: VersionStats) -> None:
        with self._lock:
            old = self._stats.get((name, delta.version), VersionStats(version=delta.version))
            durations = dict(old.durations)
            for bucket, count in delta.durations.items():
                if count:
                    durations[bucket] = durations.get(bucket, 0) + count
            self._stats[(name, delta.version)] = VersionStats(
                version=delta.version,
                jobs=old.jobs + delta.jobs,
                succeeded=old.succeeded + delta.succeeded,
                validation_failures=old.validation_failures + delta.validation_failures,
                reasks=old.reasks + delta.reasks,
                cost_usd=old.cost_usd + delta.cost_usd,
                durations=durations,
            )

    def stats(self, name: str) -> list[VersionStats]:
        with self._lock:
            return [self._stats[key] for key in sorted(key for key in self._stats if key[0] == name)]
