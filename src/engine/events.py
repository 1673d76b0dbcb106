"""Completion events: one EventBridge event each time a job reaches succeeded, failed or cancelled.

The events come from the jobs table's stream (DynamoDB Streams, new and old images), never from the
worker: a job's finishing write is the only thing it takes, so delivery does not depend on the
worker surviving after it, and the worker's path keeps its two requests. The events function reads
the stream (its event source mapping filters it to job items entering a terminal status), turns
each record into an event document and puts them on the bus, ten per PutEvents. docs/events.md
gives the event, its size rule and why this is not an EventBridge Pipe.

Delivery is at least once: a record whose event was not accepted is reported as a batch item
failure and read again, with the ones after it. `detail.event_id` (`<job_id>:<finished_at>`) is the
same on every delivery of one transition, so consumers deduplicate on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.core import Job, JobStatus
from engine.models import JobView
from engine.observability import log_unexpected, logger
from engine.store.items import job_from_item

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = "aijobs"
DETAIL_TYPES = {
    JobStatus.SUCCEEDED: "Job Succeeded",
    JobStatus.FAILED: "Job Failed",
    JobStatus.CANCELLED: "Job Cancelled",
}
# An output at most this large (compact JSON, UTF-8) travels in the event; a larger one is left out
# (`output_included: false`) and read with the client. EventBridge takes events up to 256 KiB.
MAX_EVENT_OUTPUT_BYTES = 64 * 1024
# PutEvents takes at most this many entries a request.
PUT_EVENTS_ENTRIES = 10
JOB_SK = "JOB"


@dataclass(frozen=True, slots=True)
class CompletionEvent:
    """One event document: what PutEvents sends (the bus aside), and the stream record it came from."""

    detail_type: str
    detail: dict[str, Any]
    sequence_number: str

    def entry(self, bus: str) -> PutEventsRequestEntryTypeDef:
        return {
            "Source": SOURCE,
            "DetailType": self.detail_type,
            "Detail": json.dumps(self.detail, separators=(",", ":"), ensure_ascii=False),
            "EventBusName": bus,
        }


def enters_terminal_status(record: dict[str, Any]) -> bool:
    """Whether a stream record shows a job entering succeeded, failed or cancelled: not another item
    kind, a non-terminal write, a later write to an ended job or a removal. The events function's
    filter criteria in template.yaml say the same."""
    change = record.get("dynamodb") or {}
    new, old = change.get("NewImage"), change.get("OldImage")
    if record.get("eventName") not in ("INSERT", "MODIFY") or not new or new.get("sk", {}).get("S") != JOB_SK:
        return False
    return _terminal(new) and (old is None or not _terminal(old))


def completion_event(record: dict[str, Any]) -> CompletionEvent | None:
    """The event a stream record makes, if any. A job item this code cannot read (written by a
    newer or older engine) still makes its event, with what every version writes the same way."""
    if not enters_terminal_status(record):
        return None
    change = record["dynamodb"]
    sequence_number = str(change.get("SequenceNumber", ""))
    try:
        job = job_from_item(change["NewImage"])
    except Exception as exc:
        log_unexpected("a finished job's item could not be read; its event carries its id and status", exc)
        image = change["NewImage"]
        status = JobStatus(image["status"]["S"])
        job_id, finished_at = image["job_id"]["S"], image.get("finished_at", image.get("updated_at", {})).get("N")
        detail = {"event_id": f"{job_id}:{finished_at}", "job_id": job_id, "status": status.value, "complete": False}
        return CompletionEvent(DETAIL_TYPES[status], detail, sequence_number)
    return CompletionEvent(DETAIL_TYPES[job.status], event_detail(job) | {"complete": True}, sequence_number)


def event_detail(job: Job) -> dict[str, Any]:
    """The event's detail: the job as `aijobs status --json` shows it, the output only when small."""
    view = JobView.from_job(job).model_dump(mode="json")
    output = view.pop("output")
    size = len(json.dumps(output, separators=(",", ":"), ensure_ascii=False).encode()) if output is not None else 0
    included = output is not None and size <= MAX_EVENT_OUTPUT_BYTES
    return {
        "event_id": f"{job.job_id}:{job.finished_at or job.updated_at}",
        **view,
        "output": output if included else None,
        "output_included": included,
        "output_bytes": size,
    }


class EventPublisher:
    def __init__(self, client: EventBridgeClient, bus: str) -> None:
        self._client = client
        self._bus = bus

    def publish(self, events: Sequence[CompletionEvent]) -> list[CompletionEvent]:
        """Put the events on the bus; those EventBridge did not accept."""
        refused: list[CompletionEvent] = []
        for start in range(0, len(events), PUT_EVENTS_ENTRIES):
            chunk = events[start : start + PUT_EVENTS_ENTRIES]
            response = self._client.put_events(Entries=[event.entry(self._bus) for event in chunk])
            if response.get("FailedEntryCount"):
                refused += [
                    event for event, entry in zip(chunk, response["Entries"], strict=True) if entry.get("ErrorCode")
                ]
        return refused


class CompletionEvents:
    """The events function: stream records in, completion events out."""

    def __init__(self, publisher: EventPublisher) -> None:
        self._publisher = publisher

    def handle(self, event: dict[str, Any], context: LambdaContext | None) -> dict[str, Any]:
        records = event.get("Records") or []
        events = [completed for record in records if (completed := completion_event(record)) is not None]
        try:
            refused = self._publisher.publish(events)
        except Exception as exc:
            # Nothing is known to be delivered: the whole batch is read again.
            log_unexpected("completion events could not be put on the bus", exc)
            refused = events
        if not refused:
            return {"batchItemFailures": []}
        logger.warning("completion events refused by the bus", extra={"refused": len(refused)})
        # A stream resumes from the lowest failed sequence number: report the first refused record.
        first = min(refused, key=lambda completed: int(completed.sequence_number or 0))
        return {"batchItemFailures": [{"itemIdentifier": first.sequence_number}]}


def _terminal(image: dict[str, Any]) -> bool:
    status = image.get("status", {}).get("S")
    return status in {terminal.value for terminal in DETAIL_TYPES}
