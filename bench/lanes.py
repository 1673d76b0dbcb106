"""The lanes figures of `make bench`: an interactive job's time to answer while a background backlog
drains, the backlog's goodput, and what a burst far beyond the limit's minute costs per job.

One run on the embedded stack (moto, the local provider with a limit of its own of R requests a
minute, the workers sharing the same limit, each lane's pollers as the template has them):
1. interactive probes alone, one after the other: the time from submission to answer, as the job
   item records it (created_at to finished_at);
2. a burst of ten times R's minute of background jobs, sent as SQS messages at once; the same
   probes while it drains (a backlog of hundreds of jobs behind them);
3. the rest of the drain, background alone: goodput from the provider's own log, DynamoDB requests
   counted on the workers' clients, and receives as the background queue's pollers delivered them.
`python -m bench.lanes` runs it alone (`--minutes 2` for a shorter burst).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.local.devstack import LOCAL_MODEL, DevStack, DevStackOptions, local_session
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from engine.store import DynamoJobStore
from engine.wiring import Aws, build_store

RPM = 300
BURST_MINUTES = 10
PROBES = 25
PROVIDER_LATENCY_SECONDS = 0.3
INTERACTIVE_POLLERS = 2
BACKGROUND_POLLERS = 4
# A probe waits this long at most for its answer; the burst, this long past its expected drain.
PROBE_BOUND_SECONDS = 60.0
DRAIN_SLACK_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class LaneRun:
    alone_seconds: list[float]
    backlogged_seconds: list[float]
    backlog_at_probes: int  # background jobs still waiting when the last probe was sent
    burst: int
    drained: int
    goodput: float  # background calls a minute, background alone, as a share of RPM
    dynamodb_per_job: float
    receives_per_job: float
    limited: int


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def classify_input(job_id: str) -> dict[str, Any]:
    return {"text": f"Invoice {job_id} shows the wrong amount, please fix it", "labels": ["billing", "other"]}


def probe(client: AiJobsClient, store: DynamoJobStore, rng: random.Random) -> float:
    """One interactive job, submitted and waited for: its time from creation to answer (seconds)."""
    job_id = f"probe-{uuid.uuid4().hex[:10]}"
    client.submit("classify", "person", classify_input(job_id), job_id=job_id)
    deadline = time.monotonic() + PROBE_BOUND_SECONDS
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and job.status.is_terminal and job.finished_at is not None:
            time.sleep(rng.uniform(0.2, 1.0))  # probes arrive at unrelated times
            return (job.finished_at - job.created_at) / 1000
        time.sleep(0.05)
    raise RuntimeError(f"the probe {job_id} had no answer within {PROBE_BOUND_SECONDS:g}s")


def send_burst(stack: DevStack, jobs: int) -> list[str]:
    sqs = stack.session.client("sqs", endpoint_url=stack.settings.aws_endpoint_url)
    queue_url = stack.settings.jobs_background_queue_url
    assert queue_url is not None
    ids = [f"bg-{uuid.uuid4().hex[:10]}" for _ in range(jobs)]
    for start in range(0, jobs, 10):
        entries = [
            {
                "Id": str(n),
                "MessageGroupId": "backfill",
                "MessageBody": json.dumps(
                    {"job_id": job_id, "job_type": "classify", "user_id": "backfill", "input": classify_input(job_id)}
                ),
            }
            for n, job_id in enumerate(ids[start : start + 10])
        ]
        sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
    return ids


def run(minutes: float = BURST_MINUTES, probes: int = PROBES) -> LaneRun:
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=PROVIDER_LATENCY_SECONDS,
        provider_rpm=RPM,
        concurrency=INTERACTIVE_POLLERS,
        background_concurrency=BACKGROUND_POLLERS,
        quiet=True,
        stack_name=f"lanes-{uuid.uuid4().hex[:6]}",
        function_environment={"AIJOBS_PROVIDER_LIMITS": json.dumps({LOCAL_MODEL: {"rpm": RPM}})},
    )
    stack = DevStack(options)
    requests = SessionRequests(stack.session)  # the workers' clients are made from this session
    rng = random.Random(7)
    with stack:
        provider = stack.provider
        assert provider is not None
        # The bench's own reads and submissions, on a session of its own: not counted.
        session = local_session()
        client = AiJobsClient.from_settings(stack.settings, session)
        store = build_store(stack.settings, Aws(stack.settings, session))
        alone = [probe(client, store, rng) for _ in range(probes)]

        requests.operations.clear()
        ids = send_burst(stack, round(RPM * minutes))
        time.sleep(5.0)  # the backlog is being drained
        backlogged = [probe(client, store, rng) for _ in range(probes)]
        probes_ended = time.time()
        backlog = len(ids) - sum(1 for entry in provider.log if entry.at <= probes_ended) + 2 * probes
        # Waited for on the pollers' own count of messages deleted (a job's message is deleted when it
        # ends), not by reading the jobs: thousands of reads every few seconds would load the local
        # endpoint the workers use. The job items are read once, when the drain is over.
        background = stack.resources.background_queue_url
        deadline = time.monotonic() + minutes * 60 + DRAIN_SLACK_SECONDS
        while stack.mapping_stats(background).deleted < len(ids) and time.monotonic() < deadline:
            time.sleep(1.0)
        operations = requests.of("dynamodb")
        receives = stack.mapping_stats(background).records
        log = provider.log
        ended = sum(1 for job in store.get_jobs(ids).values() if job.status.is_terminal)
    background_only = sorted(entry.at for entry in log if entry.status == 200 and entry.at > probes_ended)
    span = background_only[-1] - background_only[0] if len(background_only) > 1 else 0.0
    jobs = len(ids) + probes
    return LaneRun(
        alone_seconds=alone,
        backlogged_seconds=backlogged,
        backlog_at_probes=backlog,
        burst=len(ids),
        drained=ended,
        goodput=(len(background_only) - 1) / (span / 60) / RPM if span else 0.0,
        dynamodb_per_job=sum(operations.values()) / jobs,
        receives_per_job=receives / len(ids),
        limited=sum(entry.limited for entry in log),
    )


def lanes_figures(console: Console, minutes: float = BURST_MINUTES, probes: int = PROBES) -> list[Figure]:
    console.print(f"lanes: {probes} interactive probes alone, then a background burst of {minutes:g} minutes ...")
    result = run(minutes, probes)
    alone, backlogged = p95(result.alone_seconds), p95(result.backlogged_seconds)
    limit = f"R = {RPM} requests/min at the provider and in AIJOBS_PROVIDER_LIMITS"
    return [
        Figure(
            "interactive p95 submit→answer with a background backlog ÷ with no backlog",
            f"{backlogged / alone:.2f}  ({backlogged:.2f} s / {alone:.2f} s; p50 "
            f"{statistics.median(result.backlogged_seconds):.2f} s / {statistics.median(result.alone_seconds):.2f} s)",
            "<= 1.5",
            backlogged / alone <= 1.5,
            f"{len(result.alone_seconds)} probes one after the other, alone, then as many while a burst of "
            f"{result.burst} background jobs drained ({result.backlog_at_probes} still waiting after the last probe); "
            f"created_at to finished_at of each job item; {limit}; provider latency {PROVIDER_LATENCY_SECONDS} s",
        ),
        Figure(
            "background goodput ÷ the limit, background alone",
            f"{result.goodput:.2f}",
            ">= 0.9",
            result.goodput >= 0.9,
            "successful calls a minute from the provider's own log, from the last probe to the end of the drain",
        ),
        Figure(
            f"a burst of {result.burst} background jobs ({minutes:g} x the limit's minute): DynamoDB requests, "
            "receives per job",
            f"{result.dynamodb_per_job:.2f}, {result.receives_per_job:.2f}  ({result.drained} of {result.burst} "
            f"ended; provider 429s {result.limited})",
            "<= 3, <= 1.5",
            result.dynamodb_per_job <= 3 and result.receives_per_job <= 1.5 and result.drained == result.burst,
            f"requests on the workers' DynamoDB clients (a botocore hook) over the burst and the probes run during it; "
            f"receives: records the background queue's {BACKGROUND_POLLERS} pollers delivered to the worker",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=BURST_MINUTES, help="the burst, in minutes of the limit")
    parser.add_argument("--probes", type=int, default=PROBES, help="interactive probes alone, and during the burst")
    args = parser.parse_args(argv)
    print_figures("aijobs bench, lanes", lambda console: lanes_figures(console, args.minutes, args.probes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
