"""The figures of answers already paid for (docs/reuse.md) in `make bench`: a repeated request within
`reuse_seconds` makes no provider call, and a job of a job type that reuses answers costs at most 3
DynamoDB requests, whether it finds an answer or not.

One warm worker (the engine's runner on moto, with its catalog of data job types, as engine.wiring
builds it) serves the demo's job type file with `reuse_seconds`. It runs JOBS jobs of as many
different requests (none has an answer to take: each calls the model, and its finish keeps the
answer), then JOBS jobs repeating those requests (each takes the answer kept for it). Its DynamoDB
requests are counted by a botocore hook on its session (bench/requests.py); the provider counts its
calls. With reuse off a job costs 2, as the job types' own figure shows. `python -m bench.reuse`
runs it alone.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import boto3
from rich.console import Console

from aijobs.demo_canary import FILE
from bench.job_types import NAME, TopicProvider, detail, fleet_worker, push
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from bench.stacks import moto_stack
from engine.core import Delivery, JobStatus
from engine.definitions.catalog import DEFAULT_REFRESH_SECONDS
from engine.gateway import Completion, CompletionRequest
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.job_types import JobTypeTable

JOBS = 20
REUSE_SECONDS = 3_600


class CountedTopics(TopicProvider):
    """The job types figures' instant provider, counting the calls it answers."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        return super().complete(request)


@dataclass(frozen=True, slots=True)
class Phase:
    """What a run of jobs cost: the worker's DynamoDB requests by operation, and the provider's calls."""

    requests: Counter[str]
    calls: int
    jobs: int

    @property
    def per_job(self) -> float:
        return sum(self.requests.values()) / self.jobs


def run(worker: JobRunner, reader: DynamoJobStore, job_id: str, text: str) -> str | None:
    """Run a job of the demo's job type on `text` to success; the job whose answer it took, if any."""
    body = {"job_id": job_id, "job_type": NAME, "user_id": f"user-{job_id}", "input": {"text": text}}
    worker.process(Delivery(f"m-{job_id}", json.dumps(body)))
    job = reader.get_job(job_id)
    if job is None or job.status is not JobStatus.SUCCEEDED:
        raise RuntimeError(f"a bench job of {NAME} did not succeed: {job}")
    return job.reused_from


def first_then_repeated(jobs: int) -> tuple[Phase, Phase]:
    with moto_stack() as stack:
        push(JobTypeTable(stack.table_name, boto3.client("dynamodb")), FILE | {"reuse_seconds": REUSE_SECONDS})
        session = boto3.Session()
        counted = SessionRequests(session)
        provider = CountedTopics()
        worker = fleet_worker(stack.table_name, session.client("dynamodb"), DEFAULT_REFRESH_SECONDS, provider)
        reader = DynamoJobStore(stack.table_name, client=boto3.client("dynamodb"))
        run(worker, reader, "warm", "The first note reads the labels and the version.")
        phases = []
        for phase in ("first", "repeat"):
            counted.operations.clear()
            calls = provider.calls
            sources = [run(worker, reader, f"{phase}-{n}", f"Note {n}: the invoice is overdue.") for n in range(jobs)]
            expected = [None] * jobs if phase == "first" else [f"first-{n}" for n in range(jobs)]
            if sources != expected:
                raise RuntimeError(f"the {phase} jobs took answers from {sources}, not {expected}")
            phases.append(Phase(counted.of("dynamodb"), provider.calls - calls, jobs))
        return phases[0], phases[1]


def reuse_figures(console: Console, jobs: int = JOBS) -> list[Figure]:
    console.print(f"reuse: {jobs} jobs of different requests, then {jobs} repeating them ...")
    first, repeated = first_then_repeated(jobs)
    method = (
        f"the engine's runner on moto, a data job type with reuse_seconds {REUSE_SECONDS}, its catalog warm; "
        "botocore before-call hook on its session"
    )
    return [
        Figure(
            "reuse: a repeated request within reuse_seconds: provider calls",
            f"{repeated.calls}  ({repeated.jobs} repeats; their first requests made {first.calls} calls)",
            "= 0",
            repeated.calls == 0,
            f"{jobs} jobs repeating the requests of {jobs} jobs that succeeded before them; the provider counts "
            "its calls",
        ),
        Figure(
            "reuse: DynamoDB requests per reused job",
            f"{repeated.per_job:.2f}  ({detail(repeated.requests)} over {repeated.jobs} jobs)",
            "<= 3",
            repeated.per_job <= 3,
            f"{method}: the claim, the read of the kept answer, the finish",
        ),
        Figure(
            "reuse: DynamoDB requests per job with reuse on, no answer to take",
            f"{first.per_job:.2f}  ({detail(first.requests)} over {first.jobs} jobs)",
            "<= 3",
            first.per_job <= 3,
            f"{method}: the claim, the read that finds nothing, the finish that keeps the answer (2 with reuse off)",
        ),
    ]


def main() -> int:
    print_figures("aijobs bench, answers already paid for", reuse_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
