"""Each page in a real Chromium, as a person reads it: the jobs and their filters, the job-id box, the
cursor pages, a job's timeline, input and output, dead letters, usage, and the refresh with its pause."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect

from aijobs.ui import present
from aijobs.ui.server import DashboardServer
from engine.views import iso_timestamp
from tests.ui.conftest import BATCH_CACHED_TOKENS, LONG_SUMMARY, SUMMARIZE_INPUT, Jobs


def rows(page: Page) -> list[str]:
    """The job ids of the jobs table's rows, top to bottom."""
    return page.locator("table.jobs tbody tr td:first-child").all_inner_texts()


def test_the_jobs_page_lists_every_job_newest_first(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs?user={jobs.user}")

    expect(page.locator("#banner")).to_contain_text("embedded stack")
    expect(page.locator("#banner")).to_contain_text("read-only")
    assert rows(page) == list(reversed(jobs.all))  # made in that order, shown newest first
    failed = page.locator("tr", has_text=jobs.failed)
    expect(failed.locator(".status")).to_have_text("failed")
    expect(failed).to_contain_text("provider_rejected")
    expect(page.locator("#health")).to_contain_text("dead letters 2 in 24 h")
    page.screenshot(path=screenshots / "jobs.png", full_page=True)


def test_took_is_what_the_job_took_to_the_millisecond(page: Page, dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{dashboard.url}jobs?user={jobs.user}")

    for job_id in (jobs.succeeded, jobs.flaky, jobs.failed):
        job = jobs.store.get_job(job_id)
        assert job is not None
        assert job.finished_at is not None
        took = page.locator("tr", has_text=job_id).locator("td").nth(7)
        expect(took).to_have_text(present.duration(job.finished_at - job.created_at))
    expect(page.locator("tr", has_text=jobs.queued).locator("td").nth(7)).to_have_text("-")


def test_the_overview_counts_the_window_s_jobs_by_state_and_error_code(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs?user={jobs.user}")
    page.get_by_role("link", name="Counts of the last 24h").click()
    page.wait_for_url(f"{dashboard.url}overview?user={jobs.user}")

    # Every state with its jobs, and the failed ones by error code
    by_status = page.locator("table.by-status tbody tr")
    assert [row.locator("td").all_inner_texts() for row in by_status.all()] == [
        ["queued", "1"],
        ["running", "0"],
        ["waiting", "0"],
        ["succeeded", "4"],
        ["failed", "2"],
        ["cancelled", "0"],
    ]
    assert sorted(row.locator("td").all_inner_texts() for row in page.locator("table.by-error tbody tr").all()) == [
        ["dead_lettered", "1"],
        ["provider_rejected", "1"],
    ]
    expect(page.locator("#content .summary")).to_contain_text("7 jobs created in the last 24h match.")
    # The chart: the hour they were made in, stacked by state (each part titled with its jobs); the other
    # hours of the day empty
    parts = page.locator(".jobs-chart svg rect").evaluate_all(
        "rects => rects.map(rect => [rect.getAttribute('class'), rect.textContent])"
    )
    charted = Counter[str]()
    for status, title in parts:
        charted[status] += int(re.findall(r": (\d+) ", title)[0])
    assert charted == {"succeeded": 4, "failed": 2, "queued": 1}
    expect(page.locator(".jobs-chart .scale")).to_have_text(re.compile(r"^\d jobs in 1 h at the top$"))
    page.screenshot(path=screenshots / "overview.png", full_page=True)

    # A state's count leads to those jobs
    page.locator("table.by-status").get_by_role("link", name="failed").click()
    page.wait_for_url(re.compile(r"/jobs\?status=failed&user="))
    assert sorted(rows(page)) == sorted([jobs.failed, jobs.dead_lettered])

    # The background lane's jobs alone: one running in its batch, one its batch answered
    page.goto(f"{dashboard.url}overview?lane=background&since=7d")
    expect(page.locator("table.by-status tr", has_text="running").locator("td.num")).to_have_text("1")
    expect(page.locator("table.by-status tr", has_text="succeeded").locator("td.num")).to_have_text("1")
    expect(page.locator("select[name=since]")).to_have_value("7d")


def test_filters_are_kept_in_the_url_and_survive_a_reload(page: Page, dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{dashboard.url}jobs")

    page.select_option("select[name=status]", "failed")
    page.fill("input[name=user]", jobs.user)
    page.get_by_role("button", name="Show").click()

    page.wait_for_url(re.compile(r"status=failed"))
    assert f"user={jobs.user}" in page.url
    assert sorted(rows(page)) == sorted([jobs.failed, jobs.dead_lettered])
    page.reload()
    assert sorted(rows(page)) == sorted([jobs.failed, jobs.dead_lettered])
    expect(page.locator("select[name=status]")).to_have_value("failed")
    # The page read every job of the window (the filter on the user is applied to what it read)
    expect(page.locator("#content")).to_contain_text(f"2 of the {len(jobs.all) + len(jobs.background)} jobs")

    page.goto(f"{dashboard.url}jobs?user={jobs.user}&type=classify")
    assert sorted(rows(page)) == sorted([jobs.succeeded, jobs.failed])


def test_the_job_id_box_opens_a_job_or_says_there_is_none(page: Page, dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{dashboard.url}jobs")

    page.get_by_label("Job id").fill(jobs.flaky)
    page.get_by_label("Job id").press("Enter")

    page.wait_for_url(f"{dashboard.url}jobs/{jobs.flaky}")
    expect(page.locator("h1")).to_have_text(f"Job {jobs.flaky}")

    page.goto(f"{dashboard.url}jobs")
    page.get_by_label("Job id").fill("no-such-job")
    page.get_by_role("button", name="Open").click()
    expect(page.locator("#content")).to_contain_text("No job with id no-such-job")


def test_pages_follow_the_cursor_through_every_job_once(page: Page, dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{dashboard.url}jobs?user={jobs.user}&limit=3")

    seen = rows(page)
    assert len(seen) == 3
    while page.get_by_role("link", name="Older jobs").count():
        page.get_by_role("link", name="Older jobs").click()
        page.wait_for_load_state()
        assert "cursor=" in page.url
        assert "limit=3" in page.url
        seen += rows(page)

    assert seen == list(reversed(jobs.all))
    expect(page.locator(".pages")).to_contain_text("No older jobs")


def test_a_job_shows_its_attempt_timeline(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs/{jobs.flaky}")

    first, second = page.locator(".timeline .attempt").all()
    expect(first).to_contain_text("retryable")
    expect(first).to_contain_text("provider_unavailable")
    expect(second).to_contain_text("succeeded")
    for attempt in (first, second):
        expect(attempt).to_contain_text("gpt-4o-mini (primary)")
        expect(attempt).to_contain_text("realtime")
    expect(second).to_contain_text("100 in · 20 out")
    expect(page.locator(".facts")).to_contain_text("2 of 3")
    expect(page.locator("#output")).to_contain_text("Delivered at least once.")
    assert json.loads(page.locator("#input").inner_text()) == SUMMARIZE_INPUT
    page.screenshot(path=screenshots / "job.png", full_page=True)


def test_a_long_output_is_cut_with_the_whole_as_a_download(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs/{jobs.long}")

    shown = page.locator("#output").inner_text()
    assert len(shown) == 10_000
    expect(page.locator("#content")).to_contain_text("The first 10,000 of")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download the whole output").click()
    assert json.loads(Path(download.value.path()).read_text()) == {"summary": LONG_SUMMARY}
    page.screenshot(path=screenshots / "job-long.png")


def test_a_job_waiting_in_a_batch_is_marked_in_the_list_and_its_page_says_what_it_waits_for(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs?user={jobs.background_user}")
    window = jobs.batch_in_flight.key.split(".")[0]
    window_at = present.when(iso_timestamp(int(window)))

    # The job waiting in its batch is running, with a batch badge; the one its batch answered has none
    waiting = page.locator("tr", has_text=jobs.in_batch)
    expect(waiting.locator(".status")).to_have_text("running")
    expect(waiting.locator(".badge.batch")).to_have_text("batch")
    expect(waiting.locator(".badge.batch")).to_have_attribute(
        "title", re.compile(f"joined the window of {window_at} UTC")
    )
    expect(waiting.locator(".badge.batch")).to_have_attribute("href", f"/batches?window={window}")
    expect(waiting).to_contain_text("background")
    answered = page.locator("tr", has_text=jobs.batch_answered)
    expect(answered.locator(".status")).to_have_text("succeeded")
    expect(answered.locator(".badge")).to_have_count(0)
    page.screenshot(path=screenshots / "jobs-batched.png", full_page=True)

    # Its page says it waits for its batch, since the window it joined, with the way to the batches
    waiting.get_by_role("link", name=jobs.in_batch).click()
    via = page.locator(".facts dt", has_text="via").locator("xpath=following-sibling::dd[1]")
    expect(via).to_contain_text("waiting for its batch: it joined the batch window of")
    expect(via).to_contain_text(window_at)
    expect(page.locator(".timeline")).to_have_count(0)  # no attempt yet: its batch has not answered
    expect(page.locator("#content")).to_contain_text("Held by")
    page.screenshot(path=screenshots / "job-in-batch.png", full_page=True)

    # Its link goes to the batches of its window: the one in flight and the one ended, oldest first
    via.get_by_role("link", name="its batch").click()
    page.wait_for_url(f"{dashboard.url}batches?window={window}")
    expect(page.locator("#content")).to_contain_text(f"The batches of the window that opened {window_at} UTC")
    expect(page.locator("table.batches tbody tr")).to_have_count(2)


def test_a_job_its_batch_answered_shows_the_provider_s_batch_on_its_attempt(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs/{jobs.batch_answered}")

    expect(page.locator(".facts")).to_contain_text(f"batch {jobs.batch_answered_by}")
    [attempt] = page.locator(".timeline .attempt").all()
    expect(attempt).to_contain_text("succeeded")
    expect(attempt.locator("dt", has_text="via").locator("xpath=following-sibling::dd[1]")).to_have_text(
        f"batch {jobs.batch_answered_by}"
    )
    page.screenshot(path=screenshots / "job-batched.png", full_page=True)

    # Its batch id goes to that batch, ended, on the batches page
    page.locator(".facts").get_by_role("link", name=jobs.batch_answered_by).click()
    page.wait_for_url(f"{dashboard.url}batches?batch_id={jobs.batch_answered_by}")
    [row] = page.locator("table.batches tbody tr").all()
    expect(row.locator(".phase")).to_have_text("ended")
    expect(row.locator("code")).to_have_text(jobs.batch_answered_by)

    # A batch id no record holds is said to be gone, not guessed at
    page.goto(f"{dashboard.url}batches?batch_id=batch_gone")
    expect(page.locator("#content")).to_contain_text("No batch with this id among those in flight or ended")


def test_the_batches_page_lists_the_batches_in_flight_and_on_asking_the_ended_ones(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}jobs")
    page.get_by_role("link", name="Batches").click()
    page.wait_for_url(f"{dashboard.url}batches")

    # In flight: the pending batch, with its provider id, state, lines, age and rescue time; not the ended one
    rows = page.locator("table.batches tbody tr")
    expect(rows).to_have_count(1)
    pending = rows.first
    for text in ("pending: in_progress", "1 / 0", "0 / 0"):
        expect(pending).to_contain_text(text)
    # Its key as a person reads it: its window's start, its model, a short id; the whole key in its title
    window, _, first_part = jobs.batch_in_flight.key.split(".")
    window_at = present.when(iso_timestamp(int(window)))
    short_id = first_part.split("-")[1][:6]
    expect(pending.locator("td.key")).to_contain_text(f"window {window_at} UTC")
    expect(pending.locator("td.key small")).to_have_text(f"gpt-4o-mini · #{short_id}")
    expect(pending.locator("td.key")).to_have_attribute("title", jobs.batch_in_flight.key)
    expect(pending.locator("code", has_text="batch_pending")).to_have_text(jobs.batch_in_flight.batch_id or "")
    expect(pending).to_contain_text(re.compile(r"\b1\d min"))  # about ten minutes old
    expect(pending).to_contain_text(re.compile(r"in 5\d min"))  # rescued in about an hour
    page.screenshot(path=screenshots / "batches.png", full_page=True)

    # With the ended ones, kept in the URL: both, oldest first
    page.select_option("select[name=all]", "1")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"all=1"))
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text(jobs.batch_answered_by)
    expect(rows.first.locator(".phase")).to_have_text("ended")
    expect(rows.first).to_contain_text("completed")
    expect(rows.last.locator("td.key")).to_have_attribute("title", jobs.batch_in_flight.key)


def test_the_dead_letters_page_lists_the_message_and_its_job(
    page: Page, dashboard: DashboardServer, jobs: Jobs
) -> None:
    page.goto(f"{dashboard.url}dead-letters")

    row = page.locator("tr", has_text=jobs.dead_letter_message)
    expect(row).to_contain_text("reached the dead-letter queue after 100 receives")
    row.get_by_role("link", name=jobs.dead_lettered).click()
    expect(page.locator(".facts")).to_contain_text("dead_lettered")
    expect(page.locator("#content")).to_contain_text(jobs.dead_letter_message)


def test_usage_shows_cost_by_day_and_by_user_type_and_model(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.goto(f"{dashboard.url}usage?since=7d&user={jobs.user}")

    assert page.locator(".chart rect").count() == 8  # a bar for each UTC day of the last 7 days
    expect(page.locator("caption", has_text="By model").locator("xpath=..")).to_contain_text("gpt-4o-mini")
    expect(page.locator("caption", has_text="By job type").locator("xpath=..")).to_contain_text("summarize")
    expect(page.locator("caption", has_text="By user").locator("xpath=..")).to_contain_text(jobs.user)
    expect(page.locator("caption", has_text="By lane").locator("xpath=..")).to_contain_text("interactive")
    budget = page.locator("table.budgets tr", has_text=jobs.user)
    expect(budget).to_contain_text("$1.00")  # the cap set for the user, all of it left (no capped call)
    assert budget.locator("meter").get_attribute("max") == "1"
    page.screenshot(path=screenshots / "usage.png", full_page=True)


def test_usage_by_lane_shows_each_lane_with_its_cached_tokens(
    page: Page, dashboard: DashboardServer, jobs: Jobs
) -> None:
    page.goto(f"{dashboard.url}usage?since=7d")

    by_lane = page.locator("caption", has_text="By lane").locator("xpath=..")
    background = by_lane.locator("tbody tr", has_text="background")
    interactive = by_lane.locator("tbody tr", has_text="interactive")
    # The background lane's one attempt, answered by its batch, read 60 of its 100 input tokens from the cache
    expect(background.locator("td")).to_have_text(
        ["background", "1", "100", str(BATCH_CACHED_TOKENS), "20", re.compile(r"^\$")]
    )
    expect(interactive.locator("td.cached")).to_have_text("0")
    expect(page.locator("#content .summary")).to_contain_text(f"({BATCH_CACHED_TOKENS} of them cached")


def test_an_empty_list_says_so(page: Page, dashboard: DashboardServer, screenshots: Path) -> None:
    page.goto(f"{dashboard.url}jobs?since=1h&until=2020-01-01T00:00")

    expect(page.locator("#content")).to_contain_text("No jobs created in the 1h before 2020-01-01 00:00 UTC")
    assert rows(page) == []
    expect(page.locator("input[name=until]")).to_have_value("2020-01-01T00:00")
    page.screenshot(path=screenshots / "jobs-empty.png")

    page.goto(f"{dashboard.url}jobs?user=nobody-here")
    expect(page.locator("#content")).to_contain_text("No jobs match among the")


def test_a_narrow_window_scrolls_tables_not_the_page(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    for path in (
        f"jobs?user={jobs.user}",
        f"jobs/{jobs.long}",
        "usage",
        "batches?all=1",
        "overview",
        f"dead-letters/{jobs.hostile_letter}",
    ):
        page.goto(f"{dashboard.url}{path}")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"/{path} is wider than the window by {overflow}px"
    page.goto(f"{dashboard.url}jobs?user={jobs.user}")
    page.screenshot(path=screenshots / "jobs-narrow.png", full_page=True)


def test_the_page_refreshes_itself_until_paused(page: Page, dashboard: DashboardServer, jobs: Jobs) -> None:
    # Given the jobs of a user who has none yet, open with the page's clock in the test's hands
    user = f"{jobs.user}-later"
    page.clock.install()
    page.goto(f"{dashboard.url}jobs?user={user}")
    expect(page.locator("#content")).to_contain_text("No jobs")

    # When a job arrives and a refresh period passes, it shows without a reload
    first = jobs.client.submit("summarize", user, SUMMARIZE_INPUT).job_id
    page.clock.run_for(6_000)
    expect(page.locator("table.jobs")).to_contain_text(first)

    # When paused, nothing is fetched however long it stays open
    page.get_by_role("button", name="Pause refresh").click()
    expect(page.get_by_role("button", name="Resume refresh")).to_have_attribute("aria-pressed", "true")
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    second = jobs.client.submit("summarize", user, SUMMARIZE_INPUT).job_id
    page.clock.run_for(60_000)
    assert fetched == []
    expect(page.locator("table.jobs")).not_to_contain_text(second)

    # And resuming refreshes at once
    page.get_by_role("button", name="Resume refresh").click()
    expect(page.locator("table.jobs")).to_contain_text(second)


def test_each_page_is_one_read_of_the_table(dashboard: DashboardServer, jobs: Jobs) -> None:
    def requests(path: str) -> dict[str, int]:
        jobs.requests.clear()
        assert httpx.get(f"{dashboard.url}{path}", follow_redirects=False).status_code in {200, 303}
        return dict(jobs.requests)

    # A job: one Query of its partition (the job, its attempts, dead letters and input)
    assert requests(f"jobs/{jobs.flaky}") == {"dynamodb Query": 1}
    # A full page of jobs: one Query per shard of the day, side by side, and one BatchGetItem
    assert requests(f"jobs?user={jobs.user}&limit=3") == {"dynamodb Query": 8, "dynamodb BatchGetItem": 1}
    # The job-id box: one GetItem
    assert requests(f"jobs?job_id={jobs.flaky}") == {"dynamodb GetItem": 1}
    # The batches, in flight or all, or those of a window or a batch id: one Query of the batch records' partition
    assert requests("batches") == {"dynamodb Query": 1}
    assert requests("batches?all=1") == {"dynamodb Query": 1}
    assert requests(f"batches?window={jobs.batch_in_flight.key[:13]}") == {"dynamodb Query": 1}
    # The overview of a day's window: one Query per shard of each of the two UTC days it spans, and one
    # BatchGetItem per 100 of its jobs
    assert requests("overview") == {"dynamodb Query": 16, "dynamodb BatchGetItem": 1}
    # A dead letter: one GetItem
    assert requests(f"dead-letters/{jobs.hostile_letter}") == {"dynamodb GetItem": 1}
    # The health strip, on its own: each queue's depth (each lane's, the dead-letter queue), and the dead
    # letters of the two UTC days in 24 h
    assert requests("health") == {"sqs GetQueueAttributes": 3, "dynamodb Query": 2}


def test_a_job_that_took_a_paid_answer_names_the_job_that_paid_for_it(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    # Given two jobs of one request, of a user of their own: the second took the first's answer
    paid, reused = jobs.paid_and_reused()

    # When the second's page is read
    page.goto(f"{dashboard.url}jobs/{reused}")

    # Then it says how it got its answer, from which job, at no cost, over one attempt that made no call
    via = page.locator(".facts dt", has_text="via").locator("xpath=following-sibling::dd[1]")
    expect(via).to_have_text(f"reuse: the answer job {paid} paid for, no call made")
    expect(page.locator(".facts")).to_contain_text("$0.000000 over 1 attempt records")
    [attempt] = page.locator(".timeline .attempt").all()
    expect(attempt.locator("dt", has_text="via").locator("xpath=following-sibling::dd[1]")).to_have_text(
        f"reuse of {paid}"
    )
    expect(attempt.locator("dt", has_text="calls").locator("xpath=following-sibling::dd[1]")).to_have_text("0")
    page.screenshot(path=screenshots / "job-reused.png", full_page=True)

    # And the job it names is a link to the job that paid: a real-time call
    via.get_by_role("link", name=paid).click()
    page.wait_for_url(f"{dashboard.url}jobs/{paid}")
    expect(page.locator(".timeline .attempt")).to_contain_text("realtime")
