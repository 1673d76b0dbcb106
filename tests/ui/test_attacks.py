"""The dashboard as an attacker tries it: LLM output that means to run in the page, a page on another
origin that posts to it, a Host it does not serve (DNS rebinding), and the headers every answer carries."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from aijobs.ui.guard import CONTENT_SECURITY_POLICY
from aijobs.ui.server import DashboardServer
from engine.core import JobStatus
from tests.ui.conftest import HOSTILE, HOSTILE_BODY, Jobs, Watched

TEMPLATES = Path(__file__).resolve().parents[2] / "aijobs" / "ui" / "templates"


def assert_nothing_ran(watched: Watched) -> None:
    """No element came of the hostile text, nothing of it ran or was even tried (a CSP refusal is logged)."""
    assert watched.page.locator("script:not([src]), img, [onerror]").count() == 0
    assert watched.page.evaluate("window.__pwned") is None
    assert watched.dialogs == []
    assert watched.errors == []
    assert not [message for message in watched.console if "Content Security Policy" in message]


def test_llm_output_with_script_and_onerror_shows_as_text_and_runs_nothing(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    watched = Watched(page)

    page.goto(f"{dashboard.url}jobs/{jobs.hostile}")

    # The text is there, to the letter, in the output and the input
    expect(page.locator("#output")).to_contain_text(HOSTILE.replace('"', '\\"'))
    expect(page.locator("#input")).to_contain_text("<script>window.__pwned")
    expect(page.locator("#input")).to_contain_text("<img src=x onerror=")
    # and none of it became an element, ran, or was even tried
    assert_nothing_ran(watched)
    page.screenshot(path=screenshots / "job-hostile.png")


def test_a_provider_s_words_about_a_batch_show_as_text_and_run_nothing(
    page: Page, dashboard: DashboardServer, jobs: Jobs
) -> None:
    watched = Watched(page)

    page.goto(f"{dashboard.url}batches?all=1")

    ended = page.locator(f'table.batches tbody tr:has(td[title="{jobs.batch_ended.key}"])')
    expect(ended).to_contain_text(f"completed: {HOSTILE}")
    assert_nothing_ran(watched)


def test_a_dead_letter_s_body_shows_as_text_cut_and_downloads_as_bytes(
    page: Page, dashboard: DashboardServer, jobs: Jobs, screenshots: Path
) -> None:
    watched = Watched(page)
    page.goto(f"{dashboard.url}dead-letters")

    page.get_by_role("link", name=jobs.hostile_letter).click()

    # The body as text, to the letter, cut at what a page shows; its attributes as text too
    page.wait_for_url(f"{dashboard.url}dead-letters/{jobs.hostile_letter}")
    shown = page.locator("#body").inner_text()
    assert shown == HOSTILE_BODY[:10_000]
    expect(page.locator("#content")).to_contain_text(f"the first 10,000 of {len(HOSTILE_BODY):,} characters")
    source = page.locator(".facts dt", has_text="attribute source").locator("xpath=following-sibling::dd[1]")
    expect(source).to_have_text(HOSTILE)
    expect(page.locator(".facts")).to_contain_text("its body names no job")
    assert_nothing_ran(watched)
    page.screenshot(path=screenshots / "dead-letter.png")

    # The whole body is a download of bytes, never a page
    with page.expect_download() as download:
        page.get_by_role("link", name="Download the body").click()
    assert Path(download.value.path()).read_text() == HOSTILE_BODY
    answer = httpx.get(f"{dashboard.url}dead-letters/{jobs.hostile_letter}/body")
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == f'attachment; filename="{jobs.hostile_letter}.body"'
    assert httpx.get(f"{dashboard.url}dead-letters/no-such-message").status_code == 404


def test_no_template_lets_text_through_unescaped() -> None:
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text()
        for unsafe in ("|safe", "| safe", "Markup", "autoescape false", "<script>", "style="):
            assert unsafe not in text, f"{template.name} has {unsafe!r}"


@pytest.fixture
def attacker() -> Iterator[tuple[str, dict[str, str]]]:
    """A page on another origin (another port: another origin, the same site), serving what it is given."""
    pages: dict[str, str] = {}

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "referrer_policy",
    [
        "strict-origin-when-cross-origin",  # the browser sends the attacker's Origin
        "no-referrer",  # the browser sends `Origin: null`, and Sec-Fetch-Site: same-site
    ],
)
def test_a_form_on_another_origin_cannot_cancel_a_job(
    page: Page,
    acting_dashboard: DashboardServer,
    jobs: Jobs,
    attacker: tuple[str, dict[str, str]],
    referrer_policy: str,
) -> None:
    origin, pages = attacker
    pages["/"] = (
        f'<meta name="referrer" content="{referrer_policy}">'
        f'<form id="f" method="post" action="{acting_dashboard.url}jobs/{jobs.queued}/cancel"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )

    with page.expect_response(lambda response: response.url.endswith("/cancel")) as answer:
        page.goto(f"{origin}/")

    assert answer.value.status == 403
    expect(page.locator("body")).to_contain_text("refused")
    assert jobs.client.get(jobs.queued).status is JobStatus.QUEUED


def test_a_form_on_another_origin_cannot_retry_failed_jobs(
    page: Page, acting_dashboard: DashboardServer, jobs: Jobs, attacker: tuple[str, dict[str, str]]
) -> None:
    # Given a failed job, and a page elsewhere that posts the bulk retry's forms, asking and confirming
    failed = jobs.failed_now(f"{jobs.user}-csrf", 1)
    origin, pages = attacker
    for name, path in (("ask", "/jobs/retry-failed"), ("confirm", "/jobs/retry-failed/confirm")):
        pages[f"/{name}"] = (
            f'<form id="f" method="post" action="{acting_dashboard.url.rstrip("/")}{path}">'
            f'<input name="job_id" value="{failed[0]}"><input name="status" value="failed"></form>'
            '<script>document.getElementById("f").submit()</script>'
        )

        # When it is opened, its form is refused, and the job stays failed
        with page.expect_response(lambda response, path=path: response.url.endswith(path)) as answer:
            page.goto(f"{origin}/{name}")
        assert answer.value.status == 403
        assert jobs.client.get(failed[0]).status is JobStatus.FAILED
    # Nor can a request that says nothing of where it comes from
    confirm = f"{acting_dashboard.url}jobs/retry-failed/confirm"
    assert httpx.post(confirm, data={"job_id": failed[0]}).status_code == 403
    assert jobs.client.get(failed[0]).status is JobStatus.FAILED


def test_a_request_without_origin_fetch_metadata_or_referer_is_refused(
    acting_dashboard: DashboardServer, jobs: Jobs
) -> None:
    cancel = f"{acting_dashboard.url}jobs/{jobs.queued}/cancel"
    ours = acting_dashboard.url.rstrip("/")

    assert httpx.post(cancel).status_code == 403
    assert httpx.post(cancel, headers={"origin": "null"}).status_code == 403
    assert httpx.post(cancel, headers={"origin": "http://127.0.0.1:1"}).status_code == 403
    assert httpx.post(cancel, headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert httpx.post(cancel, headers={"referer": "http://evil.example/page"}).status_code == 403
    assert jobs.client.get(jobs.queued).status is JobStatus.QUEUED
    # What the guard lets through, the page then answers (a job that does not exist: 404)
    missing = f"{acting_dashboard.url}jobs/no-such-job/cancel"
    assert httpx.post(missing, headers={"origin": ours}).status_code == 404
    assert httpx.post(missing, headers={"origin": "null", "sec-fetch-site": "same-origin"}).status_code == 404
    assert httpx.post(missing, headers={"referer": f"{ours}/jobs"}).status_code == 404


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "[::2]:80", ""])
def test_a_host_it_does_not_serve_is_refused(dashboard: DashboardServer, host: str) -> None:
    # A name that an attacker's DNS points at 127.0.0.1 reaches the socket, not the pages
    answer = httpx.get(f"{dashboard.url}jobs", headers={"host": host})

    assert answer.status_code == 421
    assert "answers to 127.0.0.1, ::1, localhost only" in answer.text
    assert answer.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST"])
def test_loopback_names_are_served(dashboard: DashboardServer, host: str) -> None:
    answer = httpx.get(f"{dashboard.url}jobs", headers={"host": f"{host}:{dashboard.port}"})

    assert answer.status_code == 200


def test_every_answer_carries_the_security_headers(dashboard: DashboardServer, jobs: Jobs) -> None:
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    for path in ("jobs", f"jobs/{jobs.hostile}", f"jobs/{jobs.hostile}/output.json", "static/refresh.js", "nowhere"):
        answer = httpx.get(f"{dashboard.url}{path}")
        headers = answer.headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert headers["x-content-type-options"] == "nosniff", path
        assert headers["referrer-policy"] == "no-referrer", path
        assert headers["x-frame-options"] == "DENY", path
    download = httpx.get(f"{dashboard.url}jobs/{jobs.hostile}/output.json")
    assert download.headers["content-type"] == "application/json"
    assert download.headers["content-disposition"].startswith("attachment;")
