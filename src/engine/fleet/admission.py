"""Admission: a batch's claimed jobs get their user's budget, then their model's capacity, together.

The worker claims a batch's jobs, then asks `admit` once: for each user with a cap, one
reservation of the worst cases of that user's jobs; for each limited model, one take of capacity
for the jobs left. A job that gets both gets a `Pass` (when it may call); one that does not gets a
`Hold` (what it waits for and until when) and makes no provider call. When the batch is done,
`settle` gives back what the calls did not use: one write per user, and the models' share rides on
the next take. docs/fleet.md walks through it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from engine.core import ErrorCode
from engine.core.days import next_utc_midnight_ms, utc_day
from engine.core.errors import ProviderRateLimitedError
from engine.fleet.budgets import Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import Debt
from engine.gateway import CallPlan, Execution
from engine.observability import log_unexpected, logger

# A job held for its user's budget looks again this often (or at the next UTC midnight, if sooner):
# every look is a receive of its message, so a day of waiting costs ~48 of MaxReceiveCount.
BUDGET_RECHECK_MS = 30 * 60_000
# When admission itself fails (DynamoDB unavailable), jobs wait this long rather than run unchecked.
UNCHECKED_RETRY_MS = 5_000


@dataclass(frozen=True, slots=True)
class Ask:
    """A claimed job's claim on the fleet: its user and what its attempt can use."""

    user_id: str | None
    plan: CallPlan


@dataclass
class Pass:
    """Admitted: call at `call_at_ms`. The runner records what the attempt used, for `settle`."""

    call_at_ms: int
    user_id: str | None = None
    day: str = ""
    reserved_usd: Decimal = Decimal(0)
    # The capacity taken for the first call: (model, shard, tokens), when the model is limited.
    taken: tuple[str, int, int] | None = None
    execution: Execution | None = field(default=None, repr=False)

    def record(self, execution: Execution) -> None:
        self.execution = execution


@dataclass(frozen=True, slots=True)
class Hold:
    """Not admitted: no call now; the job waits, its attempt refunded, until `until_ms`."""

    code: ErrorCode  # provider_rate_limited (shared capacity) or budget_exceeded
    until_ms: int
    reason: str
    # A reservation made for the job before its model had no capacity: given back at settle.
    user_id: str | None = None
    day: str = ""
    reserved_usd: Decimal = Decimal(0)


Verdict = Pass | Hold


class Admission:
    def __init__(
        self,
        limiter: RateLimiter | None,
        budgets: Budgets | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limiter = limiter
        self._budgets = budgets
        self._clock = clock

    def admit(self, asks: Sequence[Ask], horizon_ms: int) -> list[Verdict]:
        """A verdict per ask, in order. Fails closed: if the table cannot be reached, every job waits."""
        now = self._now_ms()
        verdicts: list[Verdict | None] = [None] * len(asks)
        reserved: dict[int, Pass] = {}
        try:
            self._reserve(asks, verdicts, reserved, now)
            self._take(asks, verdicts, reserved, now, horizon_ms)
        except Exception as exc:
            log_unexpected("admission failed; the batch's jobs wait", exc)
            held = Hold(
                ErrorCode.PROVIDER_RATE_LIMITED, now + UNCHECKED_RETRY_MS, "waiting: capacity could not be checked"
            )
            # What was reserved before the failure is given back at settle.
            return [
                verdict if isinstance(verdict, Hold) else _unchecked(held, verdict, reserved.get(index))
                for index, verdict in enumerate(verdicts)
            ]
        return [verdict or Pass(call_at_ms=now) for verdict in verdicts]

    def settle(self, verdicts: Sequence[Verdict]) -> None:
        """Give back what the batch's calls did not use, and lower the rate of a model that answered 429."""
        now = self._now_ms()
        try:
            self._settle_budgets(verdicts)
        except Exception as exc:
            log_unexpected("budgets could not be settled; the reservations stay counted", exc)
        if self._limiter is not None:
            self._settle_limits(self._limiter, verdicts, now)

    # --- admit ---------------------------------------------------------------------------------

    def _reserve(
        self, asks: Sequence[Ask], verdicts: list[Verdict | None], reserved: dict[int, Pass], now: int
    ) -> None:
        """Reserve each capped user's worst cases (into `reserved`); jobs whose user has no budget left are held."""
        if self._budgets is None:
            return
        by_user: dict[str, list[int]] = defaultdict(list)
        for index, ask in enumerate(asks):
            if ask.user_id is not None:
                by_user[ask.user_id].append(index)
        caps = self._budgets.caps(by_user, now)
        day = utc_day(now)
        for user, indexes in by_user.items():
            cap = caps.get(user)
            if cap is None:
                continue
            amounts = [asks[index].plan.worst_case_usd for index in indexes]
            count = self._budgets.reserve(user, amounts, cap, now)
            for index in indexes[:count]:
                reserved[index] = Pass(now, user, day, asks[index].plan.worst_case_usd)
            until = min(next_utc_midnight_ms(now), now + BUDGET_RECHECK_MS)
            reason = f"waiting: user {user} has spent or reserved its daily budget of ${cap}"
            for index in indexes[count:]:
                verdicts[index] = Hold(ErrorCode.BUDGET_EXCEEDED, until, reason)

    def _take(
        self, asks: Sequence[Ask], verdicts: list[Verdict | None], reserved: dict[int, Pass], now: int, horizon_ms: int
    ) -> None:
        """Take each limited model's capacity for the jobs not held; those it cannot hold wait."""
        limiter = self._limiter
        by_model: dict[str, list[int]] = defaultdict(list)
        for index, ask in enumerate(asks):
            if verdicts[index] is None:
                verdicts[index] = reserved.get(index) or Pass(now)
                if limiter is not None and limiter.limits(ask.plan.model):
                    by_model[ask.plan.model].append(index)
        for model, indexes in by_model.items():
            assert limiter is not None
            taken = limiter.take(model, [asks[index].plan.first_call_tokens for index in indexes], now, horizon_ms)
            granted = len(taken.call_at_ms)
            for index, call_at in zip(indexes, taken.call_at_ms, strict=False):
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                admitted.call_at_ms = call_at
                admitted.taken = (model, taken.shard, asks[index].plan.first_call_tokens)
            for index, fits_at in zip(indexes[granted:], taken.fits_at_ms, strict=True):
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                seconds = max(1, round((fits_at - now) / 1000))
                verdicts[index] = Hold(
                    ErrorCode.PROVIDER_RATE_LIMITED,
                    max(fits_at, now + 1000),
                    f"waiting: {model} is at its shared rate limit; next try in about {seconds}s",
                    admitted.user_id,
                    admitted.day,
                    admitted.reserved_usd,
                )

    # --- settle --------------------------------------------------------------------------------

    def _settle_budgets(self, verdicts: Sequence[Verdict]) -> None:
        if self._budgets is None:
            return
        totals: dict[tuple[str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
        for verdict in verdicts:
            if verdict.user_id is None or not verdict.reserved_usd:
                continue
            spent = verdict.execution.cost_usd if isinstance(verdict, Pass) and verdict.execution else Decimal(0)
            if spent > verdict.reserved_usd:
                logger.warning("an attempt cost more than its reservation", extra={"user_id": verdict.user_id})
            total = totals[(verdict.user_id, verdict.day)]
            total[0] += verdict.reserved_usd
            total[1] += spent
        for (user, day), (reserved, spent) in totals.items():
            self._budgets.settle(user, day, reserved, spent)

    def _settle_limits(self, limiter: RateLimiter, verdicts: Sequence[Verdict], now: int) -> None:
        for verdict in verdicts:
            if not isinstance(verdict, Pass):
                continue
            execution = verdict.execution
            if verdict.taken is not None:
                model, shard, tokens = verdict.taken
                if execution is None:
                    limiter.settle(model, shard, Debt(-1, -tokens))  # no call was made
                elif execution.model == model:
                    used = execution.input_tokens + execution.output_tokens
                    limiter.settle(model, shard, Debt(execution.calls - 1, used - tokens))
                else:
                    # The primary failed without an answer (its request counted) and the fallback answered.
                    limiter.settle(model, shard, Debt(0, -tokens))
                    if limiter.limits(execution.model):
                        used = execution.input_tokens + execution.output_tokens
                        limiter.settle(execution.model, 0, Debt(execution.calls - 1, used))
            if execution is not None and isinstance(execution.error, ProviderRateLimitedError):
                try:
                    limiter.throttled(execution.model, now)
                except Exception as exc:
                    log_unexpected("the shared rate could not be lowered", exc, model=execution.model)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _unchecked(held: Hold, verdict: Verdict | None, reservation: Pass | None) -> Hold:
    if reservation is None:
        return held
    return Hold(held.code, held.until_ms, held.reason, reservation.user_id, reservation.day, reservation.reserved_usd)
