"""Expression: update and condition expressions from named parts, placeholders never silently reused."""

from __future__ import annotations

import pytest

from engine.store.expressions import Expression


def test_a_value_key_used_twice_for_the_same_value_is_one_placeholder() -> None:
    expr = Expression()

    first, second = expr.value("now", 5), expr.value("now", 5)

    assert first == second == ":now"
    assert expr.condition_params()["ExpressionAttributeValues"] == {":now": {"N": "5"}}


def test_a_value_key_used_again_for_another_value_is_refused() -> None:
    expr = Expression()
    expr.value("owner", "worker-a")

    with pytest.raises(ValueError, match=":owner already stands for another value"):
        expr.value("owner", "worker-b")


def test_sets_adds_and_removes_make_one_update_expression() -> None:
    expr = Expression().set("status", "running").add("attempt_count", 1).remove("lease_owner")
    expr.condition = f"{expr.name('status')} = {expr.value('queued', 'queued')}"

    params = expr.update_params("jobs", {"pk": {"S": "JOB#1"}})

    assert params["UpdateExpression"] == (
        "SET #status = :status ADD #attempt_count :add_attempt_count REMOVE #lease_owner"
    )
    assert params["ConditionExpression"] == "#status = :queued"
    assert params["ExpressionAttributeValues"] == {
        ":status": {"S": "running"},
        ":add_attempt_count": {"N": "1"},
        ":queued": {"S": "queued"},
    }
