"""Fair queues: every message the engine and the client send carries its user as MessageGroupId."""

from __future__ import annotations

from typing import Any

from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.core.errors import ProviderRejectedError
from handlers.worker import WorkerHandler
from tests.integration.conftest import ACKNOWLEDGED, Enqueue, TableReader, queued_messages
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider


def test_a_submitted_job_is_enqueued_in_its_users_message_group(
    jobs_client: AiJobsClient, sqs: Any, stack: StackResources
) -> None:
    jobs_client.submit("classify", "acme", job_message("classify")["input"], job_id="fair-1")
    jobs_client.submit("classify", "globex", job_message("classify")["input"], job_id="fair-2")

    assert sorted(queued_messages(sqs, stack.queue_url), key=str) == [
        ({"job_id": "fair-1"}, "acme"),
        ({"job_id": "fair-2"}, "globex"),
    ]


def test_a_retried_job_is_enqueued_in_its_users_message_group(
    jobs_client: AiJobsClient,
    sqs: Any,
    stack: StackResources,
    worker: WorkerHandler,
    provider: FakeProvider,
    enqueue: Enqueue,
    table: TableReader,
) -> None:
    provider.script = lambda _: ProviderRejectedError("provider rejected the request (HTTP 403)", status_code=403)
    message = job_message("classify", "fair-retry") | {"user_id": "initech"}
    assert worker.handle(sqs_event(enqueue(message)), InvocationContext()) == ACKNOWLEDGED

    jobs_client.retry("fair-retry")

    assert queued_messages(sqs, stack.queue_url) == [({"job_id": "fair-retry"}, "initech")]


def test_the_worker_runs_messages_with_and_without_a_group(
    sqs: Any, stack: StackResources, worker: WorkerHandler, table: TableReader
) -> None:
    # Given one message sent in a user's group and one sent without a group (a plain producer)
    for job_id, group in (("grouped", {"MessageGroupId": "acme"}), ("plain", {})):
        body = sqs_record(job_message("classify", job_id))["body"]
        sqs.send_message(QueueUrl=stack.queue_url, MessageBody=body, **group)
    received = sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    records = [
        sqs_record(m["Body"], message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"])
        for m in received["Messages"]
    ]

    # When the worker handles them, both succeed
    assert worker.handle(sqs_event(*records), InvocationContext()) == ACKNOWLEDGED
    assert {table.job(job_id).status.value for job_id in ("grouped", "plain")} == {"succeeded"}
