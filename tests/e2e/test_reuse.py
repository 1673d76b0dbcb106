"""Answers already paid for (docs/reuse.md) through the embedded stack, as a user meets them: `aijobs dev`
against an OpenAI-compatible provider of the test's own (`AI_BASE_URL`), a data job type with
`reuse_seconds` pushed with `aijobs types push`, and two identical jobs submitted with `aijobs submit
--wait`: the provider is called once, the second job says `via: reuse` and which job paid, and each
job's completion event reaches `aijobs events`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aijobs.demo_canary import FILE
from aijobs.local.devstack import DevStack, DevStackOptions
from tests.support.cli import run
from tests.support.contract import USAGE_FIELDS
from tests.support.http_provider import LocalProvider

BOUND = 30.0
HOUR = 3_600
NOTE = {"text": "The invoice is overdue."}


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    """The provider the stack's functions call: not the stack's own, as a deployed stack's is not."""
    with LocalProvider(latency_seconds=0) as served:
        yield served


@pytest.fixture(scope="module")
def dev_stack(provider: LocalProvider) -> Iterator[DevStack]:
    """`aijobs dev` with AI_BASE_URL set: jobs go to `provider`."""
    functions = {"AI_BASE_URL": provider.url, "AI_API_KEY": "sk-test", "AI_MODEL_PRIMARY": "gpt-4o-mini"}
    options = DevStackOptions(
        aws_port=0, provider_port=0, provider_latency_seconds=0, quiet=True, function_environment=functions
    )
    with DevStack(options) as stack:
        yield stack


def pushed(tmp_path: Path, **changes: Any) -> str:
    """The demo's job type file under a name of its own, with `changes`, pushed; its name."""
    name = f"reuse_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(FILE | {"name": name} | changes, sort_keys=False), encoding="utf-8")
    result = run("types", "push", str(path))
    assert result.exit_code == 0, result.output
    return name


def submitted(job_type: str, user: str) -> dict[str, Any]:
    """A job of NOTE submitted and waited for: its view as `submit --wait --json` prints it."""
    job_id = f"{user}-{uuid.uuid4().hex[:8]}"
    result = run(
        *("submit", "--type", job_type, "--user", user, "--input", json.dumps(NOTE), "--job-id", job_id),
        *("--wait", "--timeout", str(int(BOUND)), "--json"),
    )
    assert result.exit_code == 0, result.output
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def calls_for(provider: LocalProvider, job_type: str) -> int:
    return sum(entry.job_type == job_type for entry in provider.log)


def completion_events(job_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The completion events of `job_ids`, as `aijobs events --json` prints them (bounded wait)."""
    events: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + BOUND
    while not job_ids <= events.keys() and time.monotonic() < deadline:
        result = run("events", "--json")
        assert result.exit_code == 0, result.output
        for line in result.stdout.splitlines():
            event = json.loads(line)
            events[event["detail"]["job_id"]] = event
    return {job_id: events[job_id] for job_id in job_ids if job_id in events}


def test_a_repeated_request_takes_the_paid_answer_with_no_call_and_says_so(
    dev_env: DevStack, provider: LocalProvider, tmp_path: Path
) -> None:
    # Given a data job type that reuses its answers for an hour
    name = pushed(tmp_path, reuse_seconds=HOUR)
    assert "reuse_seconds" in run("types", "show", name, "--version", "1", "--json").stdout

    # When one user's job runs, then another user's job of the same request
    paid = submitted(name, "u-first")
    reused = submitted(name, "u-second")

    # Then the provider answered once; the second job took that answer, at no cost
    assert calls_for(provider, name) == 1
    assert (paid["status"], paid["via"], paid["reused_from"]) == ("succeeded", "realtime", None)
    assert (reused["status"], reused["via"], reused["reused_from"]) == ("succeeded", "reuse", paid["job_id"])
    assert reused["output"] == paid["output"]
    assert reused["usage"] == dict.fromkeys(USAGE_FIELDS, 0) | {"attempts": 1}
    assert paid["usage"]["cost_usd"] > 0
    # And inspect names the job that paid on its one attempt, which made no call
    inspected = json.loads(run("inspect", reused["job_id"], "--json").stdout)
    [attempt] = inspected["attempts"]
    assert (attempt["via"], attempt["reused_from"], attempt["calls"]) == ("reuse", paid["job_id"], 0)
    # And each job's completion event was sent, the reused one saying where its answer came from
    events = completion_events({paid["job_id"], reused["job_id"]})
    assert [events[job_id]["detail-type"] for job_id in (paid["job_id"], reused["job_id"])] == ["Job Succeeded"] * 2
    detail = events[reused["job_id"]]["detail"]
    assert (detail["via"], detail["reused_from"], detail["output"]) == ("reuse", paid["job_id"], paid["output"])


def test_without_reuse_seconds_every_job_calls_the_provider(
    dev_env: DevStack, provider: LocalProvider, tmp_path: Path
) -> None:
    name = pushed(tmp_path)

    views = [submitted(name, "u-first"), submitted(name, "u-first")]

    assert calls_for(provider, name) == 2
    assert [(view["via"], view["reused_from"]) for view in views] == [("realtime", None)] * 2


def test_a_new_version_is_a_new_request(dev_env: DevStack, provider: LocalProvider, tmp_path: Path) -> None:
    # Given a paid answer of v1
    name = pushed(tmp_path, reuse_seconds=HOUR)
    first = submitted(name, "u-versions")

    # When v2 (its prompt changed) is pushed and promoted, and the request comes again
    second_file = FILE | {
        "name": name,
        "reuse_seconds": HOUR,
        "prompt": {"system": "Topic, one word.", "user": "{text}"},
    }
    path = tmp_path / "v2.yaml"
    path.write_text(yaml.safe_dump(second_file, sort_keys=False), encoding="utf-8")
    assert run("types", "push", str(path)).exit_code == 0
    assert run("types", "promote", name, "2").exit_code == 0
    second = submitted(name, "u-versions")
    again = submitted(name, "u-versions")

    # Then v2's first job calls the provider, and v2's answer is reused from then on
    assert (first["job_type_version"], second["job_type_version"]) == (1, 2)
    assert (second["reused_from"], again["reused_from"]) == (None, second["job_id"])
    assert calls_for(provider, name) == 2
