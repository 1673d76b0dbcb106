"""What the dashboard reads, on moto: listing pages and their cursors, a job's details, budgets, usage by
day and queue depths, and in how many requests each."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from aijobs.client import AiJobsClient
from aijobs.stack import StackResources
from engine.core import AttemptOutcome, AttemptRecord, ErrorCode, JobErrorInfo, JobStatus, NewJob
from engine.queue import JobQueue
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.store.budgets import BudgetTable
from engine.store.items import LIST_DAY_SHARDS
from engine.store.listing import JobFilter, ListingCursor
from tests.conftest import RequestCounter
from tests.integration.conftest import now_ms
from tests.support.events import job_message

DAY_MS = 86_400_000
NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
HOUR_MS = 3_600_000
JOB_INPUT = {"text": "Win a free cruise now!", "labels": ["spam", "ham"]}
ROUND = {"Query": LIST_DAY_SHARDS}  # one Query per shard of a day


@pytest.fixture
def listing(stack: StackResources, dynamodb: Any) -> JobListing:
    return JobListing(stack.table_name, dynamodb)


@pytest.fixture
def make_jobs(store: DynamoJobStore, new_job: Callable[..., NewJob]) -> Callable[..., list[str]]:
    """Submit jobs one second apart from `start`, oldest first; their ids, newest first."""

    def make(count: int, start: int, prefix: str = "job", user: str = "user-1") -> list[str]:
        ids = []
        for number in range(count):
            job_id = f"{prefix}-{number:03d}"
            store.create_job(job_id, new_job(job_message("classify", job_id, user_id=user)), JOB_INPUT, start + number)
            ids.append(job_id)
        return ids[::-1]

    return make


def ids(page: Any) -> list[str]:
    return [job.job_id for job in page.jobs]


def fail(store: DynamoJobStore, job_id: str, code: ErrorCode) -> None:
    job = store.get_job(job_id)
    assert job is not None
    store.end_job(job, JobStatus.FAILED, JobErrorInfo(code, "x", False), NOW)


def test_a_page_is_one_query_per_shard_and_one_batch_get_and_its_cursor_goes_on_exactly(
    listing: JobListing, make_jobs: Callable[..., list[str]], dynamodb_requests: RequestCounter
) -> None:
    # Given 12 jobs created within an hour of one day
    newest_first = make_jobs(12, NOW - HOUR_MS)
    dynamodb_requests.reset()

    # When the listing is read 5 jobs a page
    pages, cursor = [], None
    for _ in range(4):
        page = listing.page(JobFilter(), NOW - 2 * HOUR_MS, NOW, size=5, cursor=cursor)
        pages.append((ids(page), page.read, dict(dynamodb_requests.operations)))
        dynamodb_requests.reset()
        if page.next is None:
            break
        cursor = ListingCursor.from_token(page.next.token())  # as a URL carries it

    # Then each page took the next 5 newest, in one round of queries and one BatchGetItem
    assert pages == [
        (newest_first[:5], 5, ROUND | {"BatchGetItem": 1}),
        (newest_first[5:10], 5, ROUND | {"BatchGetItem": 1}),
        (newest_first[10:], 2, ROUND | {"BatchGetItem": 1}),
    ]


def test_a_page_goes_back_through_empty_days_within_its_range_only(
    listing: JobListing, make_jobs: Callable[..., list[str]], dynamodb_requests: RequestCounter
) -> None:
    # Given jobs today and two days ago, none yesterday
    today = make_jobs(3, NOW - HOUR_MS, "today")
    older = make_jobs(2, NOW - 2 * DAY_MS, "older")
    dynamodb_requests.reset()

    # When a page of 100 covers the three days
    page = listing.page(JobFilter(), NOW - 2 * DAY_MS - HOUR_MS, NOW, size=100)

    # Then it holds all five, newest first: a round of queries per day, one BatchGetItem, and no next page
    assert ids(page) == today + older
    assert dict(dynamodb_requests.operations) == {"Query": 3 * LIST_DAY_SHARDS, "BatchGetItem": 1}
    assert page.next is None

    # And a range of today alone holds today's only
    assert ids(listing.page(JobFilter(), NOW - 2 * HOUR_MS, NOW)) == today


def test_a_full_page_that_ends_its_day_goes_on_with_the_day_before(
    listing: JobListing, make_jobs: Callable[..., list[str]]
) -> None:
    today = make_jobs(3, NOW - HOUR_MS, "today")
    older = make_jobs(2, NOW - DAY_MS, "older")
    window = (NOW - 2 * DAY_MS, NOW)

    first = listing.page(JobFilter(), *window, size=3)
    assert ids(first) == today
    assert first.next is not None
    second = listing.page(JobFilter(), *window, size=3, cursor=first.next)
    assert ids(second) == older


def test_a_user_filter_reads_only_that_users_jobs_and_other_filters_read_the_page(
    listing: JobListing,
    store: DynamoJobStore,
    make_jobs: Callable[..., list[str]],
    dynamodb: Any,
) -> None:
    # Given 4 jobs of alice and 4 of bob, one of alice's failed
    alice = make_jobs(4, NOW - HOUR_MS, "alice", user="alice")
    bob = make_jobs(4, NOW - HOUR_MS + 10, "bob", user="bob")
    fail(store, alice[0], ErrorCode.INTERNAL_ERROR)
    keys_read: list[int] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem",
        lambda params, **_: keys_read.append(sum(len(table["Keys"]) for table in params["RequestItems"].values())),
    )
    window = (NOW - 2 * HOUR_MS, NOW)

    # When alice's jobs are listed, and then everyone's failed ones
    mine = listing.page(JobFilter(user_id="alice"), *window)
    failed = listing.page(JobFilter(status=JobStatus.FAILED), *window)

    # Then only alice's jobs were read for hers (the index holds the user); the status is read on the jobs
    assert ids(mine) == alice
    assert ids(failed) == [alice[0]]
    assert (mine.read, failed.read) == (8, 8)
    assert keys_read == [4, 8]
    assert ids(listing.page(JobFilter(user_id="bob"), *window)) == bob
    assert ids(listing.page(JobFilter(job_type="summarize"), *window)) == []


def test_an_outline_reads_a_window_as_a_page_does_then_a_batch_get_per_hundred_jobs_of_a_few_attributes(
    listing: JobListing,
    store: DynamoJobStore,
    make_jobs: Callable[..., list[str]],
    dynamodb: Any,
    dynamodb_requests: RequestCounter,
) -> None:
    # Given 250 jobs of one day, one of them failed
    newest_first = make_jobs(250, NOW - HOUR_MS)
    fail(store, newest_first[3], ErrorCode.PROVIDER_REJECTED)
    asked: list[str] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem",
        lambda params, **_: asked.extend(table["ProjectionExpression"] for table in params["RequestItems"].values()),
    )
    dynamodb_requests.reset()

    # When the day is outlined, all of it, then the newest 120 only
    whole = listing.outlines(JobFilter(), NOW - 2 * HOUR_MS, NOW)
    whole_requests = dict(dynamodb_requests.operations)
    dynamodb_requests.reset()
    newest = listing.outlines(JobFilter(), NOW - 2 * HOUR_MS, NOW, limit=120)

    # Then the whole day is one round of queries and three BatchGetItems, of the outline's attributes only
    assert [outline.job_id for outline in whole.jobs] == newest_first
    assert (whole.read, whole.complete) == (250, True)
    assert whole_requests == ROUND | {"BatchGetItem": 3}
    assert asked[0] == "#a0, #a1, #a2, #a3, #a4, #a5, #a6, #a7"
    assert [(outline.status, outline.error_code) for outline in whole.jobs[3:5]] == [
        (JobStatus.FAILED, ErrorCode.PROVIDER_REJECTED),
        (JobStatus.QUEUED, None),
    ]
    # and the newest 120 say that the day holds more, back to the oldest of them
    assert [outline.job_id for outline in newest.jobs] == newest_first[:120]
    assert (newest.read, newest.complete, newest.oldest_ms) == (120, False, NOW - HOUR_MS + 130)
    assert dict(dynamodb_requests.operations) == ROUND | {"BatchGetItem": 2}
    # A filter on the user drops entries before the jobs are read; the others, on the jobs read
    assert listing.outlines(JobFilter(user_id="someone-else"), NOW - 2 * HOUR_MS, NOW).jobs == []
    failed = listing.outlines(JobFilter(status=JobStatus.FAILED), NOW - 2 * HOUR_MS, NOW)
    assert ([outline.job_id for outline in failed.jobs], failed.read) == ([newest_first[3]], 250)
    with pytest.raises(ValueError, match="1 to 2000"):
        listing.outlines(JobFilter(), NOW - HOUR_MS, NOW, limit=2001)


def test_a_cursor_is_refused_unless_the_listing_made_it_for_its_range(listing: JobListing) -> None:
    for forged in ["", "not-base64!", "bm90IGpzb24", ListingCursor("2027-01-15", {99: (1, "x")}).token()]:
        with pytest.raises(ValueError, match="not a listing cursor"):
            ListingCursor.from_token(forged)
    elsewhere = ListingCursor("2020-01-01", {})
    with pytest.raises(ValueError, match="outside the listing's time range"):
        listing.page(JobFilter(), NOW - HOUR_MS, NOW, cursor=elsewhere)
    with pytest.raises(ValueError, match="1 to 100"):
        listing.page(JobFilter(), NOW - HOUR_MS, NOW, size=101)


def test_a_jobs_details_are_one_query_even_with_a_hundred_attempts(
    store: DynamoJobStore, new_job: Callable[..., NewJob], dynamodb_requests: RequestCounter
) -> None:
    # Given a submitted job with 100 attempt records and a dead letter naming it
    message = job_message("classify", "busy")
    store.create_job("busy", new_job(message), JOB_INPUT, NOW)
    for number in range(1, 101):
        store.record_orphan_attempt(attempt(number), NOW + number)
    store.record_dead_letter("m-1", '{"job_id": "busy"}', {}, 3, "given up", NOW + 200, "busy")
    dynamodb_requests.reset()

    # When its details are read
    details = store.job_details("busy")

    # Then one Query read the job, its attempts, its dead letter and its input
    assert dict(dynamodb_requests.operations) == {"Query": 1}
    assert details is not None
    assert [record.attempt for record in details.history.attempts] == list(range(1, 101))
    assert [letter.message_id for letter in details.history.dead_letters] == ["m-1"]
    assert details.input_json is not None
    assert json.loads(details.input_json) == JOB_INPUT


def test_an_input_kept_in_the_payload_bucket_is_read_from_there(
    store: DynamoJobStore, new_job: Callable[..., NewJob]
) -> None:
    big = {"text": "x" * 300_000, "max_words": 100}
    store.create_job("big", new_job(job_message("summarize", "big")), big, NOW)

    details = store.job_details("big")

    assert details is not None
    assert details.input_json is not None
    assert json.loads(details.input_json) == big


def attempt(number: int) -> AttemptRecord:
    return AttemptRecord(
        job_id="busy",
        attempt=number,
        user_id="user-1",
        job_type="classify",
        started_at=NOW + number - 1,
        finished_at=NOW + number,
        outcome=AttemptOutcome.RETRYABLE,
        error_code=ErrorCode.PROVIDER_UNAVAILABLE,
        model="gpt-4o-mini",
        calls=1,
        input_tokens=10,
        output_tokens=1,
        cost_usd=Decimal("0.0001"),
    )


def test_budgets_of_many_users_are_one_batch_get(
    stack: StackResources, dynamodb: Any, dynamodb_requests: RequestCounter
) -> None:
    budgets = BudgetTable(stack.table_name, dynamodb)
    caps = {f"user-{number}": Decimal(number + 1) for number in range(3)}
    for user, cap in caps.items():
        budgets.set_cap(user, cap, NOW)
    budgets.reserve("user-0", "2027-01-15", Decimal("0.25"), Decimal(1), NOW)
    dynamodb_requests.reset()

    days = budgets.days(caps, NOW)

    assert dict(dynamodb_requests.operations) == {"BatchGetItem": 1}
    assert [(day.user_id, day.cap_usd, day.reserved_usd, day.left_usd) for day in days] == [
        ("user-0", Decimal(1), Decimal("0.25"), Decimal("0.75")),
        ("user-1", Decimal(2), Decimal(0), Decimal(2)),
        ("user-2", Decimal(3), Decimal(0), Decimal(3)),
    ]
    assert days == [budgets.day(user, cap, NOW) for user, cap in caps.items()]


def test_usage_by_day_holds_every_day_of_the_range(
    store: DynamoJobStore, stack: StackResources, dynamodb: Any, new_job: Callable[..., NewJob]
) -> None:
    store.create_job("busy", new_job(job_message("classify", "busy")), JOB_INPUT, NOW - 2 * DAY_MS)
    store.record_orphan_attempt(attempt(1), NOW)
    ledger = UsageLedger(stack.table_name, dynamodb)

    report = ledger.report(NOW - 2 * DAY_MS, NOW + 1_000)

    assert [day for day, _ in report.days] == ["2027-01-13", "2027-01-14", "2027-01-15"]
    assert [row.attempts for _, row in report.days] == [0, 0, 1]
    assert report.rows == ledger.summarize(NOW - 2 * DAY_MS, NOW + 1_000)


def test_a_queues_depth_counts_waiting_and_in_flight_messages(stack: StackResources, sqs: Any) -> None:
    queue = JobQueue(stack.queue_url, sqs)
    for number in range(3):
        queue.send({"job_id": f"job-{number}"})
    sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=1)

    depth = queue.depth()

    assert (depth.waiting, depth.in_flight, depth.delayed) == (2, 1, 0)


def test_the_clients_pages_of_views_and_its_health(
    jobs_client: AiJobsClient, make_jobs: Callable[..., list[str]], store: DynamoJobStore
) -> None:
    newest_first = make_jobs(3, now_ms() - 60_000)
    store.record_dead_letter("m-1", "not json", {}, 1, "not JSON", now_ms())

    page = jobs_client.list_page(JobFilter(), 3_600, size=2)
    rest = jobs_client.list_page(JobFilter(), 3_600, size=2, cursor=page.next_cursor)
    health = jobs_client.health()

    assert [view.job_id for view in page.jobs + rest.jobs] == newest_first
    assert rest.next_cursor is None
    assert health.dead_letters_today == 1
    assert set(health.queues) == {"interactive"}  # this client was given one queue, for both lanes
    assert health.dead_letter_queue is None  # this client was given none
