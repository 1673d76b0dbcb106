"""Background jobs through the provider's batch API as the `aijobs` command shows them: `status`,
`inspect` and `batches`, in this process, against the embedded stack with batches on (the local
provider's Files and Batches APIs, the batcher every second) and windows of one second.

A job waits in its batch only until the batch answers, so the test that looks at a waiting job puts
it in a batch that stalls (`batch-fault:stall` in its input: the local provider never ends that
batch until it is cancelled, and its rescue time is a day away): it waits as long as the test looks.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aijobs.local.devstack import DevStack, DevStackOptions
from tests.support.cli import succeeded
from tests.support.contract import BATCH_FIELDS, VIEW_FIELDS
from tests.support.waiting import eventually

# A window and its grace, a batcher pass, the provider's answer and a poll, on a loaded machine.
BATCH_BOUND = 120.0
LABELS = ["spam", "ham"]


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    """The embedded stack with batches on (tests use it through `dev_env`)."""
    batches_on = {
        "AIJOBS_BATCH_API": "on",
        "AIJOBS_BATCH_WINDOW_SECONDS": "1",
        "AIJOBS_BATCH_POLL_SECONDS": "1",
        "AIJOBS_BATCH_RESCUE_SECONDS": "60",
    }
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=0,
        provider_batch_delay_seconds=0,
        function_environment=batches_on,
        quiet=True,
    )
    with DevStack(options) as stack:
        yield stack


def submit_background(text: str) -> str:
    job_id = f"batched-{uuid.uuid4().hex[:8]}"
    job_input = json.dumps({"text": text, "labels": LABELS})
    succeeded("submit", "--type", "classify", "--user", "u-batch", "--input", job_input, "--job-id", job_id,
        "--lane", "background")  # fmt: skip
    return job_id


def view_once(job_id: str, holds: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The job's view (`aijobs status --json`) once `holds` is true of it."""

    def check() -> dict[str, Any] | None:
        view: dict[str, Any] = succeeded("status", job_id, "--json")
        return view if holds(view) else None

    return eventually(check, timeout=BATCH_BOUND, what=what)


def listed_batch(window: str, *flags: str) -> dict[str, Any] | None:
    """The batch of `window` that `aijobs batches` lists, once the provider has it (its id known)."""
    found = [batch for batch in succeeded("batches", "--json", *flags) if batch["key"].startswith(f"{window}.")]
    return found[0] if found and found[0]["batch_id"] else None


def test_a_job_waiting_in_its_batch_runs_via_batch_and_batches_lists_that_batch_in_flight(dev_env: DevStack) -> None:
    # Given a background job, claimed into a batch window by a worker
    job_id = submit_background("batch-fault:stall Win a free cruise now!")
    claimed = view_once(job_id, lambda view: view["via"] == "batch", "the job's claim into a batch window")
    window = claimed["batch"]

    # When the batcher has created the window's batch at the provider (which holds it unanswered)
    batch = eventually(lambda: listed_batch(window), timeout=BATCH_BOUND, what="the window's batch created")

    # Then the job is running via batch, in the window it joined (its key: the window's start, epoch ms)
    waiting = succeeded("status", job_id, "--json")
    assert list(waiting) == VIEW_FIELDS
    assert (waiting["status"], waiting["via"], waiting["batch"]) == ("running", "batch", window)
    assert re.fullmatch(r"\d{13}", window), window
    assert "batch: waiting for its batch (window of" in succeeded("status", job_id)
    inspected = succeeded("inspect", job_id)
    assert "in a provider's batch (window of" in inspected
    assert "`aijobs batches` lists the batches in flight" in inspected
    # And its batch is in flight: its one line, the provider's state, its rescue time to come
    assert list(batch) == BATCH_FIELDS
    assert (batch["model"], batch["provider"], batch["lines"]) == ("gpt-4o-mini", "openai", 1)
    assert (batch["phase"], batch["state"], batch["ended_at"]) == ("pending", "pending", None)
    assert batch["rescue_at"] > batch["created_at"]
    table = succeeded("batches")
    assert "batches in flight" in table
    assert batch["batch_id"] in table

    # And `aijobs cancel` ends the batched job at once, its batch still at the provider
    cancelled = succeeded("cancel", job_id, "--json")
    assert (cancelled["status"], cancelled["via"], cancelled["batch"]) == ("cancelled", None, None)
    still = listed_batch(window)
    assert still is not None
    assert (still["batch_id"], still["phase"]) == (batch["batch_id"], "pending")


def test_a_job_its_batch_answered_ran_via_that_batch_which_batches_all_lists_as_ended(dev_env: DevStack) -> None:
    # Given a background job submitted with batches on
    job_id = submit_background("Win a free cruise now!")

    # When its batch has answered it
    done = view_once(job_id, lambda view: view["status"] == "succeeded", "the batched job's success")

    # Then its one attempt ran via the provider's batch, which status and inspect both name
    inspection = succeeded("inspect", job_id, "--json")
    [attempt] = inspection["attempts"]
    batch_id = attempt["batch_id"]
    assert (attempt["via"], attempt["outcome"]) == ("batch", "succeeded")
    assert batch_id
    assert (inspection["job"]["via"], inspection["job"]["batch"]) == ("batch", batch_id)
    assert (done["via"], done["batch"]) == ("batch", batch_id)
    assert re.search(rf"^via\s+batch {batch_id}\s*$", succeeded("status", job_id), re.MULTILINE)
    assert f"batch {batch_id}" in succeeded("inspect", job_id)
    # And `aijobs batches` no longer lists its batch in flight; with --all, ended, its one job finished
    assert batch_id not in [batch["batch_id"] for batch in succeeded("batches", "--json")]
    [ended] = [batch for batch in succeeded("batches", "--all", "--json") if batch["batch_id"] == batch_id]
    assert list(ended) == BATCH_FIELDS
    assert (ended["phase"], ended["state"], ended["lines"]) == ("ended", "completed", 1)
    assert (ended["answered"], ended["failed"], ended["finished"], ended["returned"]) == (1, 0, 1, 0)
    assert ended["ended_at"] is not None
    assert batch_id in succeeded("batches", "--all")
