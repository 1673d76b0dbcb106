"""Every `aijobs` command against the embedded stack (DevStack: local AWS, local provider, in-process worker).

The CLI runs in this process (typer's CliRunner); jobs really run: the DevStack's pollers invoke the
worker handler, which calls the local provider over HTTP. Faults are asked of the provider through a
`fault:<kind>[*<count>]` marker in the job's input text; each job's text holds its own id, so counted
markers never share a prompt.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import boto3
import pytest
from typer.testing import Result

from aijobs.client import AiJobsClient
from aijobs.local.devstack import DevStack, DevStackOptions
from aijobs.local.provider import LocalProvider
from aijobs.stack import StackResources
from tests.support.cli import run
from tests.support.contract import USAGE_FIELDS, USAGE_ROW_FIELDS, VIEW_FIELDS
from tests.support.dev_process import clean_environment
from tests.support.waiting import eventually

LABELS = ["billing", "bug", "account", "spam"]
TERMINAL = {"succeeded", "failed", "cancelled"}
# Every wait in this module is bounded by this many seconds.
BOUND = 30.0


# --- the stack ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    # quiet: the worker handler's metrics (EMF on stdout) would land in the CliRunner's captured output.
    stack = DevStack(
        DevStackOptions(aws_port=0, provider_port=0, provider_latency_seconds=0, concurrency=2, quiet=True)
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


# --- helpers -----------------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def classify_input(job_id: str, fault: str | None = None) -> dict[str, Any]:
    marker = f" fault:{fault}" if fault else ""
    return {"text": f"My invoice shows the wrong amount ({job_id}){marker}", "labels": LABELS}


def summarize_input(job_id: str) -> dict[str, Any]:
    return {
        "text": f"SQS delivers each message at least once, so consumers must be idempotent ({job_id}).",
        "max_words": 12,
    }


def submit_args(job_id: str, user: str, job_input: dict[str, Any], job_type: str = "classify") -> list[str]:
    return ["submit", "--type", job_type, "--user", user, "--input", json.dumps(job_input), "--job-id", job_id]


def json_out(result: Result) -> Any:
    return json.loads(result.stdout)


def json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


def view_of(job_id: str) -> dict[str, Any]:
    result = run("status", job_id, "--json")
    assert result.exit_code == 0, result.output
    view: dict[str, Any] = json_out(result)
    return view


def wait_terminal(job_id: str) -> dict[str, Any]:
    final: dict[str, Any] = eventually(lambda: (view := view_of(job_id))["status"] in TERMINAL and view)
    return final


def submit_and_wait(job_id: str, user: str, job_input: dict[str, Any], job_type: str = "classify") -> dict[str, Any]:
    AiJobsClient.from_settings().submit(job_type, user, job_input, job_id=job_id)
    return wait_terminal(job_id)


# --- submit and status -------------------------------------------------------------------------------


def test_submit_of_a_600_kb_input_file_keeps_it_in_the_payload_bucket_and_runs_it(
    dev_env: DevStack, tmp_path: Any
) -> None:
    # Given an input file past what a DynamoDB item holds (seven documents of 100,000 characters)
    job_id = unique("sub-large")
    documents = [{"id": f"d{index}", "text": f"{job_id} " + "lorem " * 16_640} for index in range(7)]
    path = tmp_path / "large.json"
    path.write_text(json.dumps({"question": "What is in d0?", "documents": documents}))
    assert path.stat().st_size > 600_000

    # When it is submitted from the file
    result = run(
        "submit", "--type", "answer_with_citations", "--user", "u-large", "--input", f"@{path}",
        "--job-id", job_id, "--wait", "--timeout", str(BOUND), "--json",
    )  # fmt: skip

    # Then the worker read it back from the bucket and the job succeeded, citing one of its documents
    assert result.exit_code == 0, result.output
    view = json_out(result)
    assert view["status"] == "succeeded"
    (cited,) = view["output"]["citations"]
    assert cited in {document["id"] for document in documents}
    key = boto3.client("s3").list_objects_v2(Bucket=dev_env.environment["JOBS_PAYLOAD_BUCKET"], Prefix="inputs/")
    assert f"inputs/{job_id}.json" in {entry["Key"] for entry in key.get("Contents", [])}


def test_submit_wait_prints_the_succeeded_view(dev_env: DevStack) -> None:
    job_id = unique("sub-ok")

    result = run(*submit_args(job_id, "u-submit", classify_input(job_id)), "--wait", "--timeout", str(BOUND), "--json")

    assert result.exit_code == 0, result.output
    view = json_out(result)
    assert list(view) == VIEW_FIELDS
    assert view["job_id"] == job_id
    assert view["status"] == "succeeded"
    assert view["output"]["label"] in LABELS
    assert view["error"] is None
    assert view["usage"]["input_tokens"] > 0
    assert view["usage"]["output_tokens"] > 0
    assert view["usage"]["attempts"] == 1


def test_submit_wait_of_a_failing_job_exits_1_with_the_failed_view(dev_env: DevStack) -> None:
    job_id = unique("sub-bad")
    job_input = classify_input(job_id, "business_invalid")

    result = run(*submit_args(job_id, "u-submit", job_input), "--wait", "--timeout", str(BOUND), "--json")

    assert result.exit_code == 1, result.output
    view = json_out(result)
    assert view["status"] == "failed"
    assert view["output"] is None
    assert view["error"]["code"] == "business_validation_failed"
    assert view["error"]["retryable"] is False


def test_submit_wait_human_output_is_the_job_table(dev_env: DevStack) -> None:
    job_id = unique("sub-human")

    result = run(*submit_args(job_id, "u-submit", classify_input(job_id)), "--wait", "--timeout", str(BOUND))

    assert result.exit_code == 0, result.output
    assert job_id in result.stdout
    assert "succeeded" in result.stdout
    assert re.search(r"attempts\s+1 of 3", result.stdout)


def test_status_of_a_finished_job(dev_env: DevStack) -> None:
    job_id = unique("status")
    finished = run(
        *submit_args(job_id, "u-status", classify_input(job_id)), "--wait", "--timeout", str(BOUND), "--json"
    )
    assert finished.exit_code == 0, finished.output

    result = run("status", job_id, "--json")

    assert result.exit_code == 0, result.output
    view = json_out(result)
    assert list(view) == VIEW_FIELDS
    assert view == json_out(finished)
    assert view["job_type"] == "classify"
    assert view["user_id"] == "u-status"
    assert (view["status"], view["attempt_count"], view["max_attempts"]) == ("succeeded", 1, 3)
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    for field in ("created_at", "updated_at", "started_at", "finished_at"):
        assert stamp.match(view[field]), (field, view[field])
    assert view["created_at"] <= view["started_at"] <= view["finished_at"]
    assert set(view["output"]) == {"label", "confidence"}
    assert re.fullmatch(r"[0-9a-f]{64}", view["output_hash"])
    assert view["error"] is None
    assert view["cancel_requested"] is False
    assert list(view["usage"]) == USAGE_FIELDS
    assert view["usage"]["cost_usd"] > 0

    human = run("status", job_id)

    assert human.exit_code == 0, human.output
    assert job_id in human.stdout
    assert "succeeded" in human.stdout
    assert view["output"]["label"] in human.stdout


def test_status_names_the_attempts_counted_apart_from_the_calls_and_says_how_the_job_ran_as_inspect_does(
    dev_env: DevStack,
) -> None:
    # One 429 (recorded, not counted against the budget), then an answer
    job_id = unique("status-429")
    assert submit_and_wait(job_id, "u-status", classify_input(job_id, "rate_limited*1"))["status"] == "succeeded"

    human = run("status", job_id)
    viewed = view_of(job_id)
    inspected = json_out(run("inspect", job_id, "--json"))

    assert human.exit_code == 0, human.output
    assert re.search(r"^attempts\s+1 of 3\s*$", human.stdout, re.MULTILINE), human.stdout
    assert re.search(r"^calls\s+2\s*$", human.stdout, re.MULTILINE), human.stdout
    assert re.search(r"^via\s+realtime\s*$", human.stdout, re.MULTILINE), human.stdout
    assert "attempts)" not in human.stdout  # the attempt records are no longer called attempts
    assert (viewed["attempt_count"], viewed["usage"]["attempts"]) == (1, 2)
    assert viewed == inspected["job"]
    assert viewed["via"] == "realtime"
    inspect_human = run("inspect", job_id).stdout
    assert "2 records, 1 counted as attempts" in inspect_human
    assert re.search(r"^via\s+realtime\s*$", inspect_human, re.MULTILINE), inspect_human


LATE_JOB_TYPES = """
from dataclasses import replace
from engine.definitions.classify import CLASSIFY

JOB_DEFINITIONS = [replace(CLASSIFY, name="classify_late")]
"""
RESTART = "note: job type classify_late is not known to the running stack; restart aijobs dev"


def test_a_job_type_added_after_the_stack_started_says_to_restart_it(
    dev_env: DevStack, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job type this shell loads (AIJOBS_JOB_MODULES) but the running stack's workers did not
    (tmp_path / "late_job_types.py").write_text(LATE_JOB_TYPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AIJOBS_JOB_MODULES", "late_job_types")
    job_id = unique("late")

    # When a job of it is submitted and waited for
    waited = run(
        *submit_args(job_id, "u-late", classify_input(job_id), "classify_late"), "--wait", "--timeout", str(BOUND)
    )

    # Then it failed unknown_job_type, and the command says why and what to do, at each look at it
    assert waited.exit_code == 1, waited.output
    assert "unknown_job_type" in waited.stdout
    assert waited.stderr.strip().splitlines() == [f"{RESTART} (it loads job types once, when it starts)"]
    for args in (["status", job_id, "--json"], ["inspect", job_id], ["watch", job_id, "--json"]):
        looked = run(*args)
        assert looked.stderr.strip().startswith(RESTART), (args, looked.output)
    assert view_of(job_id)["error"]["code"] == "unknown_job_type"


def test_a_job_type_unknown_to_this_shell_too_gets_no_note(dev_env: DevStack) -> None:
    # A raw message of a type nobody registered: the worker records it, and this shell knows no better
    job_id = unique("nobody")
    boto3.client("sqs").send_message(
        QueueUrl=os.environ["JOBS_QUEUE_URL"],
        MessageBody=json.dumps({"job_id": job_id, "job_type": "nobody", "user_id": "u", "input": {}}),
    )
    failed = wait_terminal(job_id)

    assert failed["error"]["code"] == "unknown_job_type"
    assert run("status", job_id).stderr == ""


@pytest.mark.parametrize(
    "args",
    [["list", "--json", "--limit", "1000"], ["list", "--limit", "1000"], ["usage", "--json"], ["events", "--json"]],
)
def test_a_reader_that_closes_the_output_ends_the_command_quietly(dev_env: DevStack, args: list[str]) -> None:
    # Given jobs to list and their completion events to print
    for _ in range(2):
        job_id = unique("piped")
        assert submit_and_wait(job_id, "u-piped", classify_input(job_id))["status"] == "succeeded"
    eventually(lambda: run("list", "--json").stdout.count('"job_id"') >= 2)

    # When the command's reader has gone before it writes (`aijobs ... | head -1`, at its worst)
    command = subprocess.Popen(
        [sys.executable, "-m", "aijobs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_environment() | dev_env.environment,
        text=True,
    )
    assert command.stdout is not None
    command.stdout.close()
    _, stderr = command.communicate(timeout=60)

    # Then it ends with SIGPIPE's status and says nothing: no traceback, no "Exception ignored"
    assert (command.returncode, stderr) == (141, "")


def test_events_to_a_webhook_that_does_not_answer_are_one_line_each_not_a_traceback(dev_env: DevStack) -> None:
    job_id = unique("hook")
    assert submit_and_wait(job_id, "u-hook", classify_input(job_id))["status"] == "succeeded"
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}/hook"

    result = eventually(lambda: (ran := run("events", "--webhook", closed)).stderr and ran)

    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert all(
        re.fullmatch(rf"error: {closed} did not answer \(ConnectError: .+\); the event stays queued", line)
        for line in lines
    ), lines


# --- watch ---------------------------------------------------------------------------------------


def assert_status_changes(lines: list[dict[str, Any]], job_ids: list[str]) -> dict[str, list[str]]:
    """One line per status change of each job, ending terminal; returns each job's statuses."""
    statuses: dict[str, list[str]] = {job_id: [] for job_id in job_ids}
    for line in lines:
        assert list(line) == VIEW_FIELDS
        statuses[line["job_id"]].append(line["status"])
    for job_id, seen in statuses.items():
        assert seen, job_id
        assert all(a != b for a, b in pairwise(seen)), seen
        assert seen[-1] in TERMINAL, seen
        assert all(status not in TERMINAL for status in seen[:-1]), seen
    return statuses


def test_watch_json_prints_status_changes_until_all_succeed(dev_env: DevStack) -> None:
    first, second = unique("watch-a"), unique("watch-b")
    client = AiJobsClient.from_settings()
    client.submit("classify", "u-watch", classify_input(first), job_id=first)
    client.submit("summarize", "u-watch", summarize_input(second), job_id=second)

    result = run("watch", first, second, "--json", "--interval", "0.2", "--timeout", str(BOUND))

    assert result.exit_code == 0, result.output
    statuses = assert_status_changes(json_lines(result), [first, second])
    assert statuses[first][-1] == statuses[second][-1] == "succeeded"


def test_watch_exits_1_when_a_job_fails(dev_env: DevStack) -> None:
    good, bad = unique("watch-ok"), unique("watch-bad")
    client = AiJobsClient.from_settings()
    client.submit("classify", "u-watch", classify_input(good), job_id=good)
    client.submit("classify", "u-watch", classify_input(bad, "business_invalid"), job_id=bad)

    result = run("watch", good, bad, "--json", "--interval", "0.2", "--timeout", str(BOUND))

    assert result.exit_code == 1, result.output
    statuses = assert_status_changes(json_lines(result), [good, bad])
    assert (statuses[good][-1], statuses[bad][-1]) == ("succeeded", "failed")

    human = run("watch", good, bad, "--interval", "0.2", "--timeout", str(BOUND))

    assert human.exit_code == 1
    for header in ("job", "type", "status", "attempts"):
        assert header in human.stdout
    assert good in human.stdout
    assert bad in human.stdout
    assert "business_validation_failed" in human.stdout


def test_watch_human_shows_a_table_of_the_jobs(dev_env: DevStack) -> None:
    first, second = unique("watch-h1"), unique("watch-h2")
    client = AiJobsClient.from_settings()
    client.submit("classify", "u-watch", classify_input(first), job_id=first)
    client.submit("classify", "u-watch", classify_input(second), job_id=second)

    result = run("watch", first, second, "--interval", "0.2", "--timeout", str(BOUND))

    assert result.exit_code == 0, result.output
    assert first in result.stdout
    assert second in result.stdout
    assert "succeeded" in result.stdout


def test_watch_of_an_unknown_job_is_one_line(dev_env: DevStack) -> None:
    line = one_error_line(run("watch", "no-such-job-watch", "--json"))

    assert "no-such-job-watch" in line


# --- cancel --------------------------------------------------------------------------------------


def test_cancel_ends_an_unfinished_job_cancelled(dev_env: DevStack) -> None:
    # The provider answers 503 to this prompt far more often than the attempt budget: the job cannot
    # succeed, and it keeps going back to the queue (backoff) until the cancel lands.
    job_id = unique("cancel")
    AiJobsClient.from_settings().submit(
        "classify", "u-cancel", classify_input(job_id, "unavailable*100"), job_id=job_id, max_attempts=10
    )

    result = run("cancel", job_id, "--json")

    assert result.exit_code == 0, result.output
    view = json_out(result)
    assert list(view) == VIEW_FIELDS
    assert view["cancel_requested"] is True
    # Queued: cancelled at once; running: cancelled at its next fence.
    assert view["status"] in {"cancelled", "running"}
    final = eventually(lambda: (current := view_of(job_id))["status"] == "cancelled" and current)
    assert final["cancel_requested"] is True
    assert final["output"] is None
    assert final["finished_at"] is not None

    again = run("cancel", job_id)

    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == f"job {job_id} cancelled"
    assert view_of(job_id)["status"] == "cancelled"


def test_cancel_of_a_succeeded_job_says_it_had_ended_and_changes_nothing(dev_env: DevStack) -> None:
    job_id = unique("cancel-done")
    done = submit_and_wait(job_id, "u-cancel", classify_input(job_id))
    assert done["status"] == "succeeded"

    human = run("cancel", job_id)

    assert human.exit_code == 0, human.output
    assert human.stdout.strip() == f"job {job_id} had already ended succeeded"
    as_json = run("cancel", job_id, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json_out(as_json)["status"] == "succeeded"
    after = view_of(job_id)
    assert after["status"] == "succeeded"
    assert after["cancel_requested"] is False
    assert after["output"] == done["output"]


def test_cancel_of_an_unknown_job_is_one_line(dev_env: DevStack) -> None:
    line = one_error_line(run("cancel", "no-such-job-cancel"))

    assert "no-such-job-cancel" in line


# --- retry ---------------------------------------------------------------------------------------


def test_retry_requeues_a_failed_job_which_then_succeeds(dev_env: DevStack) -> None:
    # One 503, one attempt allowed: the job fails; retried, the provider's fault is used up.
    job_id = unique("retry")
    job_input = classify_input(job_id, "unavailable*1")
    failed = run(
        *submit_args(job_id, "u-retry", job_input),
        "--max-attempts",
        "1",
        "--wait",
        "--timeout",
        str(BOUND),
        "--json",
    )
    assert failed.exit_code == 1, failed.output
    failed_view = json_out(failed)
    assert failed_view["status"] == "failed"
    assert failed_view["error"]["code"] == "max_attempts_exceeded"
    assert (failed_view["attempt_count"], failed_view["max_attempts"]) == (1, 1)

    result = run("retry", job_id, "--json")

    assert result.exit_code == 0, result.output
    requeued = json_out(result)
    assert list(requeued) == VIEW_FIELDS
    assert requeued["status"] == "queued"
    assert requeued["attempt_count"] == 0
    assert requeued["error"] is None
    assert requeued["finished_at"] is None
    watched = run("watch", job_id, "--json", "--interval", "0.2", "--timeout", str(BOUND))
    assert watched.exit_code == 0, watched.output
    final = json_lines(watched)[-1]
    assert final["status"] == "succeeded"
    assert final["output"]["label"] in LABELS
    assert final["error"] is None


def test_retry_human_output_is_one_line(dev_env: DevStack) -> None:
    job_id = unique("retry-human")
    failed = submit_and_wait(job_id, "u-retry", classify_input(job_id, "business_invalid"))
    assert failed["status"] == "failed"

    result = run("retry", job_id)

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"job {job_id} queued again"
    # The marker asks for a bad answer every time: the retried job fails again, the same way.
    again = eventually(lambda: (view := view_of(job_id))["status"] == "failed" and view["finished_at"] and view)
    assert again["error"]["code"] == "business_validation_failed"


def test_retry_of_a_succeeded_job_is_refused_in_one_line(dev_env: DevStack) -> None:
    job_id = unique("retry-done")
    assert submit_and_wait(job_id, "u-retry", classify_input(job_id))["status"] == "succeeded"

    line = one_error_line(run("retry", job_id))

    assert line == f"error: job {job_id} is succeeded; only a failed job can be retried"
    assert view_of(job_id)["status"] == "succeeded"


# --- list ----------------------------------------------------------------------------------------


def test_list_newest_first_by_user_and_by_status(dev_env: DevStack) -> None:
    user, other = unique("u-list"), unique("u-list-other")
    ids = [unique("list-1"), unique("list-2"), unique("list-3")]
    other_id = unique("list-other")
    client = AiJobsClient.from_settings()
    client.submit("classify", user, classify_input(ids[0]), job_id=ids[0])
    client.submit("classify", user, classify_input(ids[1], "business_invalid"), job_id=ids[1])
    client.submit("summarize", user, summarize_input(ids[2]), job_id=ids[2])
    client.submit("classify", other, classify_input(other_id), job_id=other_id)
    for job_id in [*ids, other_id]:
        wait_terminal(job_id)
    newest_first = [*reversed(ids)]

    everyone = run("list", "--json", "--limit", "1000")
    mine = run("list", "--user", user, "--json")
    failed = run("list", "--status", "failed", "--json", "--limit", "1000")
    mine_succeeded = run("list", "--user", user, "--status", "succeeded", "--json")

    for result in (everyone, mine, failed, mine_succeeded):
        assert result.exit_code == 0, result.output
    everyone_ids = [view["job_id"] for view in json_out(everyone)]
    assert [job_id for job_id in everyone_ids if job_id in {*ids, other_id}] == [other_id, *newest_first]
    created = [view["created_at"] for view in json_out(everyone)]
    assert created == sorted(created, reverse=True)
    assert all(list(view) == VIEW_FIELDS for view in json_out(everyone))
    assert [view["job_id"] for view in json_out(mine)] == newest_first
    assert {view["user_id"] for view in json_out(mine)} == {user}
    failed_views = json_out(failed)
    assert {view["status"] for view in failed_views} == {"failed"}
    failed_ids = {view["job_id"] for view in failed_views}
    assert ids[1] in failed_ids
    assert failed_ids.isdisjoint({ids[0], ids[2], other_id})
    assert [view["job_id"] for view in json_out(mine_succeeded)] == [ids[2], ids[0]]

    human = run("list", "--user", user)

    assert human.exit_code == 0, human.output
    for header in ("job", "type", "user", "status", "attempts", "tokens", "cost", "created", "error"):
        assert header in human.stdout
    positions = [human.stdout.index(job_id) for job_id in newest_first]
    assert positions == sorted(positions)
    assert "business_validation_failed" in human.stdout
    assert other_id not in human.stdout


def test_list_of_a_user_without_jobs_is_empty(dev_env: DevStack) -> None:
    result = run("list", "--user", unique("u-nobody"), "--json")

    assert result.exit_code == 0, result.output
    assert json_out(result) == []


# --- usage ---------------------------------------------------------------------------------------


def test_usage_by_user_job_type_and_model(dev_env: DevStack) -> None:
    user = unique("u-usage")
    classify_id, summarize_id = unique("usage-c"), unique("usage-s")
    assert submit_and_wait(classify_id, user, classify_input(classify_id))["status"] == "succeeded"
    assert submit_and_wait(summarize_id, user, summarize_input(summarize_id), "summarize")["status"] == "succeeded"

    everyone = run("usage", "--json", "--since", "1h")
    mine = run("usage", "--user", user, "--json", "--since", "1h")

    assert everyone.exit_code == 0, everyone.output
    assert mine.exit_code == 0, mine.output
    rows = json_out(mine)
    assert {row["user_id"] for row in rows} == {user}
    assert {row["job_type"] for row in rows} == {"classify", "summarize"}
    for row in rows:
        assert list(row) == USAGE_ROW_FIELDS
        assert 0 <= row["cached_input_tokens"] < row["input_tokens"]
        assert row["model"] == "gpt-4o-mini"
        assert row["attempts"] == 1
        assert row["input_tokens"] > 0
        assert row["output_tokens"] > 0
        assert row["cost_usd"] > 0
    assert all(row in json_out(everyone) for row in rows)
    assert len({row["user_id"] for row in json_out(everyone)}) > 1

    human = run("usage", "--user", user, "--since", "1h")

    assert human.exit_code == 0, human.output
    assert "usage over the last 1h" in human.stdout
    for text in (user, "classify", "summarize", "gpt-4o-mini", "total", "cached", "reasoning", "cache saved"):
        assert text in human.stdout


def test_usage_refuses_a_bad_duration_in_one_line(dev_env: DevStack) -> None:
    line = one_error_line(run("usage", "--since", "7x", "--json"))

    assert line == "error: --since '7x' is not a duration like 30m, 12h, 7d or 2w"


def test_usage_refuses_a_range_past_any_date_by_its_bound_in_one_line(dev_env: DevStack) -> None:
    # A hundred billion weeks begin before the year 1: the range's bound says so, not the calendar.
    line = one_error_line(run("usage", "--since", "100000000000w", "--json"))

    assert line == "error: a usage range spans at most 400 days; this one spans 700000000001"


# --- worker --------------------------------------------------------------------------------------


def test_worker_runs_jobs_and_stops_on_interrupt(endpoint_env: StackResources, tmp_path: Any) -> None:
    # A plain moto server (no in-process pollers): only the `aijobs worker` process runs the jobs. The
    # provider answers after 1.5 s, so the interrupt can land while a batch is in hand.
    with LocalProvider(port=0, api_key="e2e-key", latency_seconds=1.5) as provider:
        env = dict(os.environ) | {
            "AI_PROVIDER": "openai",
            "AI_BASE_URL": provider.url,
            "AI_API_KEY": "e2e-key",
            "AI_MODEL_PRIMARY": "gpt-4o-mini",
            "POWERTOOLS_METRICS_DISABLED": "true",
        }
        env.pop("AI_MODEL_FALLBACK", None)
        stdout, stderr = tmp_path / "worker.out", tmp_path / "worker.err"
        with stdout.open("w") as out, stderr.open("w") as err:
            worker = subprocess.Popen(
                # A long poll of 5 s: an interrupt that lands after the batch (a slow machine) waits that out.
                [sys.executable, "-m", "aijobs", "worker", "--concurrency", "1", "--wait-seconds", "5"],
                stdout=out,
                stderr=err,
                env=env,
                # Started as a script's background job is (`aijobs worker &`): with SIGINT ignored.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            )
        try:
            first, second = unique("worker-1"), unique("worker-2")
            submitted = run(*submit_args(first, "u-worker", classify_input(first)))
            assert submitted.exit_code == 0, submitted.output
            view = wait_terminal(first)
            assert view["status"] == "succeeded", view
            assert view["usage"]["input_tokens"] > 0

            # Ctrl-C while the worker runs the second job: it finishes that batch, then stops.
            submitted = run(*submit_args(second, "u-worker", classify_input(second)))
            assert submitted.exit_code == 0, submitted.output
            eventually(lambda: view_of(second)["status"] == "running", interval=0.05)
            worker.send_signal(signal.SIGINT)
            try:
                returncode = worker.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the worker still ran {BOUND:g}s after Ctrl-C; it said:\n{stderr.read_text()}")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        served = len(provider.log)

    messages = stderr.read_text()
    assert returncode == 0, messages
    assert f"polling {endpoint_env.queue_url} with 1 pollers" in messages
    assert "stopped after 2 batches, 2 records" in messages, messages
    assert view_of(second)["status"] == "succeeded"
    assert served == 2


# --- budget ---------------------------------------------------------------------------------------


def test_budget_set_gives_a_user_a_cap_that_show_reports_for_today(dev_env: DevStack) -> None:
    user = unique("u-budget")

    set_result = run("budget", "set", "--user", user, "--daily-usd", "2.50", "--json")
    shown = run("budget", "show", "--user", user, "--json")
    everyone = run("budget", "show", "--json")
    human = run("budget", "show", "--user", user)

    assert set_result.exit_code == 0, set_result.output
    today = json_out(set_result)
    assert list(today) == ["user_id", "day", "cap_usd", "spent_usd", "reserved_usd", "left_usd"]
    assert (today["user_id"], today["cap_usd"], today["spent_usd"], today["left_usd"]) == (user, 2.5, 0.0, 2.5)
    assert json_out(shown) == today
    assert today in json_out(everyone)
    assert human.exit_code == 0, human.output
    for text in ("daily budgets", user, "$2.500000"):
        assert text in human.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--daily-usd", "-1"), "error: --daily-usd: a daily budget is an amount from 0 to 1000000000 US dollars"),
        (("--daily-usd", "NaN"), "error: --daily-usd: a daily budget is an amount from 0 to 1000000000 US dollars"),
        (("--daily-usd", "five"), "error: --daily-usd: 'five' is not an amount in US dollars"),
    ],
)
def test_budget_set_refuses_what_is_not_an_amount_in_one_line(
    dev_env: DevStack, args: tuple[str, ...], error: str
) -> None:
    assert one_error_line(run("budget", "set", "--user", "acme", *args)) == error


def test_budget_show_of_a_user_without_a_cap_says_so_in_one_line(dev_env: DevStack) -> None:
    user = unique("u-uncapped")

    line = one_error_line(run("budget", "show", "--user", user))

    assert line == f"error: user {user} has no daily budget (none of their own, and no default)"


# --- inspect -------------------------------------------------------------------------------------

INSPECTION_FIELDS = ["job", "attempts", "dead_letters", "lease", "children"]
ATTEMPT_FIELDS = [
    "attempt",
    "started_at",
    "finished_at",
    "duration_ms",
    "outcome",
    "error_code",
    "provider",
    "model",
    "tier",
    "prompt_key",
    "prompt_version",
    "calls",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_usd",
    "cache_savings_usd",
    "latency_ms",
    "priced",
    "via",
    "batch_id",
    "job_type_version",
    "reasks",
    "refused_answer",
    "prompt_sha256",
    "refused_answer_s3",
    "reused_from",
    "standard_cost_usd",
    "service_tier",
]
DEAD_LETTER_FIELDS = ["message_id", "recorded_at", "job_id", "receive_count", "reason"]


def test_inspect_shows_every_attempt_with_its_tokens_and_cost(dev_env: DevStack) -> None:
    # One 503, then a valid answer: two attempts
    job_id = unique("inspect")
    assert submit_and_wait(job_id, "u-inspect", classify_input(job_id, "unavailable*1"))["status"] == "succeeded"

    result = run("inspect", job_id, "--json")

    assert result.exit_code == 0, result.output
    inspection = json_out(result)
    assert list(inspection) == INSPECTION_FIELDS
    # The job's view, and how its latest attempt ran (its attempts were read)
    assert inspection["job"] == view_of(job_id) | {"via": "realtime"}
    first, second = inspection["attempts"]
    assert list(first) == list(second) == ATTEMPT_FIELDS
    assert [(attempt["via"], attempt["batch_id"]) for attempt in (first, second)] == [("realtime", None)] * 2
    assert (first["attempt"], first["outcome"], first["error_code"]) == (1, "retryable", "provider_unavailable")
    assert (second["attempt"], second["outcome"], second["error_code"]) == (2, "succeeded", None)
    assert (second["model"], second["calls"]) == ("gpt-4o-mini", 1)
    assert second["input_tokens"] > 0
    assert second["output_tokens"] > 0
    assert second["cost_usd"] > 0
    assert first["finished_at"] <= second["started_at"]
    assert all(attempt["duration_ms"] >= 0 for attempt in (first, second))
    total = first["cost_usd"] + second["cost_usd"]
    assert total == pytest.approx(inspection["job"]["usage"]["cost_usd"])
    assert (inspection["dead_letters"], inspection["lease"]) == ([], None)

    human = run("inspect", job_id)

    assert human.exit_code == 0, human.output
    for text in (job_id, "attempts", "provider_unavailable", "retryable", "succeeded", "gpt-4o-mini"):
        assert text in human.stdout


def test_inspect_of_an_unknown_job_is_one_line(dev_env: DevStack) -> None:
    job_id = unique("ghost")

    assert one_error_line(run("inspect", job_id, "--json")) == f"error: job {job_id} does not exist"


# --- dead letters --------------------------------------------------------------------------------


def send_to_dead_letter_queue(body: str) -> str:
    """A message put straight on the dead-letter queue, as the jobs queue's redrive would; its id."""
    sent = boto3.client("sqs").send_message(QueueUrl=os.environ["JOBS_DLQ_URL"], MessageBody=body)
    message_id: str = sent["MessageId"]
    return message_id


def dead_letters_of(message_ids: set[str]) -> dict[str, dict[str, Any]]:
    result = run("dead-letters", "list", "--since", "1h", "--limit", "1000", "--json")
    assert result.exit_code == 0, result.output
    return {letter["message_id"]: letter for letter in json_out(result) if letter["message_id"] in message_ids}


def test_dead_letters_are_listed_and_redrive_runs_the_jobs_they_name_never_a_body_without_one(
    dev_env: DevStack,
) -> None:
    # Given a job request and a body that is not JSON, both on the dead-letter queue
    job_id = unique("dlq")
    request = {"job_id": job_id, "job_type": "classify", "user_id": "u-dlq", "input": classify_input(job_id)}
    job_message_id = send_to_dead_letter_queue(json.dumps(request))
    garbage_id = send_to_dead_letter_queue(f"not json ({job_id})")

    # When the dead-letter function has recorded them, Then both are listed, one naming the job
    ids = {job_message_id, garbage_id}
    letters = eventually(lambda: (found := dead_letters_of(ids)).keys() == ids and found)
    named, garbage = letters[job_message_id], letters[garbage_id]
    assert list(named) == list(garbage) == DEAD_LETTER_FIELDS
    reason = "reached the dead-letter queue after 1 receives"
    assert (named["job_id"], named["receive_count"], named["reason"]) == (job_id, 1, reason)
    assert (garbage["job_id"], garbage["receive_count"]) == (None, 1)
    # And the job, created failed, shows the dead letter that names it
    inspected = run("inspect", job_id, "--json")
    assert inspected.exit_code == 0, inspected.output
    inspection = json_out(inspected)
    assert (inspection["job"]["status"], inspection["job"]["error"]["code"]) == ("failed", "dead_lettered")
    assert (inspection["attempts"], inspection["dead_letters"]) == ([], [named])
    human = run("dead-letters")
    assert human.exit_code == 0, human.output
    for text in ("dead letters of the last 7d", job_message_id, garbage_id, job_id):
        assert text in human.stdout

    # When both are redriven
    redriven = run("dead-letters", "redrive", job_message_id, garbage_id, "--json")

    # Then the job is queued again and runs; the body that names no job is not re-sent: exit 1, one line
    assert redriven.exit_code == 1, redriven.output
    assert json_out(redriven) == [
        {"message_id": job_message_id, "job_id": job_id, "outcome": "requeued", "detail": f"job {job_id} queued again"},
        {"message_id": garbage_id, "job_id": None, "outcome": "no_job", "detail": "names no job; not re-sent"},
    ]
    assert redriven.stderr.strip().splitlines() == [f"error: {garbage_id}: names no job; not re-sent"]
    assert wait_terminal(job_id)["status"] == "succeeded"

    # And redriven again, the job that succeeded is skipped: exit 0
    again = run("dead-letters", "redrive", job_message_id)

    assert again.exit_code == 0, again.output
    expected = f"{job_message_id}: skipped, job {job_id} is succeeded; only a failed job can be retried"
    assert again.stdout.strip() == expected


def test_dead_letters_redrive_needs_ids_or_all_in_one_line(dev_env: DevStack) -> None:
    for args in ((), ("m-1", "--all")):
        line = one_error_line(run("dead-letters", "redrive", *args))

        assert line == "error: give the message ids of dead letters, or --all"
