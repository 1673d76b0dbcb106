"""Completion events from the jobs table's stream (moto keeps it): every transition into succeeded,
failed or cancelled yields exactly one event document, and no other write yields any; and the local
tap copies a guard's `Job Type Rolled Back` too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodbstreams.models import dynamodbstreams_backends
from typer.testing import CliRunner

from aijobs.cli import app
from aijobs.stack import StackResources
from engine.core import ErrorCode, Job, JobErrorInfo, JobStatus, NewJob
from engine.core.job_types import Canary, JobTypeHead
from engine.core.outcomes import Cancelled, Failed, Released, Succeeded
from engine.events import MAX_EVENT_OUTPUT_BYTES, CompletionEvent, CompletionEvents, EventPublisher, completion_event
from engine.job_type_tally import ROLLED_BACK, rolled_back_event
from engine.store import DynamoJobStore
from handlers.events import events_handler

NOW = 1_800_000_000_000
LEASE_MS = 60_000
INPUT = {"text": "My invoice is wrong", "labels": ["billing", "other"]}
ERROR = JobErrorInfo(ErrorCode.PROVIDER_TIMEOUT, "timed out", retryable=True)
REFUSED = JobErrorInfo(ErrorCode.SCHEMA_VALIDATION_FAILED, "not JSON", retryable=False)


def read(store: DynamoJobStore, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def new_job() -> NewJob:
    return NewJob(
        job_type="classify", user_id="acme", schema_version=1, max_attempts=3, deadline_seconds=86_400, request_hash="r"
    )


class MotoStream:
    """The table's stream as moto keeps it, read through moto's Streams backend: in process, moto
    answers the Streams API with "not yet implemented" (its server, which the local stack runs,
    serves it)."""

    def __init__(self, stack: StackResources, position: str = "LATEST") -> None:
        arn = boto3.client("dynamodb").describe_table(TableName=stack.table_name)["Table"]["LatestStreamArn"]
        self._backend = dynamodbstreams_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
        shard = self._backend.describe_stream(arn)["Shards"][0]["ShardId"]
        self._iterator = self._backend.get_shard_iterator(arn, shard, position).arn

    def records(self) -> list[dict[str, Any]]:
        page = self._backend.get_records(self._iterator, 1000)
        self._iterator = page["NextShardIterator"]
        return list(page["Records"])


def handled_on_the_bus(stack: StackResources, records: list[dict[str, Any]]) -> tuple[dict[str, Any], list[int]]:
    """The events function's answer to a batch of stream records, putting its events on the stack's
    bus (moto), and how many entries each PutEvents request held."""
    events = boto3.client("events")
    sent: list[int] = []

    class Counting:
        def put_events(self, **params: Any) -> Any:
            sent.append(len(params["Entries"]))
            return events.put_events(**params)

    response = events_handler(CompletionEvents(EventPublisher(Counting(), stack.event_bus)))({"Records": records}, None)  # type: ignore[arg-type]
    return response, sent


def tap_events(stack: StackResources) -> list[dict[str, Any]]:
    """The events the bus copied to the local tap queue (the template's rule for every event), consumed."""
    sqs = boto3.client("sqs")
    bodies = []
    while batch := sqs.receive_message(QueueUrl=stack.events_queue_url, MaxNumberOfMessages=10).get("Messages"):
        bodies += [json.loads(message["Body"]) for message in batch]
        sqs.delete_message_batch(
            QueueUrl=stack.events_queue_url,
            Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)],
        )
    return bodies


@pytest.fixture
def stream_events(stack: StackResources) -> Callable[[], list[CompletionEvent]]:
    """The completion events of every stream record written since the last call."""
    stream = MotoStream(stack)
    return lambda: [event for record in stream.records() if (event := completion_event(record)) is not None]


def test_a_job_retried_then_succeeding_yields_one_succeeded_event_with_its_detail(
    store: DynamoJobStore, stream_events: Callable[[], list[CompletionEvent]]
) -> None:
    # Given a submitted job (queued), claimed, released for a retry, claimed again
    store.create_job("e-1", new_job(), INPUT, NOW)
    job = store.claim_job("e-1", "w1", LEASE_MS, NOW + 1, None)
    store.finish_job(job, Released(ERROR), NOW + 2)
    job = store.claim_job("e-1", "w2", LEASE_MS, NOW + 3, None)
    assert stream_events() == []  # created, claimed, released, claimed: no event

    # When it succeeds
    store.finish_job(job, Succeeded({"label": "billing", "confidence": 0.9}, "h"), NOW + 4)

    # Then exactly one event, Job Succeeded, with the job's view and its output
    [event] = stream_events()
    assert event.detail_type == "Job Succeeded"
    detail = event.detail
    assert detail["event_id"] == f"e-1:{NOW + 4}"
    assert (detail["job_id"], detail["job_type"], detail["user_id"], detail["status"]) == (
        "e-1",
        "classify",
        "acme",
        "succeeded",
    )
    assert (detail["attempt_count"], detail["error"]) == (2, None)
    assert (detail["output"], detail["output_included"]) == ({"label": "billing", "confidence": 0.9}, True)
    assert json.loads(event.entry("bus")["Detail"]) == detail


def test_a_failed_job_retried_and_failing_again_yields_two_events_with_their_own_ids(
    store: DynamoJobStore, stream_events: Callable[[], list[CompletionEvent]]
) -> None:
    store.create_job("e-2", new_job(), INPUT, NOW)
    store.finish_job(store.claim_job("e-2", "w1", LEASE_MS, NOW + 1, None), Failed(REFUSED), NOW + 2)
    store.requeue_failed_job("e-2", NOW + 3)
    store.finish_job(store.claim_job("e-2", "w2", LEASE_MS, NOW + 4, None), Failed(REFUSED), NOW + 5)

    events = stream_events()

    assert [event.detail_type for event in events] == ["Job Failed", "Job Failed"]
    assert [event.detail["event_id"] for event in events] == [f"e-2:{NOW + 2}", f"e-2:{NOW + 5}"]
    assert events[0].detail["error"]["code"] == "schema_validation_failed"


def test_cancellations_and_jobs_created_failed_yield_their_event_and_later_writes_none(
    store: DynamoJobStore, stream_events: Callable[[], list[CompletionEvent]]
) -> None:
    # A queued job cancelled; a running one cancelled at its fence; a bad message's job created failed
    store.create_job("e-3", new_job(), INPUT, NOW)
    store.request_cancel("e-3", NOW + 1)
    store.create_job("e-4", new_job(), INPUT, NOW)
    running = store.claim_job("e-4", "w1", LEASE_MS, NOW + 1, None)
    store.request_cancel("e-4", NOW + 2)
    store.finish_job(running, Cancelled(), NOW + 3)
    store.create_failed_job("e-5", REFUSED, NOW + 4, job_type="classify", user_id="acme")
    events = stream_events()

    # A cancel asked again of an ended job changes nothing that makes an event
    store.request_cancel("e-3", NOW + 5)

    assert sorted((event.detail["job_id"], event.detail_type) for event in events) == [
        ("e-3", "Job Cancelled"),
        ("e-4", "Job Cancelled"),
        ("e-5", "Job Failed"),
    ]
    assert stream_events() == []


def test_jobs_settled_without_a_worker_and_requests_dead_lettered_before_any_claim_yield_their_event(
    store: DynamoJobStore, stream_events: Callable[[], list[CompletionEvent]]
) -> None:
    # A queued job the reconciler (or a refused claim) ends past its deadline, and another cancelled
    store.create_job("e-6", new_job(), INPUT, NOW)
    store.create_job("e-7", new_job(), INPUT, NOW)
    late = JobErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "the job's deadline passed", retryable=False)
    assert store.end_job(read(store, "e-6"), JobStatus.FAILED, late, NOW + 1)
    assert store.end_job(read(store, "e-7"), JobStatus.CANCELLED, None, NOW + 1)
    # A full request that reached the dead-letter queue before any worker created its job
    dead = JobErrorInfo(ErrorCode.DEAD_LETTERED, "reached the dead-letter queue after 100 receives", retryable=False)
    store.create_dead_lettered_job("e-8", new_job(), INPUT, dead, NOW + 2)

    events = stream_events()

    assert sorted(
        (event.detail["job_id"], event.detail_type, event.detail["error"] and event.detail["error"]["code"])
        for event in events
    ) == [
        ("e-6", "Job Failed", "deadline_exceeded"),
        ("e-7", "Job Cancelled", None),
        ("e-8", "Job Failed", "dead_lettered"),
    ]


def test_the_events_function_puts_each_event_on_the_bus_and_reports_the_first_refused(
    store: DynamoJobStore, stack: StackResources
) -> None:
    stream = MotoStream(stack)
    for n in range(12):
        store.create_failed_job(f"bus-{n}", REFUSED, NOW + n, job_type="classify", user_id="acme")
    records = stream.records()

    # When the function handles the batch: 12 job creations, each its event
    response, sent = handled_on_the_bus(stack, records)

    # Then two PutEvents (10 + 2), all accepted, each copied to the local tap queue
    assert response == {"batchItemFailures": []}
    assert sent == [10, 2]
    bodies = tap_events(stack)
    assert sorted(body["detail"]["job_id"] for body in bodies) == sorted(f"bus-{n}" for n in range(12))
    assert {(body["source"], body["detail-type"]) for body in bodies} == {("aijobs", "Job Failed")}

    # And when the bus refuses some entries, the batch resumes from the first refused record
    class Refusing:
        def put_events(self, **params: Any) -> Any:
            return {
                "FailedEntryCount": 1,
                "Entries": [{}, {"ErrorCode": "ThrottlingException"}, *[{}] * 8][: len(params["Entries"])],
            }

    refused = events_handler(CompletionEvents(EventPublisher(Refusing(), stack.event_bus)))({"Records": records}, None)  # type: ignore[arg-type]
    assert refused == {"batchItemFailures": [{"itemIdentifier": records[1]["dynamodb"]["SequenceNumber"]}]}


def test_four_outputs_of_64_kib_in_one_stream_batch_make_four_events(
    store: DynamoJobStore, stack: StackResources
) -> None:
    # Given four jobs that succeed with an output of 64 KiB each (the largest an event carries):
    # ten entries of that size pass EventBridge's 256 KiB a request (which fit_moto holds moto to)
    stream = MotoStream(stack)
    output = {"summary": "x" * (MAX_EVENT_OUTPUT_BYTES - len('{"summary":""}'))}
    for n in range(4):
        store.create_job(f"large-{n}", new_job(), INPUT, NOW)
        job = store.claim_job(f"large-{n}", "w1", LEASE_MS, NOW + 1, None)
        store.finish_job(job, Succeeded(output, "h"), NOW + 2)
    records = stream.records()

    # When the events function handles them in one batch
    response, sent = handled_on_the_bus(stack, records)

    # Then every event was accepted, each with its output, in two requests (three fit in one)
    assert response == {"batchItemFailures": []}
    assert sent == [3, 1]
    bodies = tap_events(stack)
    assert sorted(body["detail"]["job_id"] for body in bodies) == [f"large-{n}" for n in range(4)]
    assert all(body["detail"]["output"] == output and body["detail"]["output_included"] for body in bodies)


def test_a_canary_its_guard_ended_reaches_the_local_tap_as_aijobs_events_reads_it(stack: StackResources) -> None:
    # Given a guarded canary (v2 of triage) that its guard ends, as the events function's tally does
    canary = Canary(version=2, percent=50, started_at=NOW, canary_jobs=10, canary_invalid=10, production_jobs=20)
    head = JobTypeHead(name="triage", latest=2, production=1, canary=canary, revision=3)
    why = "v2 failed validation on 100.0% of 10 jobs, production on 0.0% of 20: more than 2 points worse"
    event = rolled_back_event(head, why, NOW + 1)

    # When its `Job Type Rolled Back` event is put on the stack's bus
    refused = EventPublisher(boto3.client("events"), stack.event_bus).publish([event])

    # Then the bus took it, and `aijobs events` reads it from the local tap beside the completion
    # events: one line, whole however long, naming the job type, both versions and why
    assert refused == []
    printed = CliRunner().invoke(app, ["events", "--queue-url", stack.events_queue_url])
    assert printed.exit_code == 0, printed.output
    assert [line.split("  ", 1)[1] for line in printed.stdout.splitlines()] == [
        f"{ROLLED_BACK}  type=triage  version=2  production=1  {why}"
    ]
    assert tap_events(stack) == []
