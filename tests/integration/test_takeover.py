"""Leases and takeover: a job whose worker died is finished by a later delivery once its lease has
expired, the dead worker cannot overwrite it, and racing duplicates complete each job exactly once."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine.core import AttemptOutcome, AttemptRecord, Job, JobStatus, NewJob, Succeeded
from engine.core.errors import LeaseLostError
from engine.gateway import CompletionRequest
from engine.store import DynamoJobStore
from tests.conftest import RequestCounter
from tests.integration.conftest import (
    ACKNOWLEDGED,
    Enqueue,
    RecordingQueue,
    TableReader,
    WorkerFactory,
    now_ms,
    open_job_ids,
)
from tests.support.events import InvocationContext, job_message, sqs_event
from tests.support.providers import VALID_OUTPUTS, FakeProvider, valid_answer

DEAD_LEASE_MS = 60_000


def stale_finish(dead_store: DynamoJobStore, dead_job: Job, at_ms: int) -> LeaseLostError:
    """The dead worker wakes up and finishes with the job as it claimed it; returns the refusal."""
    attempt = AttemptRecord(
        job_id=dead_job.job_id,
        attempt=dead_job.claim_count,
        user_id=dead_job.user_id,
        job_type=dead_job.job_type,
        started_at=at_ms - 1,
        finished_at=at_ms,
        outcome=AttemptOutcome.SUCCEEDED,
        input_tokens=100,
        output_tokens=20,
    )
    with pytest.raises(LeaseLostError) as lost:
        dead_store.finish_job(dead_job, Succeeded({"label": "ham", "confidence": 0.5}, "stale-hash"), at_ms, attempt)
    return lost.value


def test_a_job_whose_worker_died_after_the_claim_is_held_until_its_lease_expires_then_taken_over(
    side_store: DynamoJobStore,
    make_worker: WorkerFactory,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a message whose job a worker claimed for 60 s and then died without finishing
    message = job_message("classify", "crash-1")
    record = enqueue(message)
    t0 = now_ms()
    dead_job = side_store.claim_job("crash-1", "dead-worker", DEAD_LEASE_MS, t0, new_job(message))
    claimed = table.job_item("crash-1")

    # When the message is delivered again 20 s later
    early = make_worker(clock=lambda: (t0 + 20_000) / 1000)
    response = early.handle(sqs_event(record), InvocationContext())

    # Then the job is held: the record is not deleted but hidden for the 40 s the lease has left
    assert response == {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    assert queue.visibility_changes == [(record["receiptHandle"], 40)]
    assert queue.refused == []
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1}
    assert provider.calls == 0
    assert table.job_item("crash-1") == claimed
    dynamodb_requests.reset()

    # When it comes back after the lease expired, and the dead worker wakes up during the new call
    late_finishes: list[tuple[LeaseLostError, dict[str, Any] | None, dict[str, Any] | None]] = []

    def dead_worker_finishes_first(request: CompletionRequest) -> Any:
        before = table.job_item("crash-1")
        refused = stale_finish(side_store, dead_job, t0 + DEAD_LEASE_MS + 2_000)
        late_finishes.append((refused, before, table.job_item("crash-1")))
        return valid_answer(request)

    provider.script = dead_worker_finishes_first
    late = make_worker(clock=lambda: (t0 + DEAD_LEASE_MS + 1_000) / 1000)
    response = late.handle(sqs_event(record), InvocationContext())

    # Then the dead worker's fenced finish was refused as a whole, changing nothing
    ((refused, before, after),) = late_finishes
    assert refused.job is not None
    assert (refused.job.status, refused.job.claim_count) == (JobStatus.RUNNING, 2)
    assert after == before
    # And the job is taken over and finished in the usual two requests, with one provider call
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 1
    job = table.job("crash-1")
    assert (job.status, job.output, job.error, job.lease_owner) == (
        JobStatus.SUCCEEDED,
        VALID_OUTPUTS["classify"],
        None,
        None,
    )
    assert (job.attempt_count, job.claim_count, job.usage.attempts) == (2, 2, 1)
    assert (job.usage.input_tokens, job.usage.output_tokens) == (100, 20)
    # And only the attempt that reached the provider is recorded, under its claim's number
    assert table.attempt("crash-1", 1) is None
    second = table.attempt("crash-1", 2)
    assert second is not None
    assert second["outcome"] == "succeeded"
    assert "crash-1" not in open_job_ids(table)

    # And a finish even later, after the job succeeded, is refused too
    finished = table.job_item("crash-1")
    assert stale_finish(side_store, dead_job, t0 + 2 * DEAD_LEASE_MS).job is not None
    assert table.job_item("crash-1") == finished
    assert table.attempt("crash-1", 1) is None


# --- racing duplicates ----------------------------------------------------------------------------

WORKERS = 3
JOBS = 5
DELIVERIES_PER_JOB = 3


def test_duplicates_racing_across_workers_complete_every_job_exactly_once(
    make_worker: WorkerFactory,
    provider: FakeProvider,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given 5 messages, each delivered 3 times, shuffled across 3 workers (each its own store and
    # runner, sharing one serialized DynamoDB client), and a provider slow enough for calls to overlap
    records = [
        enqueue(job_message("classify", f"race-{n}", input={"text": f"race message {n}", "labels": ["spam", "ham"]}))
        for n in range(JOBS)
    ]
    deliveries = [record for record in records for _ in range(DELIVERIES_PER_JOB)]
    random.Random(11).shuffle(deliveries)
    workers = [make_worker() for _ in range(WORKERS)]

    def slow_answer(request: CompletionRequest) -> Any:
        time.sleep(0.05)
        return valid_answer(request)

    provider.script = slow_answer
    dynamodb_requests.reset()
    start = threading.Barrier(WORKERS)

    def run(index: int) -> list[tuple[str, dict[str, Any]]]:
        start.wait(timeout=10)
        share = deliveries[index::WORKERS]
        return [(d["messageId"], workers[index].handle(sqs_event(d), InvocationContext())) for d in share]

    # When the workers handle their deliveries at the same time
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        responses = [response for share in pool.map(run, range(WORKERS)) for response in share]

    # Then every delivery was either acknowledged or reported back as held, never lost or in error
    assert len(responses) == JOBS * DELIVERIES_PER_JOB
    for message_id, response in responses:
        assert response in (ACKNOWLEDGED, {"batchItemFailures": [{"itemIdentifier": message_id}]})
    held = [message_id for message_id, response in responses if response != ACKNOWLEDGED]
    assert len(queue.visibility_changes) == len(held)
    assert queue.refused == []
    # And each delivery made one claim request, and each job was finished by exactly one of them
    assert dict(dynamodb_requests.operations) == {"UpdateItem": JOBS * DELIVERIES_PER_JOB, "TransactWriteItems": JOBS}
    # And each job had exactly one provider call
    calls = Counter(n for request in provider.requests for n in range(JOBS) if f"race message {n}" in request.user)
    assert calls == {n: 1 for n in range(JOBS)}
    assert provider.calls == JOBS
    # And each job succeeded once: one claim, one attempt record, the usage of one attempt
    for n in range(JOBS):
        job = table.job(f"race-{n}")
        assert (job.status, job.output) == (JobStatus.SUCCEEDED, VALID_OUTPUTS["classify"])
        assert (job.attempt_count, job.claim_count, job.usage.attempts) == (1, 1, 1)
        attempt = table.attempt(f"race-{n}", 1)
        assert attempt is not None
        assert attempt["outcome"] == "succeeded"
        assert table.attempt(f"race-{n}", 2) is None
