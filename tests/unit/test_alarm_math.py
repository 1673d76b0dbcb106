"""The metric-math alarms of template.yaml, evaluated on the series a queue shows in each situation.

`OldestMessageAlarm` must tell a parked queue (messages the engine hid on purpose: backoff,
Retry-After, shared limits, budgets) from a stuck one, and `DeadLetterBacklogAlarm` must see dead
letters that the dead-letter function keeps failing on, which its own polling keeps in flight.
Each alarm's expression is parsed and evaluated here, minute by minute or period by period, with
CloudWatch's rules: a metric with no datapoint is missing (FILL gives it a value), a comparison is
1 or 0, and the alarm fires when DatapointsToAlarm of the last EvaluationPeriods values breach.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tests.unit.test_template import properties

Value = float | None
_TOKEN = re.compile(r"\s*(>=|<=|==|!=|&&|\|\||[-+*/(),<>]|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?)")
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}


class Expression:
    """A CloudWatch metric-math expression of the subset the template uses: numbers, metric ids,
    + - * /, comparisons, AND / OR, IF(condition, then, else) and FILL(metric, value)."""

    def __init__(self, text: str) -> None:
        self.tokens = _TOKEN.findall(text)
        assert "".join(self.tokens) == re.sub(r"\s+", "", text), f"cannot read {text!r}"
        self.at = 0
        self.tree = self._or()
        assert self.at == len(self.tokens), f"trailing {self.tokens[self.at :]}"

    def __call__(self, values: Mapping[str, Value]) -> Value:
        return _evaluate(self.tree, values)

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        assert expected is None or token == expected, f"expected {expected}, read {token}"
        self.at += 1
        return token

    def _binary(self, operand: Callable[[], Any], operators: set[str]) -> Any:
        tree = operand()
        while (token := self._peek()) is not None and token.upper() in operators:
            self._take()
            tree = (token.upper(), tree, operand())
        return tree

    def _or(self) -> Any:
        return self._binary(self._and, {"OR", "||"})

    def _and(self) -> Any:
        return self._binary(self._compare, {"AND", "&&"})

    def _compare(self) -> Any:
        return self._binary(self._sum, set(_COMPARE))

    def _sum(self) -> Any:
        return self._binary(self._product, {"+", "-"})

    def _product(self) -> Any:
        return self._binary(self._atom, {"*", "/"})

    def _atom(self) -> Any:
        token = self._take()
        if token == "(":
            tree = self._or()
            self._take(")")
            return tree
        if token[0].isdigit():
            return ("number", float(token))
        if self._peek() == "(":
            self._take("(")
            arguments = [self._or()]
            while self._peek() == ",":
                self._take(",")
                arguments.append(self._or())
            self._take(")")
            return ("call", token.upper(), arguments)
        return ("metric", token)


def _evaluate(tree: Any, values: Mapping[str, Value]) -> Value:
    kind = tree[0]
    if kind == "number":
        return float(tree[1])
    if kind == "metric":
        return values[tree[1]]
    if kind == "call":
        name, arguments = tree[1], tree[2]
        if name == "FILL":
            filled = _evaluate(arguments[0], values)
            return _evaluate(arguments[1], values) if filled is None else filled
        if name == "IF":
            condition = _evaluate(arguments[0], values)
            return _evaluate(arguments[1] if condition else arguments[2], values)
        raise AssertionError(f"metric math function {name} is not known here")
    left, right = _evaluate(tree[1], values), _evaluate(tree[2], values)
    if kind in {"AND", "&&"}:
        return float(bool(left) and bool(right))
    if kind in {"OR", "||"}:
        return float(bool(left) or bool(right))
    if left is None or right is None:
        return None
    if kind in _COMPARE:
        return float(_COMPARE[kind](left, right))
    return _ARITHMETIC[kind](left, right)


def fires(alarm: str, periods: list[dict[str, Value]]) -> bool:
    """Whether the alarm is in ALARM after these periods (oldest first), its metrics given by id."""
    spec = properties(alarm)
    (shown,) = [metric for metric in spec["Metrics"] if metric.get("ReturnData") is not False]
    expression = Expression(shown["Expression"])
    results = [expression(values) for values in periods][-spec["EvaluationPeriods"] :]
    breach = {"GreaterThanThreshold": operator.gt, "GreaterThanOrEqualToThreshold": operator.ge}
    compare = breach[spec["ComparisonOperator"]]
    breaching = [result is not None and compare(result, float(spec["Threshold"])) for result in results]
    return sum(breaching) >= spec.get("DatapointsToAlarm", spec["EvaluationPeriods"])


def minutes(count: int = 5, **values: Value) -> list[dict[str, Value]]:
    return [dict(values) for _ in range(count)]


# One minute of the jobs queue each: the age of its oldest message, the fewest visible messages,
# and how many were received and deleted.
QUEUE: dict[str, list[dict[str, Value]]] = {
    "idle": minutes(age=None, visible=None, received=None, deleted=None),
    "parked: a budget holds jobs until midnight, nothing else runs": minutes(
        age=7_200, visible=0, received=0, deleted=0
    ),
    "parked under load: busy and healthy, with a job waiting out a Retry-After of hours": minutes(
        age=7_200, visible=40, received=600, deleted=590
    ),
    "fresh backlog: messages waiting a minute": minutes(age=60, visible=30, received=0, deleted=0),
}
STUCK: dict[str, list[dict[str, Value]]] = {
    "no worker: the event source disabled, or concurrency at 0": minutes(
        age=1_200, visible=50, received=None, deleted=None
    ),
    "every job goes back: taken, none finished": minutes(age=3_600, visible=5, received=120, deleted=0),
}


@pytest.mark.parametrize("situation", sorted(QUEUE))
def test_the_oldest_message_alarm_stays_quiet_on_a_parked_or_healthy_queue(situation: str) -> None:
    assert not fires("OldestMessageAlarm", QUEUE[situation])


@pytest.mark.parametrize("situation", sorted(STUCK))
def test_the_oldest_message_alarm_fires_on_a_stuck_queue(situation: str) -> None:
    assert fires("OldestMessageAlarm", STUCK[situation])


def test_the_oldest_message_alarm_wants_five_minutes_on_end() -> None:
    stuck = STUCK["no worker: the event source disabled, or concurrency at 0"]
    recovered = {"age": 1_200.0, "visible": 50.0, "received": 100.0, "deleted": 100.0}
    assert not fires("OldestMessageAlarm", [*stuck[:4], recovered])


# Five minutes of the dead-letter queue each: the fewest visible and the fewest in-flight messages.
DEAD_LETTERS: dict[str, tuple[list[dict[str, Value]], bool]] = {
    "empty": ([{"visible": None, "inflight": None}] * 3, False),
    "recorded at once": ([{"visible": 0, "inflight": 0}] * 3, False),
    "one failing message, back in flight within seconds of each visibility timeout": (
        [{"visible": 0, "inflight": 1}] * 3,
        True,
    ),
    "the dead-letter function cannot start: messages wait visible": ([{"visible": 4, "inflight": 0}] * 3, True),
    "a failing message, recorded in the third period": (
        [{"visible": 0, "inflight": 1}, {"visible": 0, "inflight": 1}, {"visible": 0, "inflight": 0}],
        False,
    ),
}


@pytest.mark.parametrize("situation", sorted(DEAD_LETTERS))
def test_the_dead_letter_backlog_alarm_sees_messages_held_in_flight(situation: str) -> None:
    periods, expected = DEAD_LETTERS[situation]
    assert fires("DeadLetterBacklogAlarm", periods) is expected


# Five minutes of the batcher each: its invocations that failed and the batches it could not move on.
BATCHER: dict[str, tuple[list[dict[str, Value]], bool]] = {
    "no batch in flight, no pass failed": ([{"failed": None, "caught": None}] * 3, False),
    "one pass crashed, the next ones did not": (
        [{"failed": 1, "caught": None}, {"failed": 0, "caught": None}, {"failed": 0, "caught": None}],
        False,
    ),
    "the provider refused polls for ten minutes": (
        [{"failed": 0, "caught": 3}, {"failed": 0, "caught": 2}, {"failed": 0, "caught": None}],
        False,
    ),
    "every pass fails to start (a setting refused)": ([{"failed": 5, "caught": None}] * 3, True),
    "a batch that cannot be moved on, pass after pass": ([{"failed": 0, "caught": 5}] * 3, True),
    "passes crashing, then a batch stuck": (
        [{"failed": 5, "caught": None}, {"failed": 5, "caught": None}, {"failed": 0, "caught": 5}],
        True,
    ),
}


@pytest.mark.parametrize("situation", sorted(BATCHER))
def test_the_batch_errors_alarm_fires_on_errors_that_do_not_pass(situation: str) -> None:
    periods, expected = BATCHER[situation]
    assert fires("BatchErrorsAlarm", periods) is expected


def test_the_expressions_of_every_metric_math_alarm_can_be_read() -> None:
    for alarm in (
        "OldestMessageAlarm",
        "DeadLetterBacklogAlarm",
        "FailedJobRateAlarm",
        "RateLimitedShareAlarm",
        "BatchErrorsAlarm",
    ):
        for metric in properties(alarm)["Metrics"]:
            if "Expression" in metric:
                Expression(metric["Expression"])
