"""DynamoDB requests per job under a binding shared limit: three worker processes as `aijobs worker`
runs them (a local event source mapping of two pollers around one worker, contexts counting down
from the function's 300 s timeout), a burst of jobs at once, and AIJOBS_PROVIDER_LIMITS at 60
requests a minute, so that most jobs wait for capacity. Each process counts its own DynamoDB
requests by what they write (a botocore hook on its session): job claims and finishes apart from the
fleet's bucket and budget items. `python -m bench.limited` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.local.aws import LocalAws
from aijobs.local.devstack import LOCAL_API_KEY, LOCAL_CREDENTIALS, LOCAL_MODEL, LOCAL_WAIT_SECONDS, local_session
from aijobs.local.poller import EventSourceMapping
from aijobs.local.provider import LocalProvider
from aijobs.stack import DEFAULT_TEMPLATE, batching_window, create_stack_resources, load_template
from bench.fleet import classify_message
from bench.report import Figure, print_figures, quiet_engine
from engine.config import load_settings
from engine.core import JobStatus, Lane
from engine.core.errors import JobNotFoundError
from engine.observability import lambda_function
from engine.store.items import JOB_PREFIX
from engine.store.limits import LIMIT_SK
from engine.wiring import build_worker
from handlers.worker import FUNCTION_TIMEOUT_SECONDS, WorkerHandler

PROCESSES = 3
# `aijobs worker`'s defaults: two pollers, a batching window of a second, batches of ten.
POLLERS = 2
WINDOW_SECONDS = 1.0
JOBS = 90
LIMIT_RPM = 60
PROVIDER_LATENCY_SECONDS = 0.05
# A burst of 90 jobs at 60 a minute takes a minute and a half; a run that takes longer has jobs
# waiting on the queue, and is cut here.
RUN_BOUND_SECONDS = 360.0
# docs/performance.md's figure with limits on for interactive jobs; background ones line up and take a turn of five
# calls at a time (docs/lanes.md: at most 3 for a burst).
TARGETS = {Lane.INTERACTIVE: 2.3, Lane.BACKGROUND: 3.0}


class Requests:
    """A worker process's DynamoDB requests, by operation and by the item they concern: a job, a rate
    limit's bucket or a budget (registered on the session before its clients are made)."""

    def __init__(self, session: Any) -> None:
        self.operations: Counter[str] = Counter()
        self.claims: Counter[str] = Counter()  # job id -> its UpdateItem requests
        session.events.register("provide-client-params.dynamodb.*", self._count)

    def _count(self, event_name: str, params: dict[str, Any], **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        if operation == "UpdateItem":
            key = str(params.get("Key", {}).get("pk", {}).get("S", ""))
            if key.startswith(JOB_PREFIX):
                self.claims[key.removeprefix(JOB_PREFIX)] += 1
                operation += " job"
            elif params.get("Key", {}).get("sk", {}).get("S") == LIMIT_SK:
                operation += " limit bucket"
            else:
                operation += " budget"
        self.operations[operation] += 1

    def dump(self) -> str:
        return json.dumps({"operations": self.operations, "claims": self.claims})


def serve_worker(lanes: list[str]) -> None:
    """One worker process: the event source mappings of `lanes`' queues around one worker, until
    stdin closes; then what it asked of DynamoDB, as one JSON line."""
    quiet_engine()
    settings = load_settings()
    session = local_session()
    requests = Requests(session)
    worker = WorkerHandler(*build_worker(settings, session))
    handler = lambda_function(worker.handle, emit_metrics=False)
    template = load_template(DEFAULT_TEMPLATE)
    queues = {
        Lane.INTERACTIVE.value: (str(settings.jobs_queue_url), WINDOW_SECONDS),
        Lane.BACKGROUND.value: (
            str(settings.jobs_background_queue_url),
            batching_window(template, "WorkerFunction", "BackgroundJobsQueue"),
        ),
    }
    sqs = session.client("sqs", endpoint_url=settings.aws_endpoint_url)
    mappings = [
        EventSourceMapping(
            queues[lane][0],
            handler,
            batching_window_seconds=queues[lane][1],
            function_timeout_seconds=FUNCTION_TIMEOUT_SECONDS,
            concurrency=POLLERS,
            wait_seconds=LOCAL_WAIT_SECONDS,
            sqs_client=sqs,
        )
        for lane in lanes
    ]
    for mapping in mappings:
        mapping.start()
    sys.stdin.read()
    for mapping in mappings:
        mapping.stop()
    print(requests.dump(), flush=True)


@dataclass(frozen=True, slots=True)
class LimitedRun:
    lane: Lane
    jobs: int
    succeeded: int
    operations: dict[str, int]
    # Jobs claimed more than once (held, or queued again), and their claims beyond the first.
    reclaimed: int
    extra_claims: int
    calls: int
    limited: int
    wall_seconds: float

    @property
    def requests(self) -> int:
        return sum(self.operations.values())

    @property
    def per_success(self) -> float:
        return self.requests / max(self.succeeded, 1)


def run_limited(lane: Lane, jobs: int = JOBS, provider_rpm: int | None = LIMIT_RPM) -> LimitedRun:
    """`jobs` classify jobs of `lane` sent at once to three worker processes under a shared limit of
    LIMIT_RPM, against the local provider (with a limit of its own, `provider_rpm`)."""
    stack = f"limited-{uuid.uuid4().hex[:6]}"
    with (
        LocalAws(separate_process=True) as aws,
        LocalProvider(api_key=LOCAL_API_KEY, latency_seconds=PROVIDER_LATENCY_SECONDS, rpm=provider_rpm) as provider,
    ):
        session = local_session()
        resources = create_stack_resources(stack, session=session, endpoint_url=aws.endpoint_url)
        environment = (
            {"AWS_ENDPOINT_URL": aws.endpoint_url, **LOCAL_CREDENTIALS}
            | resources.environment()
            | {
                "AI_PROVIDER": "openai",
                "AI_BASE_URL": provider.url,
                "AI_API_KEY": LOCAL_API_KEY,
                "AI_MODEL_PRIMARY": LOCAL_MODEL,
                "AIJOBS_PROVIDER_LIMITS": json.dumps({LOCAL_MODEL: {"rpm": LIMIT_RPM}}),
            }
        )
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.limited", "--worker", Lane.INTERACTIVE.value, Lane.BACKGROUND.value],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=os.environ | environment,
            )
            for _ in range(PROCESSES)
        ]
        try:
            settings = load_settings(environment)
            queue = str(settings.jobs_queue_url if lane is Lane.INTERACTIVE else settings.jobs_background_queue_url)
            sqs = session.client("sqs", endpoint_url=aws.endpoint_url)
            ids = [f"limited-{uuid.uuid4().hex[:10]}" for _ in range(jobs)]
            started = time.monotonic()
            for start in range(0, jobs, 10):
                entries = [
                    {"Id": str(n), "MessageBody": classify_message(job_id, "bench")}
                    for n, job_id in enumerate(ids[start : start + 10])
                ]
                sqs.send_message_batch(QueueUrl=queue, Entries=entries)  # type: ignore[arg-type]
            succeeded = _wait_until_ended(AiJobsClient.from_settings(settings, local_session()), ids)
            wall = time.monotonic() - started
        finally:
            counted = [json.loads(worker.communicate(timeout=60)[0] or "{}") for worker in workers]
        log = provider.log
    operations: Counter[str] = Counter()
    claims: Counter[str] = Counter()
    for count in counted:
        operations.update(count.get("operations", {}))
        claims.update(count.get("claims", {}))
    return LimitedRun(
        lane=lane,
        jobs=jobs,
        succeeded=succeeded,
        operations=dict(operations),
        reclaimed=sum(count > 1 for count in claims.values()),
        extra_claims=sum(count - 1 for count in claims.values()),
        calls=sum(entry.status == 200 for entry in log),
        limited=sum(entry.limited for entry in log),
        wall_seconds=wall,
    )


def _wait_until_ended(client: AiJobsClient, ids: list[str]) -> int:
    """How many of the jobs succeeded, once each has ended or the run's bound is up."""
    deadline = time.monotonic() + RUN_BOUND_SECONDS
    ended: dict[str, JobStatus] = {}
    while time.monotonic() < deadline and len(ended) < len(ids):
        for job_id in ids:
            if job_id in ended:
                continue
            try:
                status = client.get(job_id).status
            except JobNotFoundError:
                continue  # its message was not received yet
            if status.is_terminal:
                ended[job_id] = status
        time.sleep(1.0)
    return sum(status is JobStatus.SUCCEEDED for status in ended.values())


def limited_figures(console: Console, jobs: int = JOBS) -> list[Figure]:
    method = (
        f"{jobs} classify jobs as SQS messages at once; {PROCESSES} worker processes as `aijobs worker` runs them "
        f"({POLLERS} pollers, batches of 10, a {FUNCTION_TIMEOUT_SECONDS} s timeout); AIJOBS_PROVIDER_LIMITS "
        f"{LIMIT_RPM} rpm, the local provider limited alike; the processes' DynamoDB requests (botocore hook) over "
        "succeeded jobs"
    )
    figures = []
    for lane in (Lane.INTERACTIVE, Lane.BACKGROUND):
        console.print(f"limited: {jobs} {lane.value} jobs at {LIMIT_RPM} rpm, {PROCESSES} worker processes ...")
        run = run_limited(lane, jobs)
        figures.append(
            Figure(
                f"DynamoDB requests per successful job under a binding limit, {lane.value}",
                f"{run.per_success:.2f}  ({run.requests} / {run.succeeded} of {run.jobs} succeeded)",
                f"<= {TARGETS[lane]}",
                run.per_success <= TARGETS[lane] and run.succeeded == run.jobs,
                method,
            )
        )
        figures.append(
            Figure(
                f"  {lane.value}: requests by operation; jobs claimed again",
                ", ".join(f"{name} {count}" for name, count in sorted(run.operations.items()))
                + f"; {run.reclaimed} jobs claimed again ({run.extra_claims} claims)",
                "-",
                None,
                f"UpdateItem job: claims (and releases of held jobs' reservations); provider: {run.calls} answers, "
                f"{run.limited} 429s; {run.wall_seconds:.0f} s until every job ended",
            )
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", nargs="+", metavar="LANE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        serve_worker(args.worker)
        return 0
    print_figures("aijobs bench, a binding limit", limited_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
