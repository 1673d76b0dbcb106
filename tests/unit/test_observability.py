"""Tracing: the X-Ray SDK is only loaded when the function traces."""

from __future__ import annotations

from typing import ClassVar

import pytest

from engine.observability import traced


def handler(event: dict[str, object], context: object) -> dict[str, object]:
    return event


def test_outside_lambda_the_handler_is_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)

    assert traced(handler) is handler


def test_in_lambda_with_tracing_disabled_the_handler_is_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")

    assert traced(handler) is handler


class RecordingTracer:
    """Stands in for Powertools' Tracer, which would patch botocore and httplib for the whole test run."""

    built: ClassVar[list[str]] = []

    def __init__(self, service: str) -> None:
        self.built.append(service)

    def capture_lambda_handler(self, function: object) -> object:
        return ("traced", function)


def test_in_lambda_the_handler_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "false")
    monkeypatch.setattr("aws_lambda_powertools.Tracer", RecordingTracer)

    assert traced(handler) == ("traced", handler)
    assert RecordingTracer.built == ["aijobs"]
