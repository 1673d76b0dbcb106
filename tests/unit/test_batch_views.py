"""How batched jobs and batches read (docs/batches.md): the job view's `via` and `batch`, `aijobs inspect`,
and `aijobs batches` as a table and as JSON, over the engine's own batching on the in-memory stores."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aijobs.render import batches_table, inspection_group, span
from engine.core import AttemptOutcome, AttemptRecord, JobHistory, JobStatus, Via
from engine.core.batches import BatchPhase, BatchRecord, BatchState
from engine.views import BatchView, JobInspection, JobView
from tests.support.batch_fleet import MODEL, RESCUE_MS, T0_MS, TIMING, Fleet
from tests.support.contract import BATCH_FIELDS
from tests.unit.test_render import QUEUED, text_of

WINDOW = TIMING.window_of(T0_MS)  # "1800000000000": T0 is the start of a window
WINDOW_AT = "2027-01-15T08:00:00Z"
DAY_MS = 86_400_000


def inspect(fleet: Fleet, job_id: str) -> JobInspection:
    return JobInspection.of(fleet.job(job_id), fleet.store.job_history(job_id), fleet.clock.now_ms)


def rows(text: str) -> list[str]:
    """The rows of an `aijobs batches` table, each its two lines (the key over the provider's id) as one."""
    lines = text.splitlines()
    return [f"{line} {lines[number + 1]}" for number, line in enumerate(lines) if MODEL in line]


def batches(fleet: Fleet, in_flight_only: bool = True) -> list[BatchView]:
    """What AiJobsClient.batches returns for the fleet's batch records."""
    return [BatchView.from_record(record) for record in fleet.records.listed(in_flight_only)]


# --- the job view --------------------------------------------------------------------------------


def test_a_job_waiting_in_a_batch_is_running_via_batch_with_its_window() -> None:
    # Given a background job claimed into a batch window
    fleet = Fleet()
    [job_id] = fleet.submit(1)

    # When it is viewed as `aijobs status` does (the job alone), and as `aijobs inspect` does
    view = JobView.from_job(fleet.job(job_id))
    inspection = inspect(fleet, job_id)

    # Then both say it runs via batch, in the window it joined
    dumped = json.loads(view.model_dump_json())
    assert (dumped["status"], dumped["via"], dumped["batch"]) == ("running", "batch", WINDOW)
    assert inspection.job == view
    assert (view.in_batch, view.batch_window_at) == (True, WINDOW_AT)
    # And `aijobs inspect` says what it waits for, and where to look
    text = text_of(inspection_group(inspection))
    assert f"batch: waiting for its batch (window of {WINDOW_AT})" in text
    assert f"in a provider's batch (window of {WINDOW_AT}), held for it until" in text
    assert "`aijobs batches` lists the batches in flight" in text


def test_once_answered_by_its_batch_the_job_says_so_where_its_attempts_are_read() -> None:
    # Given a batched job its batch answered
    fleet = Fleet()
    [job_id] = fleet.submit(1)
    fleet.gather()
    batch_id = fleet.batches.only.batch_id
    fleet.end_batch()

    # When it is inspected
    inspection = inspect(fleet, job_id)

    # Then its view and its attempt name the provider's batch
    assert inspection.job.status is JobStatus.SUCCEEDED
    assert (inspection.job.via, inspection.job.batch, inspection.job.in_batch) == (Via.BATCH, batch_id, False)
    [attempt] = inspection.attempts
    assert (attempt.via, attempt.batch_id) == (Via.BATCH, batch_id)
    text = text_of(inspection_group(inspection))
    assert f"via       batch {batch_id}" in text
    [row] = [line for line in text.splitlines() if MODEL in line]
    assert "│ batch │" in row
    assert f"#1 ran in batch {batch_id}" in text
    # And the job alone (`aijobs status`, `list`, completion events) reads no attempt: not known
    view = JobView.from_job(fleet.job(job_id))
    assert (view.via, view.batch) == (None, None)


def test_a_job_running_now_runs_in_real_time_and_a_stopped_one_as_its_latest_attempt_ran() -> None:
    running = replace(QUEUED, status=JobStatus.RUNNING, lease_owner="w-1", lease_expires_at=T0_MS + 60_000)
    realtime = AttemptRecord("job-1", 1, "user-1", "classify", T0_MS, T0_MS + 900, AttemptOutcome.RETRYABLE)
    batched = replace(realtime, attempt=2, via=Via.BATCH, batch_id="batch_7")
    queued_after = JobHistory(attempts=[realtime, batched], dead_letters=[])

    assert (JobView.from_job(running).via, JobView.from_job(running).batch) == (Via.REALTIME, None)
    assert (JobView.from_job(QUEUED).via, JobView.from_job(QUEUED).batch) == (None, None)
    inspected = JobInspection.of(QUEUED, queued_after, T0_MS).job
    assert (inspected.via, inspected.batch, inspected.in_batch) == (Via.BATCH, "batch_7", False)
    only_realtime = JobInspection.of(QUEUED, JobHistory(attempts=[realtime], dead_letters=[]), T0_MS).job
    assert (only_realtime.via, only_realtime.batch) == (Via.REALTIME, None)
    assert "via       realtime" in text_of(inspection_group(JobInspection.of(running, queued_after, T0_MS)))
    # A window key of another form than the engine's (epoch milliseconds) is shown as it is
    elsewhere = JobView.from_job(replace(running, batch="window-7"))
    assert (elsewhere.in_batch, elsewhere.batch_window_at) == (True, "window-7")


# --- aijobs batches ------------------------------------------------------------------------------


def test_a_batch_in_flight_lists_its_key_model_lines_phase_age_rescue_time_and_provider_id() -> None:
    # Given three background jobs gathered into one batch, created at the provider
    fleet = Fleet()
    fleet.submit(3)
    fleet.gather()
    created_at = fleet.clock.now_ms
    batch_id = fleet.batches.only.batch_id

    # When the batches are listed
    [batch] = batches(fleet)

    # Then the batch shows as it stands, as JSON
    dumped = json.loads(batch.model_dump_json())
    assert list(dumped) == BATCH_FIELDS
    assert dumped["key"].startswith(f"{WINDOW}.")
    assert dumped | {"key": None} == {
        "key": None,
        "model": MODEL,
        "provider": "scripted",
        "phase": "pending",
        "state": "pending",
        "detail": "",
        "lines": 3,
        "batch_id": batch_id,
        "created_at": "2027-01-15T08:05:30Z",
        "updated_at": "2027-01-15T08:05:30Z",
        # The earliest deadline (the first job's: a day after T0) less the rescue time
        "rescue_at": "2027-01-16T07:30:00Z",
        "abandon_at": "2027-01-16T07:40:00Z",
        "ended_at": None,
        "answered": 0,
        "failed": 0,
        "handed_back": False,
        "finished": 0,
        "returned": 0,
    }
    # And as a table, ten minutes later
    ten_minutes_on = created_at + 600_000
    assert batch.age_ms(ten_minutes_on) == 600_000
    assert batch.rescue_in_ms(ten_minutes_on) == T0_MS + DAY_MS - RESCUE_MS - ten_minutes_on
    [row] = rows(text_of(batches_table([batch], ten_minutes_on, "batches in flight")))
    for cell in ("3", "pending", "10m", "in 23h 14m", batch_id, "0 / 0"):
        assert cell in row


def test_an_ended_batch_is_listed_only_with_all_and_shows_what_became_of_its_jobs() -> None:
    # Given a batch that answered two of its three jobs and failed the third's line
    fleet = Fleet()
    fleet.submit(3)
    fleet.gather()
    fleet.batches.answer(fleet.batches.only, 2)
    fleet.end_batch(BatchState.EXPIRED)

    # When the batches are listed: in flight, then with the ended ones
    in_flight, every = batches(fleet), batches(fleet, in_flight_only=False)

    # Then it is no longer in flight, and ended with two jobs finished and one handed back
    assert in_flight == []
    [ended] = every
    assert (ended.phase, ended.state, ended.in_flight) == (BatchPhase.ENDED, BatchState.EXPIRED, False)
    assert (ended.answered, ended.finished, ended.returned) == (2, 2, 1)
    assert ended.ended_at is not None
    assert ended.rescue_in_ms(fleet.clock.now_ms) is None
    text = text_of(batches_table(every, fleet.clock.now_ms, "batches in flight and ended"))
    [row] = rows(text)
    for cell in ("ended", "expired", "2 / 0", "2 / 1"):
        assert cell in row
    assert "none" in text_of(batches_table(in_flight, fleet.clock.now_ms, "batches in flight"))


def test_a_batch_not_created_yet_or_past_its_rescue_time_says_so_and_the_providers_words_are_text() -> None:
    recorded = BatchRecord(
        key=f"{WINDOW}.0a1b2c3d.1800000000000-000000000000",
        model=MODEL,
        provider="openai",
        lines=2,
        phase=BatchPhase.CREATING,
        created_at=T0_MS,
        updated_at=T0_MS,
        rescue_at=T0_MS + 60_000,
        abandon_at=T0_MS + 600_000,
    )
    cancelling = replace(
        recorded,
        key=f"{WINDOW}.0a1b2c3d.1800000000001-000000000000",
        phase=BatchPhase.CANCELLING,
        batch_id="batch_[bold]x[/]",
        state=BatchState.PENDING,
        detail="[red]in_progress[/]",
    )
    now = T0_MS + 120_000

    text = text_of(batches_table([BatchView.from_record(recorded), BatchView.from_record(cancelling)], now, "batches"))

    first, second = rows(text)
    assert "creating" in first
    assert "not created yet" in first
    assert "passed" in first
    assert "cancelling" in second
    assert "pending: [red]in_progress[/]" in second
    assert "batch_[bold]x[/]" in text
    # The provider's word is shown only where it says more than the state
    assert BatchView.from_record(replace(cancelling, detail="pending")).provider_status == "pending"
    assert BatchView.from_record(recorded).provider_status == "-"


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0, "0s"),
        (250, "250ms"),
        (59_999, "59s"),
        (60_000, "1m"),
        (3_599_000, "59m"),
        (3_600_000, "1h 0m"),
        (90_061_000, "1d 1h"),
    ],
)
def test_a_stretch_of_time_is_written_to_the_unit_that_matters(ms: int, shown: str) -> None:
    assert span(ms) == shown
