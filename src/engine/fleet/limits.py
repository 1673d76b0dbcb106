"""Shared provider rate limits: the arithmetic of one model's bucket, apart from where it is kept.

Every worker of every Lambda shares a model's limit through one small DynamoDB item (a bucket,
engine.store.limits). A bucket holds two *theoretical arrival times* (GCRA, the generic cell rate
algorithm), one for requests and one for tokens: the time by which everything taken so far would
have been sent at exactly the limit's rate. Taking capacity for a job moves them on by its cost
(one request; its estimated tokens), and the job calls at the arrival time it found: an idle
bucket lets its first call go at once and spaces the next ones at the rate. There is no burst
allowance on our side: the provider's own (they meter per-minute limits over shorter periods)
is left as the margin for calls that start late. Capacity is taken ahead of time, at most
`horizon` ahead: a worker takes for its whole batch in one write and each job waits for its own
call time; a job whose time lies past the horizon is not taken and waits on the queue.

Lanes (docs/lanes.md): a bucket also keeps the interactive lane's own arrival times, and the end of
the background lane's line. Interactive
jobs are scheduled from those, as if no background job had taken anything, and what they take is
added to the shared arrival times too; background jobs are scheduled from the shared ones, and only a
second or so ahead. So an interactive job never waits behind background calls: at most the background
calls taken within that second overlap it, which providers' tolerance of a second of their rate
absorbs, and the background calls after it are pushed back by its cost.

The limit adapts (additive increase, multiplicative decrease): a 429 from the provider multiplies
the bucket's `factor` by DECREASE for everyone, and the factor climbs back by RECOVERY_PER_SECOND
while no 429 lowers it again, up to the configured limit. A 429 lowers it only when the call's
capacity was taken after the last decrease: calls taken earlier were spaced at the old rate, and
their 429s are the same overload.

Times are integers: nanoseconds for the arrival times, milliseconds for the clock and the factor.
docs/fleet.md explains the design and its costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# How far ahead capacity is taken: a job waits at most this long in its worker for its call time.
HORIZON_MS = 10_000
# The adaptive factor: what a 429 multiplies it by, its floor, and how fast it climbs back (per second).
DECREASE = 0.7
MIN_FACTOR = 0.05
RECOVERY_PER_SECOND = 0.005
# A bucket item takes at most ~1,000 writes a second (one DynamoDB partition); a take writes once
# per batch, so a limit above this many requests a minute is split over shards of their own.
RPM_PER_SHARD = 30_000

_NS_PER_MS = 1_000_000
_NS_PER_MINUTE = 60_000 * _NS_PER_MS


@dataclass(frozen=True, slots=True)
class ModelLimit:
    """A model's limit, shared by every worker: requests and tokens (input + output) per minute."""

    rpm: int | None = None
    tpm: int | None = None
    # None: as many as the request rate needs (ceil(rpm / RPM_PER_SHARD)).
    shards: int | None = None

    @property
    def shard_count(self) -> int:
        if self.shards is not None:
            return self.shards
        return max(1, math.ceil((self.rpm or 0) / RPM_PER_SHARD))


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket as stored: arrival times (ns) and the adaptive factor with the time it was last lowered."""

    request_at: int = 0
    token_at: int = 0
    factor: float = 1.0
    factor_at: int = 0
    # The interactive lane's own arrival times: what interactive jobs alone have taken (never past the shared ones).
    interactive_request_at: int = 0
    interactive_token_at: int = 0
    # The end of the background lane's line: background workers waiting for capacity line up, so
    # that each takes its turn instead of all asking at once (RateLimiter.line_up).
    background_at: int = 0

    def interactive(self) -> BucketState:
        """The bucket as interactive jobs schedule from it: their own arrival times."""
        return BucketState(self.interactive_request_at, self.interactive_token_at, self.factor, self.factor_at)

    def factor_now(self, now_ms: int) -> float:
        """The factor as it has climbed back since its last decrease."""
        recovered = self.factor + max(now_ms - self.factor_at, 0) / 1000 * RECOVERY_PER_SECOND
        return min(1.0, max(MIN_FACTOR, recovered))

    def lowered(self, now_ms: int) -> float:
        """The factor a 429 at `now_ms` sets."""
        return max(MIN_FACTOR, self.factor_now(now_ms) * DECREASE)


@dataclass(frozen=True, slots=True)
class Costs:
    """What one request and one token move a shard's arrival times by (ns); None: not limited."""

    request_ns: int | None
    token_ns: int | None

    @classmethod
    def of(cls, limit: ModelLimit, factor: float) -> Costs:
        shards = limit.shard_count
        return cls(
            request_ns=math.ceil(_NS_PER_MINUTE * shards / (limit.rpm * factor)) if limit.rpm else None,
            token_ns=math.ceil(_NS_PER_MINUTE * shards / (limit.tpm * factor)) if limit.tpm else None,
        )

    @property
    def both(self) -> bool:
        """Limited in requests and in tokens: a call waits for the later of the two arrival times,
        which lifts the other one to it, so a batch's times are no longer a plain sum."""
        return self.request_ns is not None and self.token_ns is not None

    def moves(self, requests: int, tokens: int) -> tuple[int, int]:
        """(request, token) nanoseconds that `requests` and `tokens` move the arrival times by."""
        return (requests * (self.request_ns or 0), tokens * (self.token_ns or 0))


@dataclass(frozen=True, slots=True)
class Debt:
    """Capacity a worker owes its bucket (positive: calls beyond what it took, as re-asks) or is owed
    (negative: tokens its calls did not use); settled with its next take."""

    requests: int = 0
    tokens: int = 0

    def __add__(self, other: Debt) -> Debt:
        return Debt(self.requests + other.requests, self.tokens + other.tokens)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The outcome of a take: call times for the first asks that fit, and the bucket after it."""

    call_at_ms: tuple[int, ...]
    request_at: int
    token_at: int
    # For each ask that did not fit, when a take could include it if no other came first (ms).
    fits_at_ms: tuple[int, ...] = ()


def schedule(
    state: BucketState,
    costs: Costs,
    asks: Sequence[int],
    now_ms: int,
    debt: Debt = Debt(),
    horizon_ms: int = HORIZON_MS,
) -> Schedule:
    """Take capacity for the longest prefix of `asks` (each one request and that many tokens) that can
    call within the horizon, after settling `debt`. A job calls at the arrival times it finds."""
    now = now_ms * _NS_PER_MS
    limit = now + horizon_ms * _NS_PER_MS
    debt_request, debt_token = costs.moves(debt.requests, debt.tokens)
    # An idle bucket's arrival times are `now`: it keeps no credit, however long it was idle.
    request_at = max(state.request_at + debt_request, now)
    token_at = max(state.token_at + debt_token, now)
    calls: list[int] = []
    taken: tuple[int, int] | None = None
    for tokens in asks:
        call = max(now, request_at if costs.request_ns else now, token_at if costs.token_ns else now)
        if call > limit and taken is None:
            taken = (request_at, token_at)  # the bucket after the asks that fit
        calls.append(call)
        request_cost, token_cost = costs.moves(1, tokens)
        # A call at `call` uses the rate from then on, as the provider counts it: an arrival time
        # left behind by the other limit never lends its slack to the next calls.
        request_at = max(request_at, call) + request_cost
        token_at = max(token_at, call) + token_cost
    if taken is None:
        return Schedule(tuple(_ceil_ms(call) for call in calls), request_at, token_at)
    fit = [call for call in calls if call <= limit]
    later = calls[len(fit) :]
    horizon = horizon_ms * _NS_PER_MS
    return Schedule(tuple(_ceil_ms(call) for call in fit), *taken, tuple(_ceil_ms(call - horizon) for call in later))


def _ceil_ms(ns: int) -> int:
    return -(-ns // _NS_PER_MS)


@dataclass(frozen=True, slots=True)
class Bounds:
    """The condition under which adding to a bucket schedules every ask within the horizon without
    the idle clamp: each arrival time, before the add, within [low, high] (ns); None: not limited."""

    request: tuple[int, int] | None
    token: tuple[int, int] | None

    @property
    def feasible(self) -> bool:
        """Whether some bucket lies within them (DynamoDB refuses a BETWEEN whose low is above its high)."""
        return all(bound is None or bound[0] <= bound[1] for bound in (self.request, self.token))

    def admit(self, bucket: BucketState) -> bool:
        """Whether an add fenced on them finds `bucket`'s arrival times within them."""
        return all(
            bound is None or bound[0] <= value <= bound[1]
            for bound, value in ((self.request, bucket.request_at), (self.token, bucket.token_at))
        )


def add_bounds(costs: Costs, asks: Sequence[int], now_ms: int, debt: Debt, horizon_ms: int = HORIZON_MS) -> Bounds:
    """What `schedule` would do with a busy bucket, as a condition on the bucket before an add."""
    now = now_ms * _NS_PER_MS
    limit = now + horizon_ms * _NS_PER_MS
    debt_request, debt_token = costs.moves(debt.requests, debt.tokens)
    # The last ask calls at arrival time + debt + the asks before it, which must be <= limit.
    before_last_request, before_last_token = costs.moves(len(asks) - 1, sum(asks[:-1]))
    request = token = None
    if costs.request_ns:
        request = (now - debt_request, limit - debt_request - before_last_request)
    if costs.token_ns:
        token = (now - debt_token, limit - debt_token - before_last_token)
    return Bounds(request, token)
