"""The dashboard's parts that need no server: the same-origin and Host rules, what a query string may
ask for, how figures are written, and which stack the banner names."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from starlette.datastructures import Headers

from aijobs.target import StackTarget
from aijobs.ui.bulk import retry_ids
from aijobs.ui.guard import host_name, same_origin
from aijobs.ui.overview import Tick, overview
from aijobs.ui.present import batch_name, clip, day_chart, duration, money, pretty_json, rescue, took, totals_by
from aijobs.ui.queries import BatchesQuery, JobsQuery, include_ended
from engine.config import load_settings
from engine.core import ErrorCode, Job, JobStatus, Lane
from engine.store import UsageRow
from engine.store.listing import JobFilter, JobOutline, JobOutlines
from engine.views import BatchView, JobView
from tests.support.batches import batch_record, ended_batch

HOST = "127.0.0.1:8765"
BASE = {"JOBS_TABLE_NAME": "aijobs-jobs", "JOBS_PAYLOAD_BUCKET": "aijobs-payloads"}


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"origin": "http://127.0.0.1:8765"}, True),
        ({"origin": "http://127.0.0.1:8766"}, False),
        ({"origin": "https://127.0.0.1:8765"}, False),
        ({"origin": "http://evil.example", "sec-fetch-site": "same-origin"}, False),  # Origin decides
        ({"origin": "null", "sec-fetch-site": "same-origin"}, True),  # our form under no-referrer
        ({"origin": "null", "sec-fetch-site": "same-site"}, False),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"sec-fetch-site": "none"}, False),  # typed in the address bar: no page asked for it
        ({"referer": "http://127.0.0.1:8765/jobs/x"}, True),
        ({"referer": "http://127.0.0.1:8765.evil.example/"}, False),
        ({"origin": "null"}, False),
        ({}, False),
    ],
)
def test_a_write_must_say_it_comes_from_a_page_of_this_server(headers: dict[str, str], allowed: bool) -> None:
    assert same_origin(Headers(headers), HOST) is allowed


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8765", "::1"),
        ("evil.example:80", "evil.example"),
        ("", None),
        ("[bad", None),
    ],
)
def test_the_name_in_a_host_header(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_a_jobs_query_reads_its_filters_and_writes_them_back() -> None:
    query = JobsQuery.parse(
        {"status": "failed", "user": "alice", "type": "classify", "since": "7d", "until": "2026-12-02T10:00"}
    )

    assert query.where == JobFilter(user_id="alice", status=JobStatus.FAILED, job_type="classify")
    assert query.since_seconds == 7 * 86_400
    assert query.until_ms == 1_796_205_600_000
    assert JobsQuery.parse(query.params()) == query
    assert query.url(cursor="abc") == (
        "/jobs?status=failed&user=alice&type=classify&since=7d&until=2026-12-02T10%3A00&cursor=abc"
    )
    assert JobsQuery.parse({"status": "", "user": " ", "type": ""}) == JobsQuery()
    assert JobsQuery().url() == "/jobs"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "done"}, "status: 'done' is not one of queued, running, waiting, succeeded, failed, cancelled"),
        ({"user": "<script>"}, "user: '<script>' is not a user id"),
        ({"type": "Bad Type"}, "type: 'Bad Type' is not a job type name"),
        ({"lane": "fast"}, "lane: 'fast' is not one of interactive, background"),
        ({"since": "2y"}, "since: '2y' is not one of 1h, 24h, 7d, 30d, 90d"),
        ({"until": "yesterday"}, "until: 'yesterday' is not a date and time"),
        ({"limit": "1000"}, "limit: '1000' is not a number from 1 to 100"),
        ({"job_id": "a/b"}, "'a/b' is not a job id"),
    ],
)
def test_a_bad_query_is_refused_with_one_line(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        JobsQuery.parse(params)


def test_the_batches_page_lists_the_ended_ones_too_with_all_1_only() -> None:
    assert [include_ended(params) for params in ({}, {"all": ""}, {"all": "1"})] == [False, False, True]
    with pytest.raises(ValueError, match=r"^all: 'yes' is not 1"):
        include_ended({"all": "yes"})


def test_a_batch_s_rescue_time_is_written_as_what_is_left_of_it() -> None:
    now = 1_800_000_000_000
    record = batch_record("1800000000000", "1800000000000-000000000001", now, "batch_1")
    in_flight, ended = BatchView.from_record(record), BatchView.from_record(ended_batch(record, now))

    assert [rescue(in_flight, at) for at in (now, now + 3_599_000, now + 3_600_000)] == [
        "in 1 h 0 min",
        "in 1.0 s",
        "passed",
    ]
    assert rescue(ended, now) == "-"


def test_figures_are_written_for_reading() -> None:
    assert (money(Decimal("0.000210")), money(1234.5), money(0)) == ("$0.000210", "$1,234.50", "$0.000000")
    # A cost below a millionth is shown, not rounded to nothing, and never in E notation.
    assert money(Decimal("1E-7")) == "$0.0000001"
    assert [duration(ms) for ms in (None, 850, 1_250, 125_000, 7_500_000)] == [
        "-",
        "850 ms",
        "1.2 s",
        "2 min 5 s",
        "2 h 5 min",
    ]
    assert pretty_json('{"a": [1]}') == '{\n  "a": [\n    1\n  ]\n}'
    assert pretty_json("not json <b>") == "not json <b>"
    long = clip("x" * 25, limit=10)
    assert (long.shown, long.total_chars, long.cut) == ("x" * 10, 25, True)
    assert not clip("short").cut


def test_usage_is_summed_by_a_field_and_charted_by_day() -> None:
    rows = [
        UsageRow("alice", "classify", "m1", attempts=2, cost_usd=Decimal("0.5")),
        UsageRow("bob", "classify", "m2", attempts=1, cost_usd=Decimal("2")),
        UsageRow("alice", "summarize", "m1", attempts=1, cost_usd=Decimal("0.25")),
    ]

    by_user = totals_by(rows, "user_id")
    bars = day_chart([("2026-12-01", rows[0]), ("2026-12-02", UsageRow(None, None, None)), ("2026-12-03", rows[1])])

    assert [(name, row.attempts, row.cost_usd) for name, row in by_user] == [
        ("bob", 1, Decimal(2)),
        ("alice", 3, Decimal("0.75")),
    ]
    assert [bar.height for bar in bars] == [35.5, 0.0, 142.0]  # a quarter, none, the highest
    assert [bar.label for bar in bars] == ["12-01", "12-02", "12-03"]
    assert bars[2].title == "2026-12-03: $2.00, 1 attempts, 0 tokens"


@pytest.mark.parametrize(
    ("environment", "name", "embedded", "dashboard"),
    [
        (
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "JOBS_QUEUE_URL": "http://127.0.0.1:5000/1/q"},
            "embedded stack",
            True,
            None,
        ),
        (
            {"JOBS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/123456789012/prod-jobs"},
            "prod",
            False,
            "https://eu-west-1.console.aws.amazon.com/cloudwatch/home?region=eu-west-1#dashboards:name=prod-jobs",
        ),
        ({"JOBS_QUEUE_URL": "https://queue.example/other"}, "aijobs-jobs", False, None),
    ],
)
def test_the_banner_names_the_stack_the_client_acts_on(
    environment: dict[str, str], name: str, embedded: bool, dashboard: str | None
) -> None:
    target = StackTarget.from_settings(load_settings(BASE | environment))

    assert (target.name, target.embedded, target.dashboard_url) == (name, embedded, dashboard)


def test_took_is_counted_in_milliseconds_not_from_times_written_to_the_second() -> None:
    # Given jobs created late in one second and ended early in the next, or within one second
    created = 1_800_000_000_900
    job = succeeded_job_at(created, finished_at=created + 300)
    within = succeeded_job_at(created - 800, finished_at=created - 500)

    # Then each took 300 ms, as the table stored it, though their times are written to the second
    assert [took(JobView.from_job(each)) for each in (job, within)] == ["300 ms", "300 ms"]
    assert took(JobView.from_job(succeeded_job_at(created, finished_at=None))) == "-"


def succeeded_job_at(created_at: int, finished_at: int | None) -> Job:
    status = JobStatus.RUNNING if finished_at is None else JobStatus.SUCCEEDED
    return Job(
        job_id="job-1",
        job_type="classify",
        user_id="user-1",
        status=status,
        created_at=created_at,
        updated_at=finished_at or created_at,
        started_at=created_at + 10,
        finished_at=finished_at,
        max_attempts=3,
    )


def outline(created_at: int, status: JobStatus, code: ErrorCode | None = None) -> JobOutline:
    finished = created_at + 1_000 if status.is_terminal else None
    return JobOutline(f"job-{created_at}", "alice", "classify", Lane.INTERACTIVE, status, created_at, finished, code)


def test_the_overview_counts_every_state_and_each_failure_code_and_stacks_them_by_hour() -> None:
    # Given a day's window ending at 10:30 UTC, with jobs at 09:10 and 10:05, and one 23 hours before
    until = 1_796_207_400_000  # 2026-12-02T10:30:00Z
    hour = 3_600_000
    jobs = [
        outline(until - 25 * 60_000, JobStatus.FAILED, ErrorCode.PROVIDER_REJECTED),
        outline(until - 26 * 60_000, JobStatus.FAILED, ErrorCode.DEADLINE_EXCEEDED),
        outline(until - 27 * 60_000, JobStatus.FAILED, ErrorCode.PROVIDER_REJECTED),
        outline(until - 80 * 60_000, JobStatus.SUCCEEDED),
        outline(until - 81 * 60_000, JobStatus.QUEUED, ErrorCode.PROVIDER_RATE_LIMITED),  # waiting, not failed
        outline(until - 23 * hour, JobStatus.SUCCEEDED),
    ]

    figures = overview(JobOutlines(jobs, 6, jobs[-1].created_at, True), until - 24 * hour, until, "24h")

    # Then each state is counted, and failed jobs by their code, most first
    assert figures.by_status == [
        (JobStatus.QUEUED, 1),
        (JobStatus.RUNNING, 0),
        (JobStatus.WAITING, 0),
        (JobStatus.SUCCEEDED, 2),
        (JobStatus.FAILED, 3),
        (JobStatus.CANCELLED, 0),
    ]
    assert figures.by_error == [(ErrorCode.PROVIDER_REJECTED, 2), (ErrorCode.DEADLINE_EXCEEDED, 1)]
    # and the chart has a bar an hour from 10:00 the day before to 10:00, the 10:00 one the highest
    assert (figures.highest, figures.bar_span) == (3, "1 h")
    assert [(tick.label, tick.anchor) for tick in figures.ticks][:2] == [("10:00", "start"), ("13:00", "middle")]
    assert figures.ticks[-1] == Tick(717.12, "10:00", "end")
    stacked = [(part.status, part.title) for part in figures.segments]
    assert stacked == [
        ("succeeded", "2026-12-01 11:00 UTC: 1 succeeded"),
        ("succeeded", "2026-12-02 09:00 UTC: 1 succeeded"),
        ("queued", "2026-12-02 09:00 UTC: 1 queued"),
        ("failed", "2026-12-02 10:00 UTC: 3 failed"),
    ]
    assert [part.height for part in figures.segments] == [47.33, 47.33, 47.33, 142.0]  # a third, or all, of the room


def test_the_overview_greys_the_bars_older_than_the_jobs_it_read() -> None:
    until = 1_796_207_400_000
    jobs = [outline(until - 10 * 60_000, JobStatus.SUCCEEDED), outline(until - 130 * 60_000, JobStatus.SUCCEEDED)]

    figures = overview(JobOutlines(jobs, 2, jobs[-1].created_at, False), until - 86_400_000, until, "24h")

    uncounted = [part for part in figures.segments if part.status == "uncounted"]
    # The 25 bars from 10:00 the day before: all before 08:00 (the oldest job read was created at 08:20)
    assert len(uncounted) == 22
    assert uncounted[-1].title == "2026-12-02 07:00 UTC: not counted"


def test_a_batch_key_is_named_by_its_window_its_model_and_a_short_id() -> None:
    now = 1_800_000_000_000
    record = batch_record("1800000000000", "1800000000001-a1b2c3d4e5f6", now, "batch_1")

    name = batch_name(BatchView.from_record(record))

    assert str(name) == "window 2027-01-15 08:00:00 UTC · gpt-4o-mini · #a1b2c3"
    assert name.key == record.key
    odd = BatchView.from_record(replace(record, key="made-by-hand"))
    assert str(batch_name(odd)) == "made-by-hand"


def test_the_batches_page_shows_one_window_or_one_batch_on_asking() -> None:
    assert BatchesQuery.parse({"window": "1800000000000"}).window_at == "2027-01-15T08:00:00Z"
    assert BatchesQuery.parse({"batch_id": "batch_1"}).selects
    for params, message in (
        ({"window": "soon"}, "window: 'soon' is not a batch window"),
        ({"batch_id": "x" * 300}, "batch_id: 'xxx"),
        ({"batch_id": "a\nb"}, "batch_id: 'a\\\\nb' is not a provider's batch id"),
        ({"window": "1800000000000", "batch_id": "b"}, "window and batch_id: ask for one or the other"),
    ):
        with pytest.raises(ValueError, match="^" + message):
            BatchesQuery.parse(params)


def test_a_bulk_retry_names_each_job_once_and_at_most_a_page_of_them() -> None:
    assert retry_ids(["a", "b", "a", " c "]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"^job_id: at most 100 jobs are retried a request, not 101$"):
        retry_ids([f"job-{number}" for number in range(101)])
    with pytest.raises(ValueError, match=r"^job_id: name at least one job"):
        retry_ids([])
    with pytest.raises(ValueError, match="is not a job id"):
        retry_ids(["a/b"])
