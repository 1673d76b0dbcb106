"""The one Logger, Metrics and Tracer of the engine (Powertools). Prompts, inputs and outputs are never logged."""

import traceback
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service="aijobs")
metrics = Metrics(namespace="aijobs", service="aijobs")

Event = dict[str, Any]
Handle = Callable[[Event, LambdaContext], Any]

# Frames of an unexpected exception's stack that are logged (the innermost ones).
STACK_FRAMES = 8


def log_unexpected(message: str, exc: BaseException, **keys: Any) -> None:
    """An unexpected exception, by its type and stack only.

    Its message may quote an input, a prompt or an answer (a ValidationError's input_value, a
    UnicodeEncodeError's text), and none of those is ever logged; the stack is code.
    """
    stack = [line.rstrip() for line in traceback.format_tb(exc.__traceback__)[-STACK_FRAMES:]]
    logger.error(message, extra={**keys, "error_type": type(exc).__name__, "stack": stack})


def lambda_function(handle: Handle, *, tracing: bool = False, emit_metrics: bool = True) -> Handle:
    """A Lambda handler around `handle`: the invocation's context (cold start too) on every log line,
    the batch's metrics flushed as one EMF document (or dropped, with `emit_metrics=False`: a live
    terminal of the embedded stack), and X-Ray tracing when `tracing`.

    The Tracer loads the X-Ray SDK, about a quarter of a second of cold start, so it is only
    built when the function traces (the template's Tracing: Active, read as LAMBDA_TASK_ROOT).
    """

    @logger.inject_lambda_context
    def handler(event: Event, context: LambdaContext) -> Any:
        try:
            return handle(event, context)
        finally:
            if not emit_metrics:
                metrics.clear_metrics()

    if emit_metrics:
        handler = metrics.log_metrics(handler)

    if not tracing:
        return handler
    from aws_lambda_powertools import Tracer

    traced: Handle = Tracer(service="aijobs").capture_lambda_handler(handler)
    return traced
