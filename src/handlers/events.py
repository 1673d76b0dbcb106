"""Lambda entry point of the jobs table's stream: completion events to EventBridge, then the data
job types' stats and canary guards (engine.job_type_tally)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.config import Settings
from engine.events import CompletionEvents
from engine.job_type_tally import JobTypeTally
from engine.observability import Event, Handle, log_unexpected
from engine.wiring import build_events, entry_point


def events_handler(events: CompletionEvents, tally: JobTypeTally | None = None) -> Handle:
    """A batch of stream records; a refused event is reported, and the stream resumes from it.

    The tally counts only the records the stream will not deliver again (those before the first
    refused one), so that a retried batch is not counted twice for that reason. A tally that fails
    is logged and costs no event: its figures are lost, the completion events are not."""

    def handle(event: Event, context: LambdaContext | None) -> dict[str, Any]:
        records = event.get("Records") or []
        resume = events.publish(records)
        if tally is not None:
            done = records
            if resume is not None:
                resumed_at = int(resume)
                done = [record for record in records if _sequence(record) < resumed_at]
            try:
                tally.record(done)
            except Exception as exc:
                log_unexpected("the job types' tally failed on a batch; its figures are lost", exc)
        return {"batchItemFailures": [] if resume is None else [{"itemIdentifier": resume}]}

    return handle


def _sequence(record: dict[str, Any]) -> int:
    return int((record.get("dynamodb") or {}).get("SequenceNumber") or 0)


def build(settings: Settings) -> Handle:
    return events_handler(*build_events(settings))


lambda_handler = entry_point(build)
