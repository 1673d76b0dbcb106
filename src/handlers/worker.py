"""Lambda entry point of the jobs queue."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.observability import logger, metrics, tracer
from engine.worker import get_worker


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return get_worker().handle(event, context)
