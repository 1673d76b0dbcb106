"""DataJobTypes: the data job types as a worker serves them (docs/jobtypes.md).

A job of a data type must cost the two DynamoDB requests of any other job, so nothing here reads the
table per job: every name's head (its labels) comes from one read, kept for `refresh_seconds` (a
promote or a rollback is seen within that time), and each version's compiled definition is kept for
good once read, since versions are immutable. A name the heads do not know reads them again at once
(a type pushed a moment ago runs at once), but at most once per UNKNOWN_REFRESH_SECONDS, so that a
flood of messages naming junk cannot become a flood of reads. The worker runs jobs on threads: one
lock guards the heads, another the compiled versions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from engine.core.errors import UnknownJobTypeError
from engine.core.job_types import JobTypeHead
from engine.core.ports import JobTypeCatalog
from engine.definitions.base import JobDefinition
from engine.observability import log_unexpected

# How long the heads are kept by default: the most a promote takes to reach every worker (docs/jobtypes.md).
DEFAULT_REFRESH_SECONDS = 60
# The least time between two reads of the heads, whatever asks for them (an unknown name, a version
# newer than the heads know, a read that failed).
UNKNOWN_REFRESH_SECONDS = 2.0

# Builds a stored, already checked file's definition (engine.definitions.data.compile_job_type).
Compile = Callable[[Mapping[str, Any], int], JobDefinition]


class DataJobTypes:
    def __init__(
        self,
        catalog: JobTypeCatalog,
        compile: Compile,
        clock: Callable[[], float] = time.time,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
    ) -> None:
        self._catalog = catalog
        self._compile = compile
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self._heads: dict[str, JobTypeHead] = {}
        self._read_at: float | None = None  # when the heads were last read
        self._tried_at: float | None = None  # when a read was last tried (it may have failed)
        self._heads_lock = threading.Lock()
        self._compiled: dict[tuple[str, int], JobDefinition] = {}
        self._compile_lock = threading.Lock()

    def resolve(self, name: str, user_id: str, pinned: int | None = None) -> JobDefinition:
        """The definition a new job of `user_id` runs: the `pinned` version, else its label's (the canary's
        for its share of users, production's for the rest). UnknownJobTypeError for a name or a pinned
        version that does not exist."""
        head = self._head(name)
        if head is None:
            raise UnknownJobTypeError(f"no job type {name!r} is registered (known: {', '.join(self.names())})")
        if pinned is None:
            return self.definition(name, head.serves(user_id))
        if pinned > head.latest:
            head = self._head(name, newer_than=pinned - 1) or head  # pushed since the heads were read?
        if not 1 <= pinned <= head.latest:
            raise UnknownJobTypeError(f"{name} has no version {pinned} (latest v{head.latest})")
        return self.definition(name, pinned)

    def definition(self, name: str, version: int) -> JobDefinition:
        """One version's definition: compiled from its file on first use, then kept (versions never change)."""
        key = (name, version)
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        with self._compile_lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                stored = self._catalog.version(name, version)
                if stored is None:
                    head = self._head(name)
                    latest = f"latest v{head.latest}" if head is not None else "no such job type"
                    raise UnknownJobTypeError(f"{name} has no version {version} ({latest})")
                compiled = self._compile(stored.document, version)
                self._compiled[key] = compiled
            return compiled

    def names(self) -> list[str]:
        """The data job types' names, sorted."""
        with self._heads_lock:
            self._refresh_if_stale()
            return sorted(self._heads)

    def knows(self, name: str) -> bool:
        return self._head(name) is not None

    def _head(self, name: str, newer_than: int = 0) -> JobTypeHead | None:
        """`name`'s head, read again when the heads are stale, or when they lack it (or know no version
        past `newer_than`) and were not read in the last UNKNOWN_REFRESH_SECONDS."""
        with self._heads_lock:
            self._refresh_if_stale()
            head = self._heads.get(name)
            if (head is None or head.latest <= newer_than) and self._may_read_again():
                self._refresh()
                head = self._heads.get(name)
            return head

    def _refresh_if_stale(self) -> None:
        if self._read_at is None or (self._clock() - self._read_at >= self._refresh_seconds and self._may_read_again()):
            self._refresh()

    def _may_read_again(self) -> bool:
        return self._tried_at is None or self._clock() - self._tried_at >= UNKNOWN_REFRESH_SECONDS

    def _refresh(self) -> None:
        """Read every head (the caller holds the heads' lock). A read that fails keeps the heads this
        process has, tried again after UNKNOWN_REFRESH_SECONDS; with none yet, it propagates."""
        now = self._clock()
        self._tried_at = now
        try:
            heads = self._catalog.heads()
        except Exception as exc:
            if self._read_at is None:
                raise
            log_unexpected("the job types' heads could not be read; the ones read before serve", exc)
            return
        self._heads = {head.name: head for head in heads}
        self._read_at = now
