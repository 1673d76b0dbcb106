"""The reconciler: jobs no message will move on any more are failed at their deadline, cancelled, or
re-enqueued, found through the OpenJobs index and never a scan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import handlers.reconciler
from aijobs.stack import StackResources
from engine.core import ErrorCode, JobErrorInfo, JobStatus, NewJob, Released, Succeeded
from engine.core.open_jobs import OpenJobKey
from engine.reconciler import STOP_MARGIN_MS, Reconciler
from engine.store import DynamoJobStore
from engine.store.items import OPEN_SHARDS, open_shard
from engine.store.open_jobs import OPEN_JOBS_INDEX, OpenJobsIndex
from engine.wiring import entry_point
from tests.conftest import RequestCounter
from tests.integration.conftest import (
    RecordingQueue,
    TableReader,
    now_ms,
    open_job_ids,
    queued_bodies,
    queued_messages,
)
from tests.support.events import InvocationContext, job_message
from tests.support.providers import VALID_OUTPUTS

STALE_SECONDS = 600
# One pass reads every shard of the index once (each fits in one page here).


def writes_after_one_pass(requests: RequestCounter) -> dict[str, int]:
    """The requests of one reconciler pass less its reads: the cursor (one GetItem), a Query per
    shard, then the open jobs themselves with one BatchGetItem per shard that holds any (at most one
    per shard). Every shard read to its end, the cursor does not move and is not written."""
    operations = dict(requests.operations)
    assert operations.pop("GetItem") == 1
    assert operations.pop("Query") == OPEN_SHARDS
    assert 0 <= operations.pop("BatchGetItem", 0) <= OPEN_SHARDS
    assert "Scan" not in operations
    return operations


UNAVAILABLE = JobErrorInfo(ErrorCode.PROVIDER_UNAVAILABLE, "provider unavailable (HTTP 503)", retryable=True)


class QueryRecorder:
    """The parameters of every Query a client sends (a botocore event hook)."""

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []

    def __call__(self, params: dict[str, Any], **_: Any) -> None:
        self.queries.append(dict(params))


@pytest.fixture
def queries(dynamodb: Any) -> QueryRecorder:
    recorder = QueryRecorder()
    dynamodb.meta.events.register("before-parameter-build.dynamodb.Query", recorder)
    return recorder


@pytest.fixture
def reconciler_at(store: DynamoJobStore, queue: RecordingQueue) -> Callable[[int], Reconciler]:
    """A reconciler on the fixtures' (counted) store whose clock reads `at_ms`."""

    def build(at_ms: int) -> Reconciler:
        return Reconciler(store, queue, stale_seconds=STALE_SECONDS, clock=lambda: at_ms / 1000)

    return build


def assert_read_the_index_only(requests: RequestCounter, queries: QueryRecorder) -> None:
    assert "Scan" not in requests.operations
    assert requests.operations["Query"] == OPEN_SHARDS
    assert {query["IndexName"] for query in queries.queries} == {OPEN_JOBS_INDEX}


def test_jobs_past_their_deadline_fail_unless_a_worker_holds_them(
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    dynamodb_requests: RequestCounter,
    queries: QueryRecorder,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given three jobs with a 60 s deadline: one queued, one whose worker died (30 s lease), one held for 10 min
    t0 = now_ms()
    late = {"deadline_seconds": 60}
    message = job_message("classify")
    store.create_job("late-queued", new_job(message, **late), message["input"], t0)
    store.claim_job("late-orphan", "dead-worker", 30_000, t0, new_job(message, **late))
    store.claim_job("late-held", "live-worker", 600_000, t0, new_job(message, **late))
    held = table.job_item("late-held")
    dynamodb_requests.reset()

    # When the reconciler runs two minutes later
    report = reconciler_at(t0 + 120_000).run()

    # Then the two jobs no worker holds fail with deadline_exceeded, one write each
    assert report == {"examined": 3, "deadline_exceeded": 2}
    assert_read_the_index_only(dynamodb_requests, queries)
    assert writes_after_one_pass(dynamodb_requests) == {"UpdateItem": 2}
    for job_id in ("late-queued", "late-orphan"):
        job = table.job(job_id)
        assert job.error is not None
        assert (job.status, job.error.code, job.error.retryable) == (
            JobStatus.FAILED,
            ErrorCode.DEADLINE_EXCEEDED,
            False,
        )
        assert (job.lease_owner, job.finished_at) == (None, t0 + 120_000)
        assert "open_shard" not in (table.job_item(job_id) or {})
    # And the held job is left to its worker
    assert table.job_item("late-held") == held
    assert open_job_ids(table) == {"late-held"}


def test_a_cancel_requested_while_no_worker_holds_the_job_ends_it(
    store: DynamoJobStore,
    side_store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    dynamodb_requests: RequestCounter,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given two running jobs whose cancel was requested: one whose worker died, one held for 10 min
    t0 = now_ms()
    message = job_message("classify")
    store.claim_job("cancel-orphan", "dead-worker", 30_000, t0, new_job(message))
    store.claim_job("cancel-held", "live-worker", 600_000, t0, new_job(message))
    for job_id in ("cancel-orphan", "cancel-held"):
        side_store.request_cancel(job_id, t0)
    held = table.job_item("cancel-held")
    dynamodb_requests.reset()

    # When the reconciler runs two minutes later
    report = reconciler_at(t0 + 120_000).run()

    # Then the job no worker holds is cancelled, the other left to its worker's finishing fence
    assert report == {"examined": 2, "cancelled": 1}
    assert writes_after_one_pass(dynamodb_requests) == {"UpdateItem": 1}
    job = table.job("cancel-orphan")
    assert (job.status, job.cancel_requested, job.error, job.lease_owner) == (JobStatus.CANCELLED, True, None, None)
    assert table.job_item("cancel-held") == held
    assert open_job_ids(table) == {"cancel-held"}


def test_a_stale_queued_job_is_re_enqueued_once_when_its_input_is_stored(
    stack: StackResources,
    sqs: Any,
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    dynamodb_requests: RequestCounter,
    queries: QueryRecorder,
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given, untouched for longer than the stale time: a queued job with its input stored, and a
    # message-carried one released after a 503 (its input is only in its message)
    t0 = now_ms()
    message = job_message("classify")
    store.create_job("stale-stored", new_job(message), message["input"], t0)
    carried = store.claim_job("stale-carried", "worker", 60_000, t0, new_job(message))
    store.finish_job(carried, Released(UNAVAILABLE), t0)
    # And a queued job touched recently, and two finished jobs (not in the index at all)
    store.create_job("fresh", new_job(message), message["input"], t0 + 200_000)
    done = store.claim_job("done", "worker", 60_000, t0, new_job(message))
    store.finish_job(done, Succeeded(VALID_OUTPUTS["classify"], "hash"), t0)
    store.create_failed_job("bad", UNAVAILABLE, t0)
    assert open_job_ids(table) == {"stale-stored", "stale-carried", "fresh"}
    left_alone = {job_id: table.job_item(job_id) for job_id in ("stale-carried", "fresh", "done", "bad")}
    dynamodb_requests.reset()

    # When the reconciler runs past the stale time
    at = t0 + (STALE_SECONDS + 100) * 1000
    report = reconciler_at(at).run()

    # Then the job with its input stored gets a fresh reference message and is marked as touched
    assert report == {"examined": 3, "requeued": 1}
    assert_read_the_index_only(dynamodb_requests, queries)
    assert writes_after_one_pass(dynamodb_requests) == {"UpdateItem": 1}
    assert queued_messages(sqs, stack.queue_url) == [({"job_id": "stale-stored"}, "user-1")]
    job = table.job("stale-stored")
    assert (job.status, job.updated_at) == (JobStatus.QUEUED, at)
    # And the others are left as they were (the carried one ends at its deadline)
    assert {job_id: table.job_item(job_id) for job_id in left_alone} == left_alone
    dynamodb_requests.reset()

    # When it runs again right after, Then nothing is sent again
    assert reconciler_at(at).run() == {"examined": 3}
    assert writes_after_one_pass(dynamodb_requests) == {}
    assert queued_bodies(sqs, stack.queue_url) == []


def test_a_cancel_requested_job_past_its_deadline_ends_cancelled_as_a_delivery_would_end_it(
    store: DynamoJobStore,
    side_store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a running job with a 60 s deadline whose worker died, and whose cancel was then requested
    t0 = now_ms()
    store.claim_job("cancel-late", "dead-worker", 30_000, t0, new_job(job_message("classify"), deadline_seconds=60))
    side_store.request_cancel("cancel-late", t0)

    # When the reconciler runs after the deadline
    reconciler_at(t0 + 120_000).run()

    # Then the cancel wins, as it does when the job's message is delivered
    assert table.job("cancel-late").status is JobStatus.CANCELLED


# --- the Lambda entry point ---------------------------------------------------------------------


@pytest.fixture
def handler(lambda_environment: None) -> Callable[[], dict[str, int]]:
    """The entry point of handlers.reconciler as the schedule invokes it, configured from the environment."""
    lambda_handler = entry_point(handlers.reconciler.build)
    return lambda: lambda_handler({}, InvocationContext(function_name="aijobs-reconciler"))


def test_the_scheduled_function_fails_a_job_past_its_deadline(
    handler: Callable[[], dict[str, int]], store: DynamoJobStore, table: TableReader, new_job: Callable[..., NewJob]
) -> None:
    # Given a queued job whose 60 s deadline passed a minute ago
    message = job_message("summarize", "handler-late")
    store.create_job("handler-late", new_job(message, deadline_seconds=60), message["input"], now_ms() - 120_000)

    # When the schedule invokes the reconciler
    report = handler()

    # Then it reports what it did, and the job failed with deadline_exceeded
    assert report == {"examined": 1, "deadline_exceeded": 1}
    job = table.job("handler-late")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED)
    assert open_job_ids(table) == set()


# --- a pass that meets ended jobs, broken jobs, many jobs and its own timeout --------------------


def test_a_job_that_ended_after_the_index_was_read_is_skipped_and_the_pass_goes_on(
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    table: TableReader,
    new_job: Callable[..., NewJob],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an index that still lists a job cancelled meanwhile (it is eventually consistent), next
    # to a job past its deadline
    t0 = now_ms()
    message = job_message("classify")
    store.create_job("ended-meanwhile", new_job(message), message["input"], t0)
    store.create_job("late", new_job(message, deadline_seconds=60), message["input"], t0)
    stale_keys = [OpenJobKey(0, job_id) for job_id in ("ended-meanwhile", "late")]
    store.request_cancel("ended-meanwhile", t0)
    monkeypatch.setattr(
        OpenJobsIndex, "keys", lambda self, shard, after, count: (stale_keys if shard == 0 else [], True)
    )

    # When the reconciler runs after the deadline
    report = reconciler_at(t0 + 120_000).run()

    # Then the ended job is seen as it is now and left alone, and the next one is still handled
    assert report == {"examined": 2, "already_finished": 1, "deadline_exceeded": 1}
    assert table.job("ended-meanwhile").status is JobStatus.CANCELLED
    assert table.job("late").status is JobStatus.FAILED


def test_one_job_that_cannot_be_reconciled_is_counted_and_the_others_are_handled(
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    table: TableReader,
    new_job: Callable[..., NewJob],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = now_ms()
    message = job_message("classify")
    for job_id in ("late-1", "late-2", "late-3"):
        store.create_job(job_id, new_job(message, deadline_seconds=60), message["input"], t0)
    end = store.end_job

    def end_or_break(job: Any, *args: Any, **kwargs: Any) -> bool:
        if job.job_id == "late-2":
            raise RuntimeError("a fault on this one job")
        return end(job, *args, **kwargs)

    monkeypatch.setattr(store, "end_job", end_or_break)

    report = reconciler_at(t0 + 120_000).run()

    assert report == {"examined": 3, "deadline_exceeded": 2, "errors": 1}
    assert [table.job(job_id).status for job_id in ("late-1", "late-2", "late-3")] == [
        JobStatus.FAILED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
    ]


def test_a_pass_reads_no_more_jobs_than_it_handles(
    store: DynamoJobStore,
    queue: RecordingQueue,
    dynamodb: Any,
    queries: QueryRecorder,
    new_job: Callable[..., NewJob],
) -> None:
    # Given 40 open jobs and a reconciler that handles 16 a pass (2 per shard)
    t0 = now_ms()
    message = job_message("classify")
    for index in range(40):
        store.create_job(f"open-{index}", new_job(message), message["input"], t0)
    read_keys: list[int] = []
    dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.BatchGetItem",
        lambda params, **_: read_keys.append(sum(len(table["Keys"]) for table in params["RequestItems"].values())),
    )

    report = Reconciler(store, queue, max_jobs=16, clock=lambda: t0 / 1000).run()

    # Then each shard's query asks for its share only, and no more than 16 jobs are read
    assert report["examined"] <= 16
    assert all(query["Limit"] <= 2 for query in queries.queries)
    assert sum(read_keys) == report["examined"]


def test_a_stale_job_deep_in_its_shard_is_re_enqueued_within_one_pass_per_job_of_the_shard(
    stack: StackResources,
    sqs: Any,
    store: DynamoJobStore,
    queue: RecordingQueue,
    dynamodb_requests: RequestCounter,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a stale queued job with a 7-day deadline and, in its shard of the index, three jobs
    # touched recently whose deadlines come first; and a reconciler that reads one job a shard a pass
    t0 = now_ms()
    at = t0 + (STALE_SECONDS + 100) * 1000
    message = job_message("classify")
    store.create_job("stale-deep", new_job(message, deadline_seconds=604_800), message["input"], t0)
    shard = open_shard("stale-deep")
    ahead = [job_id for job_id in (f"ahead-{n}" for n in range(100)) if open_shard(job_id) == shard][:3]
    for job_id in ahead:
        store.create_job(job_id, new_job(message, deadline_seconds=3_600), message["input"], at - 1_000)
    reconciler = Reconciler(store, queue, stale_seconds=STALE_SECONDS, max_jobs=OPEN_SHARDS, clock=lambda: at / 1000)

    # When it runs pass after pass, each going on from where the last one stopped
    reports = []
    for _ in range(len(ahead) + 1):
        dynamodb_requests.reset()
        reports.append(reconciler.run())
        # Each pass reads the cursor once, and writes it once when it moved
        assert dynamodb_requests.operations["GetItem"] == 1
        assert dynamodb_requests.operations["UpdateItem"] == 1 + reports[-1]["requeued"]

    # Then the passes reach the jobs of the shard one by one: the stale job on the fourth, once
    assert [report["requeued"] for report in reports] == [0, 0, 0, 1]
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "stale-deep"}]


def test_a_pass_stops_before_its_invocation_runs_out_of_time(
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    dynamodb_requests: RequestCounter,
    new_job: Callable[..., NewJob],
) -> None:
    t0 = now_ms()
    message = job_message("classify")
    store.create_job("late", new_job(message, deadline_seconds=60), message["input"], t0)
    dynamodb_requests.reset()

    report = reconciler_at(t0 + 120_000).run(remaining_ms=lambda: STOP_MARGIN_MS - 1)

    assert report == {"stopped_early": 1}
    assert "UpdateItem" not in dynamodb_requests.operations


def test_a_running_job_whose_worker_died_long_ago_is_re_enqueued_and_taken_over(
    stack: StackResources,
    sqs: Any,
    store: DynamoJobStore,
    reconciler_at: Callable[[int], Reconciler],
    table: TableReader,
    new_job: Callable[..., NewJob],
) -> None:
    # Given a submitted job claimed by a worker that died (its 60 s lease long expired), whose
    # message is gone (it reached the dead-letter queue while the lease was live, say)
    t0 = now_ms()
    message = job_message("classify")
    store.create_job("orphaned", new_job(message), message["input"], t0)
    store.claim_job("orphaned", "dead-worker", 60_000, t0, None)

    # When the reconciler runs past the stale time
    at = t0 + (STALE_SECONDS + 100) * 1000
    report = reconciler_at(at).run()

    # Then a reference message is enqueued, once, and the job is left to the next claim
    assert report == {"examined": 1, "requeued": 1}
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "orphaned"}]
    assert table.job("orphaned").status is JobStatus.RUNNING
    assert reconciler_at(at).run() == {"examined": 1}
    taken = store.claim_job("orphaned", "next-worker", 60_000, at + 1, None)
    assert (taken.lease_owner, taken.attempt_count) == ("next-worker", 2)
