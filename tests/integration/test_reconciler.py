"""The reconciler: jobs no message will move on any more are failed at their deadline, cancelled, or
re-enqueued, found through the OpenJobs index and never a scan."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aijobs.stack import StackResources
from engine.errors import ErrorCode
from engine.models import JobErrorInfo, JobStatus
from engine.reconciler import Reconciler, get_reconciler
from engine.store import JobStore, NewJob, Released, Succeeded
from engine.store.items import OPEN_SHARDS
from engine.store.jobs import OPEN_JOBS_INDEX
from handlers.reconciler import lambda_handler
from tests.conftest import RequestCounter
from tests.integration.conftest import RecordingQueue, TableReader, now_ms, open_job_ids, queued_bodies
from tests.support.events import FakeLambdaContext, job_message
from tests.support.providers import VALID_OUTPUTS

STALE_SECONDS = 600
# One pass reads every shard of the index once (each fits in one page here).


def writes_after_one_pass(requests: RequestCounter) -> dict[str, int]:
    """The requests of one reconciler pass less its reads: a Query per shard, then the open jobs
    themselves with one BatchGetItem per shard that holds any (at most one per shard)."""
    operations = dict(requests.operations)
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
def reconciler_at(store: JobStore, queue: RecordingQueue) -> Callable[[int], Reconciler]:
    """A reconciler on the fixtures' (counted) store whose clock reads `at_ms`."""

    def build(at_ms: int) -> Reconciler:
        return Reconciler(store, queue, stale_seconds=STALE_SECONDS, clock=lambda: at_ms / 1000)

    return build


def assert_read_the_index_only(requests: RequestCounter, queries: QueryRecorder) -> None:
    assert "Scan" not in requests.operations
    assert requests.operations["Query"] == OPEN_SHARDS
    assert {query["IndexName"] for query in queries.queries} == {OPEN_JOBS_INDEX}


def test_jobs_past_their_deadline_fail_unless_a_worker_holds_them(
    store: JobStore,
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
    store: JobStore,
    side_store: JobStore,
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
    store: JobStore,
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
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "stale-stored"}]
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
    store: JobStore,
    side_store: JobStore,
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
def handler(lambda_environment: None) -> Iterator[Callable[[], dict[str, int]]]:
    """`handlers.reconciler.lambda_handler` as the schedule invokes it, configured from the environment."""
    get_reconciler.cache_clear()
    try:
        yield lambda: lambda_handler({}, FakeLambdaContext(function_name="aijobs-reconciler"))
    finally:
        get_reconciler.cache_clear()


def test_the_scheduled_function_fails_a_job_past_its_deadline(
    handler: Callable[[], dict[str, int]], store: JobStore, table: TableReader, new_job: Callable[..., NewJob]
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
