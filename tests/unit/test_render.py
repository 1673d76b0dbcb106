"""How `aijobs inspect` and `aijobs dead-letters` read to people: what a job is doing now, its
attempts, and dead letters shown as written (their text is never markup); costs and JSON numbers
never in E notation; attempts counted against the budget named apart from calls and records."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console, RenderableType

from aijobs.amounts import usd
from aijobs.client import RedriveOutcome, RedriveResult
from aijobs.events import event_line
from aijobs.render import (
    COMPACT,
    REUSED_NOTE,
    budgets_table,
    dead_letters_table,
    inspection_group,
    job_table,
    jobs_table,
    json_line,
    redrive_json,
    redrive_line,
    routes_table,
    stats_json,
    usage_json,
    usage_table,
)
from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    ChildOf,
    DeadLetterEntry,
    ErrorCode,
    Job,
    JobErrorInfo,
    JobHistory,
    JobStatus,
    PipelineState,
    Review,
    Usage,
    Via,
)
from engine.core.job_types import VersionStats
from engine.fleet.budgets import BudgetDay
from engine.store import UsageRow
from engine.views import AttemptView, DeadLetterView, JobInspection, JobView

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def text_of(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


QUEUED = Job(
    job_id="job-1",
    job_type="classify",
    user_id="user-1",
    status=JobStatus.QUEUED,
    created_at=NOW - 60_000,
    updated_at=NOW - 1_000,
    max_attempts=3,
)


def job(status: JobStatus, **changes: Any) -> Job:
    return replace(QUEUED, status=status, **changes)


def attempt(number: int, outcome: AttemptOutcome, error_code: ErrorCode | None = None) -> AttemptRecord:
    return AttemptRecord(
        job_id="job-1",
        attempt=number,
        user_id="user-1",
        job_type="classify",
        started_at=NOW - 10_000,
        finished_at=NOW - 8_500,
        outcome=outcome,
        error_code=error_code,
        provider="openai",
        tier="primary",
        model="gpt-4o-mini",
        calls=2,
        input_tokens=812,
        output_tokens=40,
        cost_usd=Decimal("0.00021"),
        standard_cost_usd=Decimal("0.00021"),
        cached_input_tokens=512,
        reasoning_tokens=16,
    )


NO_HISTORY = JobHistory(attempts=[], dead_letters=[])


@pytest.mark.parametrize(
    ("state", "now_ms", "shown"),
    [
        (
            job(JobStatus.RUNNING, lease_owner="w-1", lease_expires_at=NOW + 60_000),
            NOW,
            "running: lease held by w-1 until 2027-01-15T08:01:00Z",
        ),
        (
            job(JobStatus.RUNNING, lease_owner="w-1", lease_expires_at=NOW - 1),
            NOW,
            "lease of w-1 expired at 2027-01-15T07:59:59Z",
        ),
        (job(JobStatus.QUEUED), NOW, "queued: waiting for a worker"),
        (
            job(
                JobStatus.QUEUED,
                error=JobErrorInfo(ErrorCode.BUDGET_EXCEEDED, "waiting: user user-1 has spent its budget", True),
            ),
            NOW,
            "queued, waiting: user user-1 has spent its budget (budget_exceeded)",
        ),
        (
            job(
                JobStatus.QUEUED,
                error=JobErrorInfo(ErrorCode.PROVIDER_UNAVAILABLE, "provider unavailable (HTTP 503)", True),
            ),
            NOW,
            "queued: retrying after provider_unavailable: provider unavailable (HTTP 503)",
        ),
    ],
)
def test_inspect_says_what_a_job_that_has_not_ended_is_doing(state: Job, now_ms: int, shown: str) -> None:
    inspection = JobInspection.of(state, NO_HISTORY, now_ms)

    assert shown in text_of(inspection_group(inspection))


def test_inspect_of_a_finished_job_shows_each_attempt_and_the_dead_letters_naming_it() -> None:
    history = JobHistory(
        attempts=[
            attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_TIMEOUT),
            attempt(2, AttemptOutcome.SUCCEEDED),
        ],
        dead_letters=[DeadLetterEntry("m-1", NOW, 100, "reached the dead-letter queue after 100 receives", "job-1")],
    )

    text = text_of(inspection_group(JobInspection.of(job(JobStatus.SUCCEEDED, finished_at=NOW), history, NOW)))

    rows = [line for line in text.splitlines() if "gpt-4o-mini (primary)" in line]
    assert len(rows) == 2
    for cell in ("1.5 s", "812", "512", "40", "16", "$0.000210", "retryable", "provider_timeout"):
        assert cell in rows[0]
    assert "succeeded" in rows[1]
    assert "dead letters naming this job" in text
    assert "reached the dead-letter queue after 100 receives" in text
    assert "waiting" not in text
    assert "lease" not in text


def test_a_job_without_attempts_says_so() -> None:
    assert "no attempt recorded" in text_of(inspection_group(JobInspection.of(job(JobStatus.QUEUED), NO_HISTORY, NOW)))


def test_dead_letters_are_shown_as_written_never_as_markup() -> None:
    letter = DeadLetterView.from_entry(DeadLetterEntry("m-[bold]1", NOW, 1, "message body is [red]not[/] JSON", None))

    text = text_of(dead_letters_table([letter]))

    assert "m-[bold]1" in text
    assert "message body is [red]not[/] JSON" in text


def test_a_job_s_error_and_output_are_shown_as_written_never_as_markup() -> None:
    failed = job(
        JobStatus.FAILED,
        error=JobErrorInfo(ErrorCode.PROVIDER_REJECTED, "model [bold]x[/] refused [/]", False),
        output={"label": "[red]spam[/]"},
    )

    text = text_of(job_table(JobView.from_job(failed)))

    assert "provider_rejected: model [bold]x[/] refused [/]" in text
    assert '{"label": "[red]spam[/]"}' in text


def test_a_data_job_shows_the_version_of_its_job_type_it_runs_and_a_code_job_its_type_alone() -> None:
    # Given a data job that ran v2 of its job type, one not yet claimed, and a code job
    ran = job(JobStatus.SUCCEEDED, job_type="triage_ticket", job_type_version=2)
    unclaimed = job(JobStatus.QUEUED, job_type="triage_ticket")

    def type_row(one: Job) -> str:
        rows = text_of(job_table(JobView.from_job(one))).splitlines()
        return next(row for row in rows if row.startswith("type ")).split(maxsplit=1)[1].strip()

    # When each is shown, then the type row names the version where there is one
    assert type_row(ran) == "triage_ticket v2"
    assert type_row(unclaimed) == "triage_ticket"
    assert type_row(QUEUED) == "classify"


def test_redrive_results_read_as_one_line_each_and_as_json() -> None:
    skipped = RedriveResult(
        "m-1", "job-1", RedriveOutcome.SKIPPED, "job job-1 is running; only a failed job can be retried"
    )
    no_job = RedriveResult("m-2", None, RedriveOutcome.NO_JOB, "names no job; not re-sent")

    assert redrive_line(skipped) == "m-1: skipped, job job-1 is running; only a failed job can be retried"
    assert redrive_line(no_job) == "m-2: names no job; not re-sent"
    assert redrive_json(no_job) == {
        "message_id": "m-2",
        "job_id": None,
        "outcome": "no_job",
        "detail": "names no job; not re-sent",
    }


# --- attempts, calls and records --------------------------------------------------------------------


def rate_limited_then_answered() -> JobInspection:
    """A job whose first call was refused with a 429 (recorded, not counted) and whose second answered."""
    history = JobHistory(
        attempts=[
            replace(attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_RATE_LIMITED), calls=1),
            replace(attempt(2, AttemptOutcome.SUCCEEDED), calls=2),
        ],
        dead_letters=[],
    )
    usage = Usage(input_tokens=812, output_tokens=40, cost_usd=Decimal("0.00021"), attempts=2)
    done = job(JobStatus.SUCCEEDED, attempt_count=1, finished_at=NOW, usage=usage)
    return JobInspection.of(done, history, NOW)


def rows_of(text: str) -> dict[str, str]:
    return {line.split()[0]: " ".join(line.split()[1:]) for line in text.splitlines() if line.strip()}


def test_the_job_table_names_attempts_counted_apart_from_the_calls_made() -> None:
    inspection = rate_limited_then_answered()

    rows = rows_of(text_of(job_table(inspection.job, inspection.attempts)))

    assert rows["attempts"] == "1 of 3"
    assert rows["calls"] == "3"  # the refused call, then an answer and its re-ask
    assert rows["tokens"] == "812 in / 40 out"
    assert rows["via"] == "realtime"


def test_inspect_says_why_its_attempt_records_outnumber_the_attempts_counted() -> None:
    text = text_of(inspection_group(rate_limited_then_answered()))

    assert "attempt records" in text
    assert "2 records, 1 counted as attempts: rate-limited calls, and attempts before a retry, are not counted" in text


def test_inspect_shows_each_attempt_s_cache_writes_when_some_attempt_wrote_the_prompt_cache() -> None:
    # Given a Claude job whose first attempt wrote the prompt cache and whose second read it
    history = JobHistory(
        attempts=[
            replace(attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_UNAVAILABLE), cache_write_input_tokens=300),
            replace(attempt(2, AttemptOutcome.SUCCEEDED), cached_input_tokens=300, cache_write_input_tokens=0),
        ],
        dead_letters=[],
    )
    done = job(JobStatus.SUCCEEDED, attempt_count=2, finished_at=NOW)

    # When it is inspected
    text = text_of(inspection_group(JobInspection.of(done, history, NOW)))
    rows = table_rows(text)

    # Then each attempt's row holds its cache writes beside its cache reads
    header = next(line for line in text.splitlines() if "reasoning" in line)
    columns = [cell.strip() for cell in header.split("┃")[7:12]]
    assert columns == ["input", "cached", "cache write", "output", "reasoning"]
    assert rows["1"][5:10] == ["812", "512", "300", "40", "16"]
    assert rows["2"][5:10] == ["812", "300", "0", "40", "16"]


def test_inspect_shows_no_cache_write_column_when_no_attempt_wrote_the_cache() -> None:
    text = text_of(inspection_group(rate_limited_then_answered()))

    assert "cache write" not in text


def test_inspect_shows_what_each_attempt_would_have_cost_in_real_time_when_a_route_paid_less() -> None:
    # Given a job whose batch line failed (paid at the batch price) and whose real-time retry answered
    history = JobHistory(
        attempts=[
            replace(
                attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_UNAVAILABLE),
                via=Via.BATCH,
                batch_id="msgbatch_1",
                standard_cost_usd=Decimal("0.00042"),
            ),
            attempt(2, AttemptOutcome.SUCCEEDED),
        ],
        dead_letters=[],
    )
    done = job(JobStatus.SUCCEEDED, attempt_count=2, finished_at=NOW)

    # When it is inspected
    text = text_of(inspection_group(JobInspection.of(done, history, NOW)))
    rows = table_rows(text)

    # Then each attempt's cost stands beside what the same calls would have cost in real time
    header = next(line for line in text.splitlines() if "reasoning" in line)
    assert [cell.strip() for cell in header.split("┃")[11:14]] == ["cost", "in real time", "outcome"]
    assert rows["1"][9:12] == ["$0.000210", "$0.000420", "retryable"]
    assert rows["2"][9:12] == ["$0.000210", "$0.000210", "succeeded"]


def test_inspect_shows_no_real_time_column_when_every_attempt_paid_the_real_time_price() -> None:
    # Given attempts made in real time at the standard tier (their standard cost is their cost)
    history = JobHistory(attempts=[attempt(1, AttemptOutcome.SUCCEEDED)], dead_letters=[])

    # When the job is inspected
    text = text_of(inspection_group(JobInspection.of(job(JobStatus.SUCCEEDED, attempt_count=1), history, NOW)))

    # Then the table has no column that would repeat the cost
    assert "in real time" not in text


def test_inspect_of_a_job_waiting_after_one_refused_call_counts_its_one_record_in_the_singular() -> None:
    # Given a queued job whose only call the flex tier refused (a record, not counted as an attempt)
    refused = replace(attempt(1, AttemptOutcome.RETRYABLE, ErrorCode.PROVIDER_RATE_LIMITED), calls=1, via=Via.FLEX)
    waiting = job(
        JobStatus.QUEUED,
        attempt_count=0,
        error=JobErrorInfo(ErrorCode.PROVIDER_RATE_LIMITED, "the provider's flex tier is unavailable (HTTP 429)", True),
    )

    # When inspect shows it
    text = text_of(inspection_group(JobInspection.of(waiting, JobHistory([refused], []), NOW)))

    # Then the caption reads as English
    assert "1 record, 0 counted as attempts: rate-limited calls" in text
    assert "1 records" not in text


def test_the_list_shows_attempts_as_the_job_view_does() -> None:
    inspection = rate_limited_then_answered()

    text = text_of(jobs_table([inspection.job]))

    assert "1/3" in text
    assert "$0.000210" in text


def test_usage_counts_attempt_records_under_their_own_name() -> None:
    row = UsageRow("u-1", "classify", "gpt-4o-mini", "interactive", attempts=2, cost_usd=Decimal("1E-7"))

    text = text_of(usage_table([row], title="usage"))

    header = next(line for line in text.splitlines() if "user" in line and "model" in line)
    assert "records" in header
    assert "attempts" not in header
    assert "$0.0000001" in text


def reused_inspection() -> JobInspection:
    """job-2, which took the answer job-1 paid for: one attempt record, no call, no cost."""
    paid = replace(
        attempt(1, AttemptOutcome.SUCCEEDED),
        job_id="job-2",
        calls=0,
        input_tokens=0,
        output_tokens=0,
        cached_input_tokens=0,
        reasoning_tokens=0,
        cost_usd=Decimal(0),
        via=Via.REUSE,
        reused_from="job-1",
    )
    reused = job(
        JobStatus.SUCCEEDED,
        job_id="job-2",
        attempt_count=1,
        claim_count=1,
        finished_at=NOW,
        output={"label": "spam"},
        usage=Usage(attempts=1),
        reused_from="job-1",
    )
    return JobInspection.of(reused, JobHistory(attempts=[paid], dead_letters=[]), NOW)


def test_status_and_inspect_of_a_reused_answer_name_the_job_that_paid_for_it() -> None:
    inspection = reused_inspection()

    rows = rows_of(text_of(job_table(inspection.job, inspection.attempts)))
    text = text_of(inspection_group(inspection))

    assert rows["via"] == "reuse of job-1: its answer, no call made"
    assert (rows["calls"], rows["tokens"], rows["cost"]) == ("0", "0 in / 0 out", "$0.000000")
    assert "#1 took the answer job job-1 paid for" in text


def test_usage_counts_reused_jobs_and_says_what_they_are_only_when_there_are_some() -> None:
    called = UsageRow("u-1", "classify", "gpt-4o-mini", "interactive", attempts=3, cost_usd=Decimal("0.0003"))
    reused = replace(called, user_id="u-2", attempts=2, cost_usd=Decimal(0), reused=2)

    with_reuse = text_of(usage_table([called, reused], title="usage"))
    without = text_of(usage_table([called], title="usage"))

    header = next(line for line in with_reuse.splitlines() if "user" in line and "model" in line)
    assert header.split()[-2:] == ["reused", "┃"]
    assert REUSED_NOTE in with_reuse
    total = next(line for line in with_reuse.splitlines() if "total" in line).split("│")
    assert (total[5].strip(), total[-2].strip()) == ("5", "2")  # 5 records, 2 of them reused
    assert "reused" not in without
    assert usage_json(reused)["reused"] == 2


def route_rows() -> list[UsageRow]:
    """A day's usage: real time, batch and flex attempts of two job types, one attempt answered by reuse."""

    def row(job_type: str, via: str, cost: str, standard: str, **sums: Any) -> UsageRow:
        amounts = {"cost_usd": Decimal(cost), "standard_cost_usd": Decimal(standard)}
        return UsageRow("u-1", job_type, "gpt-5-mini", "background", via=via, **amounts, **sums)

    return [
        row(
            "classify",
            "realtime",
            "0.30",
            "0.30",
            attempts=3,
            cached_input_tokens=500,
            cache_savings_usd=Decimal("0.01"),
        ),
        row("classify", "flex", "0.50", "1.00", attempts=10),
        row("summarize", "flex", "0.25", "0.50", attempts=4),
        row("summarize", "batch", "1.00", "2.00", attempts=20),
        row("summarize", "reuse", "0", "0", attempts=2),
    ]


def test_usage_shows_a_row_per_user_job_type_model_and_lane_whatever_their_routes() -> None:
    text = text_of(usage_table(route_rows(), title="usage"))

    # summarize's flex, batch and reuse attempts in one row; then classify's realtime and flex ones
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines()]
    assert [row[:2] + row[4:5] for row in cells if row and row[0] == "u-1"] == [
        ["u-1", "summarize", "26"],
        ["u-1", "classify", "13"],
    ]
    assert table_rows(text)["total"][3] == "39"  # every attempt record counted once


def table_rows(text: str) -> dict[str, list[str]]:
    """A rich table's rows by their first cell: the other cells, stripped."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_cost_by_route_shows_each_route_beside_the_standard_real_time_cost_and_the_saving() -> None:
    rows = table_rows(text_of(routes_table(route_rows())))

    assert rows["realtime"] == ["3", "$0.300000", "$0.300000", "$0.000000"]
    assert rows["batch"] == ["20", "$1.000000", "$2.000000", "$1.000000"]
    assert rows["flex"] == ["14", "$0.750000", "$1.500000", "$0.750000"]
    assert rows["reuse"] == ["2", "$0.000000", "$0.000000", "$0.000000"]
    assert rows["prompt cache"] == ["500 cached tokens", "", "", "$0.010000"]
    # The total: its cost, the same calls in real time at the standard tier, and both savings
    assert rows["total"] == ["39", "$2.050000", "$3.800000", "$1.760000"]


def test_a_route_no_attempt_took_is_shown_at_zero_and_every_route_in_order() -> None:
    rows = table_rows(text_of(routes_table([])))

    assert [name for name in rows if name != "route"] == ["realtime", "batch", "flex", "reuse", "prompt cache", "total"]
    assert rows["flex"] == ["0", "$0.000000", "$0.000000", "$0.000000"]


def test_a_usage_row_as_json_names_its_route_its_standard_cost_and_its_saving() -> None:
    flex = route_rows()[1]

    document = usage_json(flex)

    assert (document["via"], document["cost_usd"], document["standard_cost_usd"], document["saved_usd"]) == (
        "flex",
        0.5,
        1.0,
        0.5,
    )


# --- costs and JSON numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        (Decimal("1E-7"), "$0.0000001"),
        (Decimal("0.00021"), "$0.000210"),
        (Decimal(0), "$0.000000"),
        (Decimal("12.5"), "$12.500000"),
        (Decimal("1E+3"), "$1000.000000"),
        (1.74e-05, "$0.0000174"),
        (7.5e-08, "$0.000000075"),
        (0.0, "$0.000000"),
    ],
)
def test_a_cost_reads_in_plain_dollars(amount: Decimal | float, shown: str) -> None:
    assert usd(amount) == shown


@given(st.decimals(min_value=0, max_value=10**6, places=10, allow_nan=False, allow_infinity=False))
def test_every_cost_to_ten_places_is_shown_exactly_and_never_in_e_notation(amount: Decimal) -> None:
    shown = usd(amount)

    assert "E" not in shown.upper()
    assert Decimal(shown.removeprefix("$")) == amount


def test_budgets_read_in_plain_dollars() -> None:
    day = BudgetDay("u-1", "2027-01-15", Decimal("0.000001"), Decimal("1E-7"), Decimal(0), Decimal("9E-7"))

    text = text_of(budgets_table([day]))

    assert "$0.0000001" in text
    assert "$0.0000009" in text


def test_an_event_line_reads_its_cost_in_plain_dollars() -> None:
    event = {"time": "t", "detail-type": "Job Succeeded", "detail": {"job_id": "j", "usage": {"cost_usd": 1.74e-05}}}

    assert "cost=$0.0000174" in event_line(event)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_json_lines_mean_what_json_dumps_means(value: Any) -> None:
    for separators in (COMPACT, (", ", ": ")):
        assert json.loads(json_line(value, separators)) == json.loads(json.dumps(value))


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_json_lines_write_every_float_in_plain_notation(number: float) -> None:
    written = json_line({"cost_usd": number})

    assert "e" not in written.lower()
    parsed = json.loads(written)["cost_usd"]
    assert isinstance(parsed, float)
    assert parsed == number or (number == 0 and parsed == 0 and math.copysign(1, parsed) == math.copysign(1, number))


def test_json_lines_write_a_job_view_s_cost_as_printed_before_but_in_plain_notation() -> None:
    view = rate_limited_then_answered().job.model_dump(mode="json")
    view["usage"]["cost_usd"] = 1.74e-05

    written = json_line(view)

    assert '"cost_usd": 0.0000174' in written
    assert written == json.dumps(view, ensure_ascii=False).replace("1.74e-05", "0.0000174")


def test_attempt_views_keep_their_numbers() -> None:
    view = AttemptView.from_record(replace(attempt(1, AttemptOutcome.SUCCEEDED), cost_usd=Decimal("1E-7")))

    assert '"cost_usd": 0.0000001' in json_line(view.model_dump(mode="json"))


def test_an_event_line_of_a_reused_job_names_the_job_whose_answer_it_took() -> None:
    # Given the completion event of a job that took another's answer, with no call
    detail = {"job_id": "r-2", "job_type": "classify", "user_id": "u", "attempt_count": 1, "via": "reuse"}
    event = {"time": "t", "detail-type": "Job Succeeded", "detail": detail | {"reused_from": "r-1", "usage": {}}}
    paid = {"time": "t", "detail-type": "Job Succeeded", "detail": detail | {"via": None, "reused_from": None}}

    # Then its line says which job paid, where it says nothing of the kind for a job that made its call
    assert event_line(event).split("  ")[-2:] == ["cost=$0.000000", "reused_from=r-1"]
    assert "reused_from" not in event_line(paid)


def test_a_review_events_line_says_who_decided_what() -> None:
    event = {
        "time": "2026-12-03T01:02:11Z",
        "detail-type": "Job Reviewed",
        "detail": {
            "job_id": "inv-1",
            "job_type": "extract_reviewed",
            "user_id": "acme",
            "decision": "rejected",
            "by": "ana",
        },
    }

    line = event_line(event)

    assert line.split("  ") == [
        "2026-12-03T01:02:11Z",
        "Job Reviewed",
        "inv-1",
        "type=extract_reviewed",
        "user=acme",
        "decision=rejected",
        "by=ana",
    ]


def pipeline_children(parent_id: str, steps: list[tuple[str, int]]) -> list[Job]:
    """A pipeline's children as the store reads them: `(step name, how many)` per step, in order."""
    return [
        job(
            JobStatus.SUCCEEDED,
            job_id=f"{parent_id}:s{index}:{part}",
            job_type="summarize",
            finished_at=NOW,
            usage=Usage(input_tokens=100, output_tokens=10, attempts=1),
            parent=ChildOf(parent_id, name, index, part),
        )
        for index, (name, count) in enumerate(steps)
        for part in range(count)
    ]


def test_inspect_lists_a_pipeline_s_children_under_the_name_of_their_step() -> None:
    # Given a summarize_long that ended: 3 parts, then the summary
    parent = job(
        JobStatus.SUCCEEDED,
        job_id="long-1",
        job_type="summarize_long",
        finished_at=NOW,
        pipeline=PipelineState(step=1, children=1, ended=frozenset({0}), counts=(3, 1)),
    )
    children = pipeline_children("long-1", [("parts", 3), ("summary", 1)])

    # When it is inspected
    text = text_of(inspection_group(JobInspection.of(parent, NO_HISTORY, NOW, children)))

    # Then each child's row names its step, in the order of the steps
    rows = [line.split("│")[1:3] for line in text.splitlines() if "long-1:s" in line]
    assert [(step.strip(), child.strip()) for step, child in rows] == [
        ("parts", "long-1:s0:0"),
        ("parts", "long-1:s0:1"),
        ("parts", "long-1:s0:2"),
        ("summary", "long-1:s1:0"),
    ]
    assert rows_of(text_of(job_table(JobView.from_job(parent))))["step"] == "2: 1 of 1 children ended"


def test_status_of_a_pipeline_waiting_for_a_review_says_until_when_and_how_to_decide() -> None:
    # Given an extract_reviewed whose fields wait for a person
    review = Review(output={"total": 120.5}, started_at=NOW, timeout_ms=3_600_000)
    waiting = job(
        JobStatus.WAITING,
        job_id="invoice-77",
        job_type="extract_reviewed",
        pipeline=PipelineState(step=1, children=0, counts=(1, 0), review=review),
    )

    # When its status is shown
    rows = rows_of(text_of(job_table(JobView.from_job(waiting))))

    # Then it says it waits for a review, until when, and the command that decides it
    assert rows["step"] == (
        "2, a review: waiting for a person until 2027-01-15T09:00:00Z "
        "(aijobs review invoice-77 --approve | --reject --reason TEXT)"
    )
    # and inspect shows the output proposed
    assert '"total": 120.5' in text_of(inspection_group(JobInspection.of(waiting, NO_HISTORY, NOW)))


def test_status_of_a_decided_review_says_who_decided_what() -> None:
    review = Review(
        output={"total": 120.5},
        started_at=NOW,
        timeout_ms=60_000,
        decision="rejected",
        by="ana",
        at=NOW + 1_000,
        reason="the total is wrong",
    )
    rejected = job(
        JobStatus.FAILED,
        job_type="extract_reviewed",
        pipeline=PipelineState(step=1, children=0, counts=(1, 0), review=review),
    )

    rows = rows_of(text_of(job_table(JobView.from_job(rejected))))

    assert rows["step"] == "2, a review: rejected by ana at 2027-01-15T08:00:01Z: the total is wrong"


def test_status_of_a_child_names_its_pipeline_and_step() -> None:
    (child,) = pipeline_children("long-1", [("parts", 1)])

    rows = rows_of(text_of(job_table(JobView.from_job(child))))

    assert rows["pipeline"] == "a child of long-1, for its step parts"


def test_a_versions_stats_as_json_give_costs_as_numbers_not_long_decimal_strings() -> None:
    row = VersionStats(version=2, jobs=3, succeeded=3, cost_usd=Decimal("0.0000798486"))

    document = json.loads(json_line(stats_json(row)))

    assert (document["cost_usd"], document["cost_per_job_usd"]) == (0.0000798486, 0.0000266162)
