"""`aijobs dev` and `aijobs demo` as a user runs them: separate processes, every wait bounded.

The demo runs in the background from the start of this module, while the `dev` test runs.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aijobs.demo import sample_jobs
from tests.support.dev_process import AIJOBS, DevProcess, clean_environment
from tests.support.waiting import eventually

DEMO_SECONDS = 180.0
DEMO_JOBS = len(sample_jobs("count"))
# The document jobs, run where the job types take attachments (aijobs.demo.document_jobs).
DOCUMENT_JOBS = [job.job_id.split("-", 1)[1] for job in sample_jobs("count") if job.attachments]
EXPORTED = {
    "JOBS_EVENTS_QUEUE_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "JOBS_TABLE_NAME",
    "JOBS_QUEUE_URL",
    "JOBS_DLQ_URL",
    "AI_BASE_URL",
}


def post_events_to_a_webhook(environment: dict[str, str]) -> list[dict[str, Any]]:
    """Run `aijobs events --webhook URL` against a local receiver until it got an event (bounded)."""
    received: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        for _ in range(10):  # the event arrives within a second or two of the job's end
            run = subprocess.run(
                [*AIJOBS, "events", "--webhook", url], capture_output=True, text=True, env=environment, timeout=60
            )
            assert run.returncode == 0, run.stderr
            if received:
                break
        return received
    finally:
        server.shutdown()


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], Path, float]]:
    output = tmp_path_factory.mktemp("demo") / "demo.out"
    with output.open("w") as out:
        process = subprocess.Popen(
            [*AIJOBS, "demo"], stdout=out, stderr=subprocess.STDOUT, env=clean_environment(), text=True
        )
    started = time.monotonic()
    try:
        yield process, output, started
    finally:
        stop(process)


@pytest.fixture(autouse=True)
def _demo_in_background(demo_run: tuple[subprocess.Popen[str], Path, float]) -> None:
    """Start the demo with the module's first test, so that it runs alongside the others."""


def test_dev_prints_its_environment_then_ready_and_runs_jobs_its_dashboard_shows(tmp_path: Path) -> None:
    with DevProcess(
        ["--port", "0", "--provider-port", "0", "--ui", "--ui-port", "0"], clean_environment(), tmp_path
    ) as dev:
        exported = dev.exported
        assert exported.keys() >= EXPORTED
        assert exported["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        assert exported["AI_BASE_URL"].startswith("http://127.0.0.1:")

        # Another shell, with those exports: a job submitted there runs on the dev stack.
        job_input = {"text": "Please cancel my subscription", "labels": ["billing", "account", "spam"]}
        submitted = dev.aijobs(
            *("submit", "--type", "classify", "--user", "u-dev", "--input", json.dumps(job_input)),
            *("--job-id", "dev-e2e-1", "--wait", "--timeout", "30", "--json"),
        )
        assert submitted.returncode == 0, submitted.stderr
        view = json.loads(submitted.stdout)
        assert view["job_id"] == "dev-e2e-1"
        assert view["status"] == "succeeded"
        assert view["output"]["label"] in {"billing", "account", "spam"}
        assert view["usage"]["input_tokens"] > 0

        # The dashboard it serves shows the job, as the stack has it
        dashboard = dev.ui_url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", dashboard), dashboard
        listed = httpx.get(f"{dashboard}jobs", timeout=30)
        assert listed.status_code == 200
        assert "dev-e2e-1" in listed.text
        assert "embedded stack" in listed.text
        shown = httpx.get(f"{dashboard}jobs/dev-e2e-1", timeout=30)
        assert '<span class="status succeeded">succeeded</span>' in shown.text

        # Its completion event reaches a webhook that `aijobs events --webhook` POSTs to
        posted = post_events_to_a_webhook(clean_environment() | exported)
        assert [(event["detail-type"], event["detail"]["job_id"]) for event in posted] == [
            ("Job Succeeded", "dev-e2e-1")
        ]
        assert posted[0]["detail"]["output"] == view["output"]

        assert dev.terminate() == 0, dev.log


def test_dev_quiet_writes_the_functions_output_to_the_file_it_names_and_its_batch_flags_win_over_the_environment(
    tmp_path: Path,
) -> None:
    # Given batches off in the environment, and metric documents on (the functions' output to look for)
    environment = clean_environment() | {"AIJOBS_BATCH_API": "off"}
    del environment["POWERTOOLS_METRICS_DISABLED"]
    batches_on = ["--batch-api", "on", "--batch-window-seconds", "1", "--batch-poll-seconds", "1"]
    args = ["--port", "0", "--provider-port", "0", "--quiet", *batches_on, "--batch-rescue-seconds", "60"]

    with DevProcess([*args, "--batch-delay", "0"], environment, tmp_path) as dev:
        # Then it prints what another shell needs, and where the functions' output goes
        assert dev.exported["AIJOBS_BATCH_API"] == "on"
        assert dev.exported["AIJOBS_BATCH_WINDOW_SECONDS"] == "1"
        assert dev.log_path is not None

        # When a background job with a day to spare runs
        job_input = {"text": "Please cancel my subscription", "labels": ["billing", "account"]}
        submitted = dev.aijobs(
            *("submit", "--type", "classify", "--user", "u-quiet", "--input", json.dumps(job_input)),
            *("--lane", "background", "--job-id", "dev-quiet-1", "--wait", "--timeout", "120", "--json"),
            timeout=180,
        )

        # Then it went through a batch (the flag, not the environment), and its logs and metric
        # documents are in the file, not on the terminal
        assert submitted.returncode == 0, submitted.stderr
        view = json.loads(submitted.stdout)
        assert (view["status"], view["via"]) == ("succeeded", "batch")
        log_path = dev.log_path
        log = eventually(lambda: (text := log_path.read_text()) and '"CloudWatchMetrics"' in text and text)
        assert '"message":"job attempt finished"' in log
        assert '"job_id":"dev-quiet-1"' in log
        assert dev.later_lines() == []
        assert '"level"' not in dev.log
        assert "CloudWatchMetrics" not in dev.log
        assert dev.terminate() == 0, dev.log
    log_path.unlink()  # kept by `aijobs dev` for its user to read: not by a test


@pytest.mark.parametrize(
    ("args", "environment", "line"),
    [
        (
            ["--batch-window-seconds", "0"],
            {},
            "error: --batch-window-seconds: Input should be greater than or equal to 1",
        ),
        (["--batch-api", "maybe"], {}, "error: --batch-api: Value error, must be on or off, not 'maybe'"),
        ([], {"AIJOBS_BATCH_API": "maybe"}, "error: AIJOBS_BATCH_API: Value error, must be on or off, not 'maybe'"),
    ],
)
def test_a_bad_batch_setting_is_one_line_naming_the_flag_or_the_variable_it_came_from(
    args: list[str], environment: dict[str, str], line: str
) -> None:
    ran = subprocess.run(
        [*AIJOBS, "dev", "--port", "0", "--provider-port", "0", *args],
        capture_output=True,
        text=True,
        env=clean_environment() | environment,
        timeout=120,
        check=False,
    )

    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [line]
    assert "export" not in ran.stdout


def test_demo_ends_every_job_as_meant(demo_run: tuple[subprocess.Popen[str], Path, float]) -> None:
    process, output, started = demo_run

    try:
        returncode = process.wait(timeout=max(0.0, DEMO_SECONDS - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"`aijobs demo` still running after {DEMO_SECONDS:g}s:\n{output.read_text()[-3000:]}")

    text = output.read_text()
    assert returncode == 0, text[-3000:]
    assert f"{DEMO_JOBS} of {DEMO_JOBS}" in text
    assert "summary" in text
    assert "`aijobs dev --ui`" in text  # how to look at jobs like these in a browser
    # What its latencies are made of, so that they do not read as slowness
    explained = " ".join(line.strip("│ ") for line in text.splitlines() if "│" in line)
    assert "what they include" in explained
    for part in ("requests/min", "Retry-After", "wait for budget until their deadline", "wait for their batch"):
        assert part in explained, part
    # Each document job listed with what it carried; the panorama refused by the provider's limit.
    lines = text.splitlines()
    titles = [n for n, line in enumerate(lines) if line.strip() == "documents"]
    assert len(titles) == bool(DOCUMENT_JOBS)
    documents = " ".join(" ".join(lines[titles[0] :]).split()) if titles else ""
    for job in DOCUMENT_JOBS:
        assert f"│ {job} │" in documents, job
    if DOCUMENT_JOBS:
        assert "panorama.png: failed" in documents
        assert "attachment_invalid" in documents
