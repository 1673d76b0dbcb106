"""The dashboard's one view of the price, in Chromium: the usage page's cost by route beside what the same
calls would have cost in real time at the standard tier, and a flex attempt on its job's page. Jobs of a
stack of this module's own, run by the engine's runner with flex on and a scripted provider."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from aijobs.client import AiJobsClient
from aijobs.local.devstack import local_session
from aijobs.ui.server import DashboardServer
from engine.config import Settings
from engine.core import Delivery, Lane
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import Completion, CompletionRequest, ModelGateway, ModelTiers
from engine.runner import JobRunner
from engine.wiring import Aws, build_store
from tests.support.providers import VALID_OUTPUTS, FakeProvider
from tests.ui.conftest import CLASSIFY_INPUT

FLEX_MODEL = "gpt-5-mini"
# One classify call of 100 input and 20 output tokens of gpt-5-mini, at the standard tier and at flex.
STANDARD_USD, FLEX_USD = "$0.000065", "$0.0000325"


def served_as_asked(request: CompletionRequest) -> Completion:
    """A valid answer, served at the tier asked for (the standard one, `default`, when none)."""
    answer = json.dumps(VALID_OUTPUTS["classify"])
    return Completion(answer, request.model, 100, 20, latency_ms=5, service_tier=request.service_tier or "default")


@dataclass(frozen=True)
class Routed:
    client: AiJobsClient
    user: str
    flex_job: str


@pytest.fixture(scope="module")
def routed(settings: Settings) -> Routed:
    """Two background jobs run at the flex tier and one interactive job in real time, of one user."""
    client = AiJobsClient.from_settings(settings, local_session())
    store = build_store(settings, Aws(settings, local_session()))
    registry = JobRegistry()
    gateway = ModelGateway(FakeProvider(served_as_asked), ModelTiers(FLEX_MODEL))
    runner = JobRunner(store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(5), flex=True)
    user = f"routes-{uuid.uuid4().hex[:6]}"
    made = []
    for name, lane in (("flex-1", Lane.BACKGROUND), ("flex-2", Lane.BACKGROUND), ("now", Lane.INTERACTIVE)):
        job_id = client.submit("classify", user, CLASSIFY_INPUT, job_id=f"{user}-{name}", lane=lane.value).job_id
        runner.process(Delivery(uuid.uuid4().hex, json.dumps({"job_id": job_id}), lane=lane))
        made.append(job_id)
    return Routed(client, user, made[0])


@pytest.fixture(scope="module")
def routes_dashboard(routed: Routed) -> Iterator[DashboardServer]:
    with DashboardServer(routed.client, port=0) as server:
        yield server


def test_usage_splits_cost_by_route_beside_the_standard_real_time_cost_and_the_saving(
    page: Page, routes_dashboard: DashboardServer, routed: Routed, screenshots: Path
) -> None:
    page.goto(f"{routes_dashboard.url}usage?since=24h&user={routed.user}")

    routes = page.locator("table.routes")
    expect(routes.locator("caption")).to_have_text("By route")
    # Two flex attempts at half the standard price; the real-time one at it; no batch or reuse
    expect(routes.locator("tr[data-route=flex] td")).to_have_text(["flex", "2", "$0.000065", "$0.000130", "$0.000065"])
    expect(routes.locator("tr[data-route=realtime] td")).to_have_text(
        ["realtime", "1", STANDARD_USD, STANDARD_USD, "$0.000000"]
    )
    expect(routes.locator("tr[data-route=batch] td").nth(1)).to_have_text("0")
    expect(routes.locator("tr[data-route=reuse] td").nth(1)).to_have_text("0")
    expect(routes.locator("tr[data-route=total] td")).to_have_text(
        ["total", "3", "$0.000130", "$0.000195", "$0.000065"]
    )
    expect(page.locator("#content .summary")).to_contain_text(
        "The same calls in real time at the standard tier: $0.000195; the batch and flex routes saved $0.000065"
    )
    page.screenshot(path=screenshots / "usage-routes.png", full_page=True)


def test_a_flex_attempt_shows_the_tier_that_served_it_and_its_real_time_cost(
    page: Page, routes_dashboard: DashboardServer, routed: Routed
) -> None:
    page.goto(f"{routes_dashboard.url}jobs/{routed.flex_job}")

    facts = page.locator(".timeline .attempt-facts").first
    expect(facts).to_contain_text("flex · served at flex")
    expect(facts).to_contain_text(f"{FLEX_USD} (in real time {STANDARD_USD})")
