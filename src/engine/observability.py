"""The one Logger, Metrics and Tracer of the engine (Powertools). Prompts, inputs and outputs are never logged."""

from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics

from engine.config import tracing_enabled

logger = Logger(service="aijobs")
metrics = Metrics(namespace="aijobs", service="aijobs")

Handler = TypeVar("Handler", bound=Callable[..., Any])


def traced(handler: Handler) -> Handler:
    """X-Ray tracing of a Lambda handler (Powertools Tracer), when tracing is on.

    The Tracer loads the X-Ray SDK, about a quarter of a second of cold start, so it is only
    built when the function traces (template parameter Tracing=Active).
    """
    if not tracing_enabled():
        return handler
    from aws_lambda_powertools import Tracer

    return Tracer(service="aijobs").capture_lambda_handler(handler)  # type: ignore[return-value]
