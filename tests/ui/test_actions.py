"""Cancel, retry and redrive in a real Chromium: absent and refused on a read-only dashboard, and
changing the job's state from the dashboard's own pages when it is started with --allow-actions."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect

from aijobs.client import os_user
from aijobs.local.devstack import local_session
from aijobs.ui.server import DashboardServer
from engine.config import Settings
from engine.core import Job, JobStatus
from engine.definitions import JobRegistry
from engine.definitions.pipelines import EXTRACT_REVIEWED
from engine.pipelines import ChildEnds, Pipelines, children_ids
from engine.wiring import Aws, build_queues
from tests.ui.conftest import CLASSIFY_INPUT, Jobs

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
    page.goto(f"{dashboard.url}jobs?user={jobs.user}&status=failed")
    assert page.get_by_role("button", name=re.compile("Retry the")).count() == 0

    # Even a same-origin POST, which the guard lets through, is refused by the read-only dashboard
    for path in (
        f"/jobs/{jobs.failed}/retry",
        f"/jobs/{jobs.queued}/cancel",
        f"/dead-letters/{jobs.dead_letter_message}/redrive",
        "/jobs/retry-failed",
        "/jobs/retry-failed/confirm",
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


def test_a_bulk_retry_asks_naming_the_failed_jobs_shown_then_retries_each(
    page: Page, acting_dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    # Given a user with three failed jobs and one that succeeded
    user = f"{jobs.user}-bulk"
    failed = jobs.failed_now(user, 3)
    succeeded = jobs.client.submit("classify", user, CLASSIFY_INPUT, job_id=f"{user}-ok").job_id
    jobs.run(succeeded)
    waiting = jobs.client.health().queues["interactive"].waiting
    page.goto(f"{acting_dashboard.url}jobs?user={user}")

    # When the jobs page's bulk retry is pressed, a page asks first, naming each failed job shown
    page.get_by_role("button", name="Retry the 3 failed jobs shown").click()
    page.wait_for_url(f"{acting_dashboard.url}jobs/retry-failed")
    expect(page.get_by_role("status")).to_contain_text("Retry these 3 failed jobs?")
    assert sorted(page.locator("table.jobs tbody tr td:first-child").all_inner_texts()) == failed
    page.screenshot(path=screenshots / "retry-failed.png", full_page=True)
    assert {jobs.client.get(job_id).status for job_id in failed} == {JobStatus.FAILED}  # asking changed nothing

    # Then confirming retries each of them, and only them
    page.get_by_role("button", name="Retry 3 jobs").click()
    page.wait_for_url(f"{acting_dashboard.url}jobs/retry-failed/confirm")
    expect(page.get_by_role("status")).to_have_text("3 of 3 jobs queued again.")
    assert {jobs.client.get(job_id).status for job_id in failed} == {JobStatus.QUEUED}
    assert jobs.client.get(succeeded).status is JobStatus.SUCCEEDED
    assert jobs.client.health().queues["interactive"].waiting == waiting + 3  # a message each

    # And back on the jobs page, with its filter, there is nothing failed left to retry
    page.get_by_role("link", name="Back to the jobs").click()
    page.wait_for_url(f"{acting_dashboard.url}jobs?user={user}")
    assert page.get_by_role("button", name=re.compile("Retry the")).count() == 0


def test_a_bulk_retry_retries_at_most_a_page_of_jobs_a_request_and_says_what_each_came_to(
    acting_dashboard: DashboardServer, jobs: Jobs
) -> None:
    user = f"{jobs.user}-limit"
    [failed] = jobs.failed_now(user, 1)
    confirm = f"{acting_dashboard.url}jobs/retry-failed/confirm"
    ours = {"origin": acting_dashboard.url.rstrip("/")}

    # More than a page of jobs is refused whole, with one line; nothing is retried
    too_many = {"job_id": [failed] + [f"{user}-{number}" for number in range(100)]}
    refused = httpx.post(confirm, data=too_many, headers=ours)
    assert refused.status_code == 400
    assert "at most 100 jobs are retried a request, not 101" in refused.text
    assert jobs.client.get(failed).status is JobStatus.FAILED

    # Within the limit each job is retried through the client's retry, and each outcome said
    answer = httpx.post(confirm, data={"job_id": [failed, jobs.succeeded, "no-such-job"]}, headers=ours)
    assert answer.status_code == 200
    assert jobs.client.get(failed).status is JobStatus.QUEUED
    assert jobs.client.get(jobs.succeeded).status is JobStatus.SUCCEEDED
    assert "1 of 3 jobs queued again." in answer.text
    assert f"job {jobs.succeeded} is succeeded; only a failed job can be retried" in answer.text
    assert "job no-such-job does not exist" in answer.text


INVOICE = {
    "text": "Invoice 4711: EUR 120.50.",
    "fields": [{"name": "total", "description": "the invoice's total", "type": "number"}],
}


def in_review(jobs: Jobs, settings: Settings) -> str:
    """An extract_reviewed job waiting for its review, moved on as the worker and the stream move it."""
    job_id = jobs.client.submit("extract_reviewed", jobs.user, INVOICE, job_id=f"review-{uuid.uuid4().hex[:6]}").job_id
    registry = JobRegistry()
    queues = build_queues(settings, Aws(settings, local_session()))
    pipelines = Pipelines(jobs.store, queues, registry)

    def advance() -> None:
        parent = jobs.store.claim_job(job_id, "ui-worker", 60_000, int(time.time() * 1000), None)
        raw = jobs.store.get_input(job_id) or {}
        pipelines.advance(parent, EXTRACT_REVIEWED, EXTRACT_REVIEWED.parse_input(raw), raw)

    advance()
    (fields,) = children_ids(stored(jobs, job_id))[0]
    jobs.run(fields, {"total": 120.5})
    ChildEnds(jobs.store, queues, registry).ended([stored(jobs, fields)])
    advance()
    return job_id


def stored(jobs: Jobs, job_id: str) -> Job:
    job = jobs.store.get_job(job_id)
    assert job is not None
    return job


def test_a_review_is_approved_with_an_edit_and_recorded_as_the_dashboards(
    page: Page, acting_dashboard: DashboardServer, jobs: Jobs, settings: Settings
) -> None:
    job_id = in_review(jobs, settings)
    page.goto(f"{acting_dashboard.url}jobs/{job_id}")
    expect(page.locator(".proposed-output")).to_contain_text("120.5")

    page.locator("textarea[name=output]").fill('{"total": 121}')
    page.get_by_role("button", name="Approve").click()

    expect(page.locator(".facts .status")).to_have_text("succeeded")
    view = jobs.client.get(job_id)
    assert view.output == {"total": 121}
    assert view.pipeline is not None
    assert view.pipeline.review is not None
    assert (view.pipeline.review.decision, view.pipeline.review.changed) == ("approved", True)
    assert view.pipeline.review.by == (f"dashboard ({os_user()})" if os_user() else "dashboard")
    expect(page.get_by_text(f"approved by {view.pipeline.review.by}")).to_be_visible()
