"""Lanes on moto: a job keeps its lane, and every message that moves it goes to its lane's queue.

Submitted, retried, redriven or re-enqueued by the reconciler, a background job's message goes to
the background queue, an interactive one's to the jobs queue; a message that names no lane runs in
the lane of the queue it came from; the view, the attempt records and the usage carry the lane.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.core import ErrorCode, JobErrorInfo, JobStatus, Lane
from engine.definitions import JobRegistry
from engine.queue import JobQueue, JobQueues
from engine.reconciler import Reconciler
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.integration.conftest import ACKNOWLEDGED, TableReader, queued_bodies
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record

BACKGROUND_ARN = "arn:aws:sqs:us-east-1:123456789012:aijobs-background-jobs"


@pytest.fixture
def queues(stack: StackResources, sqs: Any) -> JobQueues:
    return JobQueues(
        {
            Lane.INTERACTIVE: JobQueue(stack.queue_url, sqs),
            Lane.BACKGROUND: JobQueue(stack.background_queue_url, sqs),
        }
    )


@pytest.fixture
def client(store: DynamoJobStore, queues: JobQueues, registry: JobRegistry, dynamodb: Any) -> AiJobsClient:
    listing, ledger = JobListing(store.table_name, dynamodb), UsageLedger(store.table_name, dynamodb)
    return AiJobsClient(store, queues, registry, listing=listing, ledger=ledger)


def classify_input(text: str = "Win a free cruise now!") -> dict[str, Any]:
    return {"text": text, "labels": ["spam", "ham"]}


def test_a_submitted_job_goes_to_its_lanes_queue(client: AiJobsClient, stack: StackResources, sqs: Any) -> None:
    client.submit("classify", "acme", classify_input(), job_id="sub-bg", lane=Lane.BACKGROUND)
    client.submit("classify", "acme", classify_input(), job_id="sub-it")

    assert queued_bodies(sqs, stack.background_queue_url) == [{"job_id": "sub-bg"}]
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "sub-it"}]
    assert (client.get("sub-bg").lane, client.get("sub-it").lane) == (Lane.BACKGROUND, Lane.INTERACTIVE)


def test_an_unknown_lane_is_refused_before_anything_is_written(client: AiJobsClient, table: TableReader) -> None:
    with pytest.raises(Exception, match="lane") as refused:
        client.submit("classify", "acme", classify_input(), job_id="bad-lane", lane="urgent")

    assert getattr(refused.value, "code", None) is ErrorCode.INPUT_VALIDATION_FAILED
    assert table.item({"pk": {"S": "JOB#bad-lane"}, "sk": {"S": "JOB"}}) is None


def test_a_message_without_a_lane_runs_in_the_lane_of_its_queue_and_its_usage_says_so(
    runner: Any, queues: JobQueues, table: TableReader, client: AiJobsClient
) -> None:
    worker = WorkerHandler(Worker(runner), queues)
    unnamed = sqs_record(job_message("classify", "from-bg-queue"), queue_arn=BACKGROUND_ARN)
    named = sqs_record(job_message("classify", "named-it", lane="interactive"), queue_arn=BACKGROUND_ARN)

    assert worker.handle(sqs_event(unnamed, named), InvocationContext()) == ACKNOWLEDGED

    assert table.job("from-bg-queue").lane is Lane.BACKGROUND
    assert table.job("named-it").lane is Lane.INTERACTIVE
    lanes = {(row.user_id, row.lane) for row in client.usage(3600)}
    assert lanes == {("user-1", "background"), ("user-1", "interactive")}
    assert [view.job_id for view in client.list_jobs(lane=Lane.BACKGROUND)] == ["from-bg-queue"]


def test_a_retried_job_goes_back_to_its_own_lane(
    client: AiJobsClient, store: DynamoJobStore, stack: StackResources, sqs: Any
) -> None:
    # Given a background job that failed
    client.submit("classify", "acme", classify_input(), job_id="retry-bg", lane=Lane.BACKGROUND)
    queued_bodies(sqs, stack.background_queue_url)  # the submission's message, taken off
    job = store.get_job("retry-bg")
    assert job is not None
    failed = JobErrorInfo(ErrorCode.PROVIDER_REJECTED, "HTTP 400", retryable=False)
    assert store.end_job(job, JobStatus.FAILED, failed, int(time.time() * 1000))

    # When it is retried (as a redrive of its dead letter would)
    client.retry("retry-bg")

    assert queued_bodies(sqs, stack.background_queue_url) == [{"job_id": "retry-bg"}]
    assert queued_bodies(sqs, stack.queue_url) == []


def test_the_reconciler_re_enqueues_a_stale_job_on_its_own_lanes_queue(
    client: AiJobsClient, store: DynamoJobStore, queues: JobQueues, stack: StackResources, sqs: Any
) -> None:
    # Given a background job whose message was lost, untouched for longer than the stale time
    client.submit("classify", "acme", classify_input(), job_id="stale-bg", lane=Lane.BACKGROUND)
    queued_bodies(sqs, stack.background_queue_url)  # the submission's message, taken off

    report = Reconciler(store, queues, stale_seconds=60, clock=lambda: time.time() + 120).run()

    assert report["requeued"] == 1, report
    assert queued_bodies(sqs, stack.background_queue_url) == [{"job_id": "stale-bg"}]
    assert queued_bodies(sqs, stack.queue_url) == []
