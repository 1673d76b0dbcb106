"""RateLimiter: a worker's side of the shared buckets, one take per model and batch.

A take tries the cheap write first and falls back to the exact one:
1. `add` (the common case, a busy bucket with one limit, requests or tokens): move the arrival time
   on by the whole batch, fenced on it lying where every ask fits and on the rate not having been
   lowered since this worker last saw the bucket; one request, whatever other workers did meanwhile.
2. `replace` (an idle bucket, a batch that cannot fit whole, a rate lowered, a model limited in both
   requests and tokens, whose arrival times do not simply add up):
   compute the schedule from the bucket as the refused write returned it (ALL_OLD) and write it,
   fenced on those exact values; repeated while other workers get in between, at most TAKE_TRIES
   writes.
What the worker owes or is owed after its calls (re-asks, tokens not used) rides on its next take.

A 429 lowers the shared rate at once (`throttled`), and voids what this worker took before it: its
calls not yet made (`paused_until`) take capacity again after the pause rather than meet the same
overload (engine.fleet.admission).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.fleet.limits import (
    HORIZON_MS,
    Bounds,
    BucketState,
    Costs,
    Debt,
    ModelLimit,
    Schedule,
    add_bounds,
    schedule,
)
from engine.observability import logger

# A horizon no take reaches past: how far interactive calls move the shared arrival times.
UNBOUNDED_MS = 10**12
# Writes of one take before the asks that did not fit are left to wait on the queue, and how soon
# they come back then.
TAKE_TRIES = 3
RACED_RETRY_MS = 1_000
# How long calls taken before a 429 wait when the provider did not say (Retry-After).
PAUSE_MS = 1_000


class LimitStore(Protocol):
    """Where buckets are kept (engine.store.limits.LimitTable)."""

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
        """Move the arrival times on, fenced on `bounds` and `factor_at`: the shared ones, or for
        `interactive` the interactive lane's (bounds on them) and the shared ones alike."""
        ...

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
        """Set the shared arrival times (and the interactive lane's), fenced on `old`'s."""
        ...

    def lower(
        self, model: str, shard: int, seen: BucketState, factor: float, now_ms: int
    ) -> tuple[bool, BucketState | None]: ...

    def line_up(self, model: str, shard: int, tokens: bool, cost_ns: int, now_ms: int) -> int:
        """A place in the background lane's line for calls worth `cost_ns` of the request (or, with
        `tokens`, the token) arrival time: where it starts (ns). The line starts where the shared
        arrival time is, or now, when it is behind them."""
        ...


class RateLimiter:
    def __init__(self, store: LimitStore, limits: Mapping[str, ModelLimit], rng: random.Random | None = None) -> None:
        self._store = store
        self._limits = dict(limits)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        # What this worker last saw of each bucket, and what it owes each: (model, shard) -> ...
        self._seen: dict[tuple[str, int], BucketState] = {}
        self._debts: dict[tuple[str, int], Debt] = {}
        # The last 429 this worker met per model: (when, until when the provider asked to wait), ms.
        self._paused: dict[str, tuple[int, int]] = {}

    def limits(self, model: str) -> bool:
        return model in self._limits

    def spacing_ms(self, model: str, tokens: int, now_ms: int) -> int:
        """How far apart one take's calls of `tokens` tokens go (a shard's rate, as this worker last saw it)."""
        with self._lock:
            seen = self._seen.get((model, 0)) or BucketState()
        request_ns, token_ns = Costs.of(self._limits[model], seen.factor_now(now_ms)).moves(1, tokens)
        return math.ceil(max(request_ns, token_ns) / 1_000_000)

    def take(
        self, model: str, asks: Sequence[int], now_ms: int, horizon_ms: int = HORIZON_MS, interactive: bool = True
    ) -> Taken:
        """Capacity for the longest prefix of `asks` (estimated tokens of one call each) that calls within
        the horizon: when each may call, and when the first one left out could. Interactive asks are
        scheduled from the interactive lane's arrival times, background ones from the shared ones."""
        limit = self._limits[model]
        shard = self._rng.randrange(limit.shard_count)
        with self._lock:
            key = (model, shard)
            seen, debt = self._seen.get(key), self._debts.pop(key, Debt())
            try:
                return self._take(key, limit, asks, now_ms, horizon_ms, seen, debt, interactive)
            except Exception:
                self._owe(key, debt)  # nothing known to be written: still owed
                raise

    def _take(
        self,
        key: tuple[str, int],
        limit: ModelLimit,
        asks: Sequence[int],
        now_ms: int,
        horizon_ms: int,
        seen: BucketState | None,
        debt: Debt,
        interactive: bool,
    ) -> Taken:
        model, shard = key
        plan: Schedule | None = None
        ok, state = False, seen

        def frontier(bucket: BucketState | None) -> BucketState:
            """The arrival times the asks are scheduled from: their lane's."""
            bucket = bucket or BucketState()
            return bucket.interactive() if interactive else bucket

        for attempt in range(TAKE_TRIES):
            # Costs at the rate the bucket had when last seen; the add is fenced on it still holding.
            costs = Costs.of(limit, (state or BucketState()).factor_now(now_ms))
            bounds = add_bounds(costs, asks, now_ms, debt, horizon_ms)
            # The add first when the bucket likely allows it; after a refusal, whenever the bucket as
            # the refusal returned it does: no other worker's add can refuse it, as a replace they
            # get in before is (several workers meeting a new bucket at once).
            if attempt == 0:
                addable = _looks_busy(frontier(seen) if seen else None, now_ms)
            else:
                addable = state is not None and bounds.admit(frontier(state))
            if addable and bounds.feasible and not costs.both:
                request_ns, token_ns = costs.moves(debt.requests + len(asks), debt.tokens + sum(asks))
                factor_at = state.factor_at if state else 0
                ok, state = self._store.add(
                    model, shard, request_ns, token_ns, bounds, factor_at, now_ms, interactive=interactive
                )
                if ok and state is not None:
                    after = frontier(state)
                    old = BucketState(after.request_at - request_ns, after.token_at - token_ns)
                    plan = schedule(old, costs, asks, now_ms, debt, horizon_ms)
                    break
                continue
            plan = schedule(frontier(state), costs, asks, now_ms, debt, horizon_ms)
            if not plan.call_at_ms:
                break  # nothing fits now: no write, the debt stays owed
            if interactive:
                # The interactive lane's calls count against the shared arrival times too, after
                # whatever background calls were taken: those are pushed back by their cost.
                granted = asks[: len(plan.call_at_ms)]
                shared = schedule(state or BucketState(), costs, granted, now_ms, debt, UNBOUNDED_MS)
                ok, state = self._store.replace(
                    model, shard, state, shared.request_at, shared.token_at, now_ms, (plan.request_at, plan.token_at)
                )
            else:
                ok, state = self._store.replace(model, shard, state, plan.request_at, plan.token_at, now_ms)
            if ok:
                break
        if state is not None:
            self._seen[key] = state
        if not ok or plan is None:
            # Nothing was written: the debt is still owed, and nothing was taken.
            self._owe(key, debt)
            if plan is None or plan.call_at_ms:
                # Other workers kept getting in between: try again in a moment.
                return Taken(model, shard, (), tuple(now_ms + RACED_RETRY_MS for _ in asks), now_ms)
            return Taken(model, shard, (), plan.fits_at_ms, now_ms)
        return Taken(model, shard, plan.call_at_ms, plan.fits_at_ms, now_ms)

    def line_up(self, model: str, asks: Sequence[int], now_ms: int) -> int:
        """When the background lane's line comes to these asks (ms): background workers waiting for
        capacity take turns rather than all ask at each moment some frees. One write; a model split
        over shards keeps no line (its takes are large enough), and its asks' turn is now."""
        limit = self._limits[model]
        if limit.shard_count > 1:
            return now_ms
        with self._lock:
            seen = self._seen.get((model, 0)) or BucketState()
        request_ns, token_ns = Costs.of(limit, seen.factor_now(now_ms)).moves(len(asks), sum(asks))
        by_tokens = limit.rpm is None
        start = self._store.line_up(model, 0, by_tokens, token_ns if by_tokens else request_ns, now_ms)
        return -(-start // 1_000_000)

    def settle(self, model: str, shard: int, debt: Debt) -> None:
        """Owe (or be owed) what calls used beyond (or short of) what was taken for them."""
        with self._lock:
            self._owe((model, shard), debt)

    def throttled(self, model: str, taken_at_ms: int, now_ms: int, retry_after_ms: int | None = None) -> None:
        """The provider answered 429 to a call whose capacity was taken at `taken_at_ms`: pause this
        worker's calls taken before now, and lower the model's rate for every worker unless it was
        lowered since that take (then this 429 belongs to the overload that lowered it)."""
        limit = self._limits.get(model)
        if limit is None:
            return
        with self._lock:
            since, until = self._paused.get(model, (0, 0))
            self._paused[model] = (max(since, now_ms), max(until, now_ms + (retry_after_ms or PAUSE_MS)))
        for shard in range(limit.shard_count):
            with self._lock:
                state: BucketState | None = self._seen.get((model, shard)) or BucketState()
            for _ in range(2):  # with this worker's view of the bucket, then with the bucket as it is
                assert state is not None
                if state.factor_at > taken_at_ms:
                    break  # lowered since this call's capacity was taken
                factor = state.lowered(now_ms)
                ok, state = self._store.lower(model, shard, state, factor, now_ms)
                if state is None:
                    break  # no bucket: nothing was taken from it yet
                with self._lock:
                    self._seen[(model, shard)] = state
                if ok:
                    logger.warning(
                        "provider rate limit met; shared rate lowered", extra={"model": model, "factor": factor}
                    )
                    break

    def paused_until(self, model: str, taken_at_ms: int) -> int | None:
        """Until when a call whose capacity was taken at `taken_at_ms` must wait, if this worker met a
        429 for its model since: that capacity was taken at a rate the provider refused."""
        with self._lock:
            since, until = self._paused.get(model, (0, 0))
        return until if since >= taken_at_ms else None

    def _owe(self, key: tuple[str, int], debt: Debt) -> None:
        if debt != Debt():
            self._debts[key] = self._debts.get(key, Debt()) + debt


def _looks_busy(seen: BucketState | None, now_ms: int) -> bool:
    """Whether the bucket is likely busy: an add then most likely fits (else an exact write). What
    this worker took last lies a horizon ahead at most; if that is no older than a horizon, other
    workers have most likely kept the bucket busy since."""
    if seen is None:
        return True  # most takes meet a busy bucket; an idle or new one costs one refused add
    return max(seen.request_at, seen.token_at) >= (now_ms - HORIZON_MS) * 1_000_000


@dataclass(frozen=True, slots=True)
class Taken:
    """What a take got: call times for the first asks (ms), and for each ask left out, when a take
    could include it (ms)."""

    model: str
    shard: int
    call_at_ms: tuple[int, ...]
    fits_at_ms: tuple[int, ...]
    taken_at_ms: int
