"""A pass over the open jobs that goes on where the last one stopped: how the reconciler reaches them all.

A store keeps its open jobs in segments (DynamoDB: the OpenJobs index's shards; memory: one), each
ordered oldest deadline first. A walk reads up to its share of each segment (limit / segments)
from where the last saved walk stopped in it; a segment read to its end wraps around to its start
in the same walk, up to where the walk began. So a job that stays open in a segment of N jobs is
reached within ceil(N / share) walks, whatever its deadline, and a walk that is not saved changes
nothing. Every job a walk hands out counts as reached: a caller that stops early stops pulling.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.core.job import Job


@dataclass(frozen=True, order=True, slots=True)
class OpenJobKey:
    """A job's place in its segment: its deadline, then its id."""

    deadline_at: int
    job_id: str


class OpenJobSegments(Protocol):
    """Where a walk reads the open jobs, and where it keeps how far it got."""

    @property
    def segments(self) -> int: ...

    def keys(self, segment: int, after: OpenJobKey | None, count: int) -> tuple[list[OpenJobKey], bool]:
        """Up to `count` keys of the segment after `after` (from its start when None), in order, and
        whether the segment's end was reached."""
        ...

    def jobs(self, keys: Sequence[OpenJobKey]) -> Iterator[Job | None]:
        """The jobs of `keys` as they are now, in order (None for one that is gone), read as they are used."""
        ...

    def positions(self) -> dict[int, OpenJobKey]:
        """Where each segment's next walk begins: after its key; at its start when absent."""
        ...

    def keep_positions(self, positions: Mapping[int, OpenJobKey]) -> None: ...


class OpenJobsWalk:
    """One pass: iterate it for the jobs (at most `limit`), then `save()` so that the next goes on."""

    def __init__(self, source: OpenJobSegments, limit: int) -> None:
        self._source = source
        self._limit = limit
        self._started: dict[int, OpenJobKey] | None = None
        self._reached: dict[int, OpenJobKey] = {}

    def __iter__(self) -> Iterator[Job]:
        self._started = self._source.positions()
        self._reached = dict(self._started)
        share = max(1, self._limit // self._source.segments)
        left = self._limit
        for segment in range(self._source.segments):
            if left <= 0:
                return
            keys, to_end = self._segment_keys(segment, min(share, left))
            for key, job in zip(keys, self._source.jobs(keys), strict=True):
                self._reached[segment] = key
                if job is not None:
                    left -= 1
                    yield job
            if to_end:
                # Every key up to the segment's end was handed out: the next walk begins at its start.
                self._reached.pop(segment, None)

    def save(self) -> None:
        """Keep where this walk stopped in each segment (nothing is written when that did not change)."""
        if self._started is not None and self._reached != self._started:
            self._source.keep_positions(self._reached)

    def _segment_keys(self, segment: int, wanted: int) -> tuple[list[OpenJobKey], bool]:
        """The segment's next `wanted` keys from where the last walk stopped, wrapping around once."""
        start = self._reached.get(segment)
        keys, to_end = self._source.keys(segment, start, wanted)
        if not to_end or start is None or len(keys) == wanted:
            return keys, to_end
        # From the start again, up to the keys this walk read already (the segment is then read whole).
        seen = {key.job_id for key in keys}
        again, to_end = self._source.keys(segment, None, wanted - len(keys))
        for key in again:
            if key.job_id in seen:
                return keys, True
            keys.append(key)
        return keys, to_end
