"""`aijobs submit` and `aijobs status` against the stack on a moto server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from aijobs.cli import app
from aijobs.stack import StackResources
from tests.support.contract import USAGE_FIELDS, VIEW_FIELDS

CLASSIFY_INPUT = json.dumps({"text": "Win a cruise!", "labels": ["spam", "ham"]})


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def queued_messages(queue_url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs")
    received = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    return [json.loads(message["Body"]) for message in received.get("Messages", [])]


def test_submit_creates_a_queued_job_and_enqueues_a_reference(endpoint_env: StackResources) -> None:
    # Given the stack, When a job is submitted with an id
    result = run("submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "cli-1")

    # Then the id is printed, the job is queued, and the queue holds a message naming it
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "cli-1"
    assert queued_messages(endpoint_env.queue_url) == [{"job_id": "cli-1"}]
    status = run("status", "cli-1", "--json")
    view = json.loads(status.stdout)
    assert list(view) == VIEW_FIELDS
    assert view["status"] == "queued"
    assert view["attempt_count"] == 0
    assert view["max_attempts"] == 3
    assert view["usage"] == dict.fromkeys(USAGE_FIELDS, 0)


def test_submit_is_idempotent_on_the_job_id(endpoint_env: StackResources) -> None:
    first = run(
        "submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "cli-2", "--json"
    )
    second = run(
        "submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "cli-2", "--json"
    )

    assert json.loads(first.stdout) == {"job_id": "cli-2", "created": True, "status": "queued"}
    assert json.loads(second.stdout) == {"job_id": "cli-2", "created": False, "status": "queued"}


def test_submit_refuses_a_reused_id_with_other_content(endpoint_env: StackResources) -> None:
    run("submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "cli-3")
    other = json.dumps({"text": "Lunch at noon?", "labels": ["spam", "ham"]})

    result = run("submit", "--type", "classify", "--user", "u-1", "--input", other, "--job-id", "cli-3")

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: job cli-3 already exists with a different job type, user or input"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--type", "classify", "--input", json.dumps({"text": "x", "labels": ["a"]})], "input.labels"),
        (["--type", "translate", "--input", CLASSIFY_INPUT], "no job type 'translate' is registered (known:"),
        (["--type", "classify", "--input", "{not json"], "--input is not valid JSON"),
        (["--type", "classify", "--input", "[1]"], "--input must be a JSON object"),
        (["--type", "classify", "--input", "@/nonexistent/input.json"], "No such file"),
    ],
)
def test_submit_errors_are_one_line_and_write_nothing(
    endpoint_env: StackResources, args: list[str], message: str
) -> None:
    result = run("submit", "--user", "u-1", "--job-id", "cli-bad", *args)

    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert run("status", "cli-bad").exit_code == 1
    assert queued_messages(endpoint_env.queue_url) == []


def test_submit_reads_the_input_from_a_file(endpoint_env: StackResources, tmp_path: Any) -> None:
    path = tmp_path / "input.json"
    path.write_text(CLASSIFY_INPUT)

    result = run("submit", "--type", "classify", "--user", "u-1", "--input", f"@{path}", "--job-id", "cli-file")

    assert result.exit_code == 0, result.output
    assert json.loads(run("status", "cli-file", "--json").stdout)["job_type"] == "classify"


def test_status_of_an_unknown_job_is_one_line(endpoint_env: StackResources) -> None:
    result = run("status", "no-such-job", "--json")

    assert result.exit_code == 1
    assert result.stderr.strip() == "error: job no-such-job does not exist"


def test_a_missing_setting_is_named(endpoint_env: StackResources, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBS_QUEUE_URL")

    result = run("status", "anything")

    assert result.exit_code == 1
    assert result.stderr.strip() == "error: JOBS_QUEUE_URL: Field required"


def test_with_nothing_configured_the_error_names_the_ways_out(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("JOBS_", "AIJOBS_")):
            monkeypatch.delenv(name)

    result = run("status", "anything")

    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: no stack configured: pass --stack NAME (or set AIJOBS_STACK), "
        "or set JOBS_TABLE_NAME, JOBS_QUEUE_URL and JOBS_PAYLOAD_BUCKET"
    )


def test_the_console_script_runs(endpoint_env: StackResources) -> None:
    # The installed entry point, in a fresh process, against the same endpoint.
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "aijobs",
            "submit",
            "--type",
            "classify",
            "--user",
            "u-1",
            "--input",
            CLASSIFY_INPUT,
            "--job-id",
            "cli-proc",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["job_id"] == "cli-proc"
