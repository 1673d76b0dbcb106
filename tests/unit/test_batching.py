"""Routing and rescue decisions of the providers' batch APIs (engine.batching), on the in-memory stores.

A background job whose deadline is far enough is claimed into a batch window and kept in a part; the
batcher gathers closed windows into recorded batches, creates them, polls them, and finishes each job
with its answer at the batch price, or hands it back to real time (a failed line, a line an expired,
cancelled or failed batch did not answer, a batch still running at its rescue time). Every job ends
before its deadline and pays for one batch answer at most.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Ack, Fate, JobStatus, Lane, Via
from engine.core.batches import BatchPhase, BatchState
from engine.core.errors import ProviderRejectedError, ProviderUnavailableError
from engine.runner import Claimed
from tests.support.batch_fleet import (
    LINE_OUTCOMES,
    MODEL,
    POLL_MS,
    RESCUE_MS,
    T0_MS,
    TIMING,
    FaultyBatchProvider,
    Fleet,
    answering,
    realtime_cost,
)
from tests.support.batches import valid_line
from tests.support.events import job_message, new_job_for


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def last_hand_back(fleet: Fleet, ids: list[str]) -> int:
    """When the last of these batched jobs goes back to real time unanswered: two thirds of the rescue
    time before its deadline."""
    return max(fleet.job(job_id).deadline_at or 0 for job_id in ids) - RESCUE_MS * 2 // 3


# --- routing --------------------------------------------------------------------------------------


def test_a_background_job_far_from_its_deadline_joins_a_batch_and_its_message_is_acknowledged(fleet: Fleet) -> None:
    [job_id] = fleet.submit(1)

    job = fleet.job(job_id)
    assert job.status is JobStatus.RUNNING
    assert job.batch == TIMING.window_of(T0_MS)
    assert job.deadline_at is not None
    assert job.lease_expires_at == job.deadline_at - RESCUE_MS // 3
    assert fleet.realtime.calls == 0
    [part] = fleet.files.parts()
    assert part.model == MODEL
    assert [entry.job_id for entry in fleet.files.read_part(part).entries] == [job_id]


def test_a_job_whose_deadline_is_too_near_for_a_batch_runs_now(fleet: Fleet) -> None:
    near = (TIMING.eligible_ms // 1000) - 1
    step = fleet.deliver(job_message("classify", "near", lane="background", deadline_seconds=near))

    assert isinstance(step, Claimed)
    assert step.job.batch is None
    assert fleet.files.parts() == []


def test_an_existing_job_whose_deadline_is_too_near_is_claimed_once_to_run_now(fleet: Fleet) -> None:
    message = job_message("classify", "made", lane="background")
    new_job = new_job_for(message, lane=Lane.BACKGROUND, deadline_seconds=TIMING.eligible_ms // 1000 + 60)
    fleet.store.create_job("made", new_job, message["input"], fleet.clock.now_ms)  # a submission
    fleet.clock.now_ms += 120_000  # its deadline is now too near

    step = fleet.deliver({"job_id": "made"})

    assert isinstance(step, Claimed)
    assert step.job.batch is None
    assert step.job.claim_count == 1


def test_interactive_jobs_and_messages_handed_back_never_join_a_batch(fleet: Fleet) -> None:
    interactive = fleet.deliver(job_message("classify", "i-1", lane="interactive"), lane=Lane.BACKGROUND)
    handed_back = fleet.deliver(job_message("classify", "h-1", lane="background"), realtime=True)

    assert isinstance(interactive, Claimed)
    assert interactive.job.batch is None
    assert isinstance(handed_back, Claimed)
    assert handed_back.job.batch is None


# --- gathering ------------------------------------------------------------------------------------


def test_a_window_is_gathered_into_one_recorded_batch_once_it_has_closed(fleet: Fleet) -> None:
    ids = fleet.submit(2)
    fleet.clock.now_ms += 10_000
    ids += fleet.submit(1, prefix="later")
    assert fleet.batcher.run() == Counter()  # the window is still open
    assert fleet.batches.submits == 0

    report = fleet.gather()

    assert report["recorded"] == 1
    assert report["created"] == 1
    assert fleet.batches.submits == 1
    batch = fleet.batches.only
    assert len(batch.lines) == 3
    assert {line.request.model for line in batch.lines} == {MODEL}
    [record] = fleet.records.listed()
    assert record.phase is BatchPhase.PENDING
    assert record.batch_id == batch.batch_id
    assert record.lines == 3
    assert batch.metadata == {"aijobs_batch": record.key}
    assert fleet.files.parts() == []  # its parts are deleted once it is recorded
    deadlines = [fleet.job(job_id).deadline_at or 0 for job_id in ids]
    # Cancelled once its last job reaches its rescue time; its first job goes back at its own time.
    assert record.rescue_at == max(deadlines) - RESCUE_MS
    assert record.abandon_at == min(deadlines) - RESCUE_MS * 2 // 3


def test_fewer_jobs_than_the_provider_takes_in_a_batch_run_in_real_time() -> None:
    fleet = Fleet(FaultyBatchProvider(min_lines=5))
    ids = fleet.submit(2)

    report = fleet.gather()

    assert fleet.batches.submits == 0
    assert report["jobs_returned"] == 2
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.QUEUED] * 2
    assert all(isinstance(outcome, Ack) and outcome.fate is Fate.SUCCEEDED for outcome in fleet.redeliver())
    assert fleet.realtime.calls == 2


def test_parts_a_stopped_pass_recorded_but_did_not_delete_join_no_second_batch(fleet: Fleet) -> None:
    fleet.submit(2)
    objects = fleet.objects
    delete = objects.delete
    objects.delete = lambda keys: (_ for _ in ()).throw(OSError("the pass stopped here"))  # type: ignore[method-assign]
    fleet.gather()  # recorded, parts left, not created
    objects.delete = delete  # type: ignore[method-assign]

    fleet.batcher.run()

    assert fleet.batches.submits == 1
    assert fleet.files.parts() == []
    assert len(fleet.records.listed()) == 1


# --- answers --------------------------------------------------------------------------------------


def test_answers_finish_their_jobs_at_the_batch_price(fleet: Fleet) -> None:
    ids = fleet.submit(3)
    fleet.gather()

    report = fleet.end_batch()

    assert report["jobs_finished"] == 3
    assert report["ended"] == 1
    assert fleet.realtime.calls == 0
    for job_id in ids:
        job = fleet.job(job_id)
        assert job.status is JobStatus.SUCCEEDED
        assert job.output == {"label": "spam", "confidence": 0.93}
        [attempt] = fleet.store.attempts(job_id)
        assert attempt.via is Via.BATCH
        assert attempt.batch_id == fleet.batches.only.batch_id
        assert attempt.cost_usd == realtime_cost().usd / 2
        assert attempt.calls == 1
        assert job.attempt_count == 1
    [record] = fleet.records.listed(in_flight_only=False)
    assert record.phase is BatchPhase.ENDED
    assert record.finished == 3
    assert record.returned == 0
    assert fleet.records.listed() == []
    assert fleet.objects.objects == {}


def test_an_invalid_answer_is_re_asked_in_real_time() -> None:
    fleet = Fleet(FaultyBatchProvider(lambda line: '{"label": "not a label", "confidence": 2}'))
    [job_id] = fleet.submit(1)
    fleet.gather()

    fleet.end_batch()

    job = fleet.job(job_id)
    assert job.status is JobStatus.SUCCEEDED
    assert fleet.realtime.calls == 1
    [attempt] = fleet.store.attempts(job_id)
    assert attempt.calls == 2
    assert attempt.via is Via.BATCH
    assert attempt.cost_usd == realtime_cost().usd / 2 + realtime_cost().usd


def test_a_failed_line_goes_back_to_real_time_with_its_attempt_refunded() -> None:
    failing = ProviderUnavailableError("the line failed (HTTP 500)")
    fleet = Fleet(FaultyBatchProvider(lambda line: failing if line.custom_id.endswith("1") else valid_line(line)))
    ids = fleet.submit(2)
    fleet.gather()

    report = fleet.end_batch()

    assert report["jobs_finished"] == 1
    assert report["jobs_returned"] == 1
    returned = fleet.job(ids[1])
    assert returned.status is JobStatus.QUEUED
    assert returned.attempt_count == 0
    assert returned.error is not None
    assert "its batch did not answer it" in returned.error.message
    [resent] = fleet.queues[Lane.BACKGROUND].resent
    assert json.loads(resent.body)["job_id"] == ids[1]
    [outcome] = fleet.redeliver()
    assert outcome == Ack(Fate.SUCCEEDED)
    assert fleet.realtime.calls == 1
    [attempt] = fleet.store.attempts(ids[1])
    assert attempt.via is Via.REALTIME
    assert attempt.cost_usd == realtime_cost().usd


def test_an_expired_batch_s_answers_are_used_and_its_other_jobs_go_back_to_real_time(fleet: Fleet) -> None:
    ids = fleet.submit(4)
    fleet.gather()
    fleet.batches.answer(fleet.batches.only, 2)

    fleet.end_batch(BatchState.EXPIRED)
    fleet.redeliver()

    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 4
    vias = [attempt.via for job_id in ids for attempt in fleet.store.attempts(job_id)]
    assert vias == [Via.BATCH, Via.BATCH, Via.REALTIME, Via.REALTIME]


def test_a_batch_still_running_at_its_rescue_time_is_cancelled_and_its_jobs_end_before_their_deadlines(
    fleet: Fleet,
) -> None:
    ids = fleet.submit(3)
    fleet.gather()
    [record] = fleet.records.listed()
    batch = fleet.batches.only

    fleet.clock.now_ms = record.rescue_at
    fleet.batcher.run()
    assert fleet.batches.cancels == [batch.batch_id]
    assert fleet.records.listed()[0].phase is BatchPhase.CANCELLING
    fleet.end_batch(BatchState.CANCELLED)  # the provider stops it, nothing answered
    fleet.redeliver()

    for job_id in ids:
        job = fleet.job(job_id)
        assert job.status is JobStatus.SUCCEEDED
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at
    assert fleet.realtime.calls == 3  # one answer paid per job


def test_a_batch_whose_cancel_has_not_ended_it_hands_its_jobs_back_and_keeps_late_answers_as_usage(
    fleet: Fleet,
) -> None:
    ids = fleet.submit(2)
    fleet.gather()
    [record] = fleet.records.listed()
    fleet.clock.now_ms = record.rescue_at
    fleet.batcher.run()

    fleet.clock.now_ms = last_hand_back(fleet, ids)
    report = fleet.batcher.run()
    assert report["jobs_returned"] == 2
    fleet.redeliver()
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 2
    report = fleet.end_batch()  # it answers after all

    assert report["jobs_discarded"] == 2
    for job_id in ids:
        job = fleet.job(job_id)
        attempts = fleet.store.attempts(job_id)
        assert sorted(attempt.via for attempt in attempts) == [Via.BATCH, Via.REALTIME]
        assert job.output == {"label": "spam", "confidence": 0.93}  # the real-time answer stands
        assert job.usage.attempts == 2
        assert job.usage.cost_usd == sum(attempt.cost_usd for attempt in attempts)


def test_a_batched_job_cancelled_ends_at_once_and_its_answer_is_kept_as_usage(fleet: Fleet) -> None:
    [job_id] = fleet.submit(1)
    assert fleet.store.request_cancel(job_id, fleet.clock.now_ms).status is JobStatus.CANCELLED
    fleet.gather()

    report = fleet.end_batch()

    assert report["jobs_discarded"] == 1
    job = fleet.job(job_id)
    assert job.status is JobStatus.CANCELLED
    assert job.usage.attempts == 1
    assert fleet.queues[Lane.BACKGROUND].resent == []


def test_a_batch_refused_by_the_provider_hands_its_jobs_back(fleet: Fleet) -> None:
    fleet.batches.refuse_submit = ProviderRejectedError("the input file is malformed (HTTP 400)")
    ids = fleet.submit(2)

    fleet.gather()

    [record] = fleet.records.listed(in_flight_only=False)
    assert record.phase is BatchPhase.ENDED
    assert record.returned == 2
    assert "malformed" in record.detail
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.QUEUED] * 2
    fleet.redeliver()
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 2


def test_a_batch_created_by_a_pass_that_stopped_before_recording_its_id_is_adopted(fleet: Fleet) -> None:
    fleet.submit(2)
    submit = fleet.batches.submit

    def created_then_stopped(lines: Any, metadata: Any) -> str:
        submit(lines, metadata)
        raise OSError("the pass stopped before it recorded the batch's id")

    fleet.batches.submit = created_then_stopped  # type: ignore[method-assign]
    fleet.gather()
    fleet.batches.submit = submit  # type: ignore[method-assign]
    assert fleet.records.listed()[0].phase is BatchPhase.CREATING

    report = fleet.batcher.run()

    assert report["adopted"] == 1
    assert fleet.batches.submits == 1
    [record] = fleet.records.listed()
    assert record.phase is BatchPhase.PENDING
    assert record.batch_id == fleet.batches.only.batch_id


# --- budgets --------------------------------------------------------------------------------------


def test_a_capped_user_s_batched_jobs_hold_their_reservation_until_their_answers_cost_it() -> None:
    fleet = Fleet(cap="1.00")
    fleet.submit(2)
    [(_, day)] = fleet.budget_days.days
    cap, headroom, spent = fleet.budget_days.days[("user-1", day)]
    assert headroom < cap
    assert spent == 0

    fleet.gather()
    fleet.end_batch()

    cap, headroom, spent = fleet.budget_days.days[("user-1", day)]
    assert spent == 2 * realtime_cost().usd / 2
    assert headroom == cap - spent


# --- every job ends before its deadline, and pays for one batch answer at most -------------------

LINE_OUTCOME = st.sampled_from(LINE_OUTCOMES)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outcomes=st.lists(LINE_OUTCOME, min_size=1, max_size=6),
    end=st.sampled_from([BatchState.COMPLETED, BatchState.EXPIRED, BatchState.CANCELLED, BatchState.FAILED, None]),
)
def test_whatever_a_batch_answers_every_job_ends_before_its_deadline(
    outcomes: list[str], end: BatchState | None
) -> None:
    fleet = Fleet(FaultyBatchProvider(answering(outcomes)))
    ids = fleet.submit(len(outcomes))
    fleet.gather()
    batch = fleet.batches.only
    [record] = fleet.records.listed()
    if end is None:  # it stalls: the batcher's rescue and abandon times come
        for at in (record.rescue_at, last_hand_back(fleet, ids)):
            fleet.clock.now_ms = at
            fleet.batcher.run()
    else:
        fleet.batches.answer(batch)
        batch.state = end
        fleet.clock.now_ms += POLL_MS
        fleet.batcher.run()
    fleet.redeliver()

    for job_id in ids:
        job = fleet.job(job_id)
        assert job.status.is_terminal, job
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at
        batch_answers = [attempt for attempt in fleet.store.attempts(job_id) if attempt.via is Via.BATCH]
        assert len(batch_answers) <= 1
    assert fleet.files.parts() == []  # every part was gathered


def test_a_handed_back_job_s_message_is_marked_for_real_time_and_delayed(fleet: Fleet) -> None:
    fleet.batches.refuse_submit = ProviderRejectedError("refused")
    fleet.submit(1)
    fleet.gather()
    [resent] = fleet.queues[Lane.BACKGROUND].resent
    assert resent.delay_seconds > 0
    assert resent.group_id == "user-1"
