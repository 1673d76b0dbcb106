"""Duplicate and conflicting deliveries: finished, held by another worker, racing, different input."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.core import JobStatus, NewJob
from engine.store import DynamoJobStore
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import RecordingQueue, TableReader, WorkerFactory, now_ms
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider, valid_answer

# Bounds for waits on other threads: a hang fails the test, it never gates on timing.
WAIT_SECONDS = 20


def test_a_duplicate_of_a_finished_job_is_acknowledged_without_a_provider_call(
    worker: WorkerHandler, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given a job that succeeded
    message = job_message("classify", "dup-finished")
    worker.handle(sqs_event(sqs_record(message)), InvocationContext())
    before = table.job_item("dup-finished")
    dynamodb_requests.reset()

    # When the same message is delivered again
    response = worker.handle(sqs_event(sqs_record(message)), InvocationContext())

    # Then it is acknowledged after the one refused claim, without calling the provider again
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 1}
    assert provider.calls == 1
    assert table.job_item("dup-finished") == before


def test_a_duplicate_of_a_held_job_is_hidden_for_the_remaining_lease(
    worker: WorkerHandler,
    store: DynamoJobStore,
    queue: RecordingQueue,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Callable[[Any], dict[str, Any]],
    new_job: Callable[..., NewJob],
) -> None:
    # Given a job another worker holds with a live lease of 120 s
    message = job_message("classify", "dup-held")
    store.claim_job("dup-held", "other-worker", 120_000, now_ms(), new_job(message))
    held = table.job_item("dup-held")
    # And a real SQS delivery of its message
    record = enqueue(message)
    dynamodb_requests.reset()

    # When the worker handles that delivery
    response = worker.handle(sqs_event(record), InvocationContext())
    handled_at = now_ms()

    # Then the record is NOT deleted: it is a batch item failure hidden for the remaining lease
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    assert requests == {"UpdateItem": 1}
    assert provider.calls == 0
    ((handle, seconds),) = queue.visibility_changes
    assert handle == record["receiptHandle"]
    assert held is not None
    assert (held["lease_expires_at"] - handled_at) / 1000 <= seconds <= 120
    assert queue.refused == []
    # And the holder's job is untouched
    assert table.job_item("dup-held") == held


def test_two_workers_racing_on_one_message_run_the_job_once(
    make_worker: WorkerFactory,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Callable[[Any], dict[str, Any]],
) -> None:
    # Given a provider that holds its first answer until released, so both workers are in flight
    entered, release = threading.Event(), threading.Event()

    def held_answer(request: Any) -> Any:
        entered.set()
        release.wait(WAIT_SECONDS)
        return valid_answer(request)

    provider = FakeProvider(held_answer)
    # And two workers with stores of their own (one lock-serialized client), and one delivery of a job
    workers = [make_worker(fake=provider), make_worker(fake=provider)]
    record = enqueue(job_message("classify", "race-1"))
    event = sqs_event(record)
    responses: list[dict[str, Any]] = [{}, {}]

    def deliver(index: int) -> None:
        responses[index] = workers[index].handle(event, InvocationContext())

    threads = [threading.Thread(target=deliver, args=(index,)) for index in range(2)]

    # When both handle the same message at once, and the provider answers only after one has returned
    started_at = now_ms()
    for thread in threads:
        thread.start()
    assert entered.wait(WAIT_SECONDS), "no worker reached the provider"
    for _ in range(WAIT_SECONDS * 10):
        if any(not thread.is_alive() for thread in threads):
            break
        threads[0].join(0.05)
        threads[1].join(0.05)
    refused_by = now_ms()
    release.set()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert not any(thread.is_alive() for thread in threads)

    # Then the provider was called once and the job succeeded once
    assert provider.calls == 1
    assert dynamodb_requests.operations["TransactWriteItems"] == 1
    job = table.job("race-1")
    assert job.status is JobStatus.SUCCEEDED
    assert (job.attempt_count, job.usage.attempts) == (1, 1)
    # And the worker that lost the claim reported the record as held, hidden for the winner's lease
    failures = sorted(len(response["batchItemFailures"]) for response in responses)
    assert failures == [0, 1]
    ((handle, seconds),) = queue.visibility_changes
    assert handle == record["receiptHandle"]
    # (the winner's lease is its context's 300 s, counted from no earlier than `started_at`)
    assert (started_at + 300_000 - refused_by) / 1000 - 1 <= seconds <= 300
    assert queue.refused == []


def test_a_message_reusing_a_job_id_with_other_input_is_dead_lettered(
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a job that succeeded
    worker.handle(sqs_event(sqs_record(job_message("classify", "conflict-1"))), InvocationContext())
    before = table.job_item("conflict-1")
    dynamodb_requests.reset()

    # When a message with the same job id and a different input arrives
    other = job_message("classify", "conflict-1", input={"text": "Lunch at noon?", "labels": ["spam", "ham"]})
    record = sqs_record(other)
    response = worker.handle(sqs_event(record), InvocationContext())

    # Then it is acknowledged and kept as a dead letter; the job is unchanged and nothing ran again
    requests = dict(dynamodb_requests.operations)
    assert response == {"batchItemFailures": []}
    assert requests == {"UpdateItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 1
    assert table.job_item("conflict-1") == before
    dead = table.dead_letter(record["messageId"])
    assert dead is not None
    assert dead["body"] == record["body"]
    assert "different" in dead["reason"]
    assert "\n" not in dead["reason"]
