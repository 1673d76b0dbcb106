"""Job types as data (docs/jobtypes.md): a name's versions and labels, which version a user is served,
and when a guarded canary has done worse than production by enough to end by itself.

No I/O: engine.store.job_types keeps these in the jobs table, the worker's catalog reads them once a
minute (engine.definitions.catalog), the events function tallies finished jobs into them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

# A guarded canary's defaults: it is judged over at least this many finished canary jobs, and ends
# when its share of validation failures is more than this many points above production's.
DEFAULT_GUARD_MIN_JOBS = 200
DEFAULT_GUARD_MAX_REGRESSION = 2.0


class LabelAction(StrEnum):
    """What moved a name's labels, as its history records it."""

    PUSH = "push"  # a new version stored (the first is production at once)
    PROMOTE = "promote"  # a version made production
    CANARY = "canary"  # a version served to a share of users
    ROLLBACK = "rollback"  # a canary ended, or production moved back, by someone
    GUARD_ROLLBACK = "guard_rollback"  # a guarded canary ended by itself


@dataclass(frozen=True, slots=True)
class Guard:
    """A canary's guard: over at least `min_jobs` finished canary jobs, a validation-failure share more
    than `max_regression` points above production's (over the same period) ends the canary."""

    min_jobs: int = DEFAULT_GUARD_MIN_JOBS
    max_regression: float = DEFAULT_GUARD_MAX_REGRESSION


@dataclass(frozen=True, slots=True)
class Canary:
    """A version served to `percent`% of users since `started_at` (epoch ms), with what finished since:
    jobs and validation failures (schema, business, reference) on each side."""

    version: int
    percent: int
    started_at: int
    guard: Guard | None = None
    canary_jobs: int = 0
    canary_invalid: int = 0
    production_jobs: int = 0
    production_invalid: int = 0


@dataclass(frozen=True, slots=True)
class LabelEvent:
    """One move of a name's labels: when, what, which version, why and by whom (when known)."""

    at: int
    action: LabelAction
    version: int
    reason: str | None = None
    by: str | None = None


@dataclass(frozen=True, slots=True)
class JobTypeHead:
    """A data job type's name: its newest version, its labels, and how they moved."""

    name: str
    latest: int
    production: int
    canary: Canary | None = None
    # The versions production held before, oldest first: what `rollback` moves production back to.
    previous: tuple[int, ...] = ()
    history: tuple[LabelEvent, ...] = ()
    # Bumped by every write of the head: each label move is conditional on the revision it read.
    revision: int = 0

    def serves(self, user_id: str) -> int:
        """The version a new job of `user_id` runs: the canary's for its share of users, sticky while
        the canary lasts, production's for the rest."""
        canary = self.canary
        if canary is None or not user_id:
            return self.production
        return canary.version if canary_bucket(self.name, canary.version, user_id) < canary.percent else self.production


def canary_bucket(name: str, version: int, user_id: str) -> int:
    """A user's place (0-99) in a canary's split: a stable hash, so the same user is on the same side
    while that canary lasts, and another canary of the name splits users anew."""
    digest = hashlib.sha256(f"{name}\x00{version}\x00{user_id}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % 100


def guard_breach(canary: Canary) -> str | None:
    """Why a guarded canary ends by itself, in one line; None while it may go on."""
    guard = canary.guard
    if guard is None or canary.canary_jobs < guard.min_jobs:
        return None
    canary_share = 100 * canary.canary_invalid / canary.canary_jobs
    production_share = 100 * canary.production_invalid / canary.production_jobs if canary.production_jobs else 0.0
    if canary_share - production_share <= guard.max_regression:
        return None
    return (
        f"v{canary.version} failed validation on {canary_share:.1f}% of {canary.canary_jobs} jobs, production on "
        f"{production_share:.1f}% of {canary.production_jobs}: more than {guard.max_regression:g} points worse"
    )


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """One immutable version of a data job type: its checked file, as stored (canonical JSON)."""

    name: str
    version: int
    document: dict[str, Any]
    sha256: str
    pushed_at: int
    pushed_by: str | None = None


# The upper bounds (ms) of the duration histogram's buckets a version's stats keep; the last is open.
DURATION_BUCKETS_MS: tuple[int, ...] = (
    250, 500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000,
    90_000, 120_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000, 21_600_000, 86_400_000,
)  # fmt: skip


def duration_bucket(duration_ms: int) -> int:
    """The histogram bucket of a job's duration (its index in DURATION_BUCKETS_MS; len() for longer)."""
    for index, bound in enumerate(DURATION_BUCKETS_MS):
        if duration_ms <= bound:
            return index
    return len(DURATION_BUCKETS_MS)


@dataclass(frozen=True, slots=True)
class VersionStats:
    """What the finished jobs of one version did (summed by the events function as they end)."""

    version: int
    jobs: int = 0
    succeeded: int = 0
    validation_failures: int = 0
    reasks: int = 0
    cost_usd: Decimal = Decimal(0)
    # Jobs per duration bucket (creation to end), by bucket index.
    durations: dict[int, int] = field(default_factory=dict)

    @property
    def cost_per_job(self) -> Decimal:
        return self.cost_usd / self.jobs if self.jobs else Decimal(0)

    def percentile_ms(self, share: float) -> int | None:
        """The duration `share` (0-1) of the jobs took at most, as the upper bound of its bucket."""
        total = sum(self.durations.values())
        if not total:
            return None
        seen = 0
        for index in sorted(self.durations):
            seen += self.durations[index]
            if seen >= share * total:
                return DURATION_BUCKETS_MS[min(index, len(DURATION_BUCKETS_MS) - 1)]
        return DURATION_BUCKETS_MS[-1]
