"""Completion events (engine.events): which stream records make an event, what the event says, and
that the events function's filter criteria in template.yaml select exactly those records."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from moto.events.models import EventPattern

from aijobs.stack import DEFAULT_TEMPLATE, load_template
from engine.core import Job, JobStatus, Usage
from engine.events import MAX_EVENT_OUTPUT_BYTES, completion_event, enters_terminal_status, event_detail

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

    assert entering == set(itertools.product(["queued", "running"], ["succeeded", "failed", "cancelled"]))


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
