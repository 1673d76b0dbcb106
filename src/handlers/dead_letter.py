"""Lambda entry point of the dead-letter queue: each record recorded (engine.dead_letters)."""

from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.config import Settings
from engine.dead_letters import DeadLetterRecorder
from engine.observability import Event, Handle
from engine.wiring import build_recorder, entry_point
from handlers.sqs import delivery_of


def dead_letter_handler(recorder: DeadLetterRecorder) -> Handle:
    """A batch of the dead-letter queue; a record that could not be kept is reported, and stays."""

    def record_handler(record: SQSRecord) -> str:
        return recorder.arrived(delivery_of(record)).value

    def handle(event: Event, context: LambdaContext | None) -> dict[str, Any]:
        processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
        return dict(process_partial_response(event, record_handler, processor, context))

    return handle


def build(settings: Settings) -> Handle:
    return dead_letter_handler(build_recorder(settings))


lambda_handler = entry_point(build)
