"""The data job types' stores, in memory and on DynamoDB (moto, the template's table): the same moves.

engine.testing.job_types lets the catalog, the CLI and the events function's tally be tested without
AWS; these tests hold it to engine.store.job_types.JobTypeTable.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest

from engine.core.errors import JobTypeLabelError
from engine.core.job_type_labels import MAX_HISTORY, MAX_PREVIOUS
from engine.core.job_types import Guard, LabelAction, VersionStats
from engine.core.ports import JobTypeStore
from engine.store.job_types import JobTypeTable
from engine.testing import InMemoryJobTypes

NOW = 1_800_000_000_000
NAME = "triage"


def doc(n: int) -> dict[str, Any]:
    return {"name": NAME, "prompt": {"system": f"v{n}", "user": "{text}"}, "max_tokens": 256, "threshold": 0.25}


def sha(n: int) -> str:
    return f"{n:064x}"


@pytest.fixture(params=["memory", "dynamodb"])
def types(request: pytest.FixtureRequest) -> JobTypeStore:
    if request.param == "memory":
        return InMemoryJobTypes()
    return JobTypeTable(request.getfixturevalue("stack").table_name, request.getfixturevalue("dynamodb"))


def pushed(types: JobTypeStore, count: int, name: str = NAME) -> None:
    for n in range(1, count + 1):
        types.push(name, doc(n), sha(n), NOW + n, by="ana")


def test_the_first_push_is_production_and_identical_content_makes_no_new_version(types: JobTypeStore) -> None:
    assert types.head(NAME) is None
    assert types.push(NAME, doc(1), sha(1), NOW, by="ana") == (1, True)
    assert types.push(NAME, doc(2), sha(2), NOW + 1) == (2, True)
    assert types.push(NAME, doc(1), sha(1), NOW + 2) == (1, False)
    head = types.head(NAME)
    assert head is not None
    assert (head.latest, head.production, head.canary, head.previous) == (2, 1, None, ())
    assert [(event.action, event.version, event.by) for event in head.history] == [
        (LabelAction.PUSH, 1, "ana"),
        (LabelAction.PUSH, 2, None),
    ]
    stored = types.version(NAME, 2)
    assert stored is not None
    assert (stored.document, stored.sha256, stored.pushed_at) == (doc(2), sha(2), NOW + 1)
    assert types.version(NAME, 3) is None
    assert [v.version for v in types.versions(NAME)] == [1, 2]
    assert [v.document for v in types.versions(NAME)] == [doc(1), doc(2)]


def test_heads_reads_every_name(types: JobTypeStore) -> None:
    for name in ("b_type", "a_type", "c_type"):
        types.push(name, doc(1), sha(1), NOW)
    assert sorted(head.name for head in types.heads()) == ["a_type", "b_type", "c_type"]


def test_promote_moves_production_and_rollback_moves_it_back(types: JobTypeStore) -> None:
    pushed(types, 3)
    head = types.promote(NAME, 3, NOW + 10, by="bo")
    assert (head.production, head.previous) == (3, (1,))
    assert types.promote(NAME, 3, NOW + 11) == head  # production again: nothing changes
    head = types.promote(NAME, 2, NOW + 12)
    assert (head.production, head.previous) == (2, (1, 3))
    head = types.rollback(NAME, NOW + 13, by="bo", reason="bad labels")
    assert (head.production, head.previous) == (3, (1,))
    assert head.history[-1].action == LabelAction.ROLLBACK
    assert (head.history[-1].version, head.history[-1].reason, head.history[-1].by) == (3, "bad labels", "bo")
    assert types.rollback(NAME, NOW + 14).production == 1
    with pytest.raises(JobTypeLabelError, match=r"^triage: production v1 has no version before it$"):
        types.rollback(NAME, NOW + 15)
    final = types.head(NAME)
    assert final is not None
    assert (final.production, final.previous) == (1, ())


def test_refusals_name_what_is_wrong(types: JobTypeStore) -> None:
    with pytest.raises(JobTypeLabelError, match=r"^no job type named triage$"):
        types.promote(NAME, 1, NOW)
    with pytest.raises(JobTypeLabelError, match=r"^no job type named triage$"):
        types.rollback(NAME, NOW)
    pushed(types, 3)
    with pytest.raises(JobTypeLabelError, match=r"^triage has no version 9 \(latest v3\)$"):
        types.promote(NAME, 9, NOW)
    with pytest.raises(JobTypeLabelError, match=r"^triage has no version 0 \(latest v3\)$"):
        types.promote(NAME, 0, NOW, canary_percent=5)
    for percent in (0, 100):
        with pytest.raises(JobTypeLabelError, match=f"not {percent}$"):
            types.promote(NAME, 2, NOW, canary_percent=percent)
    with pytest.raises(JobTypeLabelError, match="v1 is production already"):
        types.promote(NAME, 1, NOW, canary_percent=10)
    head = types.head(NAME)
    assert head is not None
    assert (head.production, head.canary, head.revision) == (1, None, 3)


def test_a_canary_starts_counted_from_zero_and_ends_by_promote_or_rollback(types: JobTypeStore) -> None:
    pushed(types, 3)
    head = types.promote(NAME, 2, NOW + 10, canary_percent=10, guard=Guard(min_jobs=5, max_regression=1.5))
    canary = head.canary
    assert canary is not None
    assert (canary.version, canary.percent, canary.started_at, canary.guard) == (2, 10, NOW + 10, Guard(5, 1.5))
    assert (canary.canary_jobs, canary.production_jobs) == (0, 0)
    assert types.head(NAME) == head
    # Another canary replaces it, its counts anew; promoting production ends it
    types.tally(NAME, (2, NOW + 10), (4, 1, 30, 0))
    head = types.promote(NAME, 3, NOW + 20, canary_percent=50)
    assert head.canary is not None
    assert (head.canary.version, head.canary.canary_jobs, head.canary.guard) == (3, 0, None)
    head = types.promote(NAME, 3, NOW + 30)
    assert (head.production, head.canary, head.previous) == (3, None, (1,))
    # rollback ends a canary, production stays
    types.promote(NAME, 2, NOW + 40, canary_percent=5)
    head = types.rollback(NAME, NOW + 41, reason="looks off")
    assert (head.production, head.canary) == (3, None)
    assert (head.history[-1].action, head.history[-1].version, head.history[-1].reason) == (
        LabelAction.ROLLBACK,
        2,
        "looks off",
    )


def test_a_tally_counts_for_its_canary_only(types: JobTypeStore) -> None:
    pushed(types, 2)
    assert types.tally(NAME, (2, NOW), (1, 0, 1, 0)) is None  # no canary
    types.promote(NAME, 2, NOW + 10, canary_percent=20, guard=Guard())
    after = types.tally(NAME, (2, NOW + 10), (3, 1, 10, 2))
    assert after is not None
    after = types.tally(NAME, (2, NOW + 10), (2, 0, 5, 0))
    assert after is not None
    assert after.canary is not None
    counts = after.canary
    assert (counts.canary_jobs, counts.canary_invalid, counts.production_jobs, counts.production_invalid) == (
        5,
        1,
        15,
        2,
    )
    assert types.head(NAME) == after
    assert types.tally(NAME, (2, NOW + 11), (1, 0, 1, 0)) is None  # another canary's
    assert types.tally("missing", (2, NOW + 10), (1, 0, 1, 0)) is None


def test_a_guard_ends_its_canary_once(types: JobTypeStore) -> None:
    pushed(types, 2)
    types.promote(NAME, 2, NOW + 10, canary_percent=20, guard=Guard(min_jobs=1))
    assert types.end_canary(NAME, (2, NOW + 9), NOW + 20, "other") is False
    assert types.end_canary(NAME, (2, NOW + 10), NOW + 20, "v2 failed validation") is True
    assert types.end_canary(NAME, (2, NOW + 10), NOW + 21, "v2 failed validation") is False
    head = types.head(NAME)
    assert head is not None
    assert (head.production, head.canary) == (1, None)
    last = head.history[-1]
    assert (last.action, last.version, last.reason, last.at) == (
        LabelAction.GUARD_ROLLBACK,
        2,
        "v2 failed validation",
        NOW + 20,
    )
    # A move after it starts from the head as ended
    assert types.promote(NAME, 2, NOW + 30).production == 2


def test_concurrent_guards_end_a_canary_once(types: JobTypeStore) -> None:
    pushed(types, 2)
    types.promote(NAME, 2, NOW + 10, canary_percent=20, guard=Guard(min_jobs=1))
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(types.end_canary(NAME, (2, NOW + 10), NOW + 20, "worse")))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]


def test_the_head_keeps_the_last_moves(types: JobTypeStore) -> None:
    pushed(types, 2)
    steps = MAX_HISTORY + 5
    for step in range(steps):
        types.promote(NAME, 2 - step % 2, NOW + 100 + step)
    head = types.head(NAME)
    assert head is not None
    assert len(head.previous) == MAX_PREVIOUS
    assert len(head.history) == MAX_HISTORY
    assert head.history[-1].at == NOW + 100 + steps - 1


def test_stats_add_up_per_version(types: JobTypeStore) -> None:
    assert types.stats(NAME) == []
    pushed(types, 2)
    types.add_stats(
        NAME,
        VersionStats(2, jobs=3, succeeded=2, validation_failures=1, cost_usd=Decimal("0.003"), durations={0: 2, 22: 1}),
    )
    types.add_stats(NAME, VersionStats(1, jobs=1, succeeded=1, reasks=1, cost_usd=Decimal("0.001"), durations={4: 1}))
    types.add_stats(
        NAME, VersionStats(2, jobs=2, succeeded=2, reasks=2, cost_usd=Decimal("0.002"), durations={0: 1, 5: 1})
    )
    assert types.stats(NAME) == [
        VersionStats(1, jobs=1, succeeded=1, reasks=1, cost_usd=Decimal("0.001"), durations={4: 1}),
        VersionStats(
            2,
            jobs=5,
            succeeded=4,
            validation_failures=1,
            reasks=2,
            cost_usd=Decimal("0.005"),
            durations={0: 3, 5: 1, 22: 1},
        ),
    ]
    assert types.stats("other") == []
