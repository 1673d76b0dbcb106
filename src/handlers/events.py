"""Lambda entry point of the jobs table's stream: completion events to EventBridge."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.config import Settings
from engine.events import CompletionEvents
from engine.observability import Event, Handle
from engine.wiring import build_events, entry_point


def events_handler(events: CompletionEvents) -> Handle:
    """A batch of stream records; a refused event is reported, and the stream resumes from it."""

    def handle(event: Event, context: LambdaContext | None) -> dict[str, Any]:
        resume = events.publish(event.get("Records") or [])
        return {"batchItemFailures": [] if resume is None else [{"itemIdentifier": resume}]}

    return handle


def build(settings: Settings) -> Handle:
    return events_handler(build_events(settings))


lambda_handler = entry_point(build)
