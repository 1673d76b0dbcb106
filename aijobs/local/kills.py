"""Invocations that die mid-way, for the soak: one request of a function chosen as the last its invocation
makes, through botocore's hooks on the function's boto3 session.

A `KillPoint` names a request (an operation, and what its parameters, and for a kill after it its answer,
must hold) and whether the invocation dies just before the request is sent or just after it was answered
with success (its write made). Armed on `Kills`, a point fires once, in whichever invocation makes that
request first: it raises `InvocationKilled`, a BaseException, so that no handler of the engine catches it,
as no code survives its process dying. `Kills.dying(handler)` is the function as its event source mapping
sees it: an invocation that was killed fails as a whole (`InvocationDiedError`), so that its batch is
delivered again, as Lambda delivers the batch of an invocation that crashed or timed out.

Install the hooks on a session before its clients are made: a client copies its session's hooks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3

# Where a request's parameters wait in its context for the hook after its answer.
_PARAMS = "aijobs_kill_params"

# (the request's parameters, its parsed answer: None before it is sent) -> whether it is the request
Match = Callable[[Mapping[str, Any], Mapping[str, Any] | None], bool]
Handler = Callable[[dict[str, Any], Any], Any]


class InvocationKilled(BaseException):
    """Where an invocation dies (not an error of its code: its process ends): nothing but `Kills.dying`
    catches it."""


class InvocationDiedError(RuntimeError):
    """What the event source mapping sees of a killed invocation: it failed as a whole."""


@dataclass(frozen=True, slots=True)
class KillPoint:
    name: str
    operation: str  # "<service> <Operation>", as botocore names them: "dynamodb PutItem", "sqs SendMessage"
    after: bool  # True: once answered with success (its write made); False: before it is sent
    matches: Match


class Kills:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[KillPoint] = []
        self.fired: list[KillPoint] = []

    def arm(self, *points: KillPoint) -> None:
        with self._lock:
            self._armed.extend(points)

    def is_armed(self, point: KillPoint) -> bool:
        with self._lock:
            return any(armed is point for armed in self._armed)

    def install(self, session: boto3.Session) -> None:
        """Watch the requests of the clients `session` makes from now on."""
        session.events.register("provide-client-params.*.*", self._before)
        session.events.register("after-call.*.*", self._after)

    def dying(self, handler: Handler, on_death: Callable[[dict[str, Any]], None] | None = None) -> Handler:
        """`handler`, whose killed invocations fail as a whole (after `on_death(event)`)."""

        def invoke(event: dict[str, Any], context: Any) -> Any:
            try:
                return handler(event, context)
            except InvocationKilled as killed:
                if on_death is not None:
                    on_death(event)
                raise InvocationDiedError(f"the invocation was killed: {killed}") from None

        return invoke

    def _before(self, event_name: str, params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        context[_PARAMS] = params
        self._fire(_operation(event_name), False, params, None)

    def _after(
        self, event_name: str, http_response: Any, parsed: Mapping[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        if http_response.status_code < 300:
            self._fire(_operation(event_name), True, context.get(_PARAMS, {}), parsed)

    def _fire(self, operation: str, after: bool, params: Mapping[str, Any], parsed: Mapping[str, Any] | None) -> None:
        with self._lock:
            point = next(
                (
                    armed
                    for armed in self._armed
                    if armed.operation == operation and armed.after is after and armed.matches(params, parsed)
                ),
                None,
            )
            if point is None:
                return
            self._armed.remove(point)
            self.fired.append(point)
        raise InvocationKilled(point.name)


def _operation(event_name: str) -> str:
    _hook, service, operation = event_name.split(".", 2)
    return f"{service} {operation}"
