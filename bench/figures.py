"""`make bench`: the engine's figures (docs/performance.md), each a ratio measured side by side in one run.

Everything runs on this machine: DynamoDB and SQS are moto (in-process, or its server on
127.0.0.1 where another process needs it), the model is the local OpenAI-compatible provider
over real HTTP. Each figure prints its method beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3
from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.demo_canary import FILE as DEMO_JOB_TYPE
from aijobs.local.devstack import LOCAL_CREDENTIALS
from aijobs.local.lambda_events import InvocationContext, sqs_event, sqs_record
from aijobs.local.provider import LocalProvider
from aijobs.stack import StackResources, create_stack_resources
from bench import attachments, batches, events, fleet, flex, job_types, lanes, limited, pipelines, reuse, ui
from bench.capacity import Index, WriteMeter, item_size, units
from bench.report import Figure, quiet_engine, render
from bench.shapes import message
from bench.stacks import moto_stack
from engine.core import Delivery
from engine.core.errors import ProviderRejectedError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.catalog import DEFAULT_REFRESH_SECONDS
from engine.gateway import (
    Completion,
    CompletionRequest,
    ModelGateway,
    ModelTiers,
)
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.intake import parse_message
from engine.queue import JobQueue
from engine.runner import JobRunner
from engine.store import DynamoJobStore, JobListing, UsageLedger
from engine.worker import Worker
from handlers.worker import WorkerHandler

CREDENTIALS = LOCAL_CREDENTIALS
LAMBDA_MEMORY_GB = 0.5  # the template's MemorySize 512


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each block measures: the full run's sizes (the defaults), or --quick's."""

    batch_rounds: int = 3  # batches of 10 and of 1, each
    overhead_jobs: int = 40
    processes: int = 7  # fresh runtime processes per import and setup median
    fleet_jobs: int = fleet.JOBS
    budget_jobs: int = fleet.BUDGET_JOBS
    budget_worst_case: int = fleet.BUDGET_JOBS_WORST_CASE
    lane_minutes: float = lanes.BURST_MINUTES
    lane_probes: int = lanes.PROBES
    limited_jobs: int = limited.JOBS
    batch_jobs: int = batches.JOBS
    stalled_jobs: int = batches.STALLED_JOBS
    cache_jobs: int = batches.CACHE_JOBS
    rescue_seconds: int = batches.RESCUE_SECONDS
    flex_jobs: int = flex.JOBS
    event_jobs: int = events.JOBS
    dashboard_jobs: int = ui.JOBS
    dashboard_rounds: int = ui.ROUNDS
    job_type_refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    job_type_jobs: int = job_types.JOBS
    pipeline_text_bytes: int = pipelines.TEXT_BYTES
    pipeline_parents: int = pipelines.PARENTS
    reuse_jobs: int = reuse.JOBS


# Every figure at small sizes, to show that the bench runs (a few minutes on 2 cores; `make test` runs
# it): its targets are printed, not expected to hold at these sizes.
QUICK = Sizes(
    batch_rounds=1,
    overhead_jobs=5,
    processes=2,
    fleet_jobs=20,
    budget_jobs=10,
    budget_worst_case=4,
    lane_minutes=0.05,
    lane_probes=2,
    limited_jobs=10,
    batch_jobs=10,
    stalled_jobs=4,
    cache_jobs=4,
    rescue_seconds=15,
    flex_jobs=10,
    event_jobs=5,
    dashboard_jobs=200,
    dashboard_rounds=2,
    job_type_refresh_seconds=3,
    job_type_jobs=5,
    pipeline_text_bytes=40_000,
    pipeline_parents=2,
    reuse_jobs=3,
)


class RequestCounter:
    """Counts the requests a boto3 client sends, by operation (a botocore event hook)."""

    def __init__(self, client: Any) -> None:
        self.operations: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb.*", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        self.operations[event_name.rsplit(".", 1)[-1]] += 1

    def take(self) -> Counter[str]:
        taken, self.operations = self.operations, Counter()
        return taken


class InstantProvider:
    """Answers at once, in process: isolates the engine's own overhead."""

    name = "instant"

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.fail_with = fail_with

    def complete(self, request: CompletionRequest) -> Completion:
        if self.fail_with is not None:
            raise self.fail_with
        answer = {"label": "billing", "confidence": 0.9}
        return Completion(json.dumps(answer), request.model, 120, 12, latency_ms=0)


def runner_on(store: DynamoJobStore, provider: Any) -> JobRunner:
    """The engine's runner on `store` and `provider`, as engine.wiring.build_worker makes it."""
    registry = JobRegistry()
    gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini"))
    return JobRunner(store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(1))


def runner_for(stack: StackResources, provider: Any, client: Any) -> JobRunner:
    return runner_on(DynamoJobStore(stack.table_name, client=client), provider)


# --- 1. requests per path ------------------------------------------------------------------------


def requests_per_path() -> list[Figure]:
    with moto_stack() as stack:
        client = boto3.client("dynamodb")
        counter = RequestCounter(client)
        ok = runner_for(stack, InstantProvider(), client)
        paths: dict[str, Counter[str]] = {}

        ok.process(Delivery("m-ok", message("ok")))
        paths["success"] = counter.take()
        runner_for(stack, InstantProvider(ProviderUnavailableError("503")), client).process(
            Delivery("m-retry", message("retry"))
        )
        paths["retryable failure"] = counter.take()
        runner_for(stack, InstantProvider(ProviderRejectedError("401", 401)), client).process(
            Delivery("m-perm", message("permanent"))
        )
        paths["permanent failure"] = counter.take()
        ok.process(Delivery("m-ok", message("ok")))
        paths["duplicate of a finished job"] = counter.take()
        # A job another worker holds: claimed first under another owner, by an uncounted client.
        new_job = parse_message(message("held"), "m-held", JobRegistry()).new_job
        other = DynamoJobStore(stack.table_name, client=boto3.client("dynamodb"))
        other.claim_job("held", "another-worker", 60_000, int(time.time() * 1000), new_job)
        ok.process(Delivery("m-held", message("held")))
        paths["duplicate of a held job"] = counter.take()

    targets = {"success": 2, "retryable failure": 2, "permanent failure": 2}
    figures = []
    for path, operations in paths.items():
        total = sum(operations.values())
        detail = " + ".join(f"{count} {operation}" for operation, count in sorted(operations.items()))
        target = targets.get(path)
        figures.append(
            Figure(
                f"DynamoDB requests, {path}",
                f"{total} ({detail})",
                f"= {target}" if target else "-",
                total == target if target else None,
                "botocore before-call hook on the engine's client; moto",
            )
        )
    return figures


# --- 2. a batch of 10 against a batch of 1 ----------------------------------------------------------


def timed_batch(worker: WorkerHandler, size: int) -> float:
    event = sqs_event(*(sqs_record(message(f"batch-{size}-{uuid.uuid4().hex[:8]}")) for _ in range(size)))
    started = time.perf_counter()
    response = worker.handle(event, InvocationContext())
    elapsed = time.perf_counter() - started
    if response["batchItemFailures"]:
        raise RuntimeError(f"a bench batch failed: {response}")
    return elapsed


def http_worker(environment: dict[str, str], table_name: str) -> WorkerHandler:
    provider = OpenAICompatibleProvider(environment["AI_BASE_URL"], static_api_key(None))
    worker = Worker(runner_on(DynamoJobStore(table_name), provider))
    return WorkerHandler(worker, JobQueue(environment["JOBS_QUEUE_URL"]))


def batch_ratio(latency_seconds: float, rounds: int = 3) -> tuple[float, float]:
    """Median wall time of a batch of 10 and of a batch of 1, over a real-HTTP provider.

    Each batch gets a fresh table: moto copies a whole table inside every transaction, so its
    cost per request grows with the table, which DynamoDB's does not.
    """
    with served_stack(latency_seconds) as environment:

        def fresh_worker() -> WorkerHandler:
            resources = create_stack_resources(f"batch-{uuid.uuid4().hex[:6]}", session=boto3.Session())
            return http_worker(environment, resources.table_name)

        timed_batch(fresh_worker(), 1)  # warm the pools
        ones, tens = [], []
        for _ in range(rounds):
            ones.append(timed_batch(fresh_worker(), 1))
            tens.append(timed_batch(fresh_worker(), 10))
        return statistics.median(tens), statistics.median(ones)


# --- 3. engine time against its bare DynamoDB requests ---------------------------------------------


class Recorder:
    """Keeps the parameters of every DynamoDB request a client sends, to replay them bare."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        client.meta.events.register("provide-client-params.dynamodb.*", self._keep)

    def _keep(self, event_name: str, params: dict[str, Any], **_: Any) -> None:
        self.calls.append((event_name.rsplit(".", 1)[-1], json.loads(json.dumps(params))))


def engine_overhead(jobs: int = 40) -> tuple[float, float]:
    """(engine seconds per job, bare seconds per job), median over interleaved runs.

    Each job runs through the engine (instant provider) on one table; its recorded requests
    are then replayed with plain boto3 on a second table of the same size, so that both see
    the same machine load and the same moto costs.
    """
    with moto_stack() as stack:
        client = boto3.client("dynamodb")
        recorder = Recorder(client)
        runner = runner_for(stack, InstantProvider(), client)
        bare_stack = create_stack_resources(f"bare-{uuid.uuid4().hex[:6]}")
        bare = boto3.client("dynamodb")
        methods: dict[str, Callable[..., Any]] = {
            "UpdateItem": bare.update_item,
            "TransactWriteItems": bare.transact_write_items,
        }
        engine_times, bare_times = [], []
        for n in range(jobs + 5):
            recorder.calls.clear()
            started = time.perf_counter()
            runner.process(Delivery(f"m-{n}", message(f"job-{n}")))
            engine_time = time.perf_counter() - started
            replay = [(op, _retarget(params, stack.table_name, bare_stack.table_name)) for op, params in recorder.calls]
            started = time.perf_counter()
            for operation, params in replay:
                methods[operation](**params)
            bare_time = time.perf_counter() - started
            if n >= 5:  # the first jobs warm both paths up
                engine_times.append(engine_time)
                bare_times.append(bare_time)
        return statistics.median(engine_times), statistics.median(bare_times)


def _retarget(params: Any, old: str, new: str) -> Any:
    if isinstance(params, dict):
        return {key: _retarget(value, old, new) for key, value in params.items()}
    if isinstance(params, list):
        return [_retarget(value, old, new) for value in params]
    return new if params == old else params


# --- 4. cold start: import time, in what the functions get --------------------------------------

# A virtual environment holding only the functions' runtime dependencies (src/requirements.txt),
# as sam build packages them; `make runtime-venv` creates it.
RUNTIME_PYTHON = Path(".venv-runtime/bin/python")
INIT_SCRIPT = """
import time
started = time.perf_counter()
import handlers.worker
imported = time.perf_counter()
handlers.worker.lambda_handler.prepare()
print(imported - started, time.perf_counter() - imported)
"""
# What a deployed worker's first invocation reads: a stack that is never called while the parts are
# built, and the provider's key as the template passes it (a Secrets Manager ARN, read on the first
# call only), without which the deploy-time provider check refuses the default provider.
INIT_ENVIRONMENT = {
    "JOBS_TABLE_NAME": "aijobs-jobs",
    "JOBS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/aijobs-jobs",
    "JOBS_PAYLOAD_BUCKET": "aijobs-payloads",
    "AI_API_KEY_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:aijobs/openai-AbCdEf",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# What a worker's first job of a data job type adds to its cold start, after the import and the setup:
# the JSON Schema and CEL libraries (imported only where a data job type is served), the file's
# compile, and the first answer checked against its schema and rules.
DATA_TYPE_SCRIPT = """
import json, sys, time
import handlers.worker
handlers.worker.lambda_handler.prepare()
started = time.perf_counter()
from engine.definitions.data import compile_job_type
imported = time.perf_counter()
definition = compile_job_type(json.loads(sys.argv[1]), 1)
compiled = time.perf_counter()
job_input = definition.parse_input({"text": "The invoice is overdue."})
definition.validate_output(job_input, json.dumps({"topic": "billing"}))
print(imported - started, compiled - imported, time.perf_counter() - compiled)
"""


def runtime_python() -> Path:
    if not RUNTIME_PYTHON.exists():
        raise RuntimeError(f"{RUNTIME_PYTHON} is missing: run `make runtime-venv` (make bench does)")
    return RUNTIME_PYTHON


def run_runtime(args: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python args` in a fresh process of the runtime venv; a failure raises with the process's last line."""
    done = subprocess.run(
        [str(runtime_python()), *args], capture_output=True, text=True, env={**os.environ, **environment}
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"a runtime-venv process exited {done.returncode}: {last}")
    return done


def import_profile(module: str) -> dict[str, float]:
    """Seconds of `import module` spent in each top-level package's own modules (fresh runtime process)."""
    done = run_runtime(["-X", "importtime", "-c", f"import {module}"], {"PYTHONPATH": "src"})
    lines = done.stderr.strip().splitlines()[1:]  # after the header
    profile: dict[str, float] = {}
    for line in lines:
        own, _, name = line.removeprefix("import time:").split("|")
        package = name.strip().split(".")[0]
        profile[package] = profile.get(package, 0.0) + int(own) / 1_000_000
    profile["total"] = int(lines[-1].split("|")[1]) / 1_000_000
    return profile


def import_seconds(module: str, runs: int = 7) -> float:
    """Median cumulative import time of `module` in fresh runtime processes (python -X importtime)."""
    return statistics.median(import_profile(module)["total"] for _ in range(runs))


def init_seconds(runs: int = 7) -> tuple[float, float]:
    """Median seconds to import handlers.worker and then to build its parts (a first invocation's setup)."""
    samples = []
    for _ in range(runs):
        done = run_runtime(["-c", INIT_SCRIPT], {"PYTHONPATH": "src", **INIT_ENVIRONMENT})
        imported, built = (float(value) for value in done.stdout.split())
        samples.append((imported, built))
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def data_type_seconds(runs: int = 7) -> tuple[float, float, float]:
    """Median seconds of a worker's first data job type, after its setup: importing engine.definitions.data
    (jsonschema), compiling the demo's file (cel on its first rule), checking a first input and answer."""
    samples: list[tuple[float, float, float]] = []
    for _ in range(runs):
        done = run_runtime(
            ["-c", DATA_TYPE_SCRIPT, json.dumps(DEMO_JOB_TYPE)], {"PYTHONPATH": "src", **INIT_ENVIRONMENT}
        )
        library, compiled, checked = (float(value) for value in done.stdout.split())
        samples.append((library, compiled, checked))
    library, compiled, checked = (statistics.median(sample[n] for sample in samples) for n in range(3))
    return library, compiled, checked


# --- 5 and 6. a worker process: peak memory, Lambda time at 2 s provider latency -------------------

# Peak resident memory of this process: /proc's VmHWM (kB), which starts afresh at exec. ru_maxrss
# would not do: on Linux a child starts from its parent's high-water mark (this bench's, with moto).
WORKER_PROCESS = """
import json, resource, sys, time
def peak_mb():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
sys.path.insert(0, "src"); sys.path.insert(0, ".")
from aijobs.local.lambda_events import InvocationContext, sqs_event, sqs_record
from bench.shapes import message
from handlers.worker import lambda_handler
size = int(sys.argv[1])
event = sqs_event(*(sqs_record(message(f"p{size}-{n}-{time.time_ns()}")) for n in range(size)))
started = time.perf_counter()
response = lambda_handler(event, InvocationContext())
elapsed = time.perf_counter() - started
print(json.dumps({"seconds": elapsed, "failures": len(response["batchItemFailures"]), "peak_rss_mb": peak_mb()}))
"""


def worker_process(size: int, environment: dict[str, str]) -> dict[str, float]:
    """Run the real handler on one batch in a fresh process of the runtime venv (as a cold Lambda would)."""
    done = run_runtime(["-c", WORKER_PROCESS, str(size)], {**environment, "POWERTOOLS_METRICS_DISABLED": "true"})
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["failures"]:
        raise RuntimeError(f"the worker process reported failures: {result}")
    return result


AWS_PROCESS = """
import sys, time
sys.path.insert(0, "src")
from aijobs.local.aws import LocalAws
aws = LocalAws().start()
print(aws.endpoint_url, flush=True)
time.sleep(3600)
"""


@contextmanager
def served_stack(latency_seconds: float) -> Iterator[dict[str, str]]:
    """A local AWS endpoint in its own process (moto's CPU on another core, DynamoDB serialized)
    and a local provider, as the environment of a worker."""
    aws = subprocess.Popen([sys.executable, "-c", AWS_PROCESS], stdout=subprocess.PIPE, text=True)
    saved = dict(os.environ)
    try:
        assert aws.stdout is not None
        endpoint = aws.stdout.readline().strip()
        if not endpoint.startswith("http://127.0.0.1:"):
            raise RuntimeError("the local AWS endpoint process did not start")
        with LocalProvider(latency_seconds=latency_seconds) as provider:
            os.environ.update(CREDENTIALS | {"AWS_ENDPOINT_URL": endpoint})
            resources = create_stack_resources(f"proc-{uuid.uuid4().hex[:6]}", session=boto3.Session())
            yield (
                CREDENTIALS
                | resources.environment()
                | {
                    "AWS_ENDPOINT_URL": endpoint,
                    "AI_BASE_URL": provider.url,
                    "AI_MODEL_PRIMARY": "gpt-4o-mini",
                    "POWERTOOLS_LOG_LEVEL": "ERROR",
                }
            )
    finally:
        os.environ.clear()
        os.environ.update(saved)
        aws.kill()
        aws.wait(timeout=10)


# --- 7. write units of a job with a 50 KB input -----------------------------------------------------


def write_units_of_large_input(input_kb: int = 50) -> tuple[int, int, int, int]:
    """(units of a submitted job's whole life, units of storing the input once, same for a
    message-carried job, requests of the submitted job)."""
    from aijobs.stack import load_template

    template = load_template()
    indexes = [
        Index.from_template(spec) for spec in template["Resources"]["JobsTable"]["Properties"]["GlobalSecondaryIndexes"]
    ]
    text = ("lorem ipsum dolor sit amet " * (input_kb * 1024 // 27 + 1))[: input_kb * 1024]
    job_input = {"text": text, "max_words": 50}
    with moto_stack() as stack:
        client, reader = boto3.client("dynamodb"), boto3.client("dynamodb")
        meter = WriteMeter(client, reader, stack.table_name, indexes)
        store = DynamoJobStore(stack.table_name, client=client)
        jobs = AiJobsClient(
            store,
            JobQueue(stack.queue_url),
            JobRegistry(),
            listing=JobListing(stack.table_name, client),
            ledger=UsageLedger(stack.table_name, client),
        )
        jobs.submit("summarize", "bench", job_input, job_id="large-submitted")
        runner = runner_on(store, InstantSummary())
        runner.process(Delivery("m-large-1", json.dumps({"job_id": "large-submitted"})))
        submitted_units, submitted_requests = meter.total, meter.requests
        input_item = reader.get_item(
            TableName=stack.table_name, Key={"pk": {"S": "JOB#large-submitted"}, "sk": {"S": "INPUT"}}
        )["Item"]
        once = units(item_size(input_item))
        meter.table_units = meter.index_units = 0
        body = json.dumps({"job_id": "large-message", "job_type": "summarize", "user_id": "bench", "input": job_input})
        runner.process(Delivery("m-large-2", body))
        return submitted_units, once, meter.total, submitted_requests


class InstantSummary:
    name = "instant"

    def complete(self, request: CompletionRequest) -> Completion:
        return Completion(json.dumps({"summary": "A short summary of the text."}), request.model, 12_000, 10, 0)


# --- the table --------------------------------------------------------------------------------------


def ratio_figure(name: str, numerator: float, denominator: float, limit: float, method: str, unit: str = "s") -> Figure:
    ratio = numerator / denominator
    return Figure(
        name, f"{ratio:.2f}  ({numerator:.3f}{unit} / {denominator:.3f}{unit})", f"<= {limit}", ratio <= limit, method
    )


def measure(console: Console, sizes: Sizes) -> list[Figure]:
    quiet_engine()
    figures: list[Figure] = []
    console.print("requests per path ...")
    figures += requests_per_path()

    console.print("batch of 10 / batch of 1, provider 500 ms ...")
    ten, one = batch_ratio(0.5, sizes.batch_rounds)
    ten_alone, one_alone = batch_ratio(0.0, sizes.batch_rounds)
    figures.append(
        ratio_figure(
            "wall time, batch of 10 / batch of 1 (provider 500 ms)",
            ten,
            one,
            1.5,
            "WorkerHandler.handle on SQS events; local provider over HTTP; moto server in its own process, "
            f"DynamoDB serialized; fresh table per batch; median of {sizes.batch_rounds}",
        )
    )
    figures.append(
        Figure(
            "  what stands in the way: the DynamoDB emulator",
            f"{ten_alone:.3f}s for the batch of 10, {one_alone:.3f}s for 1, with an instant provider",
            "-",
            None,
            f"moto serves one request at a time, {1000 * ten_alone / 20:.0f} ms each; the provider part of the batch "
            f"of 10 is {ten - ten_alone:.3f}s against {one - one_alone:.3f}s for one record: the ten calls overlap",
        )
    )
    console.print("engine overhead ...")
    engine, bare = engine_overhead(sizes.overhead_jobs)
    figures.append(
        ratio_figure(
            "engine time per job / its bare DynamoDB requests (instant provider)",
            engine * 1000,
            bare * 1000,
            1.5,
            f"{sizes.overhead_jobs} jobs through JobRunner, each followed by its recorded requests replayed with "
            "boto3 on a twin table; "
            "median per job; moto in process",
            "ms",
        )
    )

    console.print("import time ...")
    runs = sizes.processes
    worker_import, boto3_import = import_seconds("handlers.worker", runs), import_seconds("boto3", runs)
    version = run_runtime(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"], {}).stdout.strip()
    figures.append(
        ratio_figure(
            "cold start: import handlers.worker / import boto3",
            worker_import,
            boto3_import,
            1.5,
            f"python{version} -X importtime in fresh processes of a venv with src/requirements.txt only, "
            f"median of {runs}",
        )
    )
    profile = import_profile("handlers.worker")
    heaviest = sorted(((name, t) for name, t in profile.items() if name != "total"), key=lambda pair: -pair[1])[:6]
    figures.append(
        Figure(
            "  what stands in the way: what handlers.worker imports",
            ", ".join(f"{name} {seconds:.3f}s" for name, seconds in heaviest),
            "-",
            None,
            "own import time of each top-level package's modules, one fresh runtime process",
        )
    )
    imported, built = init_seconds(runs)
    figures.append(
        Figure(
            "  first invocation's setup after the import",
            f"{built:.3f}s to build the worker (settings, clients, job types, gateway); import {imported:.3f}s",
            "-",
            None,
            f"handlers.worker.lambda_handler.prepare() in fresh runtime processes, median of {runs}; what SnapStart "
            "snapshots along with the import",
        )
    )

    library, compiled, checked = data_type_seconds(runs)
    data_type = library + compiled + checked
    figures.append(
        ratio_figure(
            "cold start: a first data job type / import handlers.worker",
            data_type,
            worker_import,
            0.5,
            f"after prepare(), in fresh runtime processes, median of {runs}: import engine.definitions.data "
            f"(jsonschema) {library:.3f}s, compile the demo's file (cel, on its rule) {compiled:.3f}s, a first "
            f"input and answer checked {checked:.3f}s; paid once per execution environment that serves one",
        )
    )

    console.print("worker processes ...")
    with served_stack(0.0) as environment:
        peak = worker_process(10, environment)["peak_rss_mb"]
    figures.append(
        Figure(
            "peak memory, batch of 10",
            f"{peak:.0f} MB",
            "<= 160 MB",
            peak <= 160,
            "peak resident memory (VmHWM) of a fresh runtime-venv process running the handler on 10 records "
            "(moto and provider in other processes)",
        )
    )
    with served_stack(2.0) as environment:
        batch = worker_process(10, environment)["seconds"]
        single = worker_process(1, environment)["seconds"]
    engine_gbs = 100 * batch * LAMBDA_MEMORY_GB
    single_gbs = 1000 * single * LAMBDA_MEMORY_GB
    figures.append(
        Figure(
            "Lambda GB-s per 1000 jobs, provider 2 s: batches of 10 / one job per invocation",
            f"{engine_gbs / single_gbs:.2f}  ({engine_gbs:.0f} / {single_gbs:.0f} GB-s)",
            "-",
            None,
            f"handler durations in fresh processes ({batch:.2f}s per batch of 10, "
            f"{single:.2f}s per job alone) x 512 MB",
        )
    )

    console.print("write units ...")
    submitted, once, carried, requests = write_units_of_large_input()
    figures.append(
        Figure(
            "write units of a successful 50 KB-input job / storing the input once",
            f"{submitted / once:.2f}  ({submitted} / {once} WCU)",
            "<= 1.2",
            submitted / once <= 1.2,
            f"submitted job (input stored once, {requests} write requests), units computed from item images "
            f"incl. indexes; the same job as a full SQS message: {carried} WCU",
        )
    )
    figures += fleet.fleet_figures(console, sizes.fleet_jobs, sizes.budget_jobs, sizes.budget_worst_case)
    figures += lanes.lanes_figures(console, sizes.lane_minutes, sizes.lane_probes)
    figures += limited.limited_figures(console, sizes.limited_jobs)
    figures += batches.batch_figures(
        console, sizes.batch_jobs, sizes.stalled_jobs, sizes.cache_jobs, sizes.rescue_seconds
    )
    figures += flex.flex_figures(console, sizes.flex_jobs)
    figures += events.events_figures(console, sizes.event_jobs)
    figures += ui.ui_figures(console, sizes.dashboard_jobs, sizes.dashboard_rounds)
    figures += attachments.attachments_figures(console)
    figures += job_types.job_types_figures(console, sizes.job_type_refresh_seconds, sizes.job_type_jobs)
    figures += pipelines.pipelines_figures(console, sizes.pipeline_text_bytes, sizes.pipeline_parents)
    figures += reuse.reuse_figures(console, sizes.reuse_jobs)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="every figure at small sizes, in a few minutes (targets not expected)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH, as a JSON list")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    figures = measure(console, QUICK if args.quick else Sizes())
    if args.json:
        args.json.write_text(json.dumps([asdict(figure) for figure in figures], indent=2) + "\n")
    console.print(
        render(figures, "aijobs bench, quick: small sizes, targets not expected" if args.quick else "aijobs bench")
    )
    targets = [figure for figure in figures if figure.met is not None]
    console.print(f"{sum(bool(figure.met) for figure in targets)} of {len(targets)} targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
