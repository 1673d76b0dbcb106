"""The completion-event figures of `make bench`: what the worker's path costs with events on, and how
long an event takes from the job's finishing write to a consumer, on the embedded stack.
`python -m bench.events` runs them alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

import boto3
from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.events import EventsTap
from aijobs.local.devstack import LOCAL_CREDENTIALS, DevStack, DevStackOptions
from aijobs.local.lambda_events import InvocationContext, sqs_event, sqs_record
from bench.report import Figure, quiet_engine, render
from bench.shapes import message
from engine.wiring import build_worker

JOBS = 60
# Every event has arrived within this long, or the run reports what is missing.
WAIT_SECONDS = 60.0


class ServiceRequests:
    """Counts every AWS request a boto3 session's clients send, by service and operation."""

    def __init__(self, session: boto3.Session) -> None:
        self.operations: Counter[str] = Counter()
        session.events.register("before-call.*.*", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        _hook, service, operation = event_name.split(".", 2)
        self.operations[f"{service} {operation}"] += 1


def events_figures(console: Console) -> list[Figure]:
    console.print(f"events: a worker's requests, then {JOBS} jobs to their events ...")
    options = DevStackOptions(
        aws_port=0, provider_port=0, concurrency=2, quiet=True, stack_name=f"ev-{uuid.uuid4().hex[:6]}"
    )
    with DevStack(options) as stack:
        requests, job_id = worker_requests(stack)
        client = AiJobsClient.from_settings(stack.settings, stack.session)
        tap = EventsTap(
            stack.session.client("sqs", endpoint_url=stack.settings.aws_endpoint_url), stack.resources.events_queue_url
        )
        ids = [f"ev-{n}-{uuid.uuid4().hex[:6]}" for n in range(JOBS)]
        for job_id_ in ids:
            client.submit(
                "classify",
                "bench",
                {"text": f"Invoice {job_id_} is wrong", "labels": ["billing", "other"]},
                job_id=job_id_,
            )
        latencies, per_job = receive(tap, set(ids) | {job_id})
    dynamodb = sum(count for name, count in requests.items() if name.startswith("dynamodb"))
    others = {name: count for name, count in requests.items() if not name.startswith("dynamodb")}
    complete = all(per_job[job] == 1 for job in [*ids, job_id])
    p50 = statistics.median(latencies) if latencies else float("nan")
    p95 = sorted(latencies)[round(0.95 * (len(latencies) - 1))] if latencies else float("nan")
    return [
        Figure(
            "AWS requests in the worker's path per successful job, events on",
            f"DynamoDB {dynamodb}, EventBridge {sum(c for n, c in others.items() if n.startswith('events'))}, "
            f"other {sum(c for n, c in others.items() if not n.startswith('events'))}  ("
            + ", ".join(f"{count} {name}" for name, count in sorted(requests.items()))
            + ")",
            "DynamoDB 2, EventBridge 0",
            dynamodb == 2 and not others,
            "a worker built by engine.wiring on a session of its own (a botocore hook on every client), one job "
            "through Worker.handle on the embedded stack; its event still arrives, from the table's stream",
        ),
        Figure(
            "finishing write to event received: p50 / p95",
            f"{p50:.2f} s / {p95:.2f} s over {len(latencies)} events; every job exactly one event: "
            + ("yes" if complete else f"no ({sum(per_job[j] != 1 for j in ids)} jobs)"),
            "-",
            complete,
            f"{JOBS} classify jobs submitted on the embedded stack; from each job's finished_at (the event's event_id) "
            "to the event read off the events queue (what `aijobs events --follow` prints); the local stream is "
            "polled every 0.2 s",
        ),
    ]


def worker_requests(stack: DevStack) -> tuple[Counter[str], str]:
    """The requests a worker of its own makes for one successful job, and that job's id."""
    session = boto3.Session(
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    counted = ServiceRequests(session)  # before the clients are made: they copy the session's hooks
    worker = build_worker(stack.settings, session)
    job_id = f"ev-worker-{uuid.uuid4().hex[:6]}"
    response = worker.handle(sqs_event(sqs_record(message(job_id))), InvocationContext())
    if response["batchItemFailures"]:
        raise RuntimeError(f"the bench's job did not succeed: {response}")
    return counted.operations, job_id


def receive(tap: EventsTap, ids: set[str]) -> tuple[list[float], Counter[str]]:
    """Seconds from each job's finishing write to its event's receipt, and events per job."""
    latencies: list[float] = []
    per_job: Counter[str] = Counter()
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline and not ids <= set(per_job):
        for event, receipt_handle in tap.receive(wait_seconds=1):
            received = time.time()
            detail = event["detail"]
            finished_ms = int(detail["event_id"].rsplit(":", 1)[1])
            latencies.append(received - finished_ms / 1000)
            per_job[detail["job_id"]] += 1
            tap.done(receipt_handle)
    return latencies, per_job


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    quiet_engine()
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(render(events_figures(console), "aijobs bench, events"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
