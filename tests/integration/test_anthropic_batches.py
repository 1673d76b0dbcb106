"""Background jobs through Anthropic's Message Batches API, on moto and the local provider's.

The same stack as tests/integration/test_batches.py (worker, runner, batcher; the engine's clock moved
on by the test, the provider's in real time), calling the local provider through the Anthropic
adapters: a batch's answers at the batch price, errored requests handed back to real time, and a
batch created by a pass that stopped before recording it, adopted by a batcher that never saw it,
once it can be told apart, and never created twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aijobs.local.provider import LocalProvider
from aijobs.stack import StackResources
from engine.core import JobStatus, Via
from engine.gateway import PriceTable
from engine.gateway.anthropic import AnthropicProvider
from engine.gateway.anthropic_batch import AnthropicBatchProvider
from engine.gateway.openai import static_api_key
from tests.conftest import RequestCounter
from tests.integration.test_batches import Stack
from tests.support.waiting import eventually

MODEL = "claude-haiku-4-5"


def anthropic_stack(stack: StackResources, provider: LocalProvider, requests: RequestCounter, dynamodb: Any) -> Stack:
    realtime = AnthropicProvider(provider.anthropic_url, static_api_key("k"))
    batches = AnthropicBatchProvider(provider.anthropic_url, static_api_key("k"))
    return Stack(stack, provider, requests, dynamodb, realtime=realtime, batches=batches, model=MODEL)


@pytest.fixture
def fleet(
    stack: StackResources, local_provider: LocalProvider, dynamodb_requests: RequestCounter, dynamodb: Any
) -> Stack:
    return anthropic_stack(stack, local_provider, dynamodb_requests, dynamodb)


@pytest.fixture
def slow_provider() -> Iterator[LocalProvider]:
    provider = LocalProvider(api_key="k", latency_seconds=0.0, batch_delay_seconds=2.0).start()
    yield provider
    provider.stop()


def test_a_message_batch_finishes_its_jobs_at_half_the_price(fleet: Stack) -> None:
    ids = fleet.submit(4)
    fleet.gather()
    fleet.until_ended()

    batch_ids = {entry.batch_id for entry in fleet.provider.log if entry.batch_id}
    assert len(batch_ids) == 1
    assert all(entry.api == "anthropic" for entry in fleet.provider.log)
    for job_id in ids:
        job = fleet.reader.get_job(job_id)
        assert job is not None
        assert job.status is JobStatus.SUCCEEDED
        [attempt] = fleet.reader.attempts(job_id)
        assert (attempt.via, attempt.batch_id) == (Via.BATCH, next(iter(batch_ids)))
        assert attempt.cost_usd == PriceTable().cost(MODEL, attempt).usd / 2


def test_errored_requests_are_handed_back_and_answered_in_real_time(fleet: Stack) -> None:
    ids = fleet.submit(4, "batch-fault:failed_lines Win a free cruise now!")
    fleet.gather()
    fleet.until_ended()
    handed_back = fleet.run_handed_back()

    # Every second request errored (api_error): those jobs, and only those, were answered in real time
    assert handed_back == 2
    assert [fleet.reader.get_job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 4  # type: ignore[union-attr]
    assert sorted(fleet.vias(job_id)[-1] for job_id in ids) == [Via.BATCH, Via.BATCH, Via.REALTIME, Via.REALTIME]


def test_a_batch_a_stopped_pass_created_is_adopted_once_it_can_be_told_apart_and_never_created_twice(
    stack: StackResources, slow_provider: LocalProvider, dynamodb_requests: RequestCounter, dynamodb: Any
) -> None:
    fleet = anthropic_stack(stack, slow_provider, dynamodb_requests, dynamodb)
    ids = fleet.submit(2)
    # Given a pass that created the batch through a process that then stopped before recording its id
    dying = AnthropicBatchProvider(slow_provider.anthropic_url, static_api_key("k"))
    created: list[str] = []

    def created_then_stopped(lines: Any, metadata: Any) -> str:
        created.append(dying.submit(lines, metadata))
        raise OSError("the pass stopped before it recorded the batch's id")

    submit = fleet.batches.submit
    fleet.batches.submit = created_then_stopped  # type: ignore[method-assign]
    fleet.gather()
    fleet.batches.submit = submit  # type: ignore[method-assign]

    # When the next pass runs while that batch is still in progress
    report = fleet.batcher.run()

    # Then it cannot tell the batch apart yet, and does not create another
    assert report["adopt_retried"] == 1
    assert report["created"] == 0

    # And once the batch has ended, it is adopted and its answers end the jobs
    eventually(lambda: fleet.batches.status(created[0]).state.ended, timeout=30, what="the batch ended")
    fleet.until_ended()
    assert [fleet.reader.get_job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 2  # type: ignore[union-attr]
    assert len({entry.batch_id for entry in slow_provider.log if entry.batch_id}) == 1
    assert [fleet.vias(job_id) for job_id in ids] == [[Via.BATCH]] * 2
