"""Background jobs through a batch API with `aijobs dev`, against a batch-capable provider of the test's own.

`aijobs dev` runs in a process of its own with AIJOBS_BATCH_API=on and short batch settings, and
AI_BASE_URL naming a local provider this test started (its Files and Batches APIs, its faults asked
for by a marker in a job's input). Each case waits for its jobs' ends, never for a time: the batch
path and its price, failed lines, an expired batch, a stalled one (cancelled at its rescue time,
its jobs answered in real time before their deadlines), and answers that fail validation.

A case's jobs are submitted together, but a window may end between their claims: they may be split
over two batches. What a case expects of its batches is read from the provider's Batches API.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from aijobs.client import AiJobsClient
from aijobs.local.provider import LocalProvider
from engine.core import AttemptRecord, JobStatus, Lane, Via
from engine.gateway import PriceTable
from engine.store import DynamoJobStore
from tests.support.dev_jobs import attempts, ended
from tests.support.dev_process import DevProcess, clean_environment

MODEL = "gpt-4o-mini"
WINDOW, POLL, RESCUE = 3, 1, 20
# Far enough for a batch (rescue + window + poll + 60 s), near enough for a stalled batch's rescue
# to come within the test.
NEAR_DEADLINE_SECONDS = RESCUE + WINDOW + POLL + 60 + 10
WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    started = LocalProvider(api_key="their-key", latency_seconds=0.0, batch_delay_seconds=0.5).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def dev(provider: LocalProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    environment = clean_environment() | {
        "AI_BASE_URL": provider.url,
        "AI_API_KEY": "their-key",
        "AI_MODEL_PRIMARY": MODEL,
        "AIJOBS_BATCH_API": "on",
        "AIJOBS_BATCH_WINDOW_SECONDS": str(WINDOW),
        "AIJOBS_BATCH_POLL_SECONDS": str(POLL),
        "AIJOBS_BATCH_RESCUE_SECONDS": str(RESCUE),
    }
    with DevProcess(["--port", "0", "--provider-port", "0"], environment, tmp_path_factory.mktemp("dev")) as started:
        yield started


def submit(client: AiJobsClient, count: int, text: str, deadline_seconds: int | None = None) -> list[str]:
    """`count` background jobs, submitted one after the other at once (the CLI's own submit is tested
    apart: one process each would spread them over several windows)."""
    run = uuid.uuid4().hex[:6]
    ids = [f"batch-{run}-{n}" for n in range(count)]
    for job_id in ids:
        job_input = {"text": f"{text} ({job_id})", "labels": ["spam", "ham"]}
        client.submit(
            "classify", "u-batch", job_input, job_id=job_id, deadline_seconds=deadline_seconds, lane=Lane.BACKGROUND
        )
    return ids


def provider_batches(provider: LocalProvider, status: str) -> list[dict[str, Any]]:
    """The provider's batches that ended with `status`, as its Batches API lists them."""
    listed = httpx.get(f"{provider.url}/batches", params={"limit": 100}, headers={"Authorization": "Bearer their-key"})
    listed.raise_for_status()
    return [batch for batch in listed.json()["data"] if batch["status"] == status]


def realtime_usd(attempt: AttemptRecord) -> Decimal:
    return PriceTable().cost(MODEL, attempt).usd


def test_background_jobs_with_a_day_to_spare_are_answered_through_a_batch_at_half_price(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    ids = submit(client, 3, "Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS + NEAR_DEADLINE_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    records = attempts(store, ids)
    assert [attempt.via for attempt in records] == [Via.BATCH] * 3
    completed = {batch["id"] for batch in provider_batches(provider, "completed")}
    assert {attempt.batch_id for attempt in records} <= completed
    for attempt in records:
        assert attempt.cost_usd == realtime_usd(attempt) / 2
    inspection = dev.aijobs("inspect", ids[0], "--json")
    assert inspection.returncode == 0, inspection.stderr
    assert json.loads(inspection.stdout)["job"]["usage"]["cost_usd"] == pytest.approx(float(records[0].cost_usd))


def test_failed_lines_of_a_batch_are_answered_in_real_time(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    ids = submit(client, 4, "batch-fault:failed_lines Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS + NEAR_DEADLINE_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    assert {job.attempt_count for job in jobs.values()} == {1}
    # Every second line of a batch failed: those jobs, and only those, were answered in real time.
    records = attempts(store, ids)
    batches = [
        batch for batch in provider_batches(provider, "completed") if batch["id"] in {a.batch_id for a in records}
    ]
    counts = Counter(attempt.via for attempt in records)
    assert counts[Via.REALTIME] == sum(batch["request_counts"]["failed"] for batch in batches) >= 1
    assert counts[Via.BATCH] == sum(batch["request_counts"]["completed"] for batch in batches) >= 1
    assert counts.total() == len(ids)


def test_an_expired_batch_s_unanswered_jobs_are_answered_in_real_time(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    ids = submit(client, 4, "batch-fault:expire_half Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS + NEAR_DEADLINE_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    # An expired batch answered the first half of its lines: the others were answered in real time.
    batches = provider_batches(provider, "expired")
    counts = Counter(attempt.via for attempt in attempts(store, ids))
    assert counts[Via.BATCH] == sum(batch["request_counts"]["completed"] for batch in batches) >= 1
    assert counts[Via.REALTIME] == len(ids) - counts[Via.BATCH] >= 2
    assert counts.total() == len(ids)


def test_a_stalled_batch_s_jobs_end_before_their_deadlines_paying_for_one_answer(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore
) -> None:
    ids = submit(client, 3, "batch-fault:stall Win a free cruise now!", deadline_seconds=NEAR_DEADLINE_SECONDS)

    jobs = ended(store, ids, dev, WAIT_SECONDS + NEAR_DEADLINE_SECONDS)

    for job in jobs.values():
        assert job.status is JobStatus.SUCCEEDED
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at
    assert [attempt.via for attempt in attempts(store, ids)] == [Via.REALTIME] * 3


def test_a_batch_answer_that_fails_validation_is_re_asked_in_real_time(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore
) -> None:
    ids = submit(client, 2, "fault:repairable Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS + NEAR_DEADLINE_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    for attempt in attempts(store, ids):
        assert attempt.via is Via.BATCH
        assert attempt.calls == 2
        # The batch's call at the batch price, the re-ask at the real-time price.
        assert realtime_usd(attempt) / 2 < attempt.cost_usd < realtime_usd(attempt)


def test_aijobs_batches_lists_the_batches(dev: DevProcess) -> None:
    listed = dev.aijobs("batches", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) >= 1
