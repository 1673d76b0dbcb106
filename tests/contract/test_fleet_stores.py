"""The fleet's stores, in memory and on DynamoDB (moto, the template's table): the same conditions.

engine.testing.fleet lets admission's decisions (lanes, holds, budgets) be tested on a clock the test
moves; these tests hold it to engine.store.limits and engine.store.budgets.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from engine.fleet.budgets import BudgetStore
from engine.fleet.limiter import LimitStore
from engine.fleet.limits import Bounds, BucketState
from engine.store.budgets import BudgetTable
from engine.store.limits import LimitTable
from engine.testing import InMemoryBudgetStore, InMemoryLimitStore

NOW = 1_800_000_000_000
NS = 1_000_000
MODEL = "gpt-4o-mini"
DAY = "2027-01-15"


@pytest.fixture(params=["memory", "dynamodb"])
def limits(request: pytest.FixtureRequest) -> LimitStore:
    if request.param == "memory":
        return InMemoryLimitStore()
    return LimitTable(request.getfixturevalue("stack").table_name, request.getfixturevalue("dynamodb"))


@pytest.fixture(params=["memory", "dynamodb"])
def budgets(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return InMemoryBudgetStore()
    return BudgetTable(request.getfixturevalue("stack").table_name, request.getfixturevalue("dynamodb"))


def test_a_new_bucket_is_written_only_where_there_is_none(limits: LimitStore) -> None:
    # An add needs a bucket; a replace from nothing makes one, once
    assert limits.add(MODEL, 0, NS, 0, Bounds((0, 2 * NOW * NS), None), 0, NOW) == (False, None)
    ok, made = limits.replace(MODEL, 0, None, NOW * NS, 0, NOW)
    assert ok
    assert made == BucketState(request_at=NOW * NS)
    again, current = limits.replace(MODEL, 0, None, 1, 0, NOW)
    assert (again, current) == (False, made)


def test_an_add_is_fenced_on_its_bounds_and_the_lane_whose_arrival_times_it_moves(limits: LimitStore) -> None:
    _, bucket = limits.replace(MODEL, 0, None, (NOW + 5_000) * NS, 0, NOW, interactive=(NOW * NS, 0))
    assert bucket is not None
    # Background: bounds on the shared arrival time, which alone moves
    assert limits.add(MODEL, 0, NS, 0, Bounds((0, NOW * NS), None), 0, NOW)[0] is False
    ok, after = limits.add(MODEL, 0, 10 * NS, 0, Bounds((NOW * NS, (NOW + 9_000) * NS), None), 0, NOW)
    assert ok
    assert after == BucketState(request_at=(NOW + 5_000) * NS + 10 * NS, interactive_request_at=NOW * NS)
    # Interactive: bounds on the interactive arrival time; both move
    assert limits.add(MODEL, 0, NS, 0, Bounds(((NOW + 1) * NS, NOW * 2 * NS), None), 0, NOW, True)[0] is False
    ok, after = limits.add(MODEL, 0, 7 * NS, 0, Bounds((0, NOW * NS), None), 0, NOW, interactive=True)
    assert ok
    assert after == BucketState(request_at=(NOW + 5_000) * NS + 17 * NS, interactive_request_at=NOW * NS + 7 * NS)


def test_a_replace_is_fenced_on_the_shared_arrival_times_and_the_rate(limits: LimitStore) -> None:
    _, bucket = limits.replace(MODEL, 0, None, NOW * NS, 0, NOW)
    assert bucket is not None
    stale = BucketState(request_at=NOW * NS - 1)
    assert limits.replace(MODEL, 0, stale, 5, 0, NOW) == (False, bucket)
    lowered, bucket = limits.lower(MODEL, 0, bucket, 0.7, NOW)
    assert lowered
    assert bucket is not None
    assert bucket.factor == pytest.approx(0.7)
    # Lowered since seen: refused, whatever the arrival times
    assert limits.replace(MODEL, 0, BucketState(request_at=NOW * NS), 5, 0, NOW)[0] is False
    ok, after = limits.replace(MODEL, 0, bucket, 5, 6, NOW, interactive=(3, 4))
    assert ok
    assert after == BucketState(5, 6, pytest.approx(0.7), NOW, 3, 4)


def test_a_reservation_keeps_what_it_must_leave_and_a_settlement_gives_back(budgets: BudgetStore) -> None:
    assert budgets.reserve("acme", DAY, Decimal("0.50"), Decimal("1.00"), NOW) == (True, Decimal("0.50"))
    # $0.40 more would leave less than the $0.20 to keep: refused, the headroom as it was
    assert budgets.reserve("acme", DAY, Decimal("0.40"), Decimal("1.00"), NOW, Decimal("0.20")) == (
        False,
        Decimal("0.50"),
    )
    assert budgets.reserve("acme", DAY, Decimal("0.30"), Decimal("1.00"), NOW, Decimal("0.20")) == (
        True,
        Decimal("0.20"),
    )
    budgets.settle("acme", DAY, Decimal("0.70"), Decimal("0.10"))
    assert budgets.reserve("acme", DAY, Decimal("0.90"), Decimal("1.00"), NOW) == (True, Decimal("0"))


def test_caps_of_their_own_and_whether_anyone_has_one(budgets: Any) -> None:
    assert budgets.any_caps() is False
    if isinstance(budgets, InMemoryBudgetStore):
        budgets.own_caps["acme"] = Decimal("2")
    else:
        budgets.set_cap("acme", Decimal("2"), NOW)

    assert budgets.any_caps() is True
    assert budgets.caps(["acme", "globex"]) == {"acme": Decimal("2")}
