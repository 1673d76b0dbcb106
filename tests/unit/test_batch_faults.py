"""The batch path as an outage meets it: every job ends before its deadline and each paid answer is
recorded once, whatever the provider, SQS or DynamoDB fail to do, on every pass or on some.

Each test names the fault, replays it against the batcher on the in-memory stores, and checks what
the promise is made of: the jobs' states and their finish times against their deadlines, the
attempts recorded (one batch answer at most per claim, each paid answer once), no job ever queued
without a message on its way, and the users' budgets to the cent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.batching.batcher import GIVE_UP_MS
from engine.batching.files import PARTS_PREFIX, UNREADABLE_PREFIX
from engine.core import JobStatus, Lane, Released, Via
from engine.core.batches import BatchPhase, BatchRecord, BatchState
from engine.core.days import utc_day
from engine.core.errors import ProviderRejectedError, ProviderUnavailableError
from engine.gateway.batches import BatchAnswer
from tests.support.batch_fleet import (
    LINE_OUTCOMES,
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

OUTAGE = ProviderUnavailableError("HTTP 503 from the provider")
GONE = ProviderRejectedError("HTTP 404 on GET /batches/batch_1")
BATCH_PRICE = realtime_cost().usd / 2


class DynamoDBError(Exception):
    """A DynamoDB request that failed (throttled past the SDK's retries, a 500)."""


class PassKilled(BaseException):
    """The batcher's invocation ends here (a timeout, the function's process gone): nothing after runs."""


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def the_record(fleet: Fleet) -> BatchRecord:
    [record] = fleet.records.listed(in_flight_only=False)
    return record


def hand_back_at(fleet: Fleet, job_id: str) -> int:
    deadline = fleet.job(job_id).deadline_at
    assert deadline is not None
    return deadline - RESCUE_MS * 2 // 3


def passes(fleet: Fleet, until_ms: int) -> None:
    """Run the batcher a poll apart until `until_ms` (three passes, a leap over the quiet hours, three
    more passes before it), delivering what it sends again to real time; after each pass no job may be
    queued with no message on its way."""
    for step in range(7):
        if fleet.clock.now_ms >= until_ms:
            return
        if step == 3:
            fleet.clock.now_ms = max(fleet.clock.now_ms, until_ms - 3 * POLL_MS)
        else:
            fleet.clock.now_ms = min(fleet.clock.now_ms + POLL_MS, until_ms)
            fleet.batcher.run()
            assert fleet.open_without_a_message() == []
            fleet.redeliver()


def assert_each_ended_in_time(fleet: Fleet, ids: list[str]) -> None:
    for job_id in ids:
        job = fleet.job(job_id)
        assert job.status is JobStatus.SUCCEEDED, job
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at


def batch_attempts(fleet: Fleet, job_id: str) -> list[Any]:
    return [attempt for attempt in fleet.store.attempts(job_id) if attempt.via is Via.BATCH]


# --- 1. the rescue does not depend on the provider answering ------------------------------------


@pytest.mark.parametrize("error", [OUTAGE, GONE], ids=["outage", "gone"])
def test_jobs_go_back_in_time_when_the_status_call_fails_on_every_pass(fleet: Fleet, error: Exception) -> None:
    ids = fleet.submit(3)
    fleet.gather()
    fleet.faulty.faults.fail("status", error)
    fleet.faulty.faults.fail("cancel", error)

    passes(fleet, hand_back_at(fleet, ids[-1]) + POLL_MS)

    assert_each_ended_in_time(fleet, ids)
    assert fleet.realtime.calls == 3
    assert the_record(fleet).handed_back


def test_a_200_that_is_not_a_batch_is_no_status_and_the_jobs_still_go_back(fleet: Fleet) -> None:
    ids = fleet.submit(2)
    fleet.gather()
    fleet.faulty.faults.fail("status", ProviderUnavailableError("provider answered without an id"))

    passes(fleet, hand_back_at(fleet, ids[-1]) + POLL_MS)

    assert_each_ended_in_time(fleet, ids)


def test_a_refused_cancel_is_asked_again_and_what_the_batch_answers_later_is_kept_as_usage(fleet: Fleet) -> None:
    ids = fleet.submit(2)
    fleet.gather()
    fleet.faulty.faults.fail("cancel", ProviderRejectedError("HTTP 400 on POST /batches/batch_1/cancel"))
    record = the_record(fleet)

    passes(fleet, hand_back_at(fleet, ids[-1]) + POLL_MS)
    assert_each_ended_in_time(fleet, ids)
    assert fleet.faulty.faults.failed["cancel"] >= 2  # asked again on later passes
    fleet.faulty.faults.heal("cancel")
    fleet.clock.now_ms += POLL_MS
    fleet.batcher.run()
    assert fleet.batches.cancels == [record.batch_id]

    fleet.end_batch()  # it had answered both after all

    for job_id in ids:
        job = fleet.job(job_id)
        [late] = batch_attempts(fleet, job_id)
        assert late.cost_usd == BATCH_PRICE
        assert job.usage.cost_usd == sum(attempt.cost_usd for attempt in fleet.store.attempts(job_id))
        assert job.output == {"label": "spam", "confidence": 0.93}
    assert the_record(fleet).phase is BatchPhase.ENDED
    assert the_record(fleet).discarded == 2


@pytest.mark.parametrize("error", [OUTAGE, GONE], ids=["outage", "file gone"])
def test_results_that_cannot_be_read_are_read_again_and_the_jobs_go_back_meanwhile(
    fleet: Fleet, error: Exception
) -> None:
    ids = fleet.submit(2)
    fleet.gather()
    fleet.faulty.faults.fail("answers", error)
    fleet.end_batch()  # completed, both lines answered: its results cannot be read
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.RUNNING] * 2

    passes(fleet, hand_back_at(fleet, ids[-1]) + POLL_MS)
    assert_each_ended_in_time(fleet, ids)
    fleet.faulty.faults.heal("answers")
    fleet.clock.now_ms += POLL_MS
    fleet.batcher.run()

    assert the_record(fleet).phase is BatchPhase.ENDED
    for job_id in ids:
        [late] = batch_attempts(fleet, job_id)  # read once the results could be, recorded once
        assert late.cost_usd == BATCH_PRICE


def test_a_batch_the_provider_never_ends_is_given_up_long_after_its_jobs_went_back(fleet: Fleet) -> None:
    ids = fleet.submit(1)
    fleet.gather()
    fleet.faulty.faults.fail("status", OUTAGE)
    passes(fleet, hand_back_at(fleet, ids[0]) + POLL_MS)
    assert_each_ended_in_time(fleet, ids)

    fleet.clock.now_ms = the_record(fleet).created_at + GIVE_UP_MS
    fleet.batcher.run()

    record = the_record(fleet)
    assert record.phase is BatchPhase.ENDED
    assert record.unanswerable


# --- 1. a transient error is tried again, never skipped ------------------------------------------


def test_a_refused_resend_keeps_the_job_held_and_the_next_pass_hands_it_back() -> None:
    fleet = Fleet(FaultyBatchProvider(lambda line: ProviderUnavailableError("the line failed")))
    ids = fleet.submit(2)
    fleet.gather()
    fleet.queues[Lane.BACKGROUND].refuse = 1  # SQS answers one entry `Failed`

    fleet.end_batch()

    assert fleet.open_without_a_message() == []
    assert sorted(fleet.job(job_id).status for job_id in ids) == [JobStatus.QUEUED, JobStatus.RUNNING]
    assert the_record(fleet).phase is BatchPhase.CONCLUDING  # not ended with a job left behind
    passes(fleet, fleet.clock.now_ms + 2 * POLL_MS)
    assert_each_ended_in_time(fleet, ids)
    assert the_record(fleet).phase is BatchPhase.ENDED


def test_a_dynamodb_error_on_a_release_is_tried_again_on_the_next_pass() -> None:
    fleet = Fleet(FaultyBatchProvider(lambda line: ProviderUnavailableError("the line failed")))
    ids = fleet.submit(3)
    fleet.gather()
    fleet.store.faults.fail("finish_job", DynamoDBError("ProvisionedThroughputExceededException"), times=1)

    fleet.end_batch()
    assert the_record(fleet).redo  # the job whose release failed is named, to go over again
    passes(fleet, fleet.clock.now_ms + 2 * POLL_MS)

    assert_each_ended_in_time(fleet, ids)
    assert the_record(fleet).returned == 3


def test_too_few_jobs_for_a_batch_go_back_even_when_their_resend_is_refused() -> None:
    fleet = Fleet(FaultyBatchProvider(min_lines=100))  # Bedrock's least
    ids = fleet.submit(2)
    fleet.queues[Lane.BACKGROUND].refuse = 2

    fleet.gather()

    assert fleet.batches.submits == 0
    assert [fleet.job(job_id).status for job_id in ids] == [JobStatus.RUNNING] * 2  # not queued without a message
    passes(fleet, fleet.clock.now_ms + POLL_MS)
    assert_each_ended_in_time(fleet, ids)
    assert fleet.files.parts() == []


def test_a_job_its_answer_queues_again_has_its_message_before_its_release() -> None:
    # The batch's answer is invalid and the re-ask meets an outage: the job is queued again.
    fleet = Fleet(FaultyBatchProvider(lambda line: "not json"))
    fleet.realtime.script = lambda request: OUTAGE
    [job_id] = fleet.submit(1)
    fleet.gather()
    finish = fleet.store.finish_job
    seen: list[bool] = []

    def finish_job(job: Any, outcome: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(outcome, Released):
            seen.append(any(json.loads(m.body)["job_id"] == job_id for m in fleet.queues[Lane.BACKGROUND].resent))
        finish(job, outcome, *args, **kwargs)

    fleet.store.finish_job = finish_job  # type: ignore[method-assign]
    fleet.end_batch()

    assert seen == [True]
    assert fleet.job(job_id).status is JobStatus.QUEUED


def test_a_job_its_answer_queued_again_whose_message_was_refused_gets_one_on_the_next_pass() -> None:
    fleet = Fleet(FaultyBatchProvider(lambda line: "not json"))
    fleet.realtime.script = lambda request: OUTAGE
    [job_id] = fleet.submit(1)
    fleet.gather()
    fleet.queues[Lane.BACKGROUND].refuse = 1

    fleet.end_batch()
    assert fleet.job(job_id).status is JobStatus.QUEUED  # its paid re-ask is recorded
    assert fleet.queues[Lane.BACKGROUND].resent == []
    fleet.clock.now_ms += POLL_MS
    fleet.batcher.run()

    [message] = fleet.queues[Lane.BACKGROUND].resent
    assert json.loads(message.body)["job_id"] == job_id
    assert the_record(fleet).phase is BatchPhase.ENDED


# --- 2. a paid batch is never thrown away, and never paid twice -----------------------------------


def test_a_completion_wins_over_an_error_line_for_the_same_request(fleet: Fleet) -> None:
    [job_id] = fleet.submit(1)
    fleet.gather()
    batch = fleet.batches.only
    fleet.batches.answer(batch)
    batch.extra.append(BatchAnswer(batch.lines[0].custom_id, error=ProviderUnavailableError("line error")))

    fleet.end_batch()

    assert fleet.job(job_id).status is JobStatus.SUCCEEDED
    assert fleet.realtime.calls == 0
    assert fleet.queues[Lane.BACKGROUND].resent == []


def test_a_request_answered_twice_is_paid_twice_and_recorded_as_such(fleet: Fleet) -> None:
    [job_id] = fleet.submit(1)
    fleet.gather()
    batch = fleet.batches.only
    fleet.batches.answer(batch)
    first = batch.answered[batch.lines[0].custom_id].completion
    assert first is not None
    batch.extra.append(BatchAnswer(batch.lines[0].custom_id, completion=first))

    fleet.end_batch()

    [attempt] = fleet.store.attempts(job_id)
    assert attempt.calls == 2
    assert attempt.cost_usd == 2 * BATCH_PRICE
    assert fleet.job(job_id).usage.cost_usd == 2 * BATCH_PRICE


def test_a_batch_a_stopped_pass_created_is_found_later_adopted_and_its_answers_kept(fleet: Fleet) -> None:
    ids = fleet.submit(2)
    submit = fleet.batches.submit

    def created_then_stopped(lines: Any, metadata: Any) -> str:
        submit(lines, metadata)
        raise PassKilled

    fleet.batches.submit = created_then_stopped  # type: ignore[method-assign]
    with pytest.raises(PassKilled):
        fleet.gather()
    fleet.batches.submit = submit  # type: ignore[method-assign]
    fleet.faulty.faults.fail("find", OUTAGE)  # the provider cannot be searched for a long while

    passes(fleet, hand_back_at(fleet, ids[-1]) + POLL_MS)
    assert_each_ended_in_time(fleet, ids)
    assert fleet.batches.submits == 1  # never created again while it could not be looked for
    fleet.faulty.faults.heal("find")
    fleet.clock.now_ms += POLL_MS
    fleet.batcher.run()  # found: adopted (and cancelled, its jobs' rescue time long past)
    record = the_record(fleet)
    assert record.batch_id == fleet.batches.only.batch_id
    fleet.end_batch()

    for job_id in ids:
        [late] = batch_attempts(fleet, job_id)
        assert late.cost_usd == BATCH_PRICE
    assert the_record(fleet).phase is BatchPhase.ENDED


def test_one_job_near_its_deadline_does_not_cancel_a_batch_of_jobs_with_a_day_to_spare(fleet: Fleet) -> None:
    near = fleet.submit(1, deadline_seconds=TIMING.eligible_ms // 1000 + 120, prefix="near")
    far = fleet.submit(3, prefix="far")
    fleet.gather()
    assert len(fleet.batches.batches) == 1

    passes(fleet, hand_back_at(fleet, near[0]) + POLL_MS)
    assert fleet.batches.cancels == []
    assert_each_ended_in_time(fleet, near)  # it went back alone, in time
    fleet.end_batch()

    assert_each_ended_in_time(fleet, far)
    for job_id in far:
        assert [attempt.via for attempt in fleet.store.attempts(job_id)] == [Via.BATCH]


def test_an_unreadable_part_is_set_aside_and_counted_and_the_others_are_gathered(fleet: Fleet) -> None:
    ids = fleet.submit(2)
    [first, _] = sorted(key for key in fleet.objects.objects if key.startswith(PARTS_PREFIX))
    fleet.objects.objects[first] = b'{"entries": [{"job_id": "truncated'

    report = fleet.gather()

    assert report["parts_unreadable"] == 1
    assert [key for key in fleet.objects.objects if key.startswith(UNREADABLE_PREFIX)] == [
        UNREADABLE_PREFIX + first.removeprefix(PARTS_PREFIX)
    ]
    assert len(fleet.batches.only.lines) == 1
    fleet.end_batch()
    assert fleet.job(ids[1]).status is JobStatus.SUCCEEDED


# --- budgets settle per job, exactly ---------------------------------------------------------------


def budget_day(fleet: Fleet, user: str = "user-1") -> tuple[Decimal, Decimal, Decimal]:
    cap, headroom, spent = fleet.budget_days.days[(user, utc_day(T0_MS))]  # the day of the reservations
    return cap, headroom, spent


def spent_by(fleet: Fleet, ids: list[str]) -> Decimal:
    """What the batch's answers cost (and their re-asks): the budget's part of the batch path. (The
    real-time runs of jobs handed back go through the worker's admission, not driven here.)"""
    return sum((attempt.cost_usd for job_id in ids for attempt in batch_attempts(fleet, job_id)), Decimal(0))


def test_a_pass_that_stops_in_the_middle_of_a_chunk_leaves_the_budget_exact() -> None:
    fleet = Fleet(
        FaultyBatchProvider(lambda line: valid_line(line) if line.custom_id < "j0000000003" else None), cap="5"
    )
    ids = fleet.submit(6)
    fleet.gather()
    finish = fleet.store.finish_job
    finishes = 0

    def dies_after_two(*args: Any, **kwargs: Any) -> None:
        nonlocal finishes
        finishes += 1
        if finishes == 3:
            raise PassKilled
        finish(*args, **kwargs)

    fleet.store.finish_job = dies_after_two  # type: ignore[method-assign]
    with pytest.raises(PassKilled):
        fleet.end_batch()  # three answered, three not: the pass dies on its third write
    fleet.store.finish_job = finish  # type: ignore[method-assign]
    passes(fleet, fleet.clock.now_ms + 2 * POLL_MS)

    assert_each_ended_in_time(fleet, ids)
    cap, headroom, spent = budget_day(fleet)
    assert spent == spent_by(fleet, ids)
    assert headroom == cap - spent  # every reservation given back exactly once
    assert the_record(fleet).phase is BatchPhase.ENDED


def test_a_cancelled_batched_job_gives_its_reservation_back_once_and_its_late_answer_is_spent() -> None:
    fleet = Fleet(cap="5")
    [job_id] = fleet.submit(1)
    fleet.store.request_cancel(job_id, fleet.clock.now_ms)
    fleet.gather()

    fleet.end_batch()
    fleet.clock.now_ms += POLL_MS
    fleet.batcher.run()

    cap, headroom, spent = budget_day(fleet)
    assert spent == BATCH_PRICE
    assert headroom == cap - spent


# --- the property: whatever fails, whenever ---------------------------------------------------------

FAULTS: dict[str, Callable[[Fleet], None]] = {
    "status": lambda fleet: fleet.faulty.faults.fail("status", OUTAGE, times=3),
    "status_gone": lambda fleet: fleet.faulty.faults.fail("status", GONE),
    "cancel": lambda fleet: fleet.faulty.faults.fail("cancel", ProviderRejectedError("refused")),
    "answers": lambda fleet: fleet.faulty.faults.fail("answers", OUTAGE, times=4),
    "resend": lambda fleet: setattr(fleet.queues[Lane.BACKGROUND], "refuse", 3),
    "release": lambda fleet: fleet.store.faults.fail("finish_job", DynamoDBError("500"), times=2),
    "reads": lambda fleet: fleet.store.faults.fail("get_jobs", DynamoDBError("throttled"), times=2),
    "orphan": lambda fleet: fleet.store.faults.fail("record_orphan_attempt", DynamoDBError("500"), times=1),
}
LINE = st.sampled_from(LINE_OUTCOMES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(
    lines=["valid"],
    faults=["answers", "reads", "release", "resend"],
    end=BatchState.EXPIRED,
    stall_passes=0,
    capped=False,
)
@given(
    lines=st.lists(LINE, min_size=1, max_size=5),
    faults=st.lists(st.sampled_from(sorted(FAULTS)), max_size=4, unique=True),
    end=st.sampled_from([BatchState.COMPLETED, BatchState.EXPIRED, BatchState.CANCELLED, None]),
    stall_passes=st.integers(0, 40),
    capped=st.booleans(),
)
def test_whatever_fails_every_job_ends_in_time_each_answer_is_recorded_once_and_budgets_are_exact(
    lines: list[str], faults: list[str], end: BatchState | None, stall_passes: int, capped: bool
) -> None:
    fleet = Fleet(FaultyBatchProvider(answering(lines)), cap="5" if capped else None)
    ids = fleet.submit(len(lines))
    fleet.gather()
    for fault in faults:
        FAULTS[fault](fleet)
    passes(fleet, fleet.clock.now_ms + stall_passes * POLL_MS)
    if end is not None:
        fleet.batches.end(fleet.batches.only, end)
    passes(fleet, hand_back_at(fleet, ids[-1]) + 3 * POLL_MS)
    for name in ("status", "cancel", "answers"):
        fleet.faulty.faults.heal(name)  # the provider comes back: what it answered is read
    # A pass a poll apart, as the schedule runs them: the faults (a few passes each, one after the
    # other) are spent well within the third of the rescue time a job has after its hand-back time.
    for _ in range(20):
        if all(fleet.job(job_id).status.is_terminal for job_id in ids) and not fleet.records.listed():
            break
        fleet.clock.now_ms += POLL_MS
        fleet.batcher.run()
        assert fleet.open_without_a_message() == []
        fleet.redeliver()

    answered = {
        line.custom_id: answer
        for line in fleet.batches.only.lines
        if (answer := fleet.batches.only.answered.get(line.custom_id)) is not None and answer.completion is not None
    }
    for job_id in ids:
        job = fleet.job(job_id)
        assert job.status.is_terminal, job
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at
        assert len(batch_attempts(fleet, job_id)) <= 1  # each paid answer recorded once
        assert job.usage.cost_usd == sum(attempt.cost_usd for attempt in fleet.store.attempts(job_id))
    if end is not None and not set(faults) & {"answers", "status_gone"}:
        assert sum(len(batch_attempts(fleet, job_id)) for job_id in ids) == len(answered)
    if capped:
        cap, headroom, spent = budget_day(fleet)
        assert spent == spent_by(fleet, ids)
        assert headroom == cap - spent
    assert fleet.files.parts() == []
