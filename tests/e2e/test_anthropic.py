"""Jobs through Anthropic's APIs with `aijobs dev` and `AI_PROVIDER=anthropic`.

`aijobs dev` runs in a process of its own against an Anthropic-compatible provider this test started
(the local provider's Messages and Message Batches APIs, on 127.0.0.1, with a key of its own), with
batches on and short batch settings: a job in real time, a fault it gets past, background jobs through
a message batch at half price, and an expired batch whose unanswered requests go back to real time.
A last case runs the embedded stack in this process with `AI_PROVIDER=anthropic` and no
`AI_BASE_URL`: its own local provider serves the jobs through its Anthropic API. Each case waits
for its jobs' ends, never for a time.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal

import pytest

from aijobs.client import AiJobsClient
from aijobs.local.devstack import LOCAL_ANTHROPIC_MODEL, DevStack, DevStackOptions
from aijobs.local.provider import LocalProvider
from engine.core import AttemptRecord, JobStatus, Lane, Via
from engine.gateway import PriceTable
from engine.store import DynamoJobStore
from tests.support.dev_jobs import attempts, ended
from tests.support.dev_process import DevProcess, clean_environment
from tests.support.waiting import eventually

MODEL = "claude-haiku-4-5"
WINDOW, POLL, RESCUE = 3, 1, 20
WAIT_SECONDS = 90.0


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    started = LocalProvider(api_key="their-key", latency_seconds=0.0, batch_delay_seconds=0.5).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def dev(provider: LocalProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    environment = clean_environment() | {
        "AI_PROVIDER": "anthropic",
        "AI_BASE_URL": provider.anthropic_url,
        "AI_API_KEY": "their-key",
        "AI_MODEL_PRIMARY": MODEL,
        "AIJOBS_BATCH_API": "on",
        "AIJOBS_BATCH_WINDOW_SECONDS": str(WINDOW),
        "AIJOBS_BATCH_POLL_SECONDS": str(POLL),
        "AIJOBS_BATCH_RESCUE_SECONDS": str(RESCUE),
    }
    with DevProcess(["--port", "0", "--provider-port", "0"], environment, tmp_path_factory.mktemp("dev")) as started:
        yield started


def submit(client: AiJobsClient, count: int, text: str, lane: Lane = Lane.BACKGROUND) -> list[str]:
    run = uuid.uuid4().hex[:6]
    ids = [f"anthropic-{run}-{n}" for n in range(count)]
    for job_id in ids:
        client.submit(
            "classify",
            "u-anthropic",
            {"text": f"{text} ({job_id})", "labels": ["spam", "ham"]},
            job_id=job_id,
            lane=lane,
        )
    return ids


def realtime_usd(attempt: AttemptRecord) -> Decimal:
    return PriceTable().cost(MODEL, attempt).usd


def test_an_interactive_job_is_answered_through_the_messages_api_with_its_cache_priced(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    # Given two interactive jobs of one job type (the second reads the prefix the first wrote)
    ids = submit(client, 1, "Win a free cruise now!", Lane.INTERACTIVE)
    ended(store, ids, dev, WAIT_SECONDS)
    ids += submit(client, 1, "Meeting moved to noon.", Lane.INTERACTIVE)

    jobs = ended(store, ids, dev, WAIT_SECONDS)

    # Then both succeeded in real time through Anthropic's API, each call billed as the provider logged it
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    records = attempts(store, ids)
    assert [attempt.via for attempt in records] == [Via.REALTIME] * 2
    served = [
        entry for entry in provider.log if entry.api == "anthropic" and entry.status == 200 and entry.batch_id is None
    ]
    assert [
        (attempt.input_tokens, attempt.cached_input_tokens, attempt.cache_write_input_tokens) for attempt in records
    ] == [(entry.prompt_tokens, entry.cached_tokens, entry.cache_write_tokens) for entry in served[-2:]]
    assert records[1].cached_input_tokens > 0
    for attempt in records:
        assert attempt.cost_usd == realtime_usd(attempt)


def test_an_overloaded_provider_is_asked_again_and_the_job_succeeds(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    # Given a job whose first call is answered 529 overloaded_error
    overloaded_before = sum(entry.status == 529 for entry in provider.log)
    ids = submit(client, 1, "fault:unavailable*1 Win a free cruise now!", Lane.INTERACTIVE)

    jobs = ended(store, ids, dev, WAIT_SECONDS)

    # Then its first attempt was unavailable, and its second succeeded
    assert jobs[ids[0]].status is JobStatus.SUCCEEDED
    assert sum(entry.status == 529 for entry in provider.log) == overloaded_before + 1
    assert [attempt.error_code for attempt in attempts(store, ids)][:1] == ["provider_unavailable"]


def test_background_jobs_go_through_a_message_batch_at_half_price(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    ids = submit(client, 3, "Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    records = attempts(store, ids)
    assert [attempt.via for attempt in records] == [Via.BATCH] * 3
    batched = {entry.batch_id for entry in provider.log if entry.batch_id}
    assert {attempt.batch_id for attempt in records} <= batched
    assert all(str(attempt.batch_id).startswith("msgbatch_") for attempt in records)
    for attempt in records:
        assert attempt.cost_usd == realtime_usd(attempt) / 2


def test_an_expired_batch_s_unanswered_requests_are_answered_in_real_time(
    dev: DevProcess, client: AiJobsClient, store: DynamoJobStore, provider: LocalProvider
) -> None:
    ids = submit(client, 4, "batch-fault:expire_half Win a free cruise now!")

    jobs = ended(store, ids, dev, WAIT_SECONDS)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    counts = Counter(attempt.via for attempt in attempts(store, ids))
    assert counts[Via.BATCH] >= 1
    assert counts[Via.REALTIME] >= 2
    assert counts.total() == len(ids)


def test_without_a_base_url_the_embedded_stack_serves_anthropic_jobs_from_its_own_provider() -> None:
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        quiet=True,
        stack_name=f"anthropic-{uuid.uuid4().hex[:6]}",
        provider_latency_seconds=0,
        function_environment={"AI_PROVIDER": "anthropic"},
    )
    with DevStack(options) as stack:
        assert stack.provider is not None
        assert (stack.settings.ai_provider, stack.settings.ai_base_url) == ("anthropic", stack.provider.anthropic_url)
        client = AiJobsClient.from_settings(stack.settings, stack.session)
        job_id = client.submit("classify", "u-local", {"text": "Win a cruise", "labels": ["spam", "ham"]}).job_id

        def finished() -> JobStatus | None:
            status = client.get(job_id).status
            return status if status.is_terminal else None

        assert eventually(finished, timeout=WAIT_SECONDS, what="the job ended") is JobStatus.SUCCEEDED
        assert [(entry.api, entry.model) for entry in stack.provider.log] == [("anthropic", LOCAL_ANTHROPIC_MODEL)]
