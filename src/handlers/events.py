"""Lambda entry point of the jobs table's stream: completion events to EventBridge, then the data
job types' stats and canary guards (engine.job_type_tally), and the pipelines moved on by their
children's ends (engine.pipelines)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.config import Settings
from engine.events import CompletionEvents, enters_terminal_status
from engine.job_type_tally import JobTypeTally
from engine.observability import Event, Handle, log_unexpected
from engine.pipelines import ChildEnds
from engine.store.items import job_from_item
from engine.wiring import build_events, entry_point


def events_handler(
    events: CompletionEvents, tally: JobTypeTally | None = None, pipelines: ChildEnds | None = None
) -> Handle:
    """A batch of stream records; a refused event is reported, and the stream resumes from it.

    The tally and the pipelines see only the records the stream will not deliver again (those before
    the first refused one), so that a retried batch is not counted twice for that reason. A tally that
    fails is logged and costs no event: its figures are lost, the completion events are not. A
    pipeline that cannot be moved on is reported like a refused event, from its record: counting a
    child's end again counts nothing, so the stream delivering it again is safe."""

    def handle(event: Event, context: LambdaContext | None) -> dict[str, Any]:
        records = event.get("Records") or []
        resume = events.publish(records)
        done = records
        if resume is not None:
            resumed_at = int(resume)
            done = [record for record in records if _sequence(record) < resumed_at]
        if tally is not None:
            try:
                tally.record(done)
            except Exception as exc:
                log_unexpected("the job types' tally failed on a batch; its figures are lost", exc)
        if pipelines is not None:
            failed_at = _move_pipelines(pipelines, done)
            if failed_at is not None:
                resume = failed_at
        return {"batchItemFailures": [] if resume is None else [{"itemIdentifier": resume}]}

    return handle


def _move_pipelines(pipelines: ChildEnds, records: list[dict[str, Any]]) -> str | None:
    """The pipelines' part of a batch: the sequence number to resume from when one record failed."""
    for record in records:
        if not enters_terminal_status(record):
            continue
        image = record["dynamodb"]["NewImage"]
        if "parent_id" not in image and "pipeline_step" not in image:
            continue
        try:
            pipelines.ended([job_from_item(image)])
        except Exception as exc:
            log_unexpected("a pipeline could not be moved on; the stream delivers its record again", exc)
            return str(_sequence(record))
    return None


def _sequence(record: dict[str, Any]) -> int:
    return int((record.get("dynamodb") or {}).get("SequenceNumber") or 0)


def build(settings: Settings) -> Handle:
    return events_handler(*build_events(settings))


lambda_handler = entry_point(build)
