"""The contract of a batched claim's budget settlement (engine.core.Settlement), on both stores.

A claim into a provider's batch holds a reservation of its user's budget until the job's write that
ends the claim gives it back and counts what the answer cost, in that same write; a write made again
(a conclusion gone over again after a pass stopped) never gives it back twice nor counts a cost
twice (docs/batches.md, Budgets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import pytest

from engine.core import Failed, Job, Lane, Released, Settlement, Succeeded
from engine.core.days import utc_day
from engine.core.errors import ConditionRefusedError
from engine.fleet.budgets import BudgetStore
from engine.store import DynamoJobStore
from engine.store.budgets import BudgetTable
from engine.testing import InMemoryBudgetStore, InMemoryJobStore
from tests.contract.conftest import JobStore
from tests.contract.test_job_store import NOW, REJECTED, attempt_of, claim, current

DAY = utc_day(NOW)
CAP = Decimal("10")
RESERVED = Decimal("0.25")


@dataclass
class Settling:
    store: JobStore
    budgets: BudgetStore

    def reserve(self, amount: Decimal = RESERVED) -> None:
        assert self.budgets.reserve("user-1", DAY, amount, CAP, NOW)[0]

    def day(self) -> tuple[Decimal, Decimal]:
        """The user's headroom and spent today."""
        if isinstance(self.budgets, InMemoryBudgetStore):
            _, headroom, spent = self.budgets.days[("user-1", DAY)]
            return headroom, spent
        assert isinstance(self.budgets, BudgetTable)
        today = self.budgets.day("user-1", CAP, NOW)
        return today.left_usd, today.spent_usd


@pytest.fixture(params=["memory", "dynamodb"])
def settling(request: pytest.FixtureRequest) -> Settling:
    if request.param == "memory":
        budgets = InMemoryBudgetStore()
        return Settling(InMemoryJobStore(budgets=budgets), budgets)
    store: DynamoJobStore = request.getfixturevalue("store")
    table = BudgetTable(request.getfixturevalue("stack").table_name, request.getfixturevalue("dynamodb"))
    return Settling(store, table)


def settlement(job: Job, returned: Decimal = RESERVED, spent: Decimal = Decimal(0)) -> Settlement:
    return Settlement(job.claim_count, "user-1", DAY, returned, spent)


def test_a_finish_with_its_settlement_gives_the_reservation_back_and_counts_the_cost(settling: Settling) -> None:
    # Given a claim that reserved $0.25 of its user's day
    settling.reserve()
    job = claim(settling.store)
    attempt = attempt_of(job, NOW + 1_000, cost_usd="0.04")

    # When its answer finishes it, settling the claim in the same write
    output: dict[str, Any] = {"label": "spam", "confidence": 0.9}
    settling.store.finish_job(
        job, Succeeded(output, "h"), NOW + 1_000, attempt, settlement=settlement(job, spent=Decimal("0.04"))
    )

    # Then the day has the cost spent and the rest of the reservation back, and the claim is settled
    assert settling.day() == (CAP - Decimal("0.04"), Decimal("0.04"))
    assert current(settling.store).batch_settled == {job.claim_count}


def test_a_hand_back_gives_the_reservation_back_and_a_late_answer_counts_only_its_cost(settling: Settling) -> None:
    # Given a claim handed back to real time (its reservation given back with the release)
    settling.reserve()
    job = claim(settling.store)
    settling.store.finish_job(job, Released(None, refund_attempt=True), NOW + 1_000, settlement=settlement(job))
    assert settling.day() == (CAP, Decimal(0))

    # When its batch's late answer is kept as usage, with its cost only
    late = attempt_of(job, NOW + 2_000, cost_usd="0.03")
    recorded = settling.store.record_orphan_attempt(late, NOW + 2_000, settlement(job, Decimal(0), Decimal("0.03")))

    # Then the cost is spent once, and nothing more is given back
    assert recorded
    assert settling.day() == (CAP - Decimal("0.03"), Decimal("0.03"))
    assert current(settling.store).usage.cost_usd == Decimal("0.03")


def test_an_orphan_attempt_recorded_again_changes_nothing(settling: Settling) -> None:
    # Given a claim its batch no longer holds (cancelled), and its answer kept once with its settlement
    settling.reserve()
    job = claim(settling.store)
    late = attempt_of(job, NOW + 2_000, cost_usd="0.03")
    assert settling.store.record_orphan_attempt(late, NOW + 2_000, settlement(job, spent=Decimal("0.03")))
    before = (settling.day(), current(settling.store))

    # When it is kept again (a conclusion gone over after its pass stopped), as it was or with its
    # reservation given back no more
    again = settling.store.record_orphan_attempt(late, NOW + 3_000, settlement(job, Decimal(0), Decimal("0.03")))

    # Then it says so, and neither the budget nor the job moved
    assert again is False
    assert (settling.day(), current(settling.store)) == before
    assert len(settling.store.attempts("job-1")) == 1


def test_a_reservation_is_given_back_once(settling: Settling) -> None:
    # Given a claim whose job ended without any write of the claim's (its user cancelled it)
    settling.reserve()
    job = claim(settling.store)

    # When its reservation is given back twice
    first = settling.store.settle_reservation("job-1", settlement(job), NOW + 1_000)
    second = settling.store.settle_reservation("job-1", settlement(job), NOW + 2_000)

    # Then it went back once
    assert (first, second) == (True, False)
    assert settling.day() == (CAP, Decimal(0))
    assert current(settling.store).batch_settled == {job.claim_count}


def test_an_orphan_attempt_that_would_give_back_a_settled_reservation_is_refused_whole(settling: Settling) -> None:
    # Given a claim whose reservation was given back already
    settling.reserve()
    job = claim(settling.store)
    assert settling.store.settle_reservation("job-1", settlement(job), NOW + 1_000)
    before = (settling.day(), current(settling.store))

    # When an answer of it is kept with the reservation given back again
    with pytest.raises(ConditionRefusedError):
        settling.store.record_orphan_attempt(attempt_of(job, NOW + 2_000), NOW + 2_000, settlement(job))

    # Then nothing was written: no attempt, no budget moved
    assert (settling.day(), current(settling.store)) == before
    assert settling.store.attempts("job-1") == []


def test_a_finish_fenced_out_settles_nothing(settling: Settling) -> None:
    # Given a claim another worker took over (its lease lost)
    settling.reserve()
    stale = claim(settling.store, owner="worker-a")
    settling.store.claim_job("job-1", "worker-b", 60_000, NOW + 70_000, None)
    before = settling.day()

    # When the stale claim's finish carries its settlement
    with pytest.raises(ConditionRefusedError):
        settling.store.finish_job(
            replace(stale, lane=Lane.BACKGROUND), Failed(REJECTED), NOW + 71_000, settlement=settlement(stale)
        )

    # Then the budget did not move, and the claim is not settled
    assert settling.day() == before
    assert current(settling.store).batch_settled == frozenset()
