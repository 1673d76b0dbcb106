"""Shared limits and budgets on DynamoDB (moto): the requests each take and reservation costs, what
they write, and that two workers sharing a bucket or a budget never take more than it holds."""

from __future__ import annotations

import random
from decimal import Decimal
from itertools import pairwise
from typing import Any

import pytest

from aijobs.stack import StackResources
from engine.core.days import utc_day
from engine.fleet.budgets import CAP_CACHE_SECONDS, Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import DECREASE, BucketState, Debt, ModelLimit
from engine.store.budgets import BudgetTable
from engine.store.limits import LimitTable, bucket_from_item, limit_key
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
NS = 1_000_000
MODEL = "gpt-4o-mini"


@pytest.fixture
def limits(stack: StackResources, dynamodb: Any) -> LimitTable:
    return LimitTable(stack.table_name, dynamodb)


def limiter(table: LimitTable, **limit: int) -> RateLimiter:
    return RateLimiter(table, {MODEL: ModelLimit(**limit)}, random.Random(1))


def bucket(table: TableReader) -> BucketState:
    item = table.client.get_item(TableName=table.table_name, Key=limit_key(MODEL, 0), ConsistentRead=True)["Item"]
    return bucket_from_item(item)


# --- limits -------------------------------------------------------------------------------------


def test_a_new_bucket_costs_a_refused_add_and_an_exact_write_then_busy_takes_cost_one_request(
    limits: LimitTable, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    workers = limiter(limits, rpm=600)

    first = workers.take(MODEL, [100] * 10, NOW)
    assert dynamodb_requests.operations == {"UpdateItem": 2}
    dynamodb_requests.reset()
    second = workers.take(MODEL, [100] * 10, NOW)

    assert dynamodb_requests.operations == {"UpdateItem": 1}
    assert [call - NOW for call in first.call_at_ms] == [100 * n for n in range(10)]
    assert [call - NOW for call in second.call_at_ms] == [1_000 + 100 * n for n in range(10)]
    assert bucket(table).request_at == (NOW + 2_000) * NS


def test_two_workers_sharing_a_bucket_never_take_two_calls_at_one_time(limits: LimitTable, table: TableReader) -> None:
    # Given two workers whose views of the bucket go stale between their takes
    a, b = limiter(limits, rpm=600), limiter(limits, rpm=600)

    calls = [*a.take(MODEL, [1] * 4, NOW).call_at_ms, *b.take(MODEL, [1] * 4, NOW).call_at_ms]
    calls += [*a.take(MODEL, [1] * 4, NOW).call_at_ms, *b.take(MODEL, [1] * 4, NOW).call_at_ms]

    # Then together they took one call per 100 ms, as one worker would have
    assert sorted(call - NOW for call in calls) == [100 * n for n in range(16)]


def test_a_batch_that_fits_only_in_part_takes_what_fits_and_says_when_the_rest_would(
    limits: LimitTable, dynamodb_requests: RequestCounter
) -> None:
    workers = limiter(limits, rpm=60)  # one a second: about ten within the horizon

    taken = workers.take(MODEL, [1] * 15, NOW)

    assert len(taken.call_at_ms) == 11
    assert [fits - NOW for fits in taken.fits_at_ms] == [1_000, 2_000, 3_000, 4_000]
    dynamodb_requests.reset()
    # And a take when nothing fits writes nothing
    assert limiter(limits, rpm=60).take(MODEL, [1], NOW).call_at_ms == ()
    assert dynamodb_requests.operations == {"UpdateItem": 1}  # the refused add only


def test_what_calls_did_not_use_rides_on_the_next_take(
    limits: LimitTable, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a worker that took 2,000 tokens for each of two jobs at 60,000 tpm (1 ms a token)
    workers = limiter(limits, tpm=60_000)
    workers.take(MODEL, [2_000, 2_000], NOW)
    before = bucket(table).token_at

    # When the jobs used 500 tokens each, one of them re-asked once, and it takes again
    workers.settle(MODEL, 0, Debt(requests=1, tokens=-3_000))
    dynamodb_requests.reset()
    workers.take(MODEL, [100], NOW)

    # Then the give-back and the next take are one write
    assert dynamodb_requests.operations == {"UpdateItem": 1}
    assert bucket(table).token_at == before + (-3_000 + 100) * NS


def test_a_429_lowers_the_shared_rate_once_per_overload(
    limits: LimitTable, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    a, b = limiter(limits, rpm=600), limiter(limits, rpm=600)
    a.take(MODEL, [1], NOW)
    b.take(MODEL, [1], NOW)

    # When both workers' calls, taken at the same rate, meet 429s
    a.throttled(MODEL, NOW, NOW + 1_000)
    b.throttled(MODEL, NOW, NOW + 2_000)  # taken before a lowered it: the same overload

    state = bucket(table)
    assert (state.factor, state.factor_at) == (pytest.approx(DECREASE), NOW + 1_000)
    # And a call taken after the decrease that meets a 429 lowers it again, from where it has climbed to
    retaken = b.take(MODEL, [1], NOW + 5_000)
    b.throttled(MODEL, retaken.taken_at_ms, NOW + 6_000)
    again = bucket(table)
    assert again.factor == pytest.approx(state.factor_now(NOW + 6_000) * DECREASE, abs=1e-6)
    # And the workers space their calls at the lowered rate
    dynamodb_requests.reset()
    calls = a.take(MODEL, [1] * 20, NOW + 6_001).call_at_ms
    assert calls[-1] - calls[-2] > 100


def test_a_take_with_a_stale_view_of_a_lowered_rate_is_refused_and_taken_at_the_lowered_rate(
    limits: LimitTable, dynamodb_requests: RequestCounter
) -> None:
    # Given a worker that last saw the bucket at the full rate, and another that lowered it since
    a, b = limiter(limits, rpm=600), limiter(limits, rpm=600)
    a.take(MODEL, [1], NOW)
    b.take(MODEL, [1], NOW)
    b.throttled(MODEL, NOW, NOW + 1)

    # When the first takes for a batch on what it saw
    dynamodb_requests.reset()
    calls = a.take(MODEL, [1] * 3, NOW + 2).call_at_ms

    # Then its add is refused (the rate changed) and the exact write spaces calls at the lowered rate
    assert dynamodb_requests.operations == {"UpdateItem": 2}
    assert [later - earlier for earlier, later in pairwise(calls)] == [143, 143]


def test_a_429_pauses_the_calls_this_worker_took_before_it(limits: LimitTable) -> None:
    workers = limiter(limits, rpm=600)
    before = workers.take(MODEL, [1] * 3, NOW)

    workers.throttled(MODEL, before.taken_at_ms, NOW + 100, retry_after_ms=2_000)

    assert workers.paused_until(MODEL, before.taken_at_ms) == NOW + 2_100
    # Capacity taken after the 429 is not paused
    assert workers.paused_until(MODEL, NOW + 101) is None


def test_a_model_without_a_limit_is_never_taken_from(limits: LimitTable) -> None:
    assert not limiter(limits, rpm=600).limits("another-model")


# --- budgets ------------------------------------------------------------------------------------


@pytest.fixture
def budget_table(stack: StackResources, dynamodb: Any) -> BudgetTable:
    return BudgetTable(stack.table_name, dynamodb)


def test_a_reservation_takes_what_the_headroom_holds_and_settles_to_the_actual_cost(
    budget_table: BudgetTable, dynamodb_requests: RequestCounter
) -> None:
    budgets = Budgets(budget_table, Decimal("1.00"))
    amounts = [Decimal("0.30")] * 5

    # The day's first reservation creates it at the cap: three of five fit, in one request
    assert budgets.reserve("acme", amounts, Decimal("1.00"), NOW) == 3
    assert dynamodb_requests.operations == {"UpdateItem": 1}
    # The headroom is 0.10 now: a refused reservation learns it and reserves nothing more
    dynamodb_requests.reset()
    assert budgets.reserve("acme", amounts, Decimal("1.00"), NOW) == 0
    assert dynamodb_requests.operations == {"UpdateItem": 1}
    # When the three attempts cost 0.02 each, settling gives the rest back
    budgets.settle("acme", utc_day(NOW), Decimal("0.90"), Decimal("0.06"))
    today = budget_table.day("acme", Decimal("1.00"), NOW)
    assert (today.spent_usd, today.reserved_usd, today.left_usd) == (Decimal("0.06"), 0, Decimal("0.94"))


def test_a_reservation_left_out_by_a_race_is_retried_with_the_headroom_it_met(budget_table: BudgetTable) -> None:
    # Given another worker that reserved 0.85 of the day since this one last looked
    budget_table.reserve("acme", utc_day(NOW), Decimal("0.85"), Decimal("1.00"), NOW)

    # When this one reserves three of 0.10, believing the day new
    count = Budgets(budget_table, Decimal("1.00")).reserve("acme", [Decimal("0.10")] * 3, Decimal("1.00"), NOW)

    # Then it gets the one that fits, and the day never goes below zero
    assert count == 1
    assert budget_table.day("acme", Decimal("1.00"), NOW).left_usd == Decimal("0.05")


def test_a_reservation_of_the_whole_cap_in_fine_amounts_settles_exactly(budget_table: BudgetTable) -> None:
    # Given worst cases priced to the nano-dollar, and a cap of exactly three of them
    worst = Decimal("0.000732450")
    budgets = Budgets(budget_table, worst * 3)
    assert budgets.reserve("acme", [worst] * 4, worst * 3, NOW) == 3

    # When the three settle, each having cost a fraction of its worst case
    budgets.settle("acme", utc_day(NOW), worst * 3, Decimal("0.000031001") * 3)

    # Then the day holds exactly what was spent, and what is left can be reserved again
    today = budget_table.day("acme", worst * 3, NOW)
    assert (today.spent_usd, today.reserved_usd) == (Decimal("0.000093003"), 0)
    assert today.left_usd == worst * 3 - Decimal("0.000093003")
    assert budgets.reserve("acme", [worst], worst * 3, NOW) == 1


def test_a_lowered_cap_begins_the_day_so_a_worker_still_holding_the_old_one_cannot_spend_it(
    budget_table: BudgetTable,
) -> None:
    # Given a user whose cap is lowered from 100 to 5 before their day has begun
    budget_table.set_cap("acme", Decimal("5"), NOW)

    # When a worker that still holds the old cap (cached) reserves 60 of it
    ok, headroom = budget_table.reserve("acme", utc_day(NOW), Decimal("60"), Decimal("100"), NOW)

    # Then the day began at the new cap: the reservation is refused
    assert (ok, headroom) == (False, Decimal("5"))
    assert budget_table.day("acme", Decimal("5"), NOW).left_usd == Decimal("5")


def test_a_settlement_retried_by_the_sdk_after_it_landed_counts_once(budget_table: BudgetTable, dynamodb: Any) -> None:
    budgets = Budgets(budget_table, Decimal("1.00"))
    assert budgets.reserve("acme", [Decimal("0.50")], Decimal("1.00"), NOW) == 1
    sent: list[dict[str, Any]] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.TransactWriteItems", lambda params, **_: sent.append(dict(params))
    )

    budgets.settle("acme", utc_day(NOW), Decimal("0.50"), Decimal("0.10"))
    # A retry of the very same request (what botocore sends when an answer is lost) changes nothing
    dynamodb.transact_write_items(**sent[0])

    today = budget_table.day("acme", Decimal("1.00"), NOW)
    assert (today.spent_usd, today.left_usd) == (Decimal("0.10"), Decimal("0.90"))


def test_each_utc_day_starts_at_the_cap(budget_table: BudgetTable) -> None:
    budgets = Budgets(budget_table, Decimal("1.00"))
    assert budgets.reserve("acme", [Decimal("1.00")], Decimal("1.00"), NOW) == 1
    assert budgets.reserve("acme", [Decimal("0.01")], Decimal("1.00"), NOW) == 0

    tomorrow = NOW + 86_400_000
    assert budgets.reserve("acme", [Decimal("0.60")], Decimal("1.00"), tomorrow) == 1
    assert budget_table.day("acme", Decimal("1.00"), tomorrow).left_usd == Decimal("0.40")


def test_a_cap_of_ones_own_replaces_the_default_and_moves_todays_headroom(
    budget_table: BudgetTable, dynamodb_requests: RequestCounter
) -> None:
    budgets = Budgets(budget_table, Decimal("1.00"))
    assert budgets.caps(["acme", "globex"], NOW) == {"acme": Decimal("1.00"), "globex": Decimal("1.00")}
    assert budgets.reserve("acme", [Decimal("0.80")], Decimal("1.00"), NOW) == 1

    budget_table.set_cap("acme", Decimal("5.00"), NOW)

    # Today: the new cap less what was reserved
    today = budget_table.day("acme", Decimal("1.00"), NOW)
    assert (today.cap_usd, today.reserved_usd, today.left_usd) == (Decimal("5.00"), Decimal("0.80"), Decimal("4.20"))
    # Workers read caps at most once per cache period, with one BatchGetItem for every user missing
    dynamodb_requests.reset()
    assert budgets.caps(["acme"], NOW + 1_000) == {"acme": Decimal("1.00")}
    assert dynamodb_requests.total == 0
    later = NOW + CAP_CACHE_SECONDS * 1000
    assert budgets.caps(["acme", "globex"], later) == {"acme": Decimal("5.00"), "globex": Decimal("1.00")}
    assert dynamodb_requests.operations == {"BatchGetItem": 1}
    assert budget_table.own_caps() == {"acme": Decimal("5.00")}


def test_without_a_default_only_users_with_a_cap_of_their_own_have_one(budget_table: BudgetTable) -> None:
    budget_table.set_cap("acme", Decimal("2"), NOW)

    assert Budgets(budget_table, None).caps(["acme", "globex"], NOW) == {"acme": Decimal("2"), "globex": None}
