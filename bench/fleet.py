"""The fleet figures of `make bench`: goodput under a provider's rate limit, adaptation to a limit set
too high, and a user's budget, each on the embedded stack (moto, the local provider with a limit of
its own, four local pollers) and measured from the provider's own log and the requests counted on
the workers' DynamoDB clients. `python -m bench.fleet` runs them alone.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.local.devstack import LOCAL_MODEL, DevStack, DevStackOptions, local_session
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from engine.core import ErrorCode, JobStatus
from engine.core.errors import JobNotFoundError
from engine.views import JobView

# The provider's own limit: jobs at this rate take about a minute.
PROVIDER_RPM = 300
JOBS = 300
POLLERS = 4
PROVIDER_LATENCY_SECONDS = 0.05
# Every job is done in this long, or the run reports what is left.
RUN_BOUND_SECONDS = 300.0
# The budget run: a cap of about this many jobs' worst case, and more jobs than that.
BUDGET_JOBS_WORST_CASE = 30
BUDGET_JOBS = 100
BUDGET_USER = "bench-budget"
# Reasoning tokens the local provider bills per answer in the budget run: with the answer, about the
# classify job type's max_tokens (256), so that a call costs near its worst case.
REASONING_TOKENS = 240


@dataclass(frozen=True, slots=True)
class RunStats:
    """A run of `jobs` jobs through the embedded stack, as the provider's log and the table saw it."""

    jobs: int
    succeeded: int
    not_ended: int
    calls_ok: int
    limited: int
    other_errors: int
    busy_seconds: float
    dynamodb_requests: int
    operations: dict[str, int]
    wall_seconds: float
    # What the jobs cost, summed from their usage, and how many were answered more than once.
    spent_usd: Decimal
    ran_twice: int
    # The user's daily cap, in a budget run.
    cap_usd: Decimal | None = None

    def goodput(self, rpm: int) -> float:
        """Successful calls per minute over the busy span (first to last answer), as a share of `rpm`."""
        return self.calls_ok / (self.busy_seconds / 60) / rpm if self.busy_seconds else 0.0

    @property
    def limited_per_100(self) -> float:
        return 100 * self.limited / max(self.calls_ok, 1)

    @property
    def requests_per_success(self) -> float:
        return self.dynamodb_requests / max(self.succeeded, 1)


def classify_input(job_id: str) -> dict[str, Any]:
    return {"text": f"Invoice {job_id} shows the wrong amount, please fix it", "labels": ["billing", "other"]}


def classify_message(job_id: str, user: str) -> str:
    return json.dumps({"job_id": job_id, "job_type": "classify", "user_id": user, "input": classify_input(job_id)})


def run_jobs(options: DevStackOptions, jobs: int, user: str = "bench", budget_jobs: int | None = None) -> RunStats:
    """Send `jobs` classify jobs of `user` as SQS messages and wait until each has ended; with
    `budget_jobs`, the user first gets a daily cap of that many jobs' worst case (`aijobs budget
    set`), and the run waits until each job has ended or waits for the budget."""
    stack = DevStack(options)
    requests = SessionRequests(stack.session)  # the workers' clients are made from this session
    with stack:
        provider = stack.provider
        assert provider is not None
        sqs = stack.session.client("sqs", endpoint_url=stack.settings.aws_endpoint_url)
        # Reads of the jobs are the bench's, on a session of its own: not counted.
        client = AiJobsClient.from_settings(stack.settings, local_session())
        ids = [f"fleet-{uuid.uuid4().hex[:10]}" for _ in range(jobs)]
        cap = None
        if budget_jobs is not None:
            worst = stack.worst_case_usd("classify", classify_input(ids[0]))
            cap = client.set_budget(user, budget_jobs * worst).cap_usd
        requests.operations.clear()  # the stack's own creation is not the engine's work
        started = time.monotonic()
        for start in range(0, jobs, 10):
            entries = [
                {"Id": str(n), "MessageBody": classify_message(job_id, user), "MessageGroupId": user}
                for n, job_id in enumerate(ids[start : start + 10])
            ]
            sqs.send_message_batch(QueueUrl=stack.settings.jobs_queue_url, Entries=entries)  # type: ignore[arg-type]
        views = _wait(client, ids, budget_jobs is not None)
        wall = time.monotonic() - started
        operations = dict(requests.of("dynamodb"))
        log = provider.log
    answered = [entry.at for entry in log if entry.status == 200]
    answers = Counter(entry.prompt_hash for entry in log if entry.status == 200)
    statuses = Counter(view.status for view in views.values())
    return RunStats(
        jobs=jobs,
        succeeded=statuses[JobStatus.SUCCEEDED],
        not_ended=sum(count for status, count in statuses.items() if not status.is_terminal) + jobs - len(views),
        calls_ok=len(answered),
        limited=sum(entry.limited for entry in log),
        other_errors=sum(entry.status != 200 and not entry.limited for entry in log),
        busy_seconds=max(answered) - min(answered) if len(answered) > 1 else 0.0,
        dynamodb_requests=sum(operations.values()),
        operations=operations,
        wall_seconds=wall,
        spent_usd=sum((Decimal(str(view.usage.cost_usd)) for view in views.values()), Decimal(0)),
        ran_twice=sum(count > 1 for count in answers.values()),
        cap_usd=cap,
    )


def _wait(client: AiJobsClient, ids: list[str], waits_for_budget: bool) -> dict[str, JobView]:
    """The jobs' views once each has ended (or waits for its budget), or when the run's bound is up."""
    deadline = time.monotonic() + RUN_BOUND_SECONDS
    views: dict[str, JobView] = {}
    while time.monotonic() < deadline:
        for job_id in ids:
            view = views.get(job_id)
            if view is None or not view.status.is_terminal:
                try:
                    views[job_id] = client.get(job_id)
                except JobNotFoundError:
                    continue  # its message was not received yet
        settled = [view for view in views.values() if view.status.is_terminal or (waits_for_budget and _waits(view))]
        if len(settled) == len(ids):
            break
        time.sleep(1.0)
    return views


def _waits(view: JobView) -> bool:
    return view.status is JobStatus.QUEUED and view.error is not None and view.error.code is ErrorCode.BUDGET_EXCEEDED


def stack_options(*, provider_rpm: int | None, limits_rpm: int | None, budget: str = "") -> DevStackOptions:
    return DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=PROVIDER_LATENCY_SECONDS,
        concurrency=POLLERS,
        provider_rpm=provider_rpm,
        function_environment={
            "AIJOBS_PROVIDER_LIMITS": json.dumps({LOCAL_MODEL: {"rpm": limits_rpm}}) if limits_rpm else "",
            "AIJOBS_DEFAULT_DAILY_BUDGET_USD": budget,
        },
        quiet=True,
        # moto keeps one account per process: each run's stack needs names of its own.
        stack_name=f"fleet-{uuid.uuid4().hex[:6]}",
    )


# --- the figures ----------------------------------------------------------------------------------


def fleet_figures(
    console: Console, jobs: int = JOBS, budget_jobs: int = BUDGET_JOBS, budget_worst_case: int = BUDGET_JOBS_WORST_CASE
) -> list[Figure]:
    r = PROVIDER_RPM
    method = (
        f"{jobs} classify jobs as SQS messages; local provider limited to R = {r} requests/min (429 + Retry-After "
        f"beyond it, 1 s of its rate at once), {PROVIDER_LATENCY_SECONDS * 1000:.0f} ms latency; {POLLERS} local "
        "pollers (a worker each, as Lambda environments), batches of 10; moto; goodput = answered calls/min from "
        "first to last answer"
    )
    console.print(f"fleet: limits = R ({r} rpm), {jobs} jobs ...")
    limited = run_jobs(stack_options(provider_rpm=r, limits_rpm=r), jobs)
    console.print("fleet: no limits ...")
    unlimited = run_jobs(stack_options(provider_rpm=r, limits_rpm=None), jobs)
    console.print(f"fleet: limits = 2R ({2 * r} rpm, too high) ...")
    too_high = run_jobs(stack_options(provider_rpm=r, limits_rpm=2 * r), jobs)
    figures = [
        Figure(
            "goodput under a provider limit: successful calls/min / R, limits = R (without limits)",
            f"{limited.goodput(r):.2f}  ({unlimited.goodput(r):.2f})",
            ">= 0.9",
            limited.goodput(r) >= 0.9,
            method,
        ),
        Figure(
            "provider 429s per 100 successful calls, limits = R (without limits)",
            f"{limited.limited_per_100:.1f}  ({unlimited.limited_per_100:.1f}; "
            f"{limited.limited} / {unlimited.limited} wasted calls)",
            "<= 2",
            limited.limited_per_100 <= 2,
            "the provider's log: 429s from its own limit; a 429 is a wasted call",
        ),
        Figure(
            "DynamoDB requests per successful job, limits = R (without limits)",
            f"{limited.requests_per_success:.2f}  ({unlimited.requests_per_success:.2f})",
            "<= 2.3",
            limited.requests_per_success <= 2.3,
            "requests of the stack's worker clients (botocore hook), all of them, over succeeded jobs: "
            + ", ".join(f"{name} {count}" for name, count in sorted(limited.operations.items())),
        ),
        Figure(
            "limit set at 2R (too high): 429s per 100 successful calls; goodput / R",
            f"{too_high.limited_per_100:.1f}; {too_high.goodput(r):.2f}",
            "<= 5; >= 0.8",
            too_high.limited_per_100 <= 5 and too_high.goodput(r) >= 0.8,
            "as above, AIJOBS_PROVIDER_LIMITS at twice the provider's limit: the shared rate is lowered on 429s "
            "(x0.7, once per overload: a 429 of capacity taken before the last decrease does not lower it again) "
            f"and climbs back 0.5%/s; {too_high.requests_per_success:.2f} requests a job",
        ),
    ]
    figures.append(
        Figure(
            "  wall time until every job ended, limits = R (without limits)",
            f"{_ended(limited)}  ({_ended(unlimited)})",
            "-",
            None,
            f"from the first message sent until every job was terminal, at most {RUN_BOUND_SECONDS:.0f} s; without "
            "limits, jobs rate-limited again and again back off up to 15 min",
        )
    )
    for name, run in (("limits = R", limited), ("2R", too_high)):
        if run.succeeded != run.jobs:
            figures.append(
                Figure(f"  {name}: jobs not succeeded", f"{run.jobs - run.succeeded}", "0", False, "run bound")
            )

    console.print(f"fleet: a budget of {budget_worst_case} jobs' worst case, {budget_jobs} jobs ...")
    budgeted = budget_run(budget_jobs, budget_worst_case)
    cap = budgeted.cap_usd
    assert cap is not None
    spent, twice = budgeted.spent_usd, budgeted.ran_twice
    figures.append(
        Figure(
            "a user's actual spend in a day / their cap",
            f"{spent / cap:.2f}  (${spent:.6f} / ${cap:.6f}); {budgeted.succeeded} ran, {budgeted.not_ended} wait, "
            f"{twice} ran twice",
            "<= 1.0",
            spent <= cap and twice == 0 and budgeted.succeeded + budgeted.not_ended == budget_jobs,
            f"{budget_jobs} jobs of one user, a daily cap (aijobs budget set) of {budget_worst_case} x one "
            "job's worst case (ModelGateway.plan: max tokens, the re-ask); the local provider bills reasoning "
            "tokens up to max_tokens so that calls cost near their worst case",
        )
    )
    return figures


def _ended(run: RunStats) -> str:
    if run.not_ended:
        return f"{run.not_ended} of {run.jobs} not ended after {run.wall_seconds:.0f} s"
    return f"{run.wall_seconds:.0f} s"


def budget_run(jobs: int, worst_case: int) -> RunStats:
    # Budgets on ("unlimited": only users with a cap of their own are capped).
    options = stack_options(provider_rpm=None, limits_rpm=None, budget="unlimited")
    options = replace(options, provider_reasoning_tokens=REASONING_TOKENS)
    return run_jobs(options, jobs, BUDGET_USER, budget_jobs=worst_case)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print_figures("aijobs bench, fleet", fleet_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
