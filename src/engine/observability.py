"""The one Logger, Metrics and Tracer of the engine (Powertools). Prompts, inputs and outputs are never logged."""

import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import EphemeralMetrics
from aws_lambda_powertools.metrics import MetricUnit as MetricUnit  # the engine's metrics name their units with it

logger = Logger(service="aijobs")
metrics = Metrics(namespace="aijobs", service="aijobs")
NAMESPACE = "aijobs"
# Counts also kept service-wide, without a job type: the alarms' (a job type is not known in advance).
SERVICE_TOTALS = ("Attempts", "Retries_provider_rate_limited")


class JobMetrics:
    """Metrics by job type (and model, where one answered), or by lane, summed over an invocation and
    written as one EMF document per (job type, model), and per lane, when it ends: not one per job.

    Names follow the OpenTelemetry GenAI conventions where CloudWatch allows: an EMF document holds
    one value per dimension, so token types are suffixes (`gen_ai.client.token.usage.input`) rather
    than a `gen_ai.token.type` dimension. docs/operations.md lists every metric.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Keyed by dimensions: ((name, value), ...); a value "" is no dimension.
        self._sums: dict[tuple[tuple[str, str], ...], dict[str, tuple[MetricUnit, list[float]]]] = {}

    def add(self, job_type: str | None, model: str | None, name: str, value: float, unit: MetricUnit) -> None:
        self._add((("job_type", job_type or "unknown"), ("model", model or "")), name, value, unit)

    def add_by_lane(self, lane: str, name: str, value: float, unit: MetricUnit) -> None:
        """A metric whose one dimension is the lane (interactive, background): what each lane waits."""
        self._add((("lane", lane),), name, value, unit)

    def _add(self, key: tuple[tuple[str, str], ...], name: str, value: float, unit: MetricUnit) -> None:
        with self._lock:
            values = self._sums.setdefault(key, {}).setdefault(name, (unit, []))[1]
            if unit is MetricUnit.Seconds:
                values.append(value)  # each value kept: CloudWatch's percentiles need them
            elif values:
                values[0] += value
            else:
                values.append(value)

    def flush(self) -> None:
        """One EMF document per (job type, model); the totals alarms need join the invocation's
        service-wide document (`metrics`), flushed after this."""
        with self._lock:
            sums, self._sums = self._sums, {}
        for name in SERVICE_TOTALS:
            total = sum(sum(named[name][1]) for named in sums.values() if name in named)
            if total:
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=total)
        for dimensions, named in sums.items():
            document = EphemeralMetrics(namespace=NAMESPACE, service="aijobs")
            for dimension, named_value in dimensions:
                if named_value:
                    document.add_dimension(name=dimension, value=named_value)
            for name, (unit, values) in named.items():
                for value in values:
                    document.add_metric(name=name, unit=unit, value=value)
            document.flush_metrics()

    def clear(self) -> None:
        with self._lock:
            self._sums = {}

    def snapshot(self) -> dict[tuple[str, ...], dict[str, list[float]]]:
        """What is summed so far: {(job type, model) or (lane,): {name: values}}."""
        with self._lock:
            return {
                tuple(value for _, value in key): {name: list(values) for name, (_, values) in named.items()}
                for key, named in self._sums.items()
            }


job_metrics = JobMetrics()


def count(name: str, value: int = 1) -> None:
    """Add to a service-wide count of the invocation (`Jobs_<fate>`, `DeadLetters_<fate>`, ...)."""
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


Event = dict[str, Any]
# A Lambda handler: the event and the invocation's context (a LambdaContext, which only src/handlers reads).
Handle = Callable[[Event, Any], Any]

# Frames of an unexpected exception's stack that are logged (the innermost ones).
STACK_FRAMES = 8


def log_unexpected(message: str, exc: BaseException, **keys: Any) -> None:
    """An unexpected exception, by its type and stack only.

    Its message may quote an input, a prompt or an answer (a ValidationError's input_value, a
    UnicodeEncodeError's text), and none of those is ever logged; the stack is code.
    """
    stack = [line.rstrip() for line in traceback.format_tb(exc.__traceback__)[-STACK_FRAMES:]]
    logger.error(message, extra={**keys, "error_type": type(exc).__name__, "stack": stack})


# Usage under its OpenTelemetry GenAI attribute names (the runner's log line, the provider call's span).
GENAI_USAGE_ATTRIBUTES = {
    "gen_ai.usage.input_tokens": "input_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.cache_read.input_tokens": "cached_input_tokens",
    "gen_ai.usage.cache_creation.input_tokens": "cache_write_input_tokens",
    "gen_ai.usage.reasoning.output_tokens": "reasoning_tokens",
}


def genai_usage(source: object | None) -> dict[str, int]:
    """A completion's or an attempt's tokens by their GenAI names (0 for none)."""
    return {name: int(getattr(source, field, 0) or 0) for name, field in GENAI_USAGE_ATTRIBUTES.items()}


_tracer: Any = None  # the Tracer, once a traced function is built (lambda_function(tracing=True))


@contextmanager
def provider_call(provider: str, model: str) -> Iterator[Callable[[dict[str, int]], None]]:
    """An X-Ray subsegment around one provider call, when the function traces: the OpenTelemetry
    GenAI attributes as metadata (`gen_ai.request.model`, `gen_ai.provider.name`, `gen_ai.usage.*`),
    and the model and provider as searchable annotations (X-Ray's keys allow letters, digits and
    underscores only). Yields a function that records the call's usage."""
    if _tracer is None:
        yield lambda _usage: None
        return
    with _tracer.provider.in_subsegment("## gen_ai chat") as subsegment:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model}

        def record(usage: dict[str, int]) -> None:
            for name, value in usage.items():
                subsegment.put_metadata(name, value, "gen_ai")

        for name, value in attributes.items():
            subsegment.put_metadata(name, value, "gen_ai")
        # Annotations are indexed (and a trace keeps at most 50): the two worth searching by.
        subsegment.put_annotation("gen_ai_request_model", model)
        subsegment.put_annotation("gen_ai_provider_name", provider)
        yield record


def lambda_function(handle: Handle, *, tracing: bool = False, emit_metrics: bool = True) -> Handle:
    """A Lambda handler around `handle`: the invocation's context (cold start too) on every log line,
    the batch's metrics flushed as one EMF document (or dropped, with `emit_metrics=False`: a live
    terminal of the embedded stack), and X-Ray tracing when `tracing`.

    The Tracer loads the X-Ray SDK, about a quarter of a second of cold start, so it is only
    built when the function traces (the template's Tracing: Active, read as LAMBDA_TASK_ROOT).
    """

    @logger.inject_lambda_context
    def handler(event: Event, context: Any) -> Any:
        try:
            return handle(event, context)
        finally:
            if emit_metrics:
                job_metrics.flush()
            else:
                metrics.clear_metrics()
                job_metrics.clear()

    if emit_metrics:
        handler = metrics.log_metrics(handler)

    if not tracing:
        return handler
    from aws_lambda_powertools import Tracer

    global _tracer
    _tracer = Tracer(service="aijobs")
    traced: Handle = _tracer.capture_lambda_handler(handler)
    return traced
