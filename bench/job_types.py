"""The job types as data figures of `make bench` (docs/jobtypes.md): how long a promote takes to reach
every worker, and the DynamoDB requests of a data job type's job.

1. A fleet of WORKERS warm workers, each the engine's runner with its own catalog of the data job types
   (engine.definitions.catalog.DataJobTypes on the table, as engine.wiring builds it), warmed one after
   another across a refresh period, as workers started at different times are. Then v2 is promoted,
   and every worker keeps running jobs (one each per POLL_SECONDS) until each has run one on v2: the
   figure is the time from the promote to the last worker's first v2 job, against the refresh period
   (60 s, the most docs/jobtypes.md allows).
2. One warm worker running JOBS jobs of a data job type, its DynamoDB requests counted by a botocore
   hook on its session: the claim and the finish, as for a code job type; and what its very first job
   adds (the heads, then the version read once).
`python -m bench.job_types` runs it alone.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import boto3
from rich.console import Console

from aijobs.demo_canary import FILE
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from bench.stacks import moto_stack
from engine.core import Delivery, JobStatus
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.catalog import DEFAULT_REFRESH_SECONDS, DataJobTypes
from engine.definitions.data import check_job_type, compile_job_type
from engine.gateway import Completion, CompletionRequest, ModelGateway, ModelProvider, ModelTiers
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.job_types import JobTypeTable

NAME = str(FILE["name"])
WORKERS = 4
POLL_SECONDS = 0.5
JOBS = 40
# v2 differs from v1 in its prompt only, as a prompt change is.
SECOND = FILE | {"prompt": {"system": "Name the note's topic in one or two words.", "user": "Note: {text}"}}


class TopicProvider:
    """Answers at once, in process, with a topic: the figures are the engine's and the table's."""

    name = "instant"

    def complete(self, request: CompletionRequest) -> Completion:
        return Completion(json.dumps({"topic": "billing"}), request.model, 80, 6, latency_ms=0)


def fleet_worker(
    table_name: str, client: Any, refresh_seconds: float, provider: ModelProvider | None = None
) -> JobRunner:
    """One worker as engine.wiring builds it: its own catalog (heads kept for a refresh period) and store;
    its provider a TopicProvider unless given."""
    store = DynamoJobStore(table_name, client=client)
    catalog = DataJobTypes(JobTypeTable(table_name, client), compile_job_type, refresh_seconds=refresh_seconds)
    registry = JobRegistry(data=catalog)
    gateway = ModelGateway(provider or TopicProvider(), ModelTiers("gpt-4o-mini"))
    return JobRunner(store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(1))


def run_one(worker: JobRunner, reader: DynamoJobStore, job_id: str) -> int | None:
    """Run a job of the data job type; the version it ran, as its item records it."""
    body = {"job_id": job_id, "job_type": NAME, "user_id": f"user-{job_id}", "input": {"text": "Invoice overdue."}}
    worker.process(Delivery(f"m-{job_id}", json.dumps(body)))
    job = reader.get_job(job_id)
    if job is None or job.status is not JobStatus.SUCCEEDED:
        raise RuntimeError(f"a bench job of {NAME} did not succeed: {job}")
    return job.job_type_version


def push(types: JobTypeTable, *documents: dict[str, Any]) -> None:
    for document in documents:
        file = check_job_type(document)
        types.push(NAME, file.document(), file.sha256, int(time.time() * 1000), by="bench")


@dataclass(frozen=True, slots=True)
class Rollout:
    seconds: list[float]  # from the promote to each worker's first job on the new version
    jobs: int


def promote_rollout(console: Console, refresh_seconds: float) -> Rollout:
    with moto_stack() as stack:
        types = JobTypeTable(stack.table_name, boto3.client("dynamodb"))
        reader = DynamoJobStore(stack.table_name, client=boto3.client("dynamodb"))
        push(types, FILE, SECOND)
        workers: list[JobRunner] = []
        for n in range(WORKERS):  # warmed across a period: each read the heads at a different time
            worker = fleet_worker(stack.table_name, boto3.client("dynamodb"), refresh_seconds)
            if run_one(worker, reader, f"warm-{n}") != 1:
                raise RuntimeError("a warm worker did not run v1, production before the promote")
            workers.append(worker)
            time.sleep(refresh_seconds / WORKERS)
        console.print(f"job types: promote v2, {WORKERS} workers polling every {POLL_SECONDS}s ...")
        types.promote(NAME, 2, int(time.time() * 1000), by="bench")
        promoted_at = time.monotonic()
        served: dict[int, float] = {}
        jobs = 0
        while len(served) < WORKERS:
            if time.monotonic() - promoted_at > 3 * refresh_seconds:
                raise RuntimeError(f"after {3 * refresh_seconds:.0f}s only {len(served)} workers serve v2")
            for n, worker in enumerate(workers):
                if n in served:
                    continue
                jobs += 1
                if run_one(worker, reader, f"poll-{n}-{jobs}") == 2:
                    served[n] = time.monotonic() - promoted_at
            time.sleep(POLL_SECONDS)
        return Rollout(sorted(served.values()), jobs)


@dataclass(frozen=True, slots=True)
class JobRequests:
    first: Counter[str]
    warm: Counter[str]
    jobs: int


def requests_per_job(jobs: int) -> JobRequests:
    with moto_stack() as stack:
        push(JobTypeTable(stack.table_name, boto3.client("dynamodb")), FILE)
        session = boto3.Session()
        counted = SessionRequests(session)
        worker = fleet_worker(stack.table_name, session.client("dynamodb"), DEFAULT_REFRESH_SECONDS)
        reader = DynamoJobStore(stack.table_name, client=boto3.client("dynamodb"))
        run_one(worker, reader, "first")
        first = counted.of("dynamodb")
        counted.operations.clear()
        for n in range(jobs):
            run_one(worker, reader, f"job-{n}")
        return JobRequests(first, counted.of("dynamodb"), jobs)


def detail(operations: Counter[str]) -> str:
    return " + ".join(f"{count} {operation}" for operation, count in sorted(operations.items()))


def job_types_figures(
    console: Console, refresh_seconds: float = DEFAULT_REFRESH_SECONDS, jobs: int = JOBS
) -> list[Figure]:
    console.print(f"job types: {WORKERS} workers warmed across a {refresh_seconds:.0f}s refresh period ...")
    rollout = promote_rollout(console, refresh_seconds)
    slowest = rollout.seconds[-1]
    console.print(f"job types: {jobs} jobs of a data job type on one warm worker ...")
    counted = requests_per_job(jobs)
    per_job = sum(counted.warm.values()) / counted.jobs
    return [
        Figure(
            "job types: promote to every worker serving it",
            f"{slowest:.1f}s  (each worker: {', '.join(f'{s:.1f}s' for s in rollout.seconds)}; {rollout.jobs} jobs)",
            f"<= {refresh_seconds:.0f}s (the refresh period)",
            slowest <= refresh_seconds + POLL_SECONDS,
            f"{WORKERS} runners, each with its own catalog on moto, warmed one after another across the period; "
            f"after `promote` each runs a job every {POLL_SECONDS}s until one records v2 (poll step included)",
        ),
        Figure(
            "job types: DynamoDB requests per job of a data job type",
            f"{per_job:.2f}  ({detail(counted.warm)} over {counted.jobs} jobs); the worker's first job: "
            f"{sum(counted.first.values())} ({detail(counted.first)})",
            "= 2",
            per_job == 2,
            "the engine's runner on moto, its catalog warm; botocore before-call hook on its session; the first "
            "job of a period also reads the heads, and a version's first job its file",
        ),
    ]


def main() -> int:
    print_figures("aijobs bench, job types as data", job_types_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
