"""Answers already paid for (docs/reuse.md): a succeeded job's answer kept under its request's key, and
what a later job of the same request reads back instead of calling the model. No I/O here.

A job type reuses answers for `reuse_seconds` (from MIN_REUSE_SECONDS to MAX_REUSE_SECONDS; off when
unset). The key is engine.reuse's; the store keeps the answer with the finish that paid for it.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_REUSE_SECONDS = 1
# Thirty days: past that, a "same request" is more likely a stale one than a repeat.
MAX_REUSE_SECONDS = 30 * 86_400


@dataclass(frozen=True, slots=True)
class Reusable:
    """A paid answer to keep for later jobs of the same request: the request's key, the answer as it was
    validated (compact JSON, before the job type's projection), and how long its job type reuses it."""

    key: str
    answer: str
    seconds: int


@dataclass(frozen=True, slots=True)
class PaidAnswer:
    """An answer kept for reuse, as read back: the job that paid for it, when it was answered (epoch ms),
    and the last moment it may be reused (its job type's time, within the table's retention)."""

    key: str
    job_id: str
    answer: str
    answered_at: int
    until: int

    def fresh(self, now_ms: int, seconds: int) -> bool:
        """Whether a job type that reuses answers for `seconds` may take this one now: answered less than
        that long ago, and before its own end. Never the table's TTL, whose removal may come days late."""
        return now_ms - self.answered_at < seconds * 1000 and now_ms < self.until
