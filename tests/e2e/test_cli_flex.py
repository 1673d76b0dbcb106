"""Flex tiers and the one view of the price as the `aijobs` command shows them, in this process, against
the embedded stack with flex on (`AIJOBS_FLEX=on`, a model with a flex tier, the local provider serving
`service_tier`): `submit --wait`, `inspect`, and `usage` by route, in JSON and as tables."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from aijobs.local.devstack import DevStack, DevStackOptions
from tests.support.cli import succeeded
from tests.support.contract import USAGE_ROW_FIELDS

FLEX_ON = {"AIJOBS_FLEX": "on", "AI_MODEL_PRIMARY": "gpt-5-mini"}
LABELS = ["spam", "ham"]


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    """The embedded stack with flex on (tests use it through `dev_env`)."""
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=0,
        provider_flex_latency_seconds=0,
        function_environment=FLEX_ON,
        quiet=True,
    )
    with DevStack(options) as stack:
        yield stack


def submit(user: str, text: str, lane: str) -> dict[str, Any]:
    """A classify job run to its end (`submit --wait --json`): its view."""
    job_input = json.dumps({"text": text, "labels": LABELS})
    job_id = f"{user}-{uuid.uuid4().hex[:6]}"
    view: dict[str, Any] = succeeded(
        "submit", "--type", "classify", "--user", user, "--input", job_input, "--job-id", job_id,
        "--lane", lane, "--wait", "--json",
    )  # fmt: skip
    return view


def test_a_background_job_runs_at_flex_and_inspect_shows_the_tier_and_both_costs(dev_env: DevStack) -> None:
    view = submit(f"u-flex-{uuid.uuid4().hex[:6]}", "Win a free cruise now!", "background")

    assert (view["status"], view["via"]) == ("succeeded", "flex")
    assert view["usage"]["standard_cost_usd"] == pytest.approx(2 * view["usage"]["cost_usd"])
    inspection = succeeded("inspect", view["job_id"], "--json")
    (attempt,) = inspection["attempts"]
    assert (attempt["via"], attempt["service_tier"]) == ("flex", "flex")
    assert attempt["standard_cost_usd"] == pytest.approx(2 * attempt["cost_usd"])
    assert "flex (flex)" in succeeded("inspect", view["job_id"])


def test_a_refused_flex_call_waits_and_the_job_still_ends_at_flex(dev_env: DevStack) -> None:
    view = submit(f"u-wait-{uuid.uuid4().hex[:6]}", "Win a cruise fault:flex_unavailable*1", "background")

    assert (view["status"], view["attempt_count"], view["usage"]["attempts"]) == ("succeeded", 1, 2)
    refused, served = succeeded("inspect", view["job_id"], "--json")["attempts"]
    assert (refused["via"], refused["error_code"], refused["cost_usd"]) == ("flex", "provider_rate_limited", 0)
    assert (served["via"], served["service_tier"], served["outcome"]) == ("flex", "flex", "succeeded")


def test_usage_splits_cost_by_route_with_what_the_same_calls_cost_in_real_time(dev_env: DevStack) -> None:
    # Given a user's background job at flex and interactive job in real time
    user = f"u-routes-{uuid.uuid4().hex[:6]}"
    flexed = submit(user, "Win a free cruise now!", "background")
    now = submit(user, "The invoice is attached.", "interactive")

    # When usage is asked for, as JSON
    rows = succeeded("usage", "--user", user, "--since", "1h", "--json")

    # Then each route has its rows, with its standard cost and its saving
    assert all(list(row) == USAGE_ROW_FIELDS for row in rows)
    by_via = {row["via"]: row for row in rows}
    assert set(by_via) == {"flex", "realtime"}
    assert by_via["flex"]["cost_usd"] == pytest.approx(flexed["usage"]["cost_usd"])
    assert by_via["flex"]["standard_cost_usd"] == pytest.approx(2 * by_via["flex"]["cost_usd"])
    assert by_via["flex"]["saved_usd"] == pytest.approx(by_via["flex"]["cost_usd"])
    assert by_via["realtime"]["cost_usd"] == pytest.approx(now["usage"]["cost_usd"])
    assert by_via["realtime"]["standard_cost_usd"] == pytest.approx(by_via["realtime"]["cost_usd"])
    assert by_via["realtime"]["saved_usd"] == 0

    # And as tables: the rows with their route, then cost by route with the prompt cache and the total
    text = succeeded("usage", "--user", user, "--since", "1h")
    assert "cost by route" in text
    for route in ("realtime", "batch", "flex", "reuse", "prompt cache", "in real time", "saved"):
        assert route in text
