"""Admission: a batch's claimed jobs get their user's budget, then their model's capacity, together.

The worker claims a batch's jobs, then asks `admit`: for each limited model, one take of
capacity for its jobs; for each user with a cap, one reservation of the worst cases of that user's
jobs that got capacity. A job that gets both gets a `Pass` (when it may call); one that does not
gets a `Hold` (what it waits for and until when) and makes no provider call. Just before its call, a pass
is checked again (`Pass.revoked`): if this worker met a 429 for its model since the capacity was
taken, that capacity is void, and this worker's passes it voided take capacity again together once
the provider's pause is over, waiting for it in the worker (or, when it comes too late for their
invocation, on the queue). A 429 lowers the model's shared rate as soon as it is met. When the
batch is done, `settle` gives back what the calls did not use: one write per user, and the models'
share rides on the next take. docs/fleet.md walks through it.

Lanes (docs/lanes.md): interactive jobs take from their own lane's arrival times (pushing the
background ones back) as far ahead as their invocation can wait; background jobs take turns in
their model's line, a few calls a take (`admit_as_capacity_comes`), waiting in their worker: only
what cannot call within the invocation waits on the queue. Background jobs may not reserve the last
part of a user's daily cap.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from engine.core import ErrorCode, Lane
from engine.core.days import next_utc_midnight_ms, utc_day
from engine.core.errors import ProviderRateLimitedError
from engine.fleet.budgets import Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import HORIZON_MS, Debt
from engine.gateway import CallPlan, Execution
from engine.observability import log_unexpected, logger

# A job held for its user's budget looks again this often (or at the next UTC midnight, if sooner):
# every look is a receive of its message, so a day of waiting costs ~48 of MaxReceiveCount.
BUDGET_RECHECK_MS = 30 * 60_000
# When admission itself fails (DynamoDB unavailable), jobs wait this long rather than run unchecked.
UNCHECKED_RETRY_MS = 5_000
# How far ahead background jobs take capacity outside a turn of the line (a worker without an
# invocation to bound it): about a second of calls, or two at a rate slower than two a second.
BACKGROUND_HORIZON_MS = 1_000
# A background worker's turn in its model's line: this many calls, taken in one write.
TURN_CALLS = 5
# A turn is taken this long before its first call: late, the bucket would fall idle and the time
# between be lost to everyone.
TAKE_AHEAD_MS = 250


@dataclass(frozen=True, slots=True)
class Ask:
    """A claimed job's claim on the fleet: its user and what its attempt can use."""

    user_id: str | None
    plan: CallPlan
    lane: Lane = Lane.INTERACTIVE


@dataclass(frozen=True, slots=True)
class Capacity:
    """The capacity taken for a job's first call: from which bucket, how many tokens, and when."""

    model: str
    shard: int
    tokens: int
    taken_at_ms: int


@dataclass
class Pass:
    """Admitted: call at `call_at_ms`. The runner checks `revoked()` just before the call and
    `record`s what the attempt used, for `settle`."""

    call_at_ms: int
    user_id: str | None = None
    day: str = ""
    reserved_usd: Decimal = Decimal(0)
    taken: Capacity | None = None  # when the model is limited
    execution: Execution | None = field(default=None, repr=False)
    admission: Admission | None = field(default=None, repr=False)
    # Set when its capacity was void and could not be taken again within its invocation.
    void_until_ms: int | None = field(default=None, repr=False)

    def revoked(self) -> Hold | None:
        """Just before the call: None when it may call now (having waited, if its capacity was taken
        again for later), or a hold instead when its capacity is void (a 429 met since)."""
        return self.admission.revoked(self) if self.admission is not None else None

    def record(self, execution: Execution) -> None:
        self.execution = execution
        if self.admission is not None:
            self.admission.recorded(self)


@dataclass(frozen=True, slots=True)
class Hold:
    """Not admitted: no call now; the job waits, its attempt refunded, until `until_ms`."""

    code: ErrorCode  # provider_rate_limited (shared capacity) or budget_exceeded
    until_ms: int
    reason: str
    # A reservation, or capacity, taken for the job before it was held: given back at settle.
    user_id: str | None = None
    day: str = ""
    reserved_usd: Decimal = Decimal(0)
    taken: Capacity | None = None
    # For a job its model's shared limit holds: when a take (with the same horizon) could include it,
    # and when it would then call; its worker may wait for that rather than hand it back.
    capacity_at_ms: int | None = None
    would_call_at_ms: int | None = None

    @classmethod
    def instead_of(cls, admitted: Pass, code: ErrorCode, until_ms: int, reason: str) -> Hold:
        """A hold for a job admitted so far, keeping what was taken for it (to give it back)."""
        return cls(code, until_ms, reason, admitted.user_id, admitted.day, admitted.reserved_usd, admitted.taken)


Verdict = Pass | Hold


class Admission:
    def __init__(
        self,
        limiter: RateLimiter | None,
        budgets: Budgets | None,
        clock: Callable[[], float] = time.time,
        background_keep: Decimal = Decimal(0),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._limiter = limiter
        self._budgets = budgets
        self._clock = clock
        # The share (0-1) of a user's daily cap that background jobs may not reserve.
        self._background_keep = background_keep
        self._sleep = sleep
        # The passes with capacity that have not called yet (by id), with what they asked and the
        # latest their invocation lets them call: for a 429 to void and take again, one take at a time.
        self._waiting: dict[int, tuple[Pass, Ask, int]] = {}
        self._waiting_lock = threading.Lock()
        self._taking_again = threading.Lock()

    def active(self) -> bool:
        """Whether the batch must be admitted: a shared limit is set, or someone may be capped. Fails
        closed: when that cannot be read, the batch goes through admission (which holds it)."""
        if self._limiter is not None:
            return True
        if self._budgets is None:
            return False
        try:
            return self._budgets.active(self._now_ms())
        except Exception as exc:
            log_unexpected("whether anyone is capped could not be read", exc)
            return True

    def admit_as_capacity_comes(
        self, asks: Sequence[Ask], call_within_ms: int | None, on_verdict: Callable[[int, Verdict], None]
    ) -> None:
        """Admit `asks` (by index, through `on_verdict`) as soon as each verdict is known.

        Interactive jobs (and any job of a model without a shared limit) are admitted at once, taking
        capacity as far ahead as they can still call within `call_within_ms` (the invocation's time
        less the job's). Background jobs of a limited model wait here for capacity, in turns: the
        worker joins its model's line for a turn of a few calls (TURN_CALLS_MS of them), waits until
        its turn comes, takes it in one write, and lines up again for the rest. A job whose turn
        comes too late for this invocation gets its hold and waits on the queue. Without an
        invocation to bound it, one admission of everything."""
        latest = None if call_within_ms is None else self._now_ms() + call_within_ms
        lined = [index for index, ask in enumerate(asks) if latest is not None and self._lines_up(ask)]
        pending = [index for index in range(len(asks)) if index not in lined]
        try:
            now = self._now_ms()
            horizon = HORIZON_MS if latest is None else max(latest - now, 0)
            for index, verdict in zip(pending, self.admit([asks[index] for index in pending], horizon), strict=True):
                on_verdict(index, verdict)
            pending = lined
            while pending:
                assert latest is not None
                assert self._limiter is not None
                model = asks[pending[0]].plan.model
                turn_of = [index for index in pending if asks[index].plan.model == model]
                tokens = max(asks[index].plan.first_call_tokens for index in turn_of)
                spacing = self._limiter.spacing_ms(model, tokens, now)
                chunk = turn_of[:TURN_CALLS]
                turn = self._limiter.line_up(model, [asks[index].plan.first_call_tokens for index in chunk], now)
                if turn > latest:
                    # Its turn comes too late for this invocation: back to the queue until then.
                    for index in turn_of:
                        on_verdict(index, self._turn_hold(asks[index], turn, now))
                    pending = [index for index in pending if index not in turn_of]
                    continue
                self._sleep(max(turn - TAKE_AHEAD_MS - self._now_ms(), 0) / 1000)
                now = self._now_ms()
                # The turn's calls, taken at once: the take reaches as far as the turn.
                reach = turn + len(chunk) * spacing - now
                verdicts = self.admit([asks[index] for index in chunk], max(latest - now, 0), reach)
                for index, verdict in zip(chunk, verdicts, strict=True):
                    if not (isinstance(verdict, Hold) and verdict.capacity_at_ms is not None):
                        on_verdict(index, verdict)
                        pending.remove(index)
                now = self._now_ms()
        except Exception as exc:
            log_unexpected("admission failed; the batch's jobs wait", exc)
            until = self._now_ms() + UNCHECKED_RETRY_MS
            for index in pending:
                on_verdict(
                    index, Hold(ErrorCode.PROVIDER_RATE_LIMITED, until, "waiting: capacity could not be checked")
                )

    def _lines_up(self, ask: Ask) -> bool:
        """Whether a job waits for capacity in its model's line: a background job of a limited model."""
        return ask.lane is Lane.BACKGROUND and self._limiter is not None and self._limiter.limits(ask.plan.model)

    def _turn_hold(self, ask: Ask, turn: int, now: int) -> Hold:
        seconds = max(1, round((turn - now) / 1000))
        reason = f"waiting: {ask.plan.model} is at its shared rate limit; next try in about {seconds}s"
        return Hold(ErrorCode.PROVIDER_RATE_LIMITED, max(turn, now + 1000), reason)

    def admit(self, asks: Sequence[Ask], horizon_ms: int, background_reach_ms: int | None = None) -> list[Verdict]:
        """A verdict per ask, in order. Fails closed: if the table cannot be reached, every job waits.
        Background jobs take capacity `background_reach_ms` ahead (their turn's), else about a second.

        Capacity first, then budgets: capacity a job cannot use rides back on the next take at no
        cost, while a reservation takes a write to give back; and a job held for capacity must not
        hold its user's budget while it waits."""
        now = self._now_ms()
        verdicts: list[Verdict] = [Pass(now, admission=self) for _ in asks]
        try:
            self._take(asks, verdicts, now, horizon_ms, background_reach_ms)
            self._reserve(asks, verdicts, now)
            self._wait_for_calls(asks, verdicts, now + horizon_ms)
        except Exception as exc:
            log_unexpected("admission failed; the batch's jobs wait", exc)
            until, reason = now + UNCHECKED_RETRY_MS, "waiting: capacity could not be checked"
            # What was taken or reserved before the failure is given back at settle.
            return [
                Hold.instead_of(verdict, ErrorCode.PROVIDER_RATE_LIMITED, until, reason)
                if isinstance(verdict, Pass)
                else verdict
                for verdict in verdicts
            ]
        return verdicts

    def revoked(self, admitted: Pass) -> Hold | None:
        """None once a pass may call. Capacity taken before a 429 this worker met for its model since
        was taken at a rate the provider refuses: it is void (not given back: the pause the 429
        asks). Once the pause is over, the passes it voided take capacity again together, at the
        lowered rate, and each waits here for its new call time; one that cannot call within its
        invocation waits on the queue instead."""
        limiter = self._limiter
        while limiter is not None and admitted.taken is not None and admitted.void_until_ms is None:
            taken = admitted.taken
            until = limiter.paused_until(taken.model, taken.taken_at_ms)
            if until is None:
                wait_ms = admitted.call_at_ms - self._now_ms()
                if wait_ms > 0:
                    self._sleep(wait_ms / 1000)  # taken again, for later: the call waits for it
                if limiter.paused_until(taken.model, taken.taken_at_ms) is None:
                    break
                continue  # a 429 was met meanwhile
            with self._taking_again:
                if admitted.taken is taken and admitted.void_until_ms is None:  # not taken again yet
                    self._sleep(max(until - self._now_ms(), 0) / 1000)
                    self._take_again(limiter, taken.model, until)
        self._forget([admitted])
        until = admitted.void_until_ms
        if until is None or admitted.taken is None:
            return None
        model = admitted.taken.model
        admitted.taken = None
        now = self._now_ms()
        seconds = max(1, round((until - now) / 1000))
        return Hold.instead_of(
            admitted,
            ErrorCode.PROVIDER_RATE_LIMITED,
            max(until, now + 1000),
            f"waiting: {model} answered 429 after this call's capacity was taken; next try in about {seconds}s",
        )

    def _take_again(self, limiter: RateLimiter, model: str, until: int) -> None:
        """One take for every pass of `model` whose capacity a 429 voided, in their call order, within
        the invocation of the one that must call soonest; those it cannot hold are void until `until`."""
        with self._waiting_lock:
            voided = sorted(
                (
                    (admitted, ask, latest)
                    for admitted, ask, latest in self._waiting.values()
                    if admitted.taken is not None
                    and admitted.taken.model == model
                    and limiter.paused_until(model, admitted.taken.taken_at_ms) is not None
                ),
                key=lambda waiting: waiting[0].call_at_ms,
            )
        now = self._now_ms()
        again: list[Verdict] = [Pass(now) for _ in voided]
        try:
            horizon = max(min(latest for _, _, latest in voided) - now, 0)
            self._take([ask for _, ask, _ in voided], again, now, horizon, None)
        except Exception as exc:
            log_unexpected("capacity could not be taken again after a 429", exc, model=model)
            again = []
        retaken = set()
        for (admitted, _, _), verdict in zip(voided, again, strict=False):
            if isinstance(verdict, Pass) and verdict.taken is not None:
                admitted.call_at_ms = verdict.call_at_ms  # before the capacity: it is what is read first
                admitted.taken = verdict.taken
                retaken.add(id(admitted))
        for admitted, _, _ in voided:
            if id(admitted) not in retaken:
                admitted.void_until_ms = until

    def _wait_for_calls(self, asks: Sequence[Ask], verdicts: Sequence[Verdict], latest_ms: int) -> None:
        """Keep the passes with capacity until they call: a 429 met meanwhile voids it."""
        with self._waiting_lock:
            for ask, verdict in zip(asks, verdicts, strict=True):
                if isinstance(verdict, Pass) and verdict.taken is not None:
                    self._waiting[id(verdict)] = (verdict, ask, latest_ms)

    def _forget(self, verdicts: Sequence[Verdict]) -> None:
        with self._waiting_lock:
            for verdict in verdicts:
                self._waiting.pop(id(verdict), None)

    def recorded(self, admitted: Pass) -> None:
        """A 429 lowers its model's shared rate at once, for every worker."""
        execution = admitted.execution
        if self._limiter is None or execution is None or not isinstance(execution.error, ProviderRateLimitedError):
            return
        taken_at = admitted.taken.taken_at_ms if admitted.taken else self._now_ms()
        retry_after = execution.error.retry_after_seconds
        try:
            self._limiter.throttled(
                execution.model, taken_at, self._now_ms(), round(retry_after * 1000) if retry_after else None
            )
        except Exception as exc:
            log_unexpected("the shared rate could not be lowered", exc, model=execution.model)

    def reserve(self, asks: Sequence[Ask]) -> list[Verdict]:
        """Budgets alone, for jobs whose call a provider's batch makes (its own limits, not the shared
        rate's): each a Pass holding its reservation, or a Hold. Settled when the batch answers."""
        now = self._now_ms()
        verdicts: list[Verdict] = [Pass(now) for _ in asks]
        self._reserve(asks, verdicts, now)
        return verdicts

    def settle(self, verdicts: Sequence[Verdict]) -> None:
        """Give back what the batch's calls did not use."""
        self._forget(verdicts)
        self._settle_budgets(verdicts)
        if self._limiter is not None:
            self._settle_limits(self._limiter, verdicts)

    # --- admit ---------------------------------------------------------------------------------

    def _take(
        self, asks: Sequence[Ask], verdicts: list[Verdict], now: int, horizon_ms: int, background_reach_ms: int | None
    ) -> None:
        """Take each limited model's capacity for its jobs; those it cannot hold wait."""
        limiter = self._limiter
        if limiter is None:
            return
        by_model: dict[tuple[str, Lane], list[int]] = defaultdict(list)
        # Interactive first: within a batch of both, they take before the background ones.
        for index, ask in sorted(enumerate(asks), key=lambda pair: pair[1].lane is Lane.BACKGROUND):
            if limiter.limits(ask.plan.model):
                by_model[(ask.plan.model, ask.lane)].append(index)
        for (model, lane), indexes in by_model.items():
            tokens = [asks[index].plan.first_call_tokens for index in indexes]
            horizon = horizon_ms
            if lane is Lane.BACKGROUND:
                # Its turn's calls, or about a second of them: interactive jobs arriving meanwhile go
                # first (their own arrival times), beside at most that much of background calls.
                reach = background_reach_ms
                if reach is None:
                    reach = max(BACKGROUND_HORIZON_MS, 2 * limiter.spacing_ms(model, max(tokens), now))
                horizon = min(horizon_ms, reach)
            taken = limiter.take(model, tokens, now, horizon, interactive=lane is Lane.INTERACTIVE)
            granted = len(taken.call_at_ms)
            for index, call_at in zip(indexes, taken.call_at_ms, strict=False):
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                admitted.call_at_ms = call_at
                admitted.taken = Capacity(model, taken.shard, asks[index].plan.first_call_tokens, taken.taken_at_ms)
            for index, fits_at in zip(indexes[granted:], taken.fits_at_ms, strict=True):
                seconds = max(1, round((fits_at - now) / 1000))
                verdicts[index] = Hold(
                    ErrorCode.PROVIDER_RATE_LIMITED,
                    max(fits_at, now + 1000),
                    f"waiting: {model} is at its shared rate limit; next try in about {seconds}s",
                    capacity_at_ms=fits_at,
                    would_call_at_ms=fits_at + horizon,
                )

    def _reserve(self, asks: Sequence[Ask], verdicts: list[Verdict], now: int) -> None:
        """Reserve the worst cases of each capped user's jobs that may call; those the budget cannot hold wait."""
        if self._budgets is None:
            return
        by_user: dict[tuple[str, Lane], list[int]] = defaultdict(list)
        # Interactive first: within a batch of both, they reserve before the background ones.
        for index, ask in sorted(enumerate(asks), key=lambda pair: pair[1].lane is Lane.BACKGROUND):
            if ask.user_id is not None and isinstance(verdicts[index], Pass):
                by_user[(ask.user_id, ask.lane)].append(index)
        caps = self._budgets.caps({user for user, _ in by_user}, now)
        day = utc_day(now)
        until = min(next_utc_midnight_ms(now), now + BUDGET_RECHECK_MS)
        for (user, lane), indexes in by_user.items():
            cap = caps.get(user)
            if cap is None:
                continue
            # Background jobs leave the last part of the cap to the user's interactive ones.
            keep = cap * self._background_keep if lane is Lane.BACKGROUND else Decimal(0)
            # A model with no price would cost an unknown amount: no budget can hold it.
            for index in [index for index in indexes if asks[index].plan.unpriced]:
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                unpriced = ", ".join(asks[index].plan.unpriced)
                reason = f"waiting: {unpriced} has no price (AIJOBS_PRICES), so user {user}'s budget cannot be kept"
                verdicts[index] = Hold.instead_of(admitted, ErrorCode.BUDGET_EXCEEDED, until, reason)
            indexes = [index for index in indexes if not asks[index].plan.unpriced]
            amounts = [asks[index].plan.worst_case_usd for index in indexes]
            count = self._budgets.reserve(user, amounts, cap, now, keep) if indexes else 0
            for index in indexes[:count]:
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                admitted.user_id, admitted.day, admitted.reserved_usd = user, day, asks[index].plan.worst_case_usd
            reason = f"waiting: user {user} has spent or reserved its daily budget of ${cap}"
            if keep:
                reason += f", less the ${keep.normalize():f} kept for its interactive jobs"
            for index in indexes[count:]:
                admitted = verdicts[index]
                assert isinstance(admitted, Pass)
                verdicts[index] = Hold.instead_of(admitted, ErrorCode.BUDGET_EXCEEDED, until, reason)

    # --- settle --------------------------------------------------------------------------------

    def _settle_budgets(self, verdicts: Sequence[Verdict]) -> None:
        if self._budgets is None:
            return
        totals: dict[tuple[str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
        for verdict in verdicts:
            spent = verdict.execution.cost_usd if isinstance(verdict, Pass) and verdict.execution else Decimal(0)
            # (Spent with nothing reserved: a batch's late answer to a job it had handed back.)
            if verdict.user_id is None or not (verdict.reserved_usd or spent):
                continue
            if verdict.reserved_usd and spent > verdict.reserved_usd:
                logger.warning("an attempt cost more than its reservation", extra={"user_id": verdict.user_id})
            total = totals[(verdict.user_id, verdict.day)]
            total[0] += verdict.reserved_usd
            total[1] += spent
        for (user, day), (reserved, spent) in totals.items():
            try:
                self._budgets.settle(user, day, reserved, spent)
            except Exception as exc:  # one user's failure leaves the others' settlements to go
                log_unexpected("a budget could not be settled; its reservations stay counted", exc, user_id=user)

    def _settle_limits(self, limiter: RateLimiter, verdicts: Sequence[Verdict]) -> None:
        for verdict in verdicts:
            taken = verdict.taken
            if taken is None:
                continue
            execution = verdict.execution if isinstance(verdict, Pass) else None
            if execution is None:
                limiter.settle(taken.model, taken.shard, Debt(-1, -taken.tokens))  # no call was made
            elif execution.model == taken.model:
                used = execution.input_tokens + execution.output_tokens
                limiter.settle(taken.model, taken.shard, Debt(execution.calls - 1, used - taken.tokens))
            else:
                # The primary failed without an answer (its request counted) and the fallback answered.
                limiter.settle(taken.model, taken.shard, Debt(0, -taken.tokens))
                if limiter.limits(execution.model):
                    used = execution.input_tokens + execution.output_tokens
                    limiter.settle(execution.model, 0, Debt(execution.calls - 1, used))

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
