"""What every entry point reads of its invocation, and the scheduled functions' one pass."""

from collections import Counter
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.observability import Event, Handle, count

RemainingMs = Callable[[], int]


def remaining_time(context: LambdaContext | None) -> RemainingMs | None:
    """The invocation's time left, in milliseconds, as the engine reads it (none outside Lambda)."""
    return getattr(context, "get_remaining_time_in_millis", None)


def scheduled(run: Callable[[RemainingMs | None], Counter[Any]], metric_prefix: str) -> Handle:
    """The handler of a scheduled function: one pass within the invocation's time, its counts answered
    and emitted as the metrics `<metric_prefix>_<what>`."""

    def handle(event: Event, context: LambdaContext | None) -> dict[str, int]:
        report = run(remaining_time(context))
        for what, times in report.items():
            count(f"{metric_prefix}_{what}", times)
        return {str(what): times for what, times in report.items()}

    return handle
