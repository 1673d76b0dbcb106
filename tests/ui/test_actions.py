"""Cancel, retry and redrive in a real Chromium: absent and refused on a read-only dashboard, and
changing the job's state from the dashboard's own pages when it is started with --allow-actions."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from aijobs.ui.server import DashboardServer
from engine.core import JobStatus
from tests.ui.conftest import Jobs

POST_FROM_THIS_PAGE = "async path => (await fetch(path, {method: 'POST'})).status"


def test_a_read_only_dashboard_offers_no_action_and_refuses_one_from_its_own_page(
    page: Page, dashboard: DashboardServer, jobs: Jobs
) -> None:
    page.goto(f"{dashboard.url}jobs/{jobs.failed}")
    expect(page.locator("#banner")).to_contain_text("read-only")
    assert page.get_by_role("button", name="Retry").count() == 0
    page.goto(f"{dashboard.url}jobs/{jobs.queued}")
    assert page.get_by_role("button", name="Cancel").count() == 0
    page.goto(f"{dashboard.url}dead-letters")
    assert page.get_by_role("button", name="Redrive").count() == 0

    # Even a same-origin POST, which the guard lets through, is refused by the read-only dashboard
    for path in (
        f"/jobs/{jobs.failed}/retry",
        f"/jobs/{jobs.queued}/cancel",
        f"/dead-letters/{jobs.dead_letter_message}/redrive",
    ):
        assert page.evaluate(POST_FROM_THIS_PAGE, path) == 403

    assert jobs.client.get(jobs.failed).status is JobStatus.FAILED
    assert jobs.client.get(jobs.queued).status is JobStatus.QUEUED
    assert jobs.client.get(jobs.dead_lettered).status is JobStatus.FAILED


def test_cancel_ends_a_queued_job(page: Page, acting_dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{acting_dashboard.url}jobs/{jobs.queued}")
    expect(page.locator("#banner")).to_contain_text("actions on: cancel, retry and redrive act on embedded stack")

    page.get_by_role("button", name="Cancel").click()

    page.wait_for_url(f"{acting_dashboard.url}jobs/{jobs.queued}?done=cancel-cancelled")
    expect(page.get_by_role("status")).to_have_text("Cancelled.")
    expect(page.locator(".facts .status")).to_have_text("cancelled")
    assert jobs.client.get(jobs.queued).status is JobStatus.CANCELLED
    assert page.get_by_role("button", name="Cancel").count() == 0


def test_retry_puts_a_failed_job_back_in_the_queue(page: Page, acting_dashboard: DashboardServer, jobs: Jobs) -> None:
    waiting = jobs.client.health().queues["interactive"].waiting
    page.goto(f"{acting_dashboard.url}jobs/{jobs.failed}")

    page.get_by_role("button", name="Retry").click()

    expect(page.get_by_role("status")).to_contain_text("Queued again")
    expect(page.locator(".facts .status")).to_have_text("queued")
    assert jobs.client.get(jobs.failed).status is JobStatus.QUEUED
    assert jobs.client.health().queues["interactive"].waiting == waiting + 1  # its message is on the queue


def test_redrive_queues_the_job_a_dead_letter_names(page: Page, acting_dashboard: DashboardServer, jobs: Jobs) -> None:
    page.goto(f"{acting_dashboard.url}dead-letters")

    page.locator("tr", has_text=jobs.dead_letter_message).get_by_role("button", name="Redrive").click()

    page.wait_for_url(f"{acting_dashboard.url}jobs/{jobs.dead_lettered}?done=redriven")
    expect(page.get_by_role("status")).to_contain_text("queued again")
    assert jobs.client.get(jobs.dead_lettered).status is JobStatus.QUEUED


def test_an_action_the_job_refuses_is_one_line_and_changes_nothing(
    page: Page, acting_dashboard: DashboardServer, jobs: Jobs
) -> None:
    page.goto(f"{acting_dashboard.url}jobs/{jobs.succeeded}")

    assert page.evaluate(POST_FROM_THIS_PAGE, f"/jobs/{jobs.succeeded}/retry") == 409
    page.goto(f"{acting_dashboard.url}jobs/{jobs.succeeded}")
    expect(page.locator(".facts .status")).to_have_text("succeeded")
