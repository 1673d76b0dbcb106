"""The one Logger, Metrics and Tracer of the engine (Powertools). Prompts, inputs and outputs are never logged."""

import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics

from engine.config import tracing_enabled

logger = Logger(service="aijobs")
metrics = Metrics(namespace="aijobs", service="aijobs")

Handler = TypeVar("Handler", bound=Callable[..., Any])

# Frames of an unexpected exception's stack that are logged (the innermost ones).
STACK_FRAMES = 8


def log_unexpected(message: str, exc: BaseException, **keys: Any) -> None:
    """An unexpected exception, by its type and stack only.

    Its message may quote an input, a prompt or an answer (a ValidationError's input_value, a
    UnicodeEncodeError's text), and none of those is ever logged; the stack is code.
    """
    stack = [line.rstrip() for line in traceback.format_tb(exc.__traceback__)[-STACK_FRAMES:]]
    logger.error(message, extra={**keys, "error_type": type(exc).__name__, "stack": stack})


def traced(handler: Handler) -> Handler:
    """X-Ray tracing of a Lambda handler (Powertools Tracer), when tracing is on.

    The Tracer loads the X-Ray SDK, about a quarter of a second of cold start, so it is only
    built when the function traces (template parameter Tracing=Active).
    """
    if not tracing_enabled():
        return handler
    from aws_lambda_powertools import Tracer

    return Tracer(service="aijobs").capture_lambda_handler(handler)  # type: ignore[return-value]
