"""The completion-event figures of `make bench`: what the worker's path costs with events on, and how
long an event takes from the job's finishing write to a consumer, on the embedded stack.
`python -m bench.events` runs them alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

import boto3
from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.local.devstack import LOCAL_CREDENTIALS, DevStack, DevStackOptions
from aijobs.local.lambda_events import InvocationContext, sqs_event, sqs_record
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from bench.shapes import message
from engine.wiring import build_worker
from handlers.worker import WorkerHandler

JOBS = 60
# Every event has arrived within this long, or the run reports what is missing.
WAIT_SECONDS = 60.0
# How long the run listens on once every job has its event, for duplicates.
LATE_SECONDS = 3.0


def events_figures(console: Console, jobs: int = JOBS) -> list[Figure]:
    console.print(f"events: a worker's requests, then {jobs} jobs to their events ...")
    options = DevStackOptions(
        aws_port=0, provider_port=0, concurrency=2, quiet=True, stack_name=f"ev-{uuid.uuid4().hex[:6]}"
    )
    with DevStack(options) as stack, PrintedEvents(stack.environment) as printed:
        counted, first = worker_requests(stack)
        printed.wait_for({first}, WAIT_SECONDS)  # the command is up and printing
        client = AiJobsClient.from_settings(stack.settings, stack.session)
        ids = [f"ev-{n}-{uuid.uuid4().hex[:6]}" for n in range(jobs)]
        for job_id in ids:
            job_input = {"text": f"Invoice {job_id} is wrong", "labels": ["billing", "other"]}
            client.submit("classify", "bench", job_input, job_id=job_id)
        printed.wait_for(set(ids), WAIT_SECONDS)
        time.sleep(LATE_SECONDS)  # any duplicate comes within this
        latencies, per_job = printed.latencies(set(ids))
    requests = counted.operations
    dynamodb, eventbridge = sum(counted.of("dynamodb").values()), sum(counted.of("events").values())
    others = sum(requests.values()) - dynamodb - eventbridge
    complete = all(per_job[job] == 1 for job in ids)
    p50 = statistics.median(latencies) if latencies else float("nan")
    p95 = sorted(latencies)[round(0.95 * (len(latencies) - 1))] if latencies else float("nan")
    return [
        Figure(
            "AWS requests in the worker's path per successful job, events on",
            f"DynamoDB {dynamodb}, EventBridge {eventbridge}, other {others}  ("
            + ", ".join(f"{count} {name}" for name, count in sorted(requests.items()))
            + ")",
            "DynamoDB 2, EventBridge 0",
            dynamodb == 2 and eventbridge == 0 and others == 0,
            "a worker built by engine.wiring on a session of its own (a botocore hook on every client), its second "
            "job through Worker.handle on the embedded stack (the first also reads whether anyone has a budget "
            "cap, once a minute); its event still arrives, from the table's stream",
        ),
        Figure(
            "finishing write to event printed by `aijobs events --follow`: p50 / p95",
            f"{p50:.2f} s / {p95:.2f} s over {len(latencies)} events; every job exactly one event: "
            + ("yes" if complete else f"no ({sum(per_job[j] != 1 for j in ids)} jobs)"),
            "-",
            complete,
            f"{jobs} classify jobs submitted on the embedded stack; from each job's finished_at (the event's event_id) "
            "to the line `aijobs events --follow --json`, running as its own process, printed; the local stream is "
            f"polled every 0.2 s; listened {LATE_SECONDS:g} s more for duplicates",
        ),
    ]


class PrintedEvents:
    """`aijobs events --follow --json` in a process of its own, each line it prints timed as it comes."""

    def __init__(self, environment: dict[str, str]) -> None:
        self._environment = os.environ | environment
        self._lines: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> PrintedEvents:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "aijobs", "events", "--follow", "--json"],
            env=self._environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            with self._lock:
                self._lines.append((time.time(), json.loads(line)))

    def wait_for(self, ids: set[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not ids <= self._seen():
            time.sleep(0.1)

    def _seen(self) -> set[str]:
        with self._lock:
            return {event["detail"]["job_id"] for _, event in self._lines}

    def latencies(self, ids: set[str]) -> tuple[list[float], Counter[str]]:
        """Seconds from each job's finishing write to its event's line, and events per job."""
        with self._lock:
            lines = [(at, event["detail"]) for at, event in self._lines if event["detail"]["job_id"] in ids]
        per_job = Counter(detail["job_id"] for _, detail in lines)
        return [at - int(detail["event_id"].rsplit(":", 1)[1]) / 1000 for at, detail in lines], per_job


def worker_requests(stack: DevStack) -> tuple[SessionRequests, str]:
    """The requests a warm worker of its own makes for one successful job, and that job's id. Warm: its
    first batch also reads whether anyone has a budget cap, once a minute per environment."""
    session = boto3.Session(
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    counted = SessionRequests(session)  # before the clients are made: they copy the session's hooks
    worker = WorkerHandler(*build_worker(stack.settings, session))
    for job_id in (f"ev-warm-{uuid.uuid4().hex[:6]}", f"ev-worker-{uuid.uuid4().hex[:6]}"):
        counted.operations.clear()
        response = worker.handle(sqs_event(sqs_record(message(job_id))), InvocationContext())
        if response["batchItemFailures"]:
            raise RuntimeError(f"the bench's job did not succeed: {response}")
    return counted, job_id


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print_figures("aijobs bench, events", events_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
