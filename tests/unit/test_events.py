"""Completion events (engine.events): which stream records make an event, what the event says, and
that the events function's filter criteria in template.yaml select exactly those records."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from moto.events.models import EventPattern

from aijobs.stack import DEFAULT_TEMPLATE, load_template
from engine.core import Job, JobStatus, Review, Usage
from engine.events import (
    MAX_EVENT_OUTPUT_BYTES,
    PUT_EVENTS_BYTES,
    PUT_EVENTS_ENTRIES,
    CompletionEvent,
    EventPublisher,
    completion_event,
    enters_terminal_status,
    event_detail,
    put_events_requests,
    record_events,
)
from engine.store.items import job_key, review_document, to_item

STATUSES = [status.value for status in JobStatus]


def image(sk: str, status: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"pk": {"S": "JOB#j-1"}, "sk": {"S": sk}, "job_id": {"S": "j-1"}}
    if status is not None:
        item["status"] = {"S": status}
    return item


def record(event_name: str, sk: str, old: str | None, new: str | None) -> dict[str, Any]:
    change: dict[str, Any] = {"SequenceNumber": "1"}
    if event_name != "INSERT":
        change["OldImage"] = image(sk, old)
    if event_name != "REMOVE":
        change["NewImage"] = image(sk, new)
    return {"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": change}


def template_filters() -> list[EventPattern]:
    function = load_template(DEFAULT_TEMPLATE)["Resources"]["EventsFunction"]["Properties"]
    filters = function["Events"]["TableChanges"]["Properties"]["FilterCriteria"]["Filters"]
    return [EventPattern.load(entry["Pattern"]) for entry in filters]


RECORDS = [
    record(event_name, sk, old, new)
    for event_name, sk, old, new in itertools.product(
        ["INSERT", "MODIFY", "REMOVE"], ["JOB", "ATTEMPT#0001", "INPUT"], STATUSES, STATUSES
    )
]


@pytest.mark.parametrize("stream_record", RECORDS, ids=lambda r: json.dumps(r["dynamodb"], sort_keys=True)[:90])
def test_the_template_filters_select_exactly_the_records_that_make_an_event(stream_record: dict[str, Any]) -> None:
    selected = any(pattern.matches_event(stream_record) for pattern in template_filters())  # type: ignore[arg-type]

    assert selected == (enters_terminal_status(stream_record))


def test_an_event_is_made_for_a_job_entering_each_terminal_status_only() -> None:
    entering = {
        (old, new)
        for old, new in itertools.product(STATUSES, STATUSES)
        if enters_terminal_status(record("MODIFY", "JOB", old, new))
    }

    assert entering == set(itertools.product(["queued", "running", "waiting"], ["succeeded", "failed", "cancelled"]))


def job(output: dict[str, Any] | None) -> Job:
    return Job(
        job_id="j-1",
        job_type="classify",
        user_id="acme",
        status=JobStatus.SUCCEEDED,
        attempt_count=1,
        max_attempts=3,
        created_at=1_800_000_000_000,
        updated_at=1_800_000_001_000,
        finished_at=1_800_000_001_000,
        output=output,
        usage=Usage(input_tokens=10, output_tokens=2),
    )


def test_a_small_output_travels_in_the_event_and_a_large_one_is_left_for_the_client() -> None:
    small = event_detail(job({"label": "billing"}))
    large = event_detail(job({"summary": "x" * MAX_EVENT_OUTPUT_BYTES}))

    assert (small["output"], small["output_included"], small["output_bytes"]) == ({"label": "billing"}, True, 19)
    assert (large["output"], large["output_included"]) == (None, False)
    assert large["output_bytes"] > MAX_EVENT_OUTPUT_BYTES
    assert small["event_id"] == "j-1:1800000001000"
    # An event stays far below EventBridge's 256 KiB
    assert len(json.dumps(large)) < 16 * 1024


def test_a_job_item_that_cannot_be_read_still_makes_its_event_with_its_id_and_status() -> None:
    # A record whose job item lacks what this version reads (as one of another version may)
    broken = record("MODIFY", "JOB", "running", "failed")
    broken["dynamodb"]["NewImage"]["finished_at"] = {"N": "1800000001000"}

    event = completion_event(broken)

    assert event is not None
    assert event.detail_type == "Job Failed"
    assert event.detail == {"event_id": "j-1:1800000001000", "job_id": "j-1", "status": "failed", "complete": False}


# --- PutEvents requests: EventBridge's entries and bytes ------------------------------------------


def succeeded(job_id: str, output: dict[str, Any]) -> CompletionEvent:
    detail = event_detail(replace(job(output), job_id=job_id)) | {"complete": True}
    return CompletionEvent("Job Succeeded", detail, sequence_number=job_id.removeprefix("j-"))


def output_of(size: int) -> dict[str, Any]:
    """An output whose compact JSON is `size` bytes."""
    return {"summary": "x" * (size - len('{"summary":""}'))}


def test_requests_hold_at_most_ten_entries_under_256_kib_in_the_stream_order() -> None:
    small = [succeeded(f"j-{n}", {"label": "billing"}) for n in range(12)]
    large = [succeeded(f"j-{n}", output_of(MAX_EVENT_OUTPUT_BYTES)) for n in range(12, 17)]

    requests = put_events_requests([*small, *large])

    assert [event for request in requests for event in request] == [*small, *large]
    assert all(len(request) <= PUT_EVENTS_ENTRIES for request in requests)
    assert all(sum(event.size for event in request) < PUT_EVENTS_BYTES for request in requests)
    # Ten small ones; two small and three large (a fourth large one would pass 256 KiB); two large
    assert [len(request) for request in requests] == [10, 5, 2]


def test_an_entry_sized_as_eventbridge_counts_it() -> None:
    event = succeeded("j-1", {"label": "fr\u00e9"})
    entry = event.entry("a-bus-name-that-does-not-count")

    assert event.size == sum(len(entry[part].encode()) for part in ("Source", "DetailType", "Detail"))  # type: ignore[literal-required]


def test_an_event_too_large_alone_travels_without_its_output_and_tells_its_size() -> None:
    # An event whose output would pass a request's limit alone (larger than events carry today)
    event = succeeded("j-1", {"label": "billing"})
    huge = CompletionEvent(
        event.detail_type,
        event.detail | {"output": output_of(PUT_EVENTS_BYTES), "output_bytes": PUT_EVENTS_BYTES},
        event.sequence_number,
    )

    fitted = huge.fitted()

    assert (fitted.detail["output"], fitted.detail["output_included"]) == (None, False)
    assert fitted.detail["output_bytes"] == PUT_EVENTS_BYTES
    assert fitted.sequence_number == huge.sequence_number
    assert fitted.size < PUT_EVENTS_BYTES
    assert event.fitted() is event


class Bus:
    """A PutEvents client that fails its `failing`-th request as a whole and accepts the others."""

    def __init__(self, failing: int) -> None:
        self.requests: list[list[str]] = []
        self._failing = failing

    def put_events(self, **params: Any) -> Any:
        self.requests.append([json.loads(entry["Detail"])["job_id"] for entry in params["Entries"]])
        if len(self.requests) == self._failing:
            raise ConnectionError("the network went away")
        return {"FailedEntryCount": 0, "Entries": [{"EventId": "e"} for _ in params["Entries"]]}


def test_a_request_that_fails_refuses_its_events_and_the_later_ones_only() -> None:
    events = [succeeded(f"j-{n}", output_of(MAX_EVENT_OUTPUT_BYTES)) for n in range(10)]
    bus = Bus(failing=2)

    refused = EventPublisher(bus, "bus").publish(events)  # type: ignore[arg-type]

    # The first request (three events) was put; the second failed, and nothing after it was sent
    assert [len(request) for request in bus.requests] == [3, 3]
    assert refused == events[3:]


# --- a pipeline's review decided -------------------------------------------------------------------


def reviewed_record(decision: str | None, by: str | None = "arn:aws:iam::123456789012:user/ana") -> dict[str, Any]:
    """The stream record of extract_reviewed's job ending with its review's decision (or still waiting)."""
    review = Review({"total": 1}, 1_800_000_000_000, 60_000, decision=decision, by=by, at=1_800_000_002_000)
    status = {"approved": "succeeded", None: "waiting"}.get(decision, "failed")
    attributes = {
        "job_id": "j-1",
        "job_type": "extract_reviewed",
        "user_id": "acme",
        "status": status,
        "created_at": 1_800_000_000_000,
        "updated_at": 1_800_000_002_000,
        "finished_at": 1_800_000_002_000,
        "max_attempts": 3,
        "attempt_count": 0,
        "claim_count": 2,
        "pipeline_step": 1,
        "pipeline_children": 0,
        "pipeline_counts": [1, 0],
        "review": review_document(review),
    }
    change = {
        "SequenceNumber": "7",
        "OldImage": image("JOB", "waiting"),
        "NewImage": job_key("j-1") | to_item(attributes),
    }
    return {"eventName": "MODIFY", "eventSource": "aws:dynamodb", "dynamodb": change}


@pytest.mark.parametrize(("decision", "completion"), [("approved", "Job Succeeded"), ("rejected", "Job Failed")])
def test_a_review_decided_makes_a_job_reviewed_event_before_its_completion(decision: str, completion: str) -> None:
    events = record_events(reviewed_record(decision))

    assert [event.detail_type for event in events] == ["Job Reviewed", completion]
    detail = events[0].detail
    assert detail["event_id"] == "j-1:reviewed:1800000002000"
    assert (detail["job_id"], detail["decision"], detail["by"]) == (
        "j-1",
        decision,
        "arn:aws:iam::123456789012:user/ana",
    )
    assert set(detail) >= {"status", "at", "reason", "changed", "started_at", "expires_at"}
    assert "output" not in detail


def test_a_review_still_open_makes_no_event_and_a_timeout_names_no_one() -> None:
    assert record_events(reviewed_record(None)) == []
    (reviewed, _) = record_events(reviewed_record("timed_out", by=None))
    assert (reviewed.detail["decision"], reviewed.detail["by"]) == ("timed_out", None)
