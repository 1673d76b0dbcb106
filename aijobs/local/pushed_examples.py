"""What the embedded provider answers a data job type with by default: the examples pushed with it.

A data job type's rules often say what a schema cannot (a label that is one of the input's), so an
answer made from the output schema alone (aijobs.local.answers.answer_for) would break them where a
model would not. `aijobs dev` therefore answers a job type pushed to its stack from the examples of
its versions (newest first), as `aijobs dev --answers FILE` answers from a file's; only examples
whose output meets the schema the request asks for are taken, so a version whose schema changed is
answered from its own examples. Fault markers still come first (aijobs.local.faults), which is how a
worse prompt is tried against the guard. A name that no file holds (a code job type) has none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.core.job_types import StoredVersion
from engine.definitions.json_schemas import validator

# A job type's versions are read at most this often (a version pushed since is seen after it).
REFRESH_SECONDS = 2.0

Example = Mapping[str, Any]


class PushedExamples:
    """The examples of a data job type's pushed versions, read from the stack's table (`versions`, as
    engine.store.job_types.JobTypeTable reads them) at most once every REFRESH_SECONDS per name."""

    def __init__(
        self, versions: Callable[[str], Sequence[StoredVersion]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._versions = versions
        self._clock = clock
        self._lock = threading.Lock()
        self._read: dict[str, tuple[float, tuple[Example, ...]]] = {}

    def __call__(self, job_type: str, schema: dict[str, Any] | None) -> list[Example]:
        """`job_type`'s examples, newest version first, whose output meets `schema` (any, without one)."""
        examples = self._examples(job_type)
        if schema is None or not examples:
            return list(examples)
        try:
            # The validator the engine checks answers with (its patterns matched in linear time).
            checker = validator(schema)
            return [example for example in examples if checker.is_valid(example.get("output"))]
        except Exception:
            return []  # a schema the validator cannot use: the answer is made from the schema instead

    def _examples(self, job_type: str) -> tuple[Example, ...]:
        now = self._clock()
        with self._lock:
            read = self._read.get(job_type)
        if read is not None and now - read[0] < REFRESH_SECONDS:
            return read[1]
        try:
            versions = sorted(self._versions(job_type), key=lambda version: version.version, reverse=True)
        except Exception:
            versions = []  # the stack's table unread: answered from the schema, as before any push
        examples = tuple(
            example
            for version in versions
            for example in version.document.get("examples") or ()
            if isinstance(example, Mapping) and isinstance(example.get("input"), Mapping) and "output" in example
        )
        with self._lock:
            self._read[job_type] = (now, examples)
        return examples
