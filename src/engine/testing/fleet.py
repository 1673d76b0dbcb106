"""The fleet's stores in memory: buckets and budgets with the conditions the DynamoDB items keep.

They let the decisions of admission (lanes, holds, budgets) be tested on a clock the test moves,
in milliseconds; tests/contract holds them to engine.store.limits and engine.store.budgets.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

from engine.fleet.limits import Bounds, BucketState


class InMemoryLimitStore:
    """engine.fleet.limiter.LimitStore: one bucket per (model, shard), each write fenced as the table's."""

    def __init__(self) -> None:
        self.buckets: dict[tuple[str, int], BucketState] = {}
        self.writes = 0
        self._lock = threading.Lock()

    def add(
        self,
        model: str,
        shard: int,
        request_ns: int,
        token_ns: int,
        bounds: Bounds,
        factor_at: int,
        now_ms: int,
        interactive: bool = False,
    ) -> tuple[bool, BucketState | None]:
        with self._lock:
            self.writes += 1
            old = self.buckets.get((model, shard))
            if old is None:
                return False, None
            seen = old.interactive() if interactive else old
            within = all(
                bound is None or bound[0] <= value <= bound[1]
                for bound, value in ((bounds.request, seen.request_at), (bounds.token, seen.token_at))
            )
            if not within or old.factor_at != factor_at:
                return False, old
            new = replace(old, request_at=old.request_at + request_ns, token_at=old.token_at + token_ns)
            if interactive:
                new = replace(
                    new,
                    interactive_request_at=old.interactive_request_at + request_ns,
                    interactive_token_at=old.interactive_token_at + token_ns,
                )
            self.buckets[(model, shard)] = new
            return True, new

    def replace(
        self,
        model: str,
        shard: int,
        old: BucketState | None,
        request_at: int,
        token_at: int,
        now_ms: int,
        interactive: tuple[int, int] | None = None,
    ) -> tuple[bool, BucketState | None]:
        with self._lock:
            self.writes += 1
            current = self.buckets.get((model, shard))
            if old is None:
                if current is not None:
                    return False, current
                new = BucketState(request_at, token_at)
            else:
                same = current is not None and (current.request_at, current.token_at, current.factor_at) == (
                    old.request_at,
                    old.token_at,
                    old.factor_at,
                )
                if current is None or not same:
                    return False, current
                new = replace(current, request_at=request_at, token_at=token_at)
            if interactive is not None:
                new = replace(new, interactive_request_at=interactive[0], interactive_token_at=interactive[1])
            self.buckets[(model, shard)] = new
            return True, new

    def line_up(self, model: str, shard: int, tokens: bool, cost_ns: int, now_ms: int) -> int:
        with self._lock:
            self.writes += 1
            current = self.buckets.get((model, shard))
            if current is None:
                return now_ms * 1_000_000
            timeline = current.token_at if tokens else current.request_at
            start = max(current.background_at, timeline, now_ms * 1_000_000)
            self.buckets[(model, shard)] = replace(current, background_at=start + cost_ns)
            return start

    def lower(
        self, model: str, shard: int, seen: BucketState, factor: float, now_ms: int
    ) -> tuple[bool, BucketState | None]:
        with self._lock:
            self.writes += 1
            current = self.buckets.get((model, shard))
            if current is None or current.factor_at != seen.factor_at:
                return False, current
            new = replace(current, factor=round(factor, 6), factor_at=now_ms)
            self.buckets[(model, shard)] = new
            return True, new


class InMemoryBudgetStore:
    """engine.fleet.budgets.BudgetStore: caps of users' own, and each user's day (cap, headroom, spent)."""

    def __init__(self) -> None:
        self.own_caps: dict[str, Decimal] = {}
        # (user, day) -> [cap, headroom, spent]
        self.days: dict[tuple[str, str], list[Decimal]] = {}
        self._lock = threading.Lock()

    def caps(self, user_ids: Sequence[str]) -> dict[str, Decimal]:
        with self._lock:
            return {user: self.own_caps[user] for user in user_ids if user in self.own_caps}

    def any_caps(self) -> bool:
        with self._lock:
            return bool(self.own_caps)

    def reserve(
        self, user_id: str, day: str, amount: Decimal, cap: Decimal, now_ms: int, keep: Decimal = Decimal(0)
    ) -> tuple[bool, Decimal]:
        with self._lock:
            current = self.days.get((user_id, day))
            if current is not None and current[1] < amount + keep:
                return False, current[1]
            if current is None:
                current = self.days[(user_id, day)] = [cap, cap, Decimal(0)]
            current[1] -= amount
            return True, current[1]

    def settle(self, user_id: str, day: str, returned: Decimal, spent: Decimal) -> None:
        with self._lock:
            current = self.days[(user_id, day)]
            current[1] += returned
            current[2] += spent
