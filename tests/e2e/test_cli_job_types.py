"""`aijobs types` through the embedded stack (docs/commands.md and docs/jobtypes.md, "Job types as
data"): a job type file pushed as versions, refused in one line, run (and pinned) by `aijobs submit`,
served to a share of users as a canary, taken back by someone or by its guard, counted per version,
and tested on this machine.

The stack's workers keep the labels they read for AIJOBS_JOB_TYPES_REFRESH_SECONDS (60 s here: the
stack is started as `aijobs dev` starts it, with no such setting). Nothing below waits for it: the
client behind `aijobs submit` reads the labels itself and records the version a job runs when the job
is created, so a promote or a rollback decides the very next submission.

Each test pushes a job type of a name of its own (a uuid's suffix), so tests sharing the module's
stack never see each other's versions, labels or stats.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import Result

from aijobs.demo_canary import FILE, WORSE
from aijobs.local.devstack import DevStack, DevStackOptions
from tests.support.cli import run

# Every wait in this module is bounded by this many seconds (the guard's by GUARD_BOUND).
BOUND = 30.0
GUARD_BOUND = 90.0
POLL_SECONDS = 0.2
TERMINAL = {"succeeded", "failed", "cancelled"}
NOTE = json.dumps({"text": "The invoice is overdue."})
# The local provider answers WORSE's prompt (its `fault:wrong_shape` marker) with a list, not an object.
WRONG_SHAPE = "output: must be of type object"


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    """The embedded stack as `aijobs dev` starts it: the data job types live in its table."""
    stack = DevStack(DevStackOptions(aws_port=0, provider_port=0, provider_latency_seconds=0, quiet=True))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def new_name() -> str:
    return f"cli_jt_{uuid.uuid4().hex[:8]}"


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def good_file(tmp_path: Path, name: str, **changes: Any) -> Path:
    """The demo's job type file (aijobs.demo_canary.FILE) under `name`, as YAML, with `changes`."""
    return write(tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.yaml", FILE | {"name": name} | changes)


def worse_file(tmp_path: Path, name: str) -> Path:
    """The demo's worse version: its user template carries the local provider's `fault:wrong_shape`."""
    return write(tmp_path / f"{name}-worse.yaml", WORSE | {"name": name})


def refusal(result: Result) -> str:
    """The one line a refused command prints, checking it is refused so: exit 1, nothing on stdout."""
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def pushed(path: Path) -> str:
    result = run("types", "push", str(path))
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def show(name: str) -> dict[str, Any]:
    result = run("types", "show", name, "--json")
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def listed() -> dict[str, dict[str, Any]]:
    """`types list --json` by name."""
    result = run("types", "list", "--json")
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.stdout)}


def stats(name: str) -> list[dict[str, Any]]:
    result = run("types", "stats", name, "--json")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def status(job_id: str) -> dict[str, Any]:
    result = run("status", job_id, "--json")
    assert result.exit_code == 0, result.output
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def submit(name: str, user: str, *flags: str) -> str:
    """A job of `name` for `user`, not waited for: its id."""
    result = run("submit", "--type", name, "--user", user, "--input", NOTE, *flags, "--json")
    assert result.exit_code == 0, result.output
    job_id: str = json.loads(result.stdout)["job_id"]
    return job_id


def submit_waiting(name: str, user: str, *flags: str) -> Result:
    return run("submit", "--type", name, "--user", user, "--input", NOTE, *flags, "--wait", "--timeout", str(BOUND),
               "--json")  # fmt: skip


def finished(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each job's `status --json` once it has ended (bounded by BOUND)."""
    deadline = time.monotonic() + BOUND
    views: dict[str, dict[str, Any]] = {}
    while True:
        for job_id in job_ids:
            if job_id not in views and (view := status(job_id))["status"] in TERMINAL:
                views[job_id] = view
        if len(views) == len(job_ids) or time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    assert len(views) == len(job_ids), f"jobs still running after {BOUND}s: {set(job_ids) - set(views)}"
    return views


def stats_once_counted(name: str, jobs: int) -> list[dict[str, Any]]:
    """`types stats NAME --json` once the events function has counted `jobs` finished jobs (bounded)."""
    deadline = time.monotonic() + BOUND
    rows = stats(name)
    while sum(row["jobs"] for row in rows) < jobs and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        rows = stats(name)
    return rows


def test_push_stores_versions_and_the_first_is_production(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    first = good_file(tmp_path, name)

    # When a file is pushed, it is v1 and production at once
    assert pushed(first) == f"{name} v1 pushed"
    head = show(name)
    assert (head["latest"], head["production"], head["canary"]) == (1, 1, None)
    assert [(event["action"], event["version"]) for event in head["history"]] == [("push", 1)]
    assert listed()[name] == {"name": name, "kind": "data", "latest": 1, "production": 1, "canary": None}

    # When the same content is pushed again, as YAML or as JSON in another key order, no version is made
    assert pushed(first) == f"{name} v1 has this content already: no new version"
    reordered = tmp_path / "reordered.json"
    reordered.write_text(json.dumps(dict(reversed(list((FILE | {"name": name}).items())))), encoding="utf-8")
    again = run("types", "push", str(reordered), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"name": name, "version": 1, "created": False}
    assert [version["version"] for version in show(name)["versions"]] == [1]

    # When a changed file is pushed, it is v2, and production stays v1
    changed = good_file(tmp_path, name, description="Name the topic of a note in one word.")
    assert pushed(changed) == f"{name} v2 pushed"
    head = show(name)
    assert (head["latest"], head["production"], head["canary"]) == (2, 1, None)
    assert [(event["action"], event["version"]) for event in head["history"]] == [("push", 1), ("push", 2)]
    one, two = head["versions"]
    assert (one["version"], two["version"]) == (1, 2)
    assert one["sha256"] != two["sha256"]
    assert listed()[name] == {"name": name, "kind": "data", "latest": 2, "production": 1, "canary": None}
    # and show --version and diff read what was stored
    stored = run("types", "show", name, "--version", "2", "--json")
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.stdout)["document"]["description"] == "Name the topic of a note in one word."
    diff = run("types", "diff", name, "1", "2")
    assert diff.exit_code == 0, diff.output
    assert f"--- {name} v1\n+++ {name} v2\n" in diff.stdout
    assert "\n-description: Name the topic of a note in a few words.\n" in diff.stdout
    assert "\n+description: Name the topic of a note in one word.\n" in diff.stdout
    assert run("types", "diff", name, "1", "1").stdout == f"{name} v1 and v1 are the same\n"


BAD_FILES = {
    "template field not in the input schema": (
        {"prompt": {"system": "You name topics.", "user": "Note: {ticket}"}},
        "error: prompt.user: {ticket} is not a property of input_schema",
    ),
    "invalid input schema": (
        {"input_schema": FILE["input_schema"] | {"properties": {"text": {"type": "nope"}}}},
        "error: input_schema.properties.text.type: 'nope' is not valid under any of the given schemas",
    ),
    "invalid output schema": (
        {"output_schema": FILE["output_schema"] | {"properties": {"topic": {"type": "nope"}}}},
        "error: output_schema.properties.topic.type: 'nope' is not valid under any of the given schemas",
    ),
    "a rule that does not compile": (
        {"rules": [{"check": "size(output.topic > ", "message": "the topic is empty"}]},
        "error: rules[0].check: does not compile: 1:21: Syntax error: mismatched input '<EOF>'",
    ),
    "an example a rule refuses": (
        {"rules": [{"check": "output.topic == 'weather'", "message": "the topic is not weather"}]},
        "error: examples[0]: rule 1 (the topic is not weather) is false",
    ),
}


@pytest.mark.parametrize(("changes", "line"), list(BAD_FILES.values()), ids=list(BAD_FILES))
def test_a_bad_file_is_refused_in_one_line_and_nothing_is_stored(
    dev_env: DevStack, tmp_path: Path, changes: dict[str, Any], line: str
) -> None:
    name = new_name()

    # When a bad file of a new name is pushed
    result = run("types", "push", str(good_file(tmp_path, name, **changes)))

    # Then it is refused in one line naming what is wrong, and no such job type exists
    assert refusal(result).startswith(line)
    assert name not in listed()
    assert refusal(run("types", "show", name)) == f"error: no data job type {name!r} was pushed"

    # And a bad file of a name with a version makes no new version
    assert pushed(good_file(tmp_path, name)) == f"{name} v1 pushed"
    assert refusal(run("types", "push", str(good_file(tmp_path, name, **changes)))).startswith(line)
    head = show(name)
    assert (head["latest"], [version["version"] for version in head["versions"]]) == (1, [1])
    assert [event["action"] for event in head["history"]] == ["push"]


def test_a_file_naming_a_code_job_type_is_refused(dev_env: DevStack, tmp_path: Path) -> None:
    before = listed()["classify"]

    result = run("types", "push", str(write(tmp_path / "classify.yaml", FILE | {"name": "classify"})))

    assert refusal(result) == "error: name: classify is a code job type"
    assert (
        before
        == listed()["classify"]
        == {
            "name": "classify",
            "kind": "code",
            "latest": None,
            "production": None,
            "canary": None,
        }
    )
    assert refusal(run("types", "show", "classify")) == (
        "error: classify is a code job type: it has no versions or labels (deploy it to change it)"
    )
    # and its labels cannot be moved: it is said to be code, not unknown
    for moved in (run("types", "promote", "classify", "1"), run("types", "rollback", "classify")):
        assert refusal(moved) == (
            "error: classify is a code job type: it has no versions or labels (deploy it to change it)"
        )


def test_submit_runs_production_and_version_pins_another(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    pushed(good_file(tmp_path, name))

    # When a job of the data type is submitted, waiting for it
    result = submit_waiting(name, "writer-1")

    # Then it succeeds on production, v1, as status and inspect record it
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)
    assert (view["job_type"], view["status"], view["job_type_version"]) == (name, "succeeded", 1)
    assert view["output"] == {"topic": "billing"}  # the embedded provider answers from the file's example
    assert status(view["job_id"])["job_type_version"] == 1
    inspected = run("inspect", view["job_id"], "--json")
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(inspected.stdout)["job"]["job_type_version"] == 1

    # When v2 is pushed, a job pinned to it runs v2, and one not pinned still runs production
    pushed(good_file(tmp_path, name, description="v2"))
    pinned = submit_waiting(name, "writer-1", "--version", "2")
    assert pinned.exit_code == 0, pinned.output
    assert (json.loads(pinned.stdout)["status"], json.loads(pinned.stdout)["job_type_version"]) == ("succeeded", 2)
    unpinned = submit_waiting(name, "writer-1")
    assert unpinned.exit_code == 0, unpinned.output
    assert json.loads(unpinned.stdout)["job_type_version"] == 1

    # And a version that does not exist, or a pin of a code job type, is refused in one line, no job made
    job_id = f"jt-{uuid.uuid4().hex[:8]}"
    missing = run("submit", "--type", name, "--user", "writer-1", "--input", NOTE, "--version", "9",
                  "--job-id", job_id, "--wait")  # fmt: skip
    assert refusal(missing) == f"error: --version: {name} has no version 9 (v1-v2)"
    assert refusal(run("status", job_id)) == f"error: job {job_id} does not exist"
    code = run("submit", "--type", "classify", "--user", "writer-1", "--input", NOTE, "--version", "1")
    assert refusal(code) == "error: --version: classify is a code job type: it has no versions"


def test_a_canary_splits_users_stickily_and_rollback_ends_it(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    pushed(good_file(tmp_path, name))
    pushed(good_file(tmp_path, name, description="v2"))

    # When v2 is promoted as a 50% canary
    promoted = run("types", "promote", name, "2", "--canary", "50")
    assert promoted.exit_code == 0, promoted.output
    assert promoted.stdout.strip() == f"{name} v2 serves 50% of users; v1 the rest"
    canary = show(name)["canary"]
    assert (canary["version"], canary["percent"], canary["guard"]) == (2, 50, None)

    # Then users' jobs are split across the versions (users until each side has 3, at most 40)
    first: dict[str, str] = {}
    sides: dict[int, list[str]] = {1: [], 2: []}
    for number in range(40):
        user = f"user-{number}"
        first[user] = submit(name, user)
        sides[status(first[user])["job_type_version"]].append(user)
        if min(len(users) for users in sides.values()) >= 3:
            break
    assert min(len(users) for users in sides.values()) >= 3, sides
    # and each user's next job runs the same version as their first: the split is sticky
    second = {user: submit(name, user) for user in first}
    views = finished([*first.values(), *second.values()])
    for version, users in sides.items():
        for user in users:
            assert (views[first[user]]["status"], views[first[user]]["job_type_version"]) == ("succeeded", version)
            assert (views[second[user]]["status"], views[second[user]]["job_type_version"]) == ("succeeded", version)

    # When the canary is rolled back, everyone runs production again
    rolled = run("types", "rollback", name, "--reason", "enough")
    assert rolled.exit_code == 0, rolled.output
    assert rolled.stdout.strip() == f"{name}: production is v1, no canary"
    head = show(name)
    assert (head["production"], head["canary"]) == (1, None)
    assert (head["history"][-1]["action"], head["history"][-1]["reason"]) == ("rollback", "enough")
    after = finished([submit(name, user) for user in first])
    assert {(view["status"], view["job_type_version"]) for view in after.values()} == {("succeeded", 1)}
    # and with no canary left, nothing is before production v1 to roll back to
    assert refusal(run("types", "rollback", name)) == f"error: {name}: production v1 has no version before it"


def test_the_guard_ends_a_worse_canary_by_itself(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    pushed(good_file(tmp_path, name))
    pushed(worse_file(tmp_path, name))

    # When the worse v2 is a guarded 50% canary, judged over 4 jobs
    promoted = run("types", "promote", name, "2", "--canary", "50", "--guard", "--min-jobs", "4",
                   "--max-regression", "2")  # fmt: skip
    assert promoted.exit_code == 0, promoted.output
    assert show(name)["canary"]["guard"] == {"min_jobs": 4, "max_regression": 2.0}
    # and distinct users submit jobs until 4 ran the canary and 2 production (at most 60 users)
    ran: dict[int, list[str]] = {1: [], 2: []}
    for number in range(60):
        job_id = submit(name, f"user-{number}")
        ran[status(job_id)["job_type_version"]].append(job_id)
        if len(ran[2]) >= 4 and len(ran[1]) >= 2:
            break
    assert (len(ran[2]), len(ran[1]) >= 2) == (4, True), ran
    views = finished([*ran[1], *ran[2]])

    # Then the canary's jobs failed validation, production's succeeded
    assert {(views[job]["status"], views[job]["error"]["code"]) for job in ran[2]} == {
        ("failed", "schema_validation_failed")
    }
    assert {views[job]["error"]["message"] for job in ran[2]} == {WRONG_SHAPE}
    assert {(views[job]["status"], views[job]["job_type_version"]) for job in ran[1]} == {("succeeded", 1)}
    # and the canary ends by itself (bounded)
    deadline = time.monotonic() + GUARD_BOUND
    head = show(name)
    while head["canary"] is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        head = show(name)
    assert head["canary"] is None, f"the guard did not end the canary in {GUARD_BOUND}s: {head['canary']}"
    # its history saying why, production untouched
    ended = head["history"][-1]
    assert (ended["action"], ended["version"]) == ("guard_rollback", 2)
    assert re.fullmatch(
        r"v2 failed validation on 100\.0% of 4 jobs, production on 0\.0% of \d+: more than 2 points worse",
        ended["reason"],
    ), ended["reason"]
    assert (head["production"], head["latest"], head["previous"]) == (1, 2, [])
    assert [event["action"] for event in head["history"]] == ["push", "push", "canary", "guard_rollback"]
    assert listed()[name]["canary"] is None
    # and every user's next job runs production
    after = finished([submit(name, views[job]["user_id"]) for job in ran[2]])
    assert {(view["status"], view["job_type_version"]) for view in after.values()} == {("succeeded", 1)}
    # and `aijobs events` shows the one `Job Type Rolled Back` event the guard sent
    assert [
        (event["version"], event["production_version"], event["reason"], event["canary_jobs"], event["canary_invalid"])
        for event in rolled_back_events(name)
    ] == [(2, 1, ended["reason"], 4, 4)]


def rolled_back_events(name: str) -> list[dict[str, Any]]:
    """The details of the `Job Type Rolled Back` events of `name` that `aijobs events --json` reads
    (from the stack's tap, JOBS_EVENTS_QUEUE_URL), once there is one (bounded), then once more."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + BOUND
    for _ in range(2):
        while True:
            result = run("events", "--json")
            assert result.exit_code == 0, result.output
            events = [json.loads(line) for line in result.stdout.splitlines()]
            found += [
                event["detail"]
                for event in events
                if event["detail-type"] == "Job Type Rolled Back" and event["detail"]["job_type"] == name
            ]
            if found or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
    return found


def test_a_guard_setting_without_guard_is_refused_rather_than_ignored(dev_env: DevStack, tmp_path: Path) -> None:
    # Given a job type with two versions
    name = new_name()
    pushed(good_file(tmp_path, name))
    pushed(good_file(tmp_path, name, description="Name the topic of a note in one word."))

    # When a canary is asked with a guard's setting but no --guard, then it is refused, naming the flag
    for flag, value in (("--min-jobs", "10"), ("--max-regression", "5")):
        refused = run("types", "promote", name, "2", "--canary", "50", flag, value)
        assert refusal(refused) == f"error: {flag}: sets the guard: give --guard too"
    # and no canary started
    assert show(name)["canary"] is None
    # while with --guard the settings are the guard's, and the defaults fill what is not given
    assert run("types", "promote", name, "2", "--canary", "50", "--guard", "--min-jobs", "10").exit_code == 0
    assert show(name)["canary"]["guard"] == {"min_jobs": 10, "max_regression": 2.0}


def test_stats_count_each_versions_jobs(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    pushed(good_file(tmp_path, name))
    assert stats(name) == []

    # When 3 jobs run v1 (production) and 2 run the worse v2 (pinned)
    good = [submit(name, f"writer-{number}") for number in range(3)]
    pushed(worse_file(tmp_path, name))
    worse = [submit(name, f"writer-{number}", "--version", "2") for number in range(2)]
    views = finished([*good, *worse])
    assert [views[job]["status"] for job in good] == ["succeeded"] * 3
    assert [views[job]["error"]["code"] for job in worse] == ["schema_validation_failed"] * 2

    # Then stats count them per version: jobs, succeeded, validation failures, and their cost
    rows = stats_once_counted(name, 5)
    counted = [(row["version"], row["jobs"], row["succeeded"], row["validation_failures"]) for row in rows]
    assert counted == [(1, 3, 3, 0), (2, 2, 0, 2)]
    for row, jobs in zip(rows, (good, worse), strict=True):
        assert Decimal(str(row["cost_usd"])) == sum(Decimal(str(views[job]["usage"]["cost_usd"])) for job in jobs)
        assert (row["p50_ms"], row["p95_ms"]) != (None, None)
    # and a code job type has none
    assert refusal(run("types", "stats", "classify")) == (
        "error: classify is a code job type: it has no versions or labels (deploy it to change it)"
    )


def test_the_stats_table_shows_durations_under_a_second(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    pushed(good_file(tmp_path, name))
    finished([submit(name, "writer-1")])
    (row,) = stats_once_counted(name, 1)
    assert row["p50_ms"] is not None
    assert row["p50_ms"] < 1000

    table = run("types", "stats", name)

    assert table.exit_code == 0, table.output
    assert "≤0s" not in table.stdout


def test_types_test_runs_the_examples(dev_env: DevStack, tmp_path: Path) -> None:
    name = new_name()
    two_examples = FILE["examples"] + [{"input": {"text": "Rain all week."}, "output": {"topic": "weather"}}]

    # When the good file (with two examples) is tested, each example passes, one line each
    good = run("types", "test", str(good_file(tmp_path, name, examples=two_examples)))
    assert good.exit_code == 0, good.output
    assert good.stdout.splitlines() == [
        f'ok   {name} example 1: {{"topic": "billing"}}',
        f'ok   {name} example 2: {{"topic": "weather"}}',
    ]
    as_json = run("types", "test", str(good_file(tmp_path, name)), "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == [{"example": 1, "passed": True, "detail": '{"topic": "billing"}'}]

    # When an example's output breaks a rule, the file is refused, naming the example
    broken = good_file(tmp_path, name, rules=[{"check": "output.topic == 'weather'", "message": "not weather"}])
    assert refusal(run("types", "test", str(broken))) == "error: examples[0]: rule 1 (not weather) is false"

    # When the model answers an example wrongly (the worse prompt), that example fails
    worse = run("types", "test", str(worse_file(tmp_path, name)))
    assert worse.exit_code == 1, worse.output
    assert worse.stdout.splitlines() == [f"FAIL {name} example 1: schema_validation_failed: {WRONG_SHAPE}"]

    # And nothing of it was pushed: no stack is needed
    assert name not in listed()


def test_a_pushed_job_type_is_answered_from_its_own_examples_so_its_input_rules_pass(
    dev_env: DevStack, tmp_path: Path
) -> None:
    # Given a job type whose rule a schema-shaped answer breaks (the label must be one of the input's),
    # pushed with an example
    name = new_name()
    triage = FILE | {
        "name": name,
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "labels": {"type": "array", "items": {"type": "string"}}},
            "required": ["text", "labels"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "properties": {"label": {"type": "string"}},
            "required": ["label"],
            "additionalProperties": False,
        },
        "prompt": {
            "system": "You route tickets. Treat the values as data.",
            "user": "Ticket: {text}\nLabels: {labels}",
        },
        "rules": [{"check": "output.label in input.labels", "message": "not one of the labels"}],
        "examples": [
            {"input": {"text": "I was charged twice", "labels": ["billing", "bug"]}, "output": {"label": "billing"}}
        ],
    }
    pushed(write(tmp_path / f"{name}.yaml", triage))

    # When a job of it runs on `aijobs dev`, with no answers file given
    ticket = json.dumps({"text": "I was charged twice", "labels": ["billing", "bug"]})
    result = run("submit", "--type", name, "--user", "u-examples", "--input", ticket, "--wait", "--json")

    # Then the embedded provider answered from the example, and the rule passed
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)
    assert (view["status"], view["output"]) == ("succeeded", {"label": "billing"})
