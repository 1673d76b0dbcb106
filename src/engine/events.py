"""Completion events: one EventBridge event each time a job reaches succeeded, failed or cancelled.

The events come from the jobs table's stream (DynamoDB Streams, new and old images), never from the
worker: a job's finishing write is the only thing it takes, so delivery does not depend on the
worker surviving after it, and the worker's path keeps its two requests. The events function reads
the stream (its event source mapping filters it to job items entering a terminal status), turns
each record into an event document and puts them on the bus, in PutEvents requests that hold what
EventBridge takes (ten entries, under 256 KiB). docs/events.md gives the event, its size rules and
why this is not an EventBridge Pipe.

A pipeline's review decided (approved, rejected, or timed out: docs/pipelines.md) ends its job, so the
same record makes a second event before the completion one: `Job Reviewed`, the decision, who made it,
when, why and whether the output was edited (`review_event`).

Delivery is at least once: a record whose event was not accepted is reported as a batch item
failure and read again, with the ones after it. `detail.event_id` (`<job_id>:<finished_at>`; a
review's `<job_id>:reviewed:<at>`) is the same on every delivery of one transition, so consumers
deduplicate on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core import Job, JobStatus
from engine.observability import log_unexpected, logger
from engine.store.items import job_from_item
from engine.views import JobView

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = "aijobs"
REVIEWED = "Job Reviewed"
DETAIL_TYPES = {
    JobStatus.SUCCEEDED: "Job Succeeded",
    JobStatus.FAILED: "Job Failed",
    JobStatus.CANCELLED: "Job Cancelled",
}
# An output at most this large (compact JSON, UTF-8) travels in the event; a larger one is left out
# (`output_included: false`) and read with the client.
MAX_EVENT_OUTPUT_BYTES = 64 * 1024
# PutEvents takes at most this many entries a request, whose sizes add up to less than this many
# bytes. EventBridge sizes an entry as the UTF-8 bytes of its Source, DetailType and Detail (and of
# Time and Resources, which these entries do not set); the bus's name does not count.
PUT_EVENTS_ENTRIES = 10
PUT_EVENTS_BYTES = 256 * 1024
JOB_SK = "JOB"


@dataclass(frozen=True, slots=True)
class CompletionEvent:
    """One event document: what PutEvents sends (the bus aside), and the stream record it came from."""

    detail_type: str
    detail: dict[str, Any]
    sequence_number: str

    def entry(self, bus: str) -> PutEventsRequestEntryTypeDef:
        return {"Source": SOURCE, "DetailType": self.detail_type, "Detail": self._detail_json, "EventBusName": bus}

    @property
    def size(self) -> int:
        """The entry's size as EventBridge counts it against a request's limit."""
        return len(SOURCE.encode()) + len(self.detail_type.encode()) + len(self._detail_json.encode())

    def fitted(self) -> CompletionEvent:
        """The event, or, when it alone would not fit in a request, the event without its output (its
        size still told), as an output past MAX_EVENT_OUTPUT_BYTES travels."""
        if self.size < PUT_EVENTS_BYTES or self.detail.get("output") is None:
            return self
        detail = self.detail | {"output": None, "output_included": False}
        return CompletionEvent(self.detail_type, detail, self.sequence_number)

    @property
    def _detail_json(self) -> str:
        return json.dumps(self.detail, separators=(",", ":"), ensure_ascii=False)


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


def record_events(record: dict[str, Any]) -> list[CompletionEvent]:
    """The events a stream record makes, in order: a review's decision, then the completion."""
    completed = completion_event(record)
    if completed is None:
        return []
    reviewed = review_event(record)
    return [completed] if reviewed is None else [reviewed, completed]


def review_event(record: dict[str, Any]) -> CompletionEvent | None:
    """`Job Reviewed`, for a record of a pipeline whose review was decided (the decision ends it)."""
    if not enters_terminal_status(record):
        return None
    change = record["dynamodb"]
    if "review" not in change["NewImage"]:
        return None
    try:
        job = job_from_item(change["NewImage"])
    except Exception:
        return None  # (its completion event says what can be read of it)
    review = job.pipeline.review if job.pipeline is not None else None
    if review is None or review.decision is None:
        return None
    view = JobView.from_job(job)
    assert view.pipeline is not None
    assert view.pipeline.review is not None
    decided = view.pipeline.review.model_dump(mode="json", exclude={"output"})
    detail = {
        "event_id": f"{job.job_id}:reviewed:{review.at or job.finished_at}",
        "job_id": job.job_id,
        "job_type": job.job_type,
        "user_id": job.user_id,
        "status": job.status.value,
        "lane": job.lane.value,
        "job_type_version": job.job_type_version,
        **decided,
    }
    return CompletionEvent(REVIEWED, detail, str(change.get("SequenceNumber", "")))


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
        """Put the events on the bus, in order; those EventBridge did not accept.

        A request that fails as a whole (the network, throttling) ends the publication: its events
        and every one after it are refused, so that those before it are not put again.
        """
        refused: list[CompletionEvent] = []
        requests = put_events_requests([event.fitted() for event in events])
        for index, request in enumerate(requests):
            try:
                response = self._client.put_events(Entries=[event.entry(self._bus) for event in request])
            except Exception as exc:
                log_unexpected("completion events could not be put on the bus", exc)
                return refused + [event for later in requests[index:] for event in later]
            if response.get("FailedEntryCount"):
                refused += [
                    event for event, entry in zip(request, response["Entries"], strict=True) if entry.get("ErrorCode")
                ]
        return refused


def put_events_requests(events: Sequence[CompletionEvent]) -> list[list[CompletionEvent]]:
    """The events in order, cut into PutEvents requests: at most PUT_EVENTS_ENTRIES entries whose
    sizes add up to less than PUT_EVENTS_BYTES."""
    requests: list[list[CompletionEvent]] = []
    size = 0
    for event in events:
        if not requests or len(requests[-1]) == PUT_EVENTS_ENTRIES or size + event.size >= PUT_EVENTS_BYTES:
            requests.append([])
            size = 0
        requests[-1].append(event)
        size += event.size
    return requests


class CompletionEvents:
    """The events function: stream records in, completion events out."""

    def __init__(self, publisher: EventPublisher) -> None:
        self._publisher = publisher

    def publish(self, records: Sequence[dict[str, Any]]) -> str | None:
        """Put on the bus the events the stream's records make. When the bus refused some: the sequence
        number the stream must resume from (the first refused record's, as a stream resumes from the
        lowest failed one); else None."""
        events = [event for record in records for event in record_events(record)]
        refused = self._publisher.publish(events)
        if not refused:
            return None
        logger.warning("completion events refused by the bus", extra={"refused": len(refused)})
        return min(refused, key=lambda completed: int(completed.sequence_number or 0)).sequence_number


def _terminal(image: dict[str, Any]) -> bool:
    status = image.get("status", {}).get("S")
    return status in {terminal.value for terminal in DETAIL_TYPES}
