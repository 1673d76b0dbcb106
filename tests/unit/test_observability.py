"""A Lambda function's handler: its context in the logs (cold start too), metrics flushed once, tracing
only when the function traces (the X-Ray SDK is loaded then only)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from aijobs.local.lambda_events import InvocationContext
from engine.config import load_settings
from engine.observability import lambda_function, logger, metrics

BASE = {"JOBS_TABLE_NAME": "jobs", "JOBS_QUEUE_URL": "http://127.0.0.1:1/q", "JOBS_PAYLOAD_BUCKET": "payloads"}


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    logger.info("handled")
    metrics.add_metric(name="Jobs_succeeded", unit="Count", value=1)
    return event


@pytest.mark.parametrize(
    ("environment", "traced"),
    [
        ({}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task"}, True),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "false"}, True),
    ],
)
def test_a_function_traces_in_lambda_unless_tracing_is_disabled(environment: dict[str, str], traced: bool) -> None:
    assert load_settings(BASE | environment).tracing_enabled is traced


class RecordingTracer:
    """Stands in for Powertools' Tracer, which would patch botocore and httplib for the whole test run."""

    built: ClassVar[list[str]] = []

    def __init__(self, service: str) -> None:
        self.built.append(service)

    def capture_lambda_handler(self, function: Any) -> Any:
        return lambda event, context: ("traced", function(event, context))


def test_a_traced_function_is_wrapped_by_the_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aws_lambda_powertools.Tracer", RecordingTracer)
    monkeypatch.setattr("engine.observability._tracer", None)  # restored after the test

    handler = lambda_function(handle, tracing=True, emit_metrics=False)

    assert handler({"a": 1}, InvocationContext()) == ("traced", {"a": 1})
    assert RecordingTracer.built == ["aijobs"]


def test_each_log_line_carries_the_invocation_and_the_metrics_are_flushed_once(
    capfd: pytest.CaptureFixture[str],
) -> None:
    seen: list[dict[str, Any]] = []

    def handle_and_look(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.append(dict(logger.get_current_keys()))
        return handle(event, context)

    context = InvocationContext(function_name="aijobs-worker")

    assert lambda_function(handle_and_look)({"a": 1}, context) == {"a": 1}

    # The keys every log line of the invocation carries, cold start included
    (keys,) = seen
    assert (keys["function_name"], keys["function_request_id"]) == ("aijobs-worker", context.aws_request_id)
    assert "cold_start" in keys
    # One EMF document with the invocation's metrics
    (emf,) = [json.loads(line) for line in capfd.readouterr().out.splitlines() if '"_aws"' in line]
    assert emf["Jobs_succeeded"] == [1.0]


def test_a_quiet_function_drops_its_metrics(capfd: pytest.CaptureFixture[str]) -> None:
    lambda_function(handle, emit_metrics=False)({}, InvocationContext())

    assert not [line for line in capfd.readouterr().out.splitlines() if '"_aws"' in line]


class FakeSubsegment:
    def __init__(self) -> None:
        self.annotations: dict[str, object] = {}
        self.metadata: dict[str, object] = {}

    def put_annotation(self, key: str, value: object) -> None:
        assert key.replace("_", "").isalnum()  # X-Ray's rule for annotation keys
        self.annotations[key] = value

    def put_metadata(self, key: str, value: object, namespace: str) -> None:
        self.metadata[f"{namespace}/{key}"] = value


def test_a_provider_call_is_a_subsegment_with_the_genai_attributes_when_the_function_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextlib import contextmanager
    from types import SimpleNamespace

    from engine import observability
    from engine.gateway import Completion

    segments: list[tuple[str, FakeSubsegment]] = []

    @contextmanager
    def in_subsegment(name: str) -> Iterator[FakeSubsegment]:
        segment = FakeSubsegment()
        segments.append((name, segment))
        yield segment

    monkeypatch.setattr(
        observability, "_tracer", SimpleNamespace(provider=SimpleNamespace(in_subsegment=in_subsegment))
    )
    completion = Completion("{}", "gpt-4o-mini", 100, 20, 5, cached_input_tokens=60, reasoning_tokens=4)

    with observability.provider_call("openai", "gpt-4o-mini") as record:
        record(observability.genai_usage(completion))

    [(name, segment)] = segments
    assert name == "## gen_ai chat"
    assert segment.metadata["gen_ai/gen_ai.request.model"] == "gpt-4o-mini"
    assert segment.metadata["gen_ai/gen_ai.provider.name"] == "openai"
    assert segment.metadata["gen_ai/gen_ai.usage.cache_read.input_tokens"] == 60
    assert segment.metadata["gen_ai/gen_ai.usage.input_tokens"] == 100
    # Only the model and the provider are annotations (indexed; a trace keeps at most 50)
    assert segment.annotations == {"gen_ai_request_model": "gpt-4o-mini", "gen_ai_provider_name": "openai"}


def test_without_tracing_a_provider_call_opens_no_subsegment() -> None:
    from engine import observability

    assert observability._tracer is None
    with observability.provider_call("openai", "gpt-4o-mini") as record:
        record({"gen_ai.usage.input_tokens": 1})
