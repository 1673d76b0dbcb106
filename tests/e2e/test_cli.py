"""`aijobs submit` and `aijobs status` against the stack on a moto server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from aijobs.cli import app
from aijobs.stack import StackResources
from tests.support.cli import run
from tests.support.contract import USAGE_FIELDS, VIEW_FIELDS

CLASSIFY_INPUT = json.dumps({"text": "Win a cruise!", "labels": ["spam", "ham"]})


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
        (
            ["--type", "classify", "--input", json.dumps({"text": "x", "labels": ["a"]})],
            "error: --input: labels: List should have at least 2 items after validation, not 1",
        ),
        (
            ["--type", "classify", "--input", json.dumps({"txt": "x", "labels": ["a", "b"]})],
            "error: --input: unknown field 'txt' (classify takes text, labels)",
        ),
        (
            ["--type", "classify", "--input", json.dumps({"labels": ["a", "b"]})],
            "error: --input: missing field 'text' (classify takes text, labels)",
        ),
        (
            ["--type", "answer_with_citations", "--input", json.dumps({"question": "q", "documents": [{"id": "a"}]})],
            "error: --input: missing field 'text' in documents[0]",
        ),
        (
            ["--type", "translate", "--input", CLASSIFY_INPUT],
            "error: --type: no job type 'translate' is registered (known: answer_with_citations, classify,",
        ),
        (["--type", "classify", "--input", "{not json"], "error: --input: not valid JSON: Expecting property name"),
        (
            ["--type", "classify", "--input", '{"text": NaN}'],
            "error: --input: not valid JSON: NaN is not a JSON number",
        ),
        (["--type", "classify", "--input", "[1]"], "error: --input: must be a JSON object, not list"),
        (
            ["--type", "classify", "--input", "@/nonexistent/input.json"],
            "error: --input: cannot read @/nonexistent/input.json: no such file",
        ),
        (
            ["--type", "classify", "--input", CLASSIFY_INPUT, "--user", "u 2"],
            "error: --user: 'u 2' is not a user id: 1-128 characters of A-Z a-z 0-9 . _ : @ -",
        ),
        (
            ["--type", "classify", "--input", CLASSIFY_INPUT, "--max-attempts", "11"],
            "error: --max-attempts: Input should be less than or equal to 10",
        ),
        (
            ["--type", "classify", "--input", CLASSIFY_INPUT, "--deadline-seconds", "5"],
            "error: --deadline-seconds: Input should be greater than or equal to 60",
        ),
    ],
)
def test_submit_errors_are_one_line_naming_the_flag_and_write_nothing(
    endpoint_env: StackResources, args: list[str], message: str
) -> None:
    result = run("submit", "--user", "u-1", "--job-id", "cli-bad", *args)

    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(message), lines[0]
    assert run("status", "cli-bad").exit_code == 1
    assert queued_messages(endpoint_env.queue_url) == []


def test_a_bad_job_id_is_named_by_its_flag(endpoint_env: StackResources) -> None:
    result = run("submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "a b")

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: --job-id: 'a b' is not a job id: 1-128 characters of A-Z a-z 0-9 . _ : -"
    ]
    assert queued_messages(endpoint_env.queue_url) == []


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--user", "a b"],
        ["usage", "--user", "a b"],
        ["budget", "show", "--user", "a b"],
        ["budget", "set", "--user", "a b", "--daily-usd", "1"],
    ],
)
def test_a_bad_user_is_one_line_naming_the_flag_in_every_command(endpoint_env: StackResources, args: list[str]) -> None:
    result = run(*args)

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: --user: 'a b' is not a user id: 1-128 characters of A-Z a-z 0-9 . _ : @ -"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--status", "bogus"], "error: Invalid value for '--status': "),
        (["list", "--limit", "0"], "error: Invalid value for '--limit': "),
        (["submit", "--user", "u-1"], "error: Missing option '--type'."),
        (["dev", "--quite"], "error: No such option: --quite (Possible options: --quiet"),
        (["status"], "error: Missing argument 'job_id'."),
    ],
)
def test_a_flag_missing_unknown_or_of_a_bad_value_is_one_line_pointing_to_the_help(
    endpoint_env: StackResources, args: list[str], message: str
) -> None:
    result = run(*args)

    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(message), lines[0]
    # (typer's test runner calls the program `root`, the console script `aijobs`)
    assert re.search(rf"\(see `\w+ {args[0]} --help`\)$", lines[0]), lines[0]
    assert result.stdout == ""


def test_a_commands_help_wraps_its_paragraphs_to_the_terminal_not_to_the_source() -> None:
    result = CliRunner().invoke(app, ["dev", "--help"], terminal_width=200, env={"COLUMNS": "200"})

    assert result.exit_code == 0
    # One paragraph of the docstring, written over four source lines: one line at 200 columns.
    (line,) = [line for line in result.stdout.splitlines() if "in memory only" in line]
    assert "it is gone when it stops, and a new start begins empty" in line


@pytest.mark.parametrize("args", [[], ["budget"]])
def test_a_group_without_a_command_shows_its_help(args: list[str]) -> None:
    result = run(*args)

    assert result.exit_code == 0
    assert "Usage:" in result.stdout
    assert result.stderr == ""


def test_an_endpoint_on_this_machine_that_does_not_answer_is_one_line_saying_to_start_aijobs_dev(
    endpoint_env: StackResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")

    result = run("status", "anything")

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f'error: Could not connect to the endpoint URL: "http://127.0.0.1:{port}/": is `aijobs dev` running? '
        "(start it, then use the exports it prints)"
    ]


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
