"""The events function's tally of data job types (engine.job_type_tally, docs/jobtypes.md) over stream records
as DynamoDB gives them (NEW_AND_OLD_IMAGES of job items): the stats summed per version, and guarded
canaries ended once when they fail validation more often than production by more than they may.
"""

from __future__ import annotations

import itertools
import json
import logging
from decimal import Decimal
from typing import Any

import pytest

from engine.core import ErrorCode, JobErrorInfo, NewJob
from engine.core.job_types import Guard, JobTypeHead, LabelAction, VersionStats
from engine.events import EventPublisher
from engine.intake import request_hash
from engine.job_type_tally import ROLLED_BACK, ROLLED_BACK_METRIC, JobTypeTally
from engine.observability import job_metrics, metrics
from engine.store.items import OPEN_SHARD, attempt_sk, error_attribute, job_key, to_item
from engine.store.table import creation_attributes
from engine.testing import InMemoryJobTypes
from tests.support.clock import Clock

NAME = "triage_ticket"
SCHEMA, BUSINESS, REFERENCE = (
    ErrorCode.SCHEMA_VALIDATION_FAILED,
    ErrorCode.BUSINESS_VALIDATION_FAILED,
    ErrorCode.REFERENCE_VALIDATION_FAILED,
)
DURATION_MS = 1_500  # creation to end: the histogram's bucket of up to 2 s, index 3
COST = Decimal("0.000027")
_ids = itertools.count(1)


# --- stream records ------------------------------------------------------------------------------


def job_image(
    job_id: str,
    status: str,
    created_at: int,
    *,
    name: str = NAME,
    version: int | None = 1,
    code: ErrorCode | None = None,
    cost: Decimal = COST,
    reasks: int | None = None,
) -> dict[str, Any]:
    """A job item as the store writes it: created by its claim, then (terminal) finished by its attempt."""
    new_job = NewJob(
        job_type=name,
        user_id="user-1",
        schema_version=1,
        max_attempts=3,
        deadline_seconds=86_400,
        request_hash=request_hash(name, "user-1", {"text": job_id}),
        job_type_version=version,
    )
    attributes = creation_attributes(job_id, new_job, created_at) | {
        "status": status,
        "attempt_count": 1,
        "claim_count": 1,
    }
    if status in ("succeeded", "failed", "cancelled"):
        attributes.pop(OPEN_SHARD)
        attributes |= {
            "updated_at": created_at + DURATION_MS,
            "finished_at": created_at + DURATION_MS,
            "input_tokens": 100,
            "output_tokens": 20,
            "cost_usd": cost,
            "usage_attempts": 1,
        }
    else:
        attributes |= {"updated_at": created_at, "lease_owner": "w-1", "lease_expires_at": created_at + 300_000}
    if code is not None:
        attributes["error"] = error_attribute(JobErrorInfo(code, f"the answer failed: {code.value}", retryable=False))
    if reasks is not None:
        attributes["reasks"] = reasks
    return to_item(attributes) | job_key(job_id)


def stream_record(new: dict[str, Any] | None, old: dict[str, Any] | None, event_name: str = "MODIFY") -> dict[str, Any]:
    change: dict[str, Any] = {"SequenceNumber": str(next(_ids)), "StreamViewType": "NEW_AND_OLD_IMAGES"}
    if new is not None:
        change["NewImage"] = new
    if old is not None:
        change["OldImage"] = old
    return {"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": change}


def finished(
    created_at: int,
    *,
    code: ErrorCode | None = None,
    status: str | None = None,
    version: int | None = 1,
    name: str = NAME,
    cost: Decimal = COST,
    reasks: int | None = None,
) -> dict[str, Any]:
    """The record of a job's finishing write: running to succeeded (or, with a code, failed)."""
    job_id = f"j-{next(_ids)}"
    ended = status or ("failed" if code is not None else "succeeded")
    new = job_image(job_id, ended, created_at, name=name, version=version, code=code, cost=cost, reasks=reasks)
    old = job_image(job_id, "running", created_at, name=name, version=version)
    return stream_record(new, old)


def jobs(count: int, created_at: int, version: int, invalid: int = 0) -> list[dict[str, Any]]:
    """`count` finished jobs of `version`, the first `invalid` of them failed schema validation."""
    return [finished(created_at, version=version, code=SCHEMA if n < invalid else None) for n in range(count)]


# --- the parts --------------------------------------------------------------------------------------


class Bus:
    """A PutEvents client that accepts every entry (or, `failing`, fails every request) and keeps them."""

    def __init__(self, failing: bool = False) -> None:
        self.entries: list[dict[str, Any]] = []
        self.failing = failing

    def put_events(self, **params: Any) -> Any:
        if self.failing:
            raise ConnectionError("the network went away")
        self.entries += params["Entries"]
        return {"FailedEntryCount": 0, "Entries": [{"EventId": "e"} for _ in params["Entries"]]}


class CountingTypes(InMemoryJobTypes):
    """The in-memory store, counting the guard's end_canary calls and what each answered."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[bool] = []

    def end_canary(self, name: str, canary: tuple[int, int], now_ms: int, reason: str) -> bool:
        ended = super().end_canary(name, canary, now_ms, reason)
        self.ends.append(ended)
        return ended


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def types(clock: Clock) -> CountingTypes:
    """Two versions of NAME, v1 production (pushed at T0)."""
    types = CountingTypes()
    for version in (1, 2):
        types.push(NAME, {"name": NAME, "v": version}, f"{version:064x}", clock.now_ms)
    return types


@pytest.fixture
def bus() -> Bus:
    return Bus()


@pytest.fixture
def tally(types: CountingTypes, bus: Bus, clock: Clock) -> JobTypeTally:
    return JobTypeTally(types, EventPublisher(bus, "aijobs-events"), clock=clock)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def no_metrics_yet() -> None:
    metrics.clear_metrics()
    job_metrics.clear()  # what other tests of this process counted


def canary_of(types: InMemoryJobTypes, percent: int = 50, guard: Guard | None = None, at_ms: int = 0) -> int:
    """A canary of v2 started at `at_ms`; its start (epoch ms)."""
    head = types.promote(NAME, 2, at_ms, canary_percent=percent, guard=guard)
    assert head.canary is not None
    return head.canary.started_at


def head_of(types: InMemoryJobTypes) -> JobTypeHead:
    head = types.head(NAME)
    assert head is not None
    return head


def canary_counts(types: InMemoryJobTypes) -> tuple[int, int, int, int]:
    canary = head_of(types).canary
    assert canary is not None, "the canary ended"
    return canary.canary_jobs, canary.canary_invalid, canary.production_jobs, canary.production_invalid


def guard_rollbacks(types: InMemoryJobTypes) -> list[str | None]:
    return [event.reason for event in head_of(types).history if event.action is LabelAction.GUARD_ROLLBACK]


# --- stats -------------------------------------------------------------------------------------------


def test_finished_jobs_of_a_data_type_are_summed_per_version(
    tally: JobTypeTally, types: CountingTypes, clock: Clock
) -> None:
    t = clock.now_ms
    records = [
        finished(t, version=1, reasks=1),
        finished(t, version=1, cost=Decimal("0.000100")),
        finished(t, version=1, code=SCHEMA, reasks=2),
        finished(t, version=2, code=BUSINESS, reasks=1),
        finished(t, version=2, code=REFERENCE),
        finished(t, version=2, code=ErrorCode.PROVIDER_REJECTED),
        finished(t, version=2, status="cancelled"),
        finished(t, version=2),
    ]

    tally.record(records)

    assert types.stats(NAME) == [
        VersionStats(
            version=1,
            jobs=3,
            succeeded=2,
            validation_failures=1,
            reasks=3,
            cost_usd=Decimal("0.000154"),
            durations={3: 3},
        ),
        VersionStats(
            version=2, jobs=5, succeeded=1, validation_failures=2, reasks=1, cost_usd=5 * COST, durations={3: 5}
        ),
    ]
    assert types.stats(NAME)[1].cost_per_job == COST
    assert types.stats(NAME)[0].percentile_ms(0.5) == 2_000


def test_batches_add_to_the_stats_they_find(tally: JobTypeTally, types: CountingTypes, clock: Clock) -> None:
    tally.record(jobs(3, clock.now_ms, version=1, invalid=1))
    tally.record(jobs(2, clock.now_ms, version=1, invalid=1))

    (stats,) = types.stats(NAME)
    assert (stats.jobs, stats.succeeded, stats.validation_failures) == (5, 3, 2)


def test_code_job_types_and_records_that_finish_no_job_are_left_out(
    tally: JobTypeTally, types: CountingTypes, clock: Clock
) -> None:
    t = clock.now_ms
    queued = job_image("j-q", "queued", t)
    running = job_image("j-q", "running", t)
    done = job_image("j-done", "succeeded", t)
    records = [
        finished(t, name="classify", version=None),  # a code job type: no version on its item
        finished(t, name="classify", version=None, code=SCHEMA),
        stream_record(queued, None, "INSERT"),  # created
        stream_record(running, queued),  # claimed
        stream_record(queued, running),  # put back for a retry
        stream_record(done, done),  # a later write to a job that had ended
        stream_record(None, done, "REMOVE"),  # its TTL
        stream_record(job_image("j-a", "succeeded", t) | job_key("j-a", attempt_sk(1)), None, "INSERT"),
    ]

    tally.record(records)

    assert types.stats(NAME) == []
    assert types.stats("classify") == []
    assert types.heads_reads == 0  # nothing to tally: the heads are not read either


@pytest.mark.parametrize(
    ("code", "invalid"),
    [
        (SCHEMA, True),
        (BUSINESS, True),
        (REFERENCE, True),
        (ErrorCode.MAX_ATTEMPTS_EXCEEDED, False),
        (ErrorCode.PROVIDER_REJECTED, False),
        (ErrorCode.OUTPUT_TOO_LARGE, False),
    ],
)
def test_only_schema_business_and_reference_failures_are_validation_failures(
    tally: JobTypeTally, types: CountingTypes, clock: Clock, code: ErrorCode, invalid: bool
) -> None:
    tally.record([finished(clock.now_ms, code=code)])

    (stats,) = types.stats(NAME)
    assert (stats.jobs, stats.succeeded, stats.validation_failures) == (1, 0, int(invalid))


# --- guarded canaries -------------------------------------------------------------------------------


def test_a_guarded_canary_that_fails_validation_more_than_allowed_ends_once_with_an_event_and_a_metric(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock
) -> None:
    # Given a guarded canary of v2 (at least 20 jobs, 2 points) started a second ago
    started = canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)
    clock.advance(1)
    created = clock.now_ms
    clock.advance(5)

    # When 20 canary jobs finish with 5 invalid (25%), and 20 of production with 1 (5%)
    tally.record([*jobs(20, created, version=2, invalid=5), *jobs(20, created, version=1, invalid=1)])

    # Then the canary is ended, once, its reason recorded in the name's history
    reason = "v2 failed validation on 25.0% of 20 jobs, production on 5.0% of 20: more than 2 points worse"
    head = head_of(types)
    assert (head.production, head.canary) == (1, None)
    assert types.ends == [True]
    assert guard_rollbacks(types) == [reason]
    assert head.history[-1].at == clock.now_ms
    # And one `Job Type Rolled Back` event says what was ended, and why
    (entry,) = bus.entries
    assert (entry["DetailType"], entry["EventBusName"]) == (ROLLED_BACK, "aijobs-events")
    assert json.loads(entry["Detail"]) == {
        "job_type": NAME,
        "version": 2,
        "production_version": 1,
        "reason": reason,
        "canary_jobs": 20,
        "canary_invalid": 5,
        "production_jobs": 20,
        "production_invalid": 1,
        "at": clock.now_ms,
    }
    assert started < created
    # And it is counted, service-wide and for the job type
    assert metrics.metric_set[ROLLED_BACK_METRIC]["Value"] == [1.0]
    assert job_metrics.snapshot() == {(NAME, ""): {ROLLED_BACK_METRIC: [1.0]}}


def test_a_guarded_canary_is_judged_only_once_it_has_its_minimum_of_jobs(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock
) -> None:
    canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)

    # 19 canary jobs, every one invalid: not enough to judge
    tally.record(jobs(19, clock.now_ms, version=2, invalid=19))
    assert canary_counts(types) == (19, 19, 0, 0)
    assert (types.ends, bus.entries) == ([], [])

    # The 20th (valid) makes enough: 95% against production's 0%
    tally.record(jobs(1, clock.now_ms, version=2))
    assert head_of(types).canary is None
    assert types.ends == [True]
    assert len(bus.entries) == 1


@pytest.mark.parametrize(("canary_invalid", "ended"), [(6, False), (7, False), (8, True)])
def test_a_guarded_canary_within_its_allowed_regression_goes_on(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock, canary_invalid: int, ended: bool
) -> None:
    # Production fails 5% of 100; the canary may fail up to 2 points more (7%)
    canary_of(types, guard=Guard(min_jobs=100, max_regression=2), at_ms=clock.now_ms)

    tally.record(
        [*jobs(100, clock.now_ms, version=2, invalid=canary_invalid), *jobs(100, clock.now_ms, version=1, invalid=5)]
    )

    assert (head_of(types).canary is None) is ended
    assert len(bus.entries) == int(ended)
    assert types.ends == ([True] if ended else [])


def test_an_unguarded_canary_is_never_ended_by_the_tally(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock
) -> None:
    canary_of(types, at_ms=clock.now_ms)

    tally.record([*jobs(300, clock.now_ms, version=2, invalid=300), *jobs(300, clock.now_ms, version=1)])

    assert canary_counts(types) == (300, 300, 300, 0)
    assert (types.ends, bus.entries, guard_rollbacks(types)) == ([], [], [])
    assert ROLLED_BACK_METRIC not in metrics.metric_set


def test_a_batch_delivered_twice_ends_the_canary_once_with_one_event(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock
) -> None:
    canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)
    batch = [*jobs(20, clock.now_ms, version=2, invalid=10), *jobs(20, clock.now_ms, version=1)]

    tally.record(batch)
    tally.record(batch)  # the stream's at-least-once delivery

    assert head_of(types).canary is None
    assert len(guard_rollbacks(types)) == 1
    assert len(bus.entries) == 1
    assert metrics.metric_set[ROLLED_BACK_METRIC]["Value"] == [1.0]
    # (the stats are figures, summed as often as they come: docs say so)
    assert [stats.jobs for stats in types.stats(NAME)] == [40, 40]


def test_two_tallies_of_one_breach_end_the_canary_once(types: CountingTypes, bus: Bus, clock: Clock) -> None:
    # Two events-function environments given the same batch (a retried invocation beside the first)
    canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)
    batch = [*jobs(20, clock.now_ms, version=2, invalid=10), *jobs(20, clock.now_ms, version=1)]
    first = JobTypeTally(types, EventPublisher(bus, "aijobs-events"), clock=clock)  # type: ignore[arg-type]
    second = JobTypeTally(types, EventPublisher(bus, "aijobs-events"), clock=clock)  # type: ignore[arg-type]

    first.record(batch)
    second.record(batch)

    assert len(guard_rollbacks(types)) == 1
    assert len(bus.entries) == 1


def test_a_canary_started_after_a_job_was_created_does_not_count_that_job(
    tally: JobTypeTally, types: CountingTypes, bus: Bus, clock: Clock
) -> None:
    # Given jobs created a minute before a guarded canary started (v2 pinned, v1 production)
    before = clock.now_ms
    clock.advance(60)
    started = canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)
    clock.advance(1)

    # When they finish, every canary one invalid, with some created since the canary started
    tally.record([*jobs(30, before, version=2, invalid=30), *jobs(30, before, version=1)])
    tally.record([*jobs(3, started, version=2, invalid=1), *jobs(4, clock.now_ms, version=1)])

    # Then only those created since count, on both sides, and the canary goes on
    assert canary_counts(types) == (3, 1, 4, 0)
    assert (types.ends, bus.entries) == ([], [])
    # (their stats count them all)
    assert [stats.jobs for stats in types.stats(NAME)] == [34, 33]


def test_jobs_of_a_version_on_neither_side_are_not_counted(
    tally: JobTypeTally, types: CountingTypes, clock: Clock
) -> None:
    types.push(NAME, {"name": NAME, "v": 3}, f"{3:064x}", clock.now_ms)
    canary_of(types, guard=Guard(min_jobs=5, max_regression=2), at_ms=clock.now_ms)

    tally.record([*jobs(10, clock.now_ms, version=3, invalid=10), *jobs(2, clock.now_ms, version=2)])

    assert canary_counts(types) == (2, 0, 0, 0)


def test_a_canary_replaced_by_another_counts_anew(tally: JobTypeTally, types: CountingTypes, clock: Clock) -> None:
    canary_of(types, percent=10, guard=Guard(min_jobs=50), at_ms=clock.now_ms)
    tally.record(jobs(10, clock.now_ms, version=2, invalid=5))
    clock.advance(1)

    started = canary_of(types, percent=20, guard=Guard(min_jobs=50), at_ms=clock.now_ms)
    tally.record(jobs(4, started, version=2))

    assert canary_counts(types) == (4, 0, 0, 0)


def test_an_event_the_bus_refuses_leaves_the_canary_ended_and_says_so(
    types: CountingTypes, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    tally = JobTypeTally(types, EventPublisher(Bus(failing=True), "aijobs-events"), clock=clock)  # type: ignore[arg-type]
    canary_of(types, guard=Guard(min_jobs=20, max_regression=2), at_ms=clock.now_ms)
    caplog.set_level(logging.ERROR, logger="aijobs")

    tally.record(jobs(20, clock.now_ms, version=2, invalid=20))

    assert head_of(types).canary is None
    assert len(guard_rollbacks(types)) == 1
    messages = [record.getMessage() for record in caplog.records]
    assert "the event of a guarded canary's end was refused by the bus" in messages
