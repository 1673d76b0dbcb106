"""`aijobs ... --stack NAME` (or AIJOBS_STACK) against a deployed stack on a moto server: the
commands find the table, queue and bucket in the stack's outputs, with no JOBS_* variable set."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from typer.testing import Result

from aijobs.stack import StackResources, create_stack_resources
from engine.store.batches import BatchTable
from tests.support.batches import batch_record, ended_batch
from tests.support.cli import run
from tests.support.contract import BATCH_FIELDS
from tests.support.deployed import deploy_stand_in

CLASSIFY_INPUT = json.dumps({"text": "Win a cruise!", "labels": ["spam", "ham"]})
Deploy = Callable[..., tuple[str, StackResources]]


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    return line


@pytest.fixture
def deploy(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Deploy:
    """Deploy a stand-in stack on the server (its resources from template.yaml), with nothing in
    the environment naming them."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    for name in list(os.environ):
        if name.upper().startswith(("JOBS_", "AIJOBS_")):
            monkeypatch.delenv(name)

    def deployed(**parameters: str) -> tuple[str, StackResources]:
        name = f"deployed-{uuid.uuid4().hex[:8]}"
        resources = create_stack_resources(name, session=boto3.Session(region_name="us-east-1"))
        deploy_stand_in(boto3.client("cloudformation"), name, resources, parameters)
        return name, resources

    return deployed


def queued_messages(queue_url: str) -> list[Any]:
    received = boto3.client("sqs").receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    return [json.loads(message["Body"]) for message in received.get("Messages", [])]


def test_submit_status_and_list_take_the_stack_after_the_command(deploy: Deploy) -> None:
    # Given a deployed stack, When a job is submitted, shown and listed with --stack after the command
    stack, resources = deploy()
    submitted = run(
        "submit", "--type", "classify", "--user", "u-1", "--input", CLASSIFY_INPUT, "--job-id", "s-1", "--stack", stack
    )
    status = run("status", "s-1", "--stack", stack, "--json")
    listed = run("list", "--stack", stack, "--json")

    # Then each reads the stack's table, and the job's message is on the stack's queue
    assert submitted.exit_code == 0, submitted.output
    assert submitted.stdout.strip() == "s-1"
    assert json.loads(status.stdout)["status"] == "queued"
    assert [view["job_id"] for view in json.loads(listed.stdout)] == ["s-1"]
    assert queued_messages(resources.queue_url) == [{"job_id": "s-1"}]


def test_aijobs_stack_in_the_environment_does_the_same(deploy: Deploy, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, resources = deploy()
    monkeypatch.setenv("AIJOBS_STACK", stack)

    submitted = run("submit", "--type", "classify", "--user", "u-2", "--input", CLASSIFY_INPUT, "--job-id", "s-2")
    status = run("status", "s-2", "--json")
    listed = run("list", "--user", "u-2", "--json")

    assert submitted.exit_code == 0, submitted.output
    assert json.loads(status.stdout)["user_id"] == "u-2"
    assert [view["job_id"] for view in json.loads(listed.stdout)] == ["s-2"]
    assert queued_messages(resources.queue_url) == [{"job_id": "s-2"}]


def test_the_option_wins_over_the_environment(deploy: Deploy, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, _ = deploy()
    other, _ = deploy()
    monkeypatch.setenv("AIJOBS_STACK", other)
    run("submit", "--type", "classify", "--user", "u-3", "--input", CLASSIFY_INPUT, "--job-id", "s-3", "--stack", stack)

    assert json.loads(run("status", "s-3", "--stack", stack, "--json").stdout)["job_id"] == "s-3"
    assert one_error_line(run("status", "s-3")) == "error: job s-3 does not exist"


def test_budget_show_knows_the_stack_s_default_daily_budget(deploy: Deploy) -> None:
    # The stack's DefaultDailyBudgetUsd is the cap of a user without one of their own, as the workers have it.
    stack, _ = deploy(DefaultDailyBudgetUsd="0.5")

    shown = run("budget", "show", "--user", "acme", "--stack", stack, "--json")

    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["cap_usd"] == 0.5


def test_dead_letters_without_a_command_takes_the_stack(deploy: Deploy) -> None:
    stack, _ = deploy()

    listed = run("dead-letters", "--stack", stack, "--json")

    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []


def test_batches_lists_the_stack_s_batches_in_flight_and_with_all_the_ended_ones(deploy: Deploy) -> None:
    # Given a deployed stack whose batcher recorded a batch in flight and one that ended
    stack, resources = deploy()
    assert run("batches", "--stack", stack, "--json").stdout.strip() == "[]"
    now = int(time.time() * 1000)
    window = f"{now - now % 300_000:013d}"
    pending = batch_record(window, f"{now:013d}-000000000001", now, "batch_pending", lines=40, answered=12)
    ended = ended_batch(
        batch_record(window, f"{now:013d}-000000000000", now - 6_600_000, "batch_ended", lines=40),
        now - 3_600_000,
        answered=39,
        failed=1,
        finished=39,
        returned=1,
    )
    records = BatchTable(resources.table_name, boto3.client("dynamodb"))
    assert records.create(pending)
    assert records.create(ended)

    # When they are listed with --stack: in flight, with --all, and as a table
    in_flight = run("batches", "--stack", stack, "--json")
    every = run("batches", "--all", "--stack", stack, "--json")
    table = run("batches", "--stack", stack)

    # Then the batch in flight alone, then both oldest first, each with the documented fields
    assert in_flight.exit_code == 0, in_flight.output
    [listed] = json.loads(in_flight.stdout)
    assert list(listed) == BATCH_FIELDS
    assert (listed["batch_id"], listed["phase"], listed["state"], listed["lines"]) == (
        "batch_pending",
        "pending",
        "pending",
        40,
    )
    assert [batch["batch_id"] for batch in json.loads(every.stdout)] == ["batch_ended", "batch_pending"]
    assert json.loads(every.stdout)[0]["ended_at"] is not None
    assert table.exit_code == 0, table.output
    for cell in ("batches in flight", "batch_pending", "pending: in_progress", "12 / 0"):
        assert cell in table.stdout
    # Its age, and its rescue time to come (within minutes of the test's own times: the machine may be slow)
    assert re.search(r"\b1\dm\b", table.stdout), table.stdout
    assert re.search(r"\bin 5\dm\b", table.stdout), table.stdout
    assert "batch_ended" not in table.stdout


def test_an_unknown_stack_is_one_line(deploy: Deploy) -> None:
    assert one_error_line(run("list", "--stack", "no-such-stack")) == (
        "error: stack no-such-stack does not exist in us-east-1"
    )
