"""Lambda entry point of the dead-letter queue."""

from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.dead_letters import get_recorder
from engine.observability import logger, metrics, traced


@traced
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext | None) -> dict[str, Any]:
    logger.append_keys(function_request_id=getattr(context, "aws_request_id", None))
    # A record that could not be stored raises, is reported as failed and stays on the queue.
    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    return dict(process_partial_response(event, get_recorder().handle_record, processor, context))
