"""The pipelines' writes (engine.core.ports.PipelineStore), held to one contract on both stores: a step
started (`waiting`, the claim refunded), a child's end counted once with its usage, the parent moved on
once, a review decided once, a waiting pipeline cancelled at once, and a retried pipeline's rerun: the
mark its next claim reads, a step started again keeping its succeeded children, and the children that
did not succeed put back to `queued`."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any, Protocol, cast

import pytest

from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    ChildOf,
    ErrorCode,
    Failed,
    Job,
    JobErrorInfo,
    JobStatus,
    NewJob,
    Review,
    Succeeded,
    Usage,
    Waits,
)
from engine.core.errors import PipelineStateError
from engine.core.ports import PipelineStore
from tests.contract.conftest import JobStore

NOW = 1_800_000_000_000
LEASE_MS = 60_000
TEXT = {"text": "a long text", "max_words": 50}
BROKEN = JobErrorInfo(ErrorCode.SCHEMA_VALIDATION_FAILED, "output: not JSON", retryable=False)


class Pipelines(JobStore, PipelineStore, Protocol):
    """Both stores, with the pipelines' writes."""


@pytest.fixture
def pipelines(job_store: JobStore) -> Pipelines:
    """The store under test, with its pipelines' writes (both stores have them)."""
    return cast(Pipelines, job_store)


def new_job(job_type: str, job_input: dict[str, Any], parent: ChildOf | None = None) -> NewJob:
    return NewJob(job_type, "u-1", 1, 3, 3600, f"hash-{job_type}-{sorted(job_input.items())}", parent=parent)


def waiting(store: Pipelines, children: int = 3) -> Job:
    """Pipeline "p" waiting on its first step, with `children` children made (queued)."""
    store.create_job("p", new_job("summarize_long", TEXT), TEXT, NOW)
    parent = store.claim_job("p", "w-p", LEASE_MS, NOW, None)
    for part in range(children):
        child_input = {"text": f"part {part}", "max_words": 50}
        store.create_job(
            f"p:s0:{part}", new_job("summarize", child_input, ChildOf("p", "parts", 0, part)), child_input, NOW
        )
    store.finish_job(parent, Waits(0, children, (children,)), NOW + 1)
    return read(store, "p")


def read(store: Pipelines, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def end_child(store: Pipelines, part: int, *, fail: bool = False, tokens: int = 100) -> Job:
    job_id = f"p:s0:{part}"
    claimed = store.claim_job(job_id, f"w-{part}", LEASE_MS, NOW + 2, None)
    attempt = AttemptRecord(
        job_id=job_id,
        attempt=claimed.claim_count,
        user_id="u-1",
        job_type="summarize",
        started_at=NOW + 2,
        finished_at=NOW + 3,
        outcome=AttemptOutcome.FAILED if fail else AttemptOutcome.SUCCEEDED,
        input_tokens=tokens,
        output_tokens=tokens // 10,
        cost_usd=Decimal("0.0001") * tokens,
    )
    outcome = Failed(BROKEN) if fail else Succeeded({"summary": f"part {part}"}, "h")
    store.finish_job(claimed, outcome, NOW + 3, attempt)
    return read(store, job_id)


def test_a_step_started_leaves_the_pipeline_waiting_with_its_claim_refunded_and_children_made(
    pipelines: Pipelines,
) -> None:
    store = pipelines
    parent = waiting(store)

    assert parent.status is JobStatus.WAITING
    assert parent.attempt_count == 0
    assert parent.lease_owner is None
    assert parent.pipeline is not None
    assert (parent.pipeline.step, parent.pipeline.children, parent.pipeline.counts) == (0, 3, (3,))
    assert parent.pipeline.ended == frozenset()
    child = read(store, "p:s0:1")
    assert child.parent == ChildOf("p", "parts", 0, 1)
    assert child.status is JobStatus.QUEUED


def test_a_child_is_counted_once_with_its_usage_and_the_parent_moved_on_once(pipelines: Pipelines) -> None:
    store = pipelines
    waiting(store)
    first, second = end_child(store, 0, tokens=100), end_child(store, 1, fail=True, tokens=50)

    counted = store.count_child(first, NOW + 4)
    again = store.count_child(first, NOW + 5)
    failed = store.count_child(second, NOW + 6)

    assert counted.counted
    assert not again.counted
    assert failed.counted
    assert failed.parent is not None
    state = failed.parent.pipeline
    assert state is not None
    assert (state.ended, state.failed) == (frozenset({0, 1}), frozenset({1}))
    assert not state.step_ended
    assert (failed.parent.usage.input_tokens, failed.parent.usage.output_tokens) == (150, 15)
    assert failed.parent.usage.attempts == 2
    assert failed.parent.usage.cost_usd == Decimal("0.015")
    # When two callers see the step over, one only moves the parent on
    assert store.make_ready(failed.parent, NOW + 7)
    assert not store.make_ready(failed.parent, NOW + 8)
    assert read(store, "p").status is JobStatus.QUEUED
    # and a child that ends after the parent moved on (its step failed) still adds its usage, once, and
    # moves the parent no further
    late = end_child(store, 2, tokens=10)
    assert store.count_child(late, NOW + 9).counted
    assert not store.count_child(late, NOW + 10).counted
    parent = read(store, "p")
    assert parent.status is JobStatus.QUEUED
    assert parent.usage.input_tokens == 160
    assert parent.usage.attempts == 3


def test_a_late_answer_to_an_ended_child_adds_its_usage_to_the_parent_too_once(pipelines: Pipelines) -> None:
    # Given a pipeline cancelled with its children, one of which a provider's batch answers afterwards
    store = pipelines
    waiting(store)
    store.request_cancel("p", NOW + 4)
    cancelled = store.request_cancel("p:s0:0", NOW + 4)
    assert cancelled.status is JobStatus.CANCELLED
    assert store.count_child(cancelled, NOW + 5).counted  # its end, as the stream counts it: no usage
    open_child = read(store, "p:s0:1")
    late = AttemptRecord(
        job_id="p:s0:0",
        attempt=1,
        user_id="u-1",
        job_type="summarize",
        started_at=NOW + 6,
        finished_at=NOW + 6,
        outcome=AttemptOutcome.SUCCEEDED,
        input_tokens=4_000,
        output_tokens=20,
        cost_usd=Decimal("0.0003"),
    )

    # When its answer is kept as usage (a batch's conclusion gone over twice), and an open child's too
    assert store.record_orphan_attempt(late, NOW + 6, None, cancelled.parent)
    assert not store.record_orphan_attempt(late, NOW + 7, None, cancelled.parent)
    opened = replace(late, job_id="p:s0:1", input_tokens=900)
    assert store.record_orphan_attempt(opened, NOW + 8, None, open_child.parent)

    # Then the ended child's usage is added to the parent's, once; the open child's is not (its end,
    # counted later, carries it)
    parent = read(store, "p")
    assert (parent.usage.input_tokens, parent.usage.output_tokens, parent.usage.attempts) == (4_000, 20, 1)
    assert parent.usage.cost_usd == Decimal("0.0003")
    assert read(store, "p:s0:0").usage.input_tokens == 4_000
    assert read(store, "p:s0:1").usage.input_tokens == 900
    assert parent.status is JobStatus.CANCELLED


def test_a_waiting_pipeline_is_cancelled_at_once(pipelines: Pipelines) -> None:
    store = pipelines
    waiting(store)

    cancelled = store.request_cancel("p", NOW + 5)

    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.cancel_requested


def test_a_review_is_decided_once_and_a_second_decision_is_refused(pipelines: Pipelines) -> None:
    store = pipelines
    store.create_job("r", new_job("extract_reviewed", TEXT), TEXT, NOW)
    parent = store.claim_job("r", "w-r", LEASE_MS, NOW, None)
    proposed = Review(output={"total": 1}, started_at=NOW, timeout_ms=60_000)
    store.finish_job(parent, Waits(1, 0, (1, 0), proposed), NOW + 1)
    waiting_job = read(store, "r")
    approved = Review({"total": 1}, NOW, 60_000, decision="approved", by="ana", at=NOW + 2, changed=True)

    decided = store.decide_review(waiting_job, approved, {"total": 2}, "h2", None, NOW + 2)

    assert decided.status is JobStatus.SUCCEEDED
    assert decided.output == {"total": 2}
    assert decided.pipeline is not None
    assert decided.pipeline.review == approved
    with pytest.raises(PipelineStateError):
        store.decide_review(waiting_job, approved, None, None, BROKEN, NOW + 3)
    assert read(store, "r").status is JobStatus.SUCCEEDED


def test_a_retried_pipeline_is_marked_to_rerun_until_its_next_finish(pipelines: Pipelines) -> None:
    store = pipelines
    parent = waiting(store)
    store.count_child(end_child(store, 0, fail=True), NOW + 4)
    store.make_ready(parent, NOW + 5)
    claimed = store.claim_job("p", "w-p2", LEASE_MS, NOW + 6, None)
    store.finish_job(claimed, Failed(BROKEN), NOW + 7)

    requeued = store.requeue_failed_job("p", NOW + 8)

    assert requeued.status is JobStatus.QUEUED
    assert requeued.pipeline is not None
    assert requeued.pipeline.rerun
    # When its claim starts the step again, keeping part 1's end and giving back part 0's usage
    again = store.claim_job("p", "w-p3", LEASE_MS, NOW + 9, None)
    assert again.pipeline is not None
    assert again.pipeline.rerun
    before = read(store, "p").usage
    back = Usage(input_tokens=-100, output_tokens=-10, cost_usd=Decimal("-0.01"), attempts=-1)
    store.finish_job(again, Waits(0, 3, (3,), ended=frozenset({1}), usage=back), NOW + 10)

    # Then it waits on the same step with that end counted, the mark gone and the usage taken back
    rerun = read(store, "p")
    assert rerun.status is JobStatus.WAITING
    assert rerun.pipeline is not None
    assert (rerun.pipeline.ended, rerun.pipeline.failed, rerun.pipeline.rerun) == (frozenset({1}), frozenset(), False)
    assert rerun.usage.input_tokens == before.input_tokens - 100
    assert rerun.usage.attempts == before.attempts - 1
    assert rerun.usage.cost_usd == before.cost_usd - Decimal("0.01")


@pytest.mark.parametrize("ends", ["failed", "cancelled"])
def test_a_child_that_did_not_succeed_is_put_back_to_queued_with_a_fresh_budget(
    pipelines: Pipelines, ends: str
) -> None:
    store = pipelines
    waiting(store)
    child = end_child(store, 0, fail=True) if ends == "failed" else store.request_cancel("p:s0:0", NOW + 3)
    deadline_at = NOW + 7_200_000

    assert store.rerun_child(child, deadline_at, NOW + 10)

    rerun = read(store, "p:s0:0")
    assert rerun.status is JobStatus.QUEUED
    assert (rerun.attempt_count, rerun.cancel_requested, rerun.error, rerun.finished_at) == (0, False, None, None)
    assert rerun.deadline_at == deadline_at
    assert store.get_input("p:s0:0") == {"text": "part 0", "max_words": 50}
    # and the same child, as read before, is not put back twice
    assert not store.rerun_child(child, deadline_at, NOW + 11)
    claimed = store.claim_job("p:s0:0", "w-again", LEASE_MS, NOW + 12, None)
    assert claimed.attempt_count == 1
