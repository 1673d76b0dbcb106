"""The dashboard as a person (and an attacker) uses it: a moto server on 127.0.0.1 with the template's
resources, jobs made by the engine's own runner (a scripted provider), the dashboard on port 0, and
a real Chromium driven by Playwright.

Chromium: the system's (/usr/bin/chromium, Debian's `chromium` package: .ci/run installs it), else
Playwright's own. With neither, the tests fail under AIJOBS_REQUIRE_BROWSER=1 (.ci/run sets it) and
are skipped otherwise, and the run ends with a line saying so.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Error, Page, sync_playwright

from aijobs.client import AiJobsClient
from aijobs.local.aws import LocalAws
from aijobs.local.devstack import local_session
from aijobs.stack import create_stack_resources
from aijobs.ui.server import DashboardServer
from engine.aws_errors import is_transient
from engine.config import Settings, load_settings
from engine.core import BatchTerms, Delivery, Lane
from engine.core.batches import BatchRecord
from engine.core.errors import ProviderRejectedError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.classify import CLASSIFY
from engine.gateway import Answered, Completion, ModelGateway, ModelTiers
from engine.runner import Claimed, JobRunner
from engine.store import DynamoJobStore
from engine.store.batches import BatchTable
from engine.wiring import Aws, build_store
from tests.conftest import BROWSERLESS
from tests.support.batches import batch_record, ended_batch
from tests.support.providers import FakeProvider, valid_answer

SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
# What a run without a browser says, in each skipped test and once at its end (tests/conftest.py).
NO_BROWSER = f"{BROWSERLESS} no Chromium at {SYSTEM_CHROMIUM} (apt-get install chromium)"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# LLM output meant to run in the page: it must show as text and run nothing.
HOSTILE = '<script>window.__pwned = "script"; alert(1)</script><img src=x onerror="window.__pwned = \'img\'; alert(2)">'
# Longer than a page shows (present.CLIP_CHARS), within what summarize accepts (1.2 x max_words words).
LONG_SUMMARY = " ".join(f"sentence-{n:05d}" for n in range(1_100))
LONG_INPUT = {"text": "".join(f"paragraph {n:05d} of a long input. " for n in range(1_500)), "max_words": 1_000}
SUMMARIZE_INPUT = {"text": "SQS stores messages redundantly and delivers them at least once.", "max_words": 30}
CLASSIFY_INPUT = {"text": "Win a free cruise now!", "labels": ["spam", "ham"]}
# The batch window a background job joins (AIJOBS_BATCH_WINDOW_SECONDS' default), and how long before
# its deadline its batch holds it.
BATCH_WINDOW_MS = 300_000
BATCH_HOLD_MS = 600_000
# Of the input tokens of the job its batch answered: read from the provider's prompt cache.
BATCH_CACHED_TOKENS = 60
# A dead letter's body that names no job: markup meant to run, then more than a page shows.
HOSTILE_BODY = f"{HOSTILE} " + "x" * 12_000


@dataclass
class Jobs:
    """The jobs the module's stack holds, by role, and what a test needs to make more."""

    client: AiJobsClient
    # The AWS requests the client sent, by "<service> <Operation>".
    requests: Counter[str]
    store: DynamoJobStore
    run: Any
    user: str
    succeeded: str
    flaky: str
    hostile: str
    long: str
    queued: str
    failed: str
    dead_lettered: str
    dead_letter_message: str
    # A dead letter whose body names no job (HOSTILE_BODY).
    hostile_letter: str
    # Background jobs (of a user of their own): one waiting in a provider's batch, one its batch answered;
    # and the batch records the batcher keeps: one in flight, one ended.
    background_user: str
    in_batch: str
    batch_answered: str
    batch_answered_by: str
    batch_in_flight: BatchRecord
    batch_ended: BatchRecord

    @property
    def all(self) -> list[str]:
        """Every job of `user`, in the order they were made."""
        return [self.succeeded, self.flaky, self.hostile, self.long, self.failed, self.dead_lettered, self.queued]

    def failed_now(self, user: str, count: int) -> list[str]:
        """`count` new jobs of `user`, each failed by the provider's refusal; their ids, oldest first."""
        made = []
        for number in range(count):
            job_id = self.client.submit("classify", user, CLASSIFY_INPUT, job_id=f"{user}-failed-{number}").job_id
            self.run(job_id, ProviderRejectedError("the provider refused the request (HTTP 400)", 400))
            made.append(job_id)
        return made

    def paid_and_reused(self) -> tuple[str, str]:
        """Two new jobs of one request (of a user of their own), their job type reusing answers: the first
        calls the model, the second takes its answer (docs/reuse.md). Their ids."""
        registry = JobRegistry([replace(CLASSIFY, reuse_seconds=3_600)])
        gateway = ModelGateway(FakeProvider(), ModelTiers("gpt-4o-mini"))
        runner = JobRunner(self.store, gateway, registry, DeadLetterRecorder(self.store, registry))
        made = []
        for role in ("paid", "reused"):
            job_id = f"{role}-{uuid.uuid4().hex[:6]}"
            message = {
                "job_id": job_id,
                "job_type": "classify",
                "user_id": f"{self.user}-reuse",
                "input": CLASSIFY_INPUT,
            }
            runner.process(Delivery(uuid.uuid4().hex, json.dumps(message)))
            made.append(job_id)
        return made[0], made[1]

    @property
    def background(self) -> list[str]:
        """Every job of `background_user`, in the order they were made (before `all`)."""
        return [self.in_batch, self.batch_answered]


class ScriptedRuns:
    """Runs a job once through the engine's runner, the provider answering as told."""

    def __init__(self, store: DynamoJobStore) -> None:
        self.provider = FakeProvider()
        registry = JobRegistry()
        gateway = ModelGateway(self.provider, ModelTiers("gpt-4o-mini"))
        recorder = DeadLetterRecorder(store, registry)
        self.runner = JobRunner(store, gateway, registry, recorder, rng=random.Random(7), is_transient=is_transient)

    def __call__(self, job_id: str, answer: Any = valid_answer) -> None:
        self.provider.script = answer if callable(answer) else lambda _request: answer
        self.runner.process(Delivery(uuid.uuid4().hex, json.dumps({"job_id": job_id})))

    def into_batch(self, job_id: str, window: str) -> Claimed:
        """Claim a background job into a provider's batch window, as a background worker does."""
        delivery = Delivery(uuid.uuid4().hex, json.dumps({"job_id": job_id}), lane=Lane.BACKGROUND)
        claimed = self.runner.claim(delivery, batch=BatchTerms(window, 0, BATCH_HOLD_MS))
        assert isinstance(claimed, Claimed)
        assert claimed.job.batch == window
        return claimed

    def answered_by_batch(self, claimed: Claimed, batch_id: str, answer: dict[str, Any]) -> None:
        """Finish a job its batch answered, as the batcher does."""
        completion = Completion(
            json.dumps(answer), "gpt-4o-mini", 100, 20, latency_ms=0, cached_input_tokens=BATCH_CACHED_TOKENS
        )
        decision = self.runner.answer(claimed, Answered(completion, batch_id))
        self.runner.finish(claimed.job, claimed.request, decision)


@pytest.fixture(scope="module")
def settings() -> Iterator[Settings]:
    """A moto server on 127.0.0.1 (port 0) with a fresh stack from template.yaml: the embedded stack's AWS."""
    with LocalAws() as aws:
        resources = create_stack_resources(
            f"ui-{uuid.uuid4().hex[:8]}", session=local_session(), endpoint_url=aws.endpoint_url
        )
        yield load_settings({"AWS_ENDPOINT_URL": aws.endpoint_url} | resources.environment())


@pytest.fixture(scope="module")
def jobs(settings: Settings) -> Jobs:
    """A job of every kind a page shows, made the way the engine makes them (about 40 requests)."""
    session = local_session()
    requests: Counter[str] = Counter()
    session.events.register(
        "before-call.*.*", lambda event_name, **_: requests.update([" ".join(event_name.split(".")[1:3])])
    )
    client = AiJobsClient.from_settings(settings, session)
    store = build_store(settings, Aws(settings, local_session()))
    run = ScriptedRuns(store)
    tag = uuid.uuid4().hex[:6]
    user = f"ui-{tag}"

    def submit(name: str, job_type: str = "summarize", job_input: dict[str, Any] | None = None) -> str:
        job_input = job_input or (SUMMARIZE_INPUT if job_type == "summarize" else CLASSIFY_INPUT)
        return client.submit(job_type, user, job_input, job_id=f"{name}-{tag}").job_id

    # First the background user's jobs: the user's own are the newest, for the pages that list them.
    background_user = f"{user}-bg"
    now = int(time.time() * 1000)
    window = f"{now - now % BATCH_WINDOW_MS:013d}"
    in_batch = client.submit("classify", background_user, CLASSIFY_INPUT, job_id=f"in-batch-{tag}", lane="background")
    run.into_batch(in_batch.job_id, window)
    answered = client.submit("classify", background_user, CLASSIFY_INPUT, job_id=f"by-batch-{tag}", lane="background")
    answered_by = f"batch_ui_{tag}"
    run.answered_by_batch(run.into_batch(answered.job_id, window), answered_by, {"label": "spam", "confidence": 0.9})
    # Each batch's first part is named, as the batcher names parts, by when it was written and a random id.
    in_flight = batch_record(window, f"{now:013d}-{uuid.uuid4().hex[:12]}", now, f"batch_pending_{tag}", answered=1)
    # The provider's words are outside text too: its detail of the ended batch means to run in the page.
    ended = ended_batch(
        batch_record(window, f"{now - 1:013d}-{uuid.uuid4().hex[:12]}", now, answered_by),
        now,
        detail=HOSTILE,
        finished=1,
    )
    succeeded = submit("ok", "classify")
    run(succeeded)
    flaky = submit("flaky")
    run(flaky, ProviderUnavailableError("the provider answered 503"))
    run(flaky, {"summary": "Delivered at least once."})
    hostile = submit("hostile", job_input={"text": f"Untrusted input {HOSTILE}", "max_words": 30})
    run(hostile, {"summary": HOSTILE})
    long = submit("long", job_input=LONG_INPUT)
    run(long, {"summary": LONG_SUMMARY})
    failed = submit("failed", "classify")
    run(failed, ProviderRejectedError("the provider refused the request (HTTP 400)", 400))
    dead_lettered = submit("dead")
    message = f"m-{tag}"
    recorder = DeadLetterRecorder(store, JobRegistry())
    recorder.record(message, json.dumps({"job_id": dead_lettered}), {}, 100)
    hostile_letter = f"m-hostile-{tag}"
    recorder.keep(hostile_letter, HOSTILE_BODY, {"source": HOSTILE}, 100, "not JSON")
    queued = submit("queued")
    client.set_budget(user, Decimal(1))

    records = BatchTable(settings.jobs_table_name, Aws(settings, local_session()).client("dynamodb"))
    assert records.create(in_flight)
    assert records.create(ended)
    return Jobs(
        client, requests, store, run, user, succeeded, flaky, hostile, long, queued, failed, dead_lettered, message,
        hostile_letter, background_user, in_batch.job_id, answered.job_id, answered_by, in_flight, ended,
    )  # fmt: skip


@pytest.fixture(scope="module")
def dashboard(jobs: Jobs) -> Iterator[DashboardServer]:
    """The read-only dashboard, as `aijobs ui --port 0` serves it."""
    with DashboardServer(jobs.client, port=0) as server:
        yield server


@pytest.fixture(scope="module")
def acting_dashboard(jobs: Jobs) -> Iterator[DashboardServer]:
    """The dashboard with cancel, retry and redrive, as `aijobs ui --allow-actions --port 0` serves it."""
    with DashboardServer(jobs.client, port=0, allow_actions=True) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """The system's Chromium, else Playwright's own; with neither, the browser tests fail where a browser
    is required (AIJOBS_REQUIRE_BROWSER=1: .ci/run) and are skipped elsewhere, saying so (NO_BROWSER)."""
    with sync_playwright() as playwright:
        if SYSTEM_CHROMIUM.exists():
            chromium = playwright.chromium.launch(executable_path=str(SYSTEM_CHROMIUM), args=CHROMIUM_ARGS)
        else:
            try:
                chromium = playwright.chromium.launch(args=CHROMIUM_ARGS)
            except Error as exc:
                why = f"{NO_BROWSER}; nor Playwright's own: {str(exc).splitlines()[0]}"
                if os.environ.get("AIJOBS_REQUIRE_BROWSER") == "1":
                    pytest.fail(f"AIJOBS_REQUIRE_BROWSER=1 and {why}")
                pytest.skip(why)
        yield chromium
        chromium.close()


class Watched:
    """A page, with what it reported: dialogs it opened, console messages, and its page errors."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.console: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        page.on("console", lambda message: self.console.append(message.text))
        page.on("pageerror", lambda error: self.errors.append(str(error)))


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


# Where the tests save what the pages looked like, for a person to look at (printed after the run).
SCREENSHOTS = Path(os.environ.get("AIJOBS_UI_SCREENSHOTS") or Path(tempfile.gettempdir()) / "aijobs-ui-screenshots")


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SCREENSHOTS.is_dir() and any(SCREENSHOTS.glob("*.png")):
        terminalreporter.write_line(f"dashboard screenshots: {SCREENSHOTS}")
