"""Pipelines' decisions on the in-memory store (docs/pipelines.md): a retried pipeline runs again only
what did not succeed, its usage still its children's sum; a review given again; a step whose children's
counts were lost recounted once by the reconciler; a waiting pipeline past its deadline ended and its
open children cancelled."""

from __future__ import annotations

import pytest

from engine.core import (
    ErrorCode,
    JobStatus,
    Usage,
)
from engine.core.errors import PipelineStateError
from engine.definitions.base import MAX_OUTPUT_BYTES
from engine.definitions.pipelines import EXTRACT_REVIEWED, SUMMARIZE_LONG, split_text
from engine.pipelines import children_ids
from engine.reconciler import Reconciled
from tests.support.pipelines import BROKEN, Stack, summed

TEXT = " ".join(f"Sentence {n} is about invoices, payments and their due dates." for n in range(700))
INVOICE = {
    "text": "Invoice 4711: EUR 120.50.",
    "fields": [{"name": "total", "description": "the total", "type": "number"}],
}


@pytest.fixture
def stack() -> Stack:
    return Stack()


def test_a_retried_pipeline_runs_again_only_its_failed_child_and_keeps_its_usage_the_childrens_sum(
    stack: Stack,
) -> None:
    # Given a summarize_long of three parts whose middle part failed, failing the pipeline
    parts = len(split_text(TEXT))
    assert parts == 3
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    stack.run_child(ids[0])
    stack.run_child(ids[1], fail=True)
    stack.run_child(ids[2], counted=False)  # (it ends after the parent moved on: never counted)
    stack.advance()
    failed = stack.job()
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None
    assert failed.error.code is ErrorCode.STEP_FAILED
    stack.queue.sent.clear()

    # When it is retried
    stack.retry()

    # Then only the failed child is queued again, with a fresh budget, and the parent waits on it
    assert stack.queue.sent == [ids[1]]
    rerun = stack.job(ids[1])
    assert (rerun.status, rerun.attempt_count, rerun.error) == (JobStatus.QUEUED, 0, None)
    parent = stack.job()
    assert parent.status is JobStatus.WAITING
    assert parent.pipeline is not None
    assert (parent.pipeline.ended, parent.pipeline.failed, parent.pipeline.rerun) == (
        frozenset({0, 2}),
        frozenset(),
        False,
    )
    assert parent.usage == summed([stack.job(ids[0]), stack.job(ids[2])])
    assert parent.attempt_count == 0
    # When the child succeeds this time, the pipeline moves on once and ends
    stack.run_child(ids[1], tokens=200)
    assert stack.job().status is JobStatus.QUEUED
    stack.advance()
    (summary,) = children_ids(stack.job())[1]
    stack.run_child(summary)
    stack.advance()
    done = stack.job()
    assert done.status is JobStatus.SUCCEEDED
    assert done.output == {"summary": f"summary of {summary}"}
    # and no succeeded child was called again: one call a child, two for the one that failed once
    assert sorted(stack.calls) == sorted([*ids, ids[1], summary])
    assert done.usage == summed(stack.children())


def test_a_retried_pipeline_runs_again_the_children_cancelled_with_it(stack: Stack) -> None:
    # Given a pipeline whose first part failed while the others were still queued, then cancelled
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    stack.run_child(ids[0], fail=True)
    stack.advance()
    stack.ends.ended([stack.job()])
    assert [stack.job(job_id).status for job_id in ids] == [JobStatus.FAILED] + [JobStatus.CANCELLED] * 2
    stack.queue.sent.clear()

    stack.retry()

    assert stack.queue.sent == ids
    assert {stack.job(job_id).status for job_id in ids} == {JobStatus.QUEUED}
    assert stack.job().usage == Usage()
    for job_id in ids:
        stack.run_child(job_id)
    assert stack.job().status is JobStatus.QUEUED
    stack.advance()
    assert len(children_ids(stack.job())[1]) == 1


def test_a_retried_pipeline_whose_children_all_succeeded_moves_on_at_once(stack: Stack) -> None:
    # Given a pipeline that passed its deadline while its children ended (their counts lost)
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    for job_id in ids:
        stack.run_child(job_id, counted=False)
    assert stack.store.end_job(stack.job(), JobStatus.FAILED, BROKEN, stack.clock.tick())
    stack.queue.sent.clear()

    stack.retry()

    # Then no child runs again: the pipeline is queued to start its next step, its usage its children's
    assert stack.queue.sent == ["p"]
    assert stack.job().status is JobStatus.QUEUED
    assert stack.job().usage == summed(stack.children())
    stack.advance()
    assert len(children_ids(stack.job())[1]) == 1


def test_a_retried_pipeline_whose_review_was_rejected_waits_for_a_review_again(stack: Stack) -> None:
    from engine.pipelines import decided_review

    stack.submit(EXTRACT_REVIEWED, INVOICE)
    stack.advance()
    (fields,) = children_ids(stack.job())[0]
    stack.run_child(fields)
    stack.advance()
    waiting = stack.job()
    review, _, error = decided_review(
        waiting, EXTRACT_REVIEWED, EXTRACT_REVIEWED.parse_input(INVOICE), False, None, "wrong", "ana", stack.clock.ms
    )
    stack.store.decide_review(waiting, review, None, None, error, stack.clock.tick())
    assert stack.job().status is JobStatus.FAILED

    stack.retry()

    again = stack.job()
    assert again.status is JobStatus.WAITING
    assert again.pipeline is not None
    assert again.pipeline.review is not None
    assert again.pipeline.review.decision is None
    assert again.pipeline.review.output == {"total": 120.5}
    assert stack.calls == [fields]  # the extraction is not run again


@pytest.mark.parametrize(
    ("total", "refusal"),
    [
        ("x" * MAX_OUTPUT_BYTES, rf"the output is {MAX_OUTPUT_BYTES + 12} bytes as JSON; a job stores at most"),
        ("lots \ud800", r"output.total: holds a lone UTF-16 surrogate"),
    ],
)
def test_an_edited_output_a_job_cannot_store_is_refused_in_one_line_and_the_review_still_waits(
    stack: Stack, total: str, refusal: str
) -> None:
    from engine.pipelines import decided_review

    # Given an extraction waiting for its review, whose output schema takes any text as its total
    fields = {**INVOICE, "fields": [{"name": "total", "description": "the total", "type": "string"}]}
    stack.submit(EXTRACT_REVIEWED, fields)
    stack.advance()
    (child,) = children_ids(stack.job())[0]
    stack.run_child(child)
    stack.advance()
    waiting = stack.job()
    job_input = EXTRACT_REVIEWED.parse_input(fields)

    # When a person approves an edit larger than a job's item holds, or holding a lone surrogate
    with pytest.raises(PipelineStateError, match=f"^the edited output is refused: {refusal}") as refused:
        decided_review(waiting, EXTRACT_REVIEWED, job_input, True, {"total": total}, None, "ana", stack.clock.ms)

    # Then it is refused in one line before anything is written, and the review still waits
    assert "\n" not in str(refused.value)
    assert stack.job().status is JobStatus.WAITING
    assert stack.job().pipeline == waiting.pipeline


def test_a_review_of_a_pipeline_waiting_on_its_children_is_refused_saying_what_it_waits_for(stack: Stack) -> None:
    from engine.pipelines import decided_review

    # Given a summarize_long waiting on the children of its first step
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    waiting = stack.job()
    assert waiting.status is JobStatus.WAITING

    # When a person approves it
    with pytest.raises(PipelineStateError) as refused:
        decided_review(waiting, SUMMARIZE_LONG, SUMMARIZE_LONG.parse_input({"text": TEXT}), True, None, None, "ana", 0)

    # Then the refusal says it waits on its children (not "is waiting, not waiting for a review")
    assert str(refused.value) == f"job {waiting.job_id} is waiting on its step's children, not for a review"
    assert stack.job().status is JobStatus.WAITING


def test_a_child_cancelled_alone_fails_its_pipeline_naming_it_cancelled(stack: Stack) -> None:
    # Given a summarize_long whose parts run, one of which is cancelled alone (`aijobs cancel CHILD`)
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    stack.run_child(ids[0])
    stack.run_child(ids[2])
    cancelled = stack.store.request_cancel(ids[1], stack.clock.tick())
    stack.ends.ended([cancelled])

    # When the pipeline moves on
    stack.advance()

    # Then it fails step_failed naming the step and the child, cancelled (it has no error of its own)
    failed = stack.job()
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None
    assert failed.error.code is ErrorCode.STEP_FAILED
    assert failed.error.message == f"step 'parts': child {ids[1]} cancelled"
    assert failed.usage == summed(stack.children())


def test_the_reconciler_recounts_a_waiting_step_whose_counts_were_lost_once(stack: Stack) -> None:
    # Given a pipeline whose children all ended, none of their stream records counted
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    stack.run_child(ids[0])
    for job_id in ids[1:]:
        stack.run_child(job_id, counted=False)
    stack.queue.sent.clear()

    # When the reconciler passes before the parent is stale, nothing happens
    assert Reconciled.RECOUNTED not in stack.reconciler.run()
    # and when it passes after, the children are counted and the parent moved on, once
    stack.clock.tick(16 * 60_000)
    first = stack.reconciler.run()
    second = stack.reconciler.run()

    assert first[Reconciled.RECOUNTED] == 1
    assert Reconciled.RECOUNTED not in second
    assert stack.queue.sent == ["p"]
    parent = stack.job()
    assert parent.status is JobStatus.QUEUED
    assert parent.usage == summed(stack.children())
    # and a stream record delivered late counts nothing more
    stack.ends.ended([stack.job(ids[2])])
    assert stack.job().usage == summed(stack.children())


def test_a_waiting_pipeline_past_its_deadline_ends_and_its_open_children_are_cancelled(stack: Stack) -> None:
    stack.submit(SUMMARIZE_LONG, {"text": TEXT})
    stack.advance()
    ids = children_ids(stack.job())[0]
    stack.run_child(ids[0])
    stack.clock.tick(86_400_000)

    stack.reconciling(max_jobs=1).run()  # (the parent, oldest: its children's turn comes later)
    parent = stack.job()
    assert parent.status is JobStatus.FAILED
    assert parent.error is not None
    assert parent.error.code is ErrorCode.DEADLINE_EXCEEDED
    stack.ends.ended([parent])  # (the parent's stream record)
    assert [stack.job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] + [JobStatus.CANCELLED] * 2


def test_the_reconciler_sends_again_the_message_of_a_review_whose_time_is_up(stack: Stack) -> None:
    stack.submit(EXTRACT_REVIEWED, INVOICE | {"review_timeout_seconds": 60})
    stack.advance()
    (fields,) = children_ids(stack.job())[0]
    stack.run_child(fields)
    stack.advance()
    stack.queue.sent.clear()

    stack.clock.tick(60_000)
    assert Reconciled.REQUEUED not in stack.reconciler.run()  # its own message ends it
    stack.clock.tick(15 * 60_000)
    report = stack.reconciler.run()

    assert report[Reconciled.REQUEUED] == 1
    assert stack.queue.sent == ["p"]
    stack.pipelines.on_waiting(stack.job())  # (the worker, refused a claim of a waiting job)
    timed_out = stack.job()
    assert timed_out.error is not None
    assert timed_out.error.code is ErrorCode.REVIEW_TIMEOUT
