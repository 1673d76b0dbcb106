"""Daily spending caps per user (UTC days), kept in the jobs table, enforced before provider calls.

A user's day is one item holding its `headroom`: the cap less what is reserved or spent. Before
its provider call an attempt reserves its worst case (engine.gateway.CallPlan.worst_case_usd) with
a write fenced on `headroom >= amount`, and when it ends, whatever its outcome, the reservation is
settled to the actual cost: headroom gets back what was not spent. Since every cost was reserved
before it was incurred and no reservation exceeds the headroom, what a user spends in a day never
exceeds the cap (as long as a call costs no more than its worst case, which bounds its tokens).

A worker reserves for all of a batch's jobs of one user in one write, and settles them in one.
Caps of their own (`aijobs budget set`) are read with BatchGetItem and kept CAP_CACHE_SECONDS. With
no default cap, a worker first asks whether anyone has a cap of their own (a marker item that
`aijobs budget set` writes), at most once per CAP_CACHE_SECONDS: while no one has, budgets cost no
request per job.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from engine.core.days import utc_day

# How long a worker trusts the caps it read (a raised budget takes effect within this).
CAP_CACHE_SECONDS = 60
# Writes of one reservation before the jobs left out wait for the budget.
RESERVE_TRIES = 3


@dataclass(frozen=True, slots=True)
class BudgetDay:
    """A user's day: the cap, what was spent, what is reserved by attempts in flight, what is left."""

    user_id: str
    day: str
    cap_usd: Decimal
    spent_usd: Decimal
    reserved_usd: Decimal
    left_usd: Decimal


class BudgetStore(Protocol):
    """Where caps and days are kept (engine.store.budgets.BudgetTable)."""

    def caps(self, user_ids: Sequence[str]) -> dict[str, Decimal]:
        """The caps of their own of those users that have one."""
        ...

    def any_caps(self) -> bool:
        """Whether any user was ever given a cap of their own."""
        ...

    def reserve(self, user_id: str, day: str, amount: Decimal, cap: Decimal, now_ms: int) -> tuple[bool, Decimal]:
        """Take `amount` from the day's headroom (the cap when the day is new): (True, headroom after) when
        at least that much was left, else (False, the headroom as it was)."""
        ...

    def settle(self, user_id: str, day: str, returned: Decimal, spent: Decimal) -> None:
        """Give back `returned` to the day's headroom and count `spent`."""
        ...


class Budgets:
    def __init__(
        self,
        store: BudgetStore,
        default_cap: Decimal | None,
        cache_seconds: int = CAP_CACHE_SECONDS,
    ) -> None:
        self._store = store
        self._default = default_cap
        self._cache_ms = cache_seconds * 1000
        self._caps: dict[str, tuple[Decimal | None, int]] = {}
        # Whether anyone has a cap of their own, and when that was read (None: not yet).
        self._own_caps_seen: tuple[bool, int] | None = None
        self._lock = threading.Lock()

    def active(self, now_ms: int) -> bool:
        """Whether anyone may be capped: a default cap, or caps of their own (read once per cache period)."""
        if self._default is not None:
            return True
        with self._lock:
            seen = self._own_caps_seen
        if seen is not None and now_ms - seen[1] < self._cache_ms:
            return seen[0]
        capped = self._store.any_caps()
        with self._lock:
            self._own_caps_seen = (capped, now_ms)
        return capped

    def caps(self, user_ids: Iterable[str], now_ms: int) -> dict[str, Decimal | None]:
        """Each user's cap (theirs, else the default; None: no cap), read at most once per cache period."""
        wanted = set(user_ids)
        if not self.active(now_ms):
            return dict.fromkeys(wanted)
        with self._lock:
            cached = {user: self._caps[user] for user in wanted if user in self._caps}
        fresh = {user: cap for user, (cap, at) in cached.items() if now_ms - at < self._cache_ms}
        missing = sorted(wanted - fresh.keys())
        if missing:
            own = self._store.caps(missing)
            read = {user: own.get(user, self._default) for user in missing}
            with self._lock:
                self._caps.update({user: (cap, now_ms) for user, cap in read.items()})
            fresh |= read
        return fresh

    def reserve(self, user_id: str, amounts: Sequence[Decimal], cap: Decimal, now_ms: int) -> int:
        """Reserve the longest prefix of `amounts` that today's headroom holds; how many were reserved."""
        day = utc_day(now_ms)
        headroom = cap  # until the store says otherwise: a new day starts at the cap
        for _ in range(RESERVE_TRIES):
            count = _prefix_within(amounts, headroom)
            if count == 0:
                return 0
            ok, headroom = self._store.reserve(user_id, day, sum(amounts[:count], Decimal(0)), cap, now_ms)
            if ok:
                return count
        return 0

    def settle(self, user_id: str, day: str, reserved: Decimal, spent: Decimal) -> None:
        self._store.settle(user_id, day, reserved - spent, spent)


def _prefix_within(amounts: Sequence[Decimal], headroom: Decimal) -> int:
    total = Decimal(0)
    for count, amount in enumerate(amounts):
        total += amount
        if total > headroom:
            return count
    return len(amounts)
