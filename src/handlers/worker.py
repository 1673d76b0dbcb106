"""Lambda entry point of the jobs queue."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.observability import logger, metrics, traced
from engine.worker import get_worker


@traced
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext | None) -> dict[str, Any]:
    # Like logger.inject_lambda_context, but also for callers that pass no context (scripts, harnesses).
    logger.append_keys(
        function_name=getattr(context, "function_name", None),
        function_request_id=getattr(context, "aws_request_id", None),
    )
    return get_worker().handle(event, context)
