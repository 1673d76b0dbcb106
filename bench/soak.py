"""The soak: N jobs and pipelines in both lanes, some through a provider's batch, with injected faults,
duplicated deliveries and killed invocations, through the whole stack in one process.

A moto server holds the template's queues and table, the local OpenAI-compatible provider answers
(its Files and Batches APIs too), and the worker runs behind one local event source mapping per
lane, each with its own pollers and the template's batching window; the batcher runs on its
schedule (AIJOBS_BATCH_API=on, short windows, polls and rescue time, so that batches end within the
run). Jobs go to three routes: interactive, background with a deadline too near for a batch (real
time), and background with one far enough for a batch. One job in five carries a fault of its
route: a `fault:<kind>[*K]` marker the provider obeys (in a batch's line as in a real-time call), or
a message the engine must reject, so each job's final status, error code, lane, attempt count and
provider calls (and which of them a batch made) are known in advance. Every message is sent two or
three times, the extra copies delayed a little. The run ends when every job is terminal (or the time
budget passes); the queues are then drained, the completion events the events function made from
the table's stream are counted (exactly one per job, of the job's lane, told apart by their event_id as
a consumer does), and one table compares what happened with the plan: every job ended as planned and
by its deadline, and its recorded tokens and cost equal the calls the provider's log shows for it, a
batch's line at the batch price (AIJOBS_PRICES' `batch` factor) and its re-asks in real time. The exit
status is 1 when any check fails.

Pipelines (bench.soak_pipelines) go among them: `summarize_long` and `extract_reviewed` jobs, some of
whose children fail, reviewed by the soak or left to time out, while the events function's stream
delivers every record two or three times (aijobs.local.streams.StreamCopies) and some invocations of
the worker and of the events function die mid-way (aijobs.local.kills), each once, their batches
delivered again. The table adds the pipelines' checks: each ended as planned, no step advanced twice,
no child run twice at once, and usage summed exactly.

Concessions to the harness, none to the engine (the table's caption repeats them):
- moto is fitted as everywhere else (aijobs.local.moto_patches): DynamoDB operations one at a time
  (moto alone is not linearizable), transaction rollbacks of the touched items only and server
  routing cached (same results, far less time); messages are fed keeping at most --queue-depth on
  the queues, because moto's SQS requests cost time in proportion to a queue's depth;
- the visibility the engine sets (backoff, Retry-After, a held duplicate's remaining lease, a batched
  job's included) is capped at --visibility-clamp seconds, so that retries happen within the run; the
  table counts the capped ones and the longest delay asked for;
- the engine asks for `json_object` output (AI_STRUCTURED_OUTPUT): the schema then travels in the
  system message, and the local provider answers from it alone, the soak's own quick classify type
  (1 s timeout, for the hangs) like any other;
- the batcher runs every second (every minute in AWS), and the local provider answers a batch two
  seconds after its creation (most real batches take minutes);
- a killed worker invocation's messages come back after --visibility-clamp seconds (the queue's
  visibility timeout, 30 minutes in AWS), and one that dies before its pipeline waits had 15 s left
  (bench.soak_pipelines.KILLED_INVOCATION_SECONDS), so that the lease it leaves ends within the run.

Usage: python -m bench.soak [--jobs 1000] [--pipelines N] [--batch-share 0.2] [--background-share 0.2]
[--budget 420] [--seed 7] (or make soak; make soak SOAK_ARGS="--jobs 200" for a short run)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from typing import Any

import boto3
from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.events import EventsTap
from aijobs.local.aws import LocalAws
from aijobs.local.devstack import LOCAL_BATCHER_SECONDS, local_session
from aijobs.local.faults import prompt_hash
from aijobs.local.poller import EventSourceMapping
from aijobs.local.provider import LocalProvider, ServedRequest
from aijobs.local.schedule import Schedule
from aijobs.local.streams import StreamCopies, TableStream
from aijobs.stack import batching_window, create_stack_resources, function_timeout, load_template
from bench.soak_ledger import (
    BATCH_PRICE_SHARE,
    PRICES,
    CallTally,
    Report,
    TableContents,
    call_cost,
    format_tokens,
    item_tokens,
    logged_tokens,
    read_table,
    recorded_batch_attempts,
    total_tokens,
    usage_tokens,
)
from bench.soak_pipelines import (
    EXTRACT_REVIEWED,
    KILLED_INVOCATION_SECONDS,
    Decision,
    PipelineKills,
    Reviewer,
    evaluate_pipelines,
    explain_pipeline,
    plan_pipelines,
    prompt_keys,
    read_stream,
    stream_history,
)
from engine.batching.files import MANIFESTS_PREFIX, PARTS_PREFIX
from engine.config import Settings, load_settings
from engine.core import ErrorCode, Job, JobStatus, Lane
from engine.core.batches import BatchPhase
from engine.definitions import BUILTIN_DEFINITIONS, JobRegistry
from engine.definitions.classify import CLASSIFY
from engine.events import REVIEWED
from engine.queue import JobQueue, JobQueues
from engine.store.items import job_key
from engine.wiring import Aws, build_batcher, build_events, build_store, build_worker
from handlers.events import events_handler
from handlers.invocation import scheduled
from handlers.worker import WorkerHandler

API_KEY = "sk-soak"
MODEL = "local-model"
REGION = "us-east-1"
REASONING_TOKENS = 8
# classify with a 1 s provider timeout: a hanging provider (3 s) costs an attempt about a second.
QUICK_CLASSIFY = replace(CLASSIFY, name="soak_quick_classify", timeout_seconds=1.0)
HANG_SECONDS = 3.0
PROVIDER_LATENCY_SECONDS = 0.01
# The shortest deadline a message may set (docs/messages.md): how long a job rate-limited for ever lasts.
SHORT_DEADLINE_SECONDS = 60
# Batches (docs/batches.md): 5 s windows polled every second, and a rescue time of a minute and a half
# (the defaults, 300 / 60 / 1800 s, would keep a batch longer than a soak runs); the batcher runs every
# second, as in the embedded stack, and the local provider answers a batch 2 s after its creation.
BATCH_WINDOW_SECONDS, BATCH_POLL_SECONDS, BATCH_RESCUE_SECONDS = 5, 1, 90
BATCH_DELAY_SECONDS = 2.0
# A background job joins a batch when its deadline is at least rescue + window + poll + 60 s away
# (156 s). The soak's batched jobs have theirs four minutes away, so that they must end within the run
# (their rescue time comes 150 s after their creation); its background jobs in real time two minutes
# away, too near for a batch.
BATCHED_DEADLINE_SECONDS = 240
NEAR_DEADLINE_SECONDS = 120
DRAIN_SECONDS = 30.0
# Pipelines among the jobs (bench.soak_pipelines): one per JOBS_PER_PIPELINE jobs, at least one of each plan.
JOBS_PER_PIPELINE = 20
MIN_PIPELINES = 9
# Every ended job's completion event has arrived within this long after the queue drained.
EVENTS_WAIT_SECONDS = 30.0
PROGRESS_SECONDS = 5.0


# --- the plan --------------------------------------------------------------------------------------


class Route(StrEnum):
    """Which queue a job's messages go to, and how it is meant to run."""

    INTERACTIVE = "interactive"  # the jobs queue
    BACKGROUND = "background"  # the background queue, its deadline too near for a batch: real time
    BATCH = "batch"  # the background queue, its deadline far: through the provider's batch API

    @property
    def lane(self) -> Lane:
        return Lane.INTERACTIVE if self is Route.INTERACTIVE else Lane.BACKGROUND

    @property
    def deadline_seconds(self) -> int | None:
        """The deadline its jobs' messages set (unless their plan sets one); None: the job type's, a day."""
        return {Route.BACKGROUND: NEAR_DEADLINE_SECONDS, Route.BATCH: BATCHED_DEADLINE_SECONDS}.get(self)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a job is made to meet, and how it must end. None: not fixed in advance."""

    label: str
    job_type: str
    marker: str | None = None
    status: JobStatus = JobStatus.SUCCEEDED
    code: ErrorCode | None = None
    attempts: int | None = 1
    calls: int | None = 1
    fields: Mapping[str, Any] = field(default_factory=dict)
    bad_input: bool = False
    # How many of its calls a provider's batch makes (logged with a batch_id): any of these counts.
    batch_calls: tuple[int, ...] = (0,)

    @property
    def faulty(self) -> bool:
        return self.marker is not None or self.code is not None


FAILED, MAX_ATTEMPTS = JobStatus.FAILED, ErrorCode.MAX_ATTEMPTS_EXCEEDED
SCHEMA, BUSINESS = ErrorCode.SCHEMA_VALIDATION_FAILED, ErrorCode.BUSINESS_VALIDATION_FAILED
REFERENCE = ErrorCode.REFERENCE_VALIDATION_FAILED

# Transient faults come with a count: served K times, then a good answer (K < 3) or the budget of 3
# attempts is spent (K = 3). Content faults fail after the one repair re-ask (2 calls).
FAULT_PLANS: tuple[Plan, ...] = (
    Plan("rate_limited*2", "classify", "fault:rate_limited*2", calls=3),  # 429s refund the attempt
    Plan(
        "rate_limited until the deadline",
        "summarize",
        "fault:rate_limited",
        FAILED,
        ErrorCode.DEADLINE_EXCEEDED,
        attempts=None,
        calls=None,
        fields={"deadline_seconds": SHORT_DEADLINE_SECONDS},
    ),
    Plan("server_error*1", "answer_with_citations", "fault:server_error*1", attempts=2, calls=2),
    Plan("server_error*3", "classify", "fault:server_error*3", FAILED, MAX_ATTEMPTS, attempts=3, calls=3),
    Plan("unavailable*2", "summarize", "fault:unavailable*2", attempts=3, calls=3),
    Plan("unavailable*3", "answer_with_citations", "fault:unavailable*3", FAILED, MAX_ATTEMPTS, attempts=3, calls=3),
    Plan("hang*1", QUICK_CLASSIFY.name, "fault:hang*1", attempts=2, calls=2),
    Plan("hang*3", QUICK_CLASSIFY.name, "fault:hang*3", FAILED, MAX_ATTEMPTS, attempts=3, calls=3),
    Plan("drop*1", "summarize", "fault:drop*1", attempts=2, calls=2),
    Plan("drop*3", "classify", "fault:drop*3", FAILED, MAX_ATTEMPTS, attempts=3, calls=3),
    Plan("non_json", "classify", "fault:non_json", FAILED, SCHEMA, calls=2),
    Plan("wrong_shape", "answer_with_citations", "fault:wrong_shape", FAILED, SCHEMA, calls=2),
    Plan("business_invalid", "summarize", "fault:business_invalid", FAILED, BUSINESS, calls=2),
    Plan("reference_invalid", "answer_with_citations", "fault:reference_invalid", FAILED, REFERENCE, calls=2),
    Plan("repairable", "classify", "fault:repairable", calls=2),
    # Messages the engine must reject without a provider call.
    Plan("invalid input", "classify", None, FAILED, ErrorCode.INPUT_VALIDATION_FAILED, 0, 0, bad_input=True),
    Plan("unknown job type", "no_such_type", None, FAILED, ErrorCode.UNKNOWN_JOB_TYPE, 0, 0),
    Plan("schema version 2", "summarize", None, FAILED, ErrorCode.SCHEMA_VERSION_MISMATCH, 0, 0, {"schema_version": 2}),
)
# Background jobs in real time meet the same faults, but for the messages the engine rejects: the job
# such a message fails is recorded without a lane (engine.dead_letters.DeadLetterRecorder.fail_bad_message),
# so it reads as interactive whichever queue the message came from.
BACKGROUND_FAULT_PLANS: tuple[Plan, ...] = tuple(plan for plan in FAULT_PLANS if plan.calls != 0)
CLEAN_PLANS: tuple[Plan, ...] = tuple(
    Plan("no fault", job_type) for job_type in ("classify", "summarize", "answer_with_citations")
)
# Batched jobs: their first call is a line of a provider's batch, and their faults ones that leave
# each job's end and calls known in advance. Batch-wide faults (`batch-fault:stall`, `expire_half`,
# `failed_lines`) are not among them: a batch gathers whatever jobs of its model share its window,
# so such a fault would reach other planned jobs, and `failed_lines` fails lines by their place in
# the batch. Built-in job types only: the batcher registers the job types its settings name.
BATCH_CLEAN_PLANS: tuple[Plan, ...] = tuple(
    replace(plan, label="batch: no fault", batch_calls=(1,)) for plan in CLEAN_PLANS
)
BATCH_FAULT_PLANS: tuple[Plan, ...] = (
    # The batch's answer is invalid; the re-ask (in real time, by the batcher) repairs it.
    Plan("batch: repairable", "classify", "fault:repairable", calls=2, batch_calls=(1,)),
    # The batch's answer and the real-time re-ask both fail validation: its schema, business or reference rules.
    Plan("batch: non_json", "summarize", "fault:non_json", FAILED, SCHEMA, calls=2, batch_calls=(1,)),
    Plan("batch: business_invalid", "summarize", "fault:business_invalid", FAILED, BUSINESS, calls=2, batch_calls=(1,)),
    Plan(
        "batch: reference_invalid",
        "answer_with_citations",
        "fault:reference_invalid",
        FAILED,
        REFERENCE,
        calls=2,
        batch_calls=(1,),
    ),
    # Its line fails (a 500): the job is handed back, its attempt refunded, and its next call answers:
    # in real time, or in a second batch when a duplicate copy (not marked for real time) claims the
    # job before the handed-back message does.
    Plan("batch: server_error*1", "classify", "fault:server_error*1", calls=2, batch_calls=(1, 2)),
)


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job_id: str
    plan: Plan
    route: Route
    message: dict[str, Any]
    copies: int
    # The prompt the provider logs the job's calls under; None when no call is expected.
    prompt_key: str | None


def job_input(job_type: str, job_id: str, marker: str | None, bad: bool) -> dict[str, Any]:
    """A built-in job type's input whose free text names the job (one prompt per job) and holds the marker."""
    tail = f" {marker}" if marker else ""
    if job_type == "answer_with_citations":
        return {
            "question": f"How long does SQS keep the messages of {job_id}?{tail}",
            "documents": [
                {"id": "retention", "text": f"Messages of {job_id} are kept for up to 14 days."},
                {"id": "size", "text": "A message holds at most 1 MiB."},
            ],
        }
    if job_type == "summarize":
        text = f"Report {job_id}. SQS stores every message redundantly and delivers it at least once.{tail}"
        return {"text": text, "max_words": 12}
    labels = ["spam"] if bad else ["spam", "ham", "newsletter"]
    return {"text": f"Ticket {job_id}: you have won a free cruise, click here now!{tail}", "labels": labels}


@dataclass(frozen=True, slots=True)
class Shares:
    """The shares of the jobs given a fault, sent as batched background jobs, and as background jobs
    whose deadline is too near for a batch; the rest are interactive."""

    faults: float
    batched: float
    background: float


def plan_jobs(count: int, shares: Shares, rng: random.Random, registry: JobRegistry) -> list[PlannedJob]:
    """`count` jobs in their routes, spread at random; a share of them, also spread at random, take the
    fault plans of their route in turn."""
    numbers = range(count)
    batched = set(rng.sample(numbers, round(count * shares.batched)))
    background = set(rng.sample([n for n in numbers if n not in batched], round(count * shares.background)))
    faulty = set(rng.sample(numbers, round(count * shares.faults)))
    faults = {
        Route.INTERACTIVE: itertools.cycle(FAULT_PLANS),
        Route.BACKGROUND: itertools.cycle(BACKGROUND_FAULT_PLANS),
        Route.BATCH: itertools.cycle(BATCH_FAULT_PLANS),
    }
    jobs = []
    for number in numbers:
        job_id = f"soak-{number:05d}"
        route = Route.BATCH if number in batched else Route.BACKGROUND if number in background else Route.INTERACTIVE
        clean = BATCH_CLEAN_PLANS if route is Route.BATCH else CLEAN_PLANS
        plan = next(faults[route]) if number in faulty else clean[number % len(clean)]
        raw_input = job_input(plan.job_type, job_id, plan.marker, plan.bad_input)
        message = {
            "job_id": job_id,
            "job_type": plan.job_type,
            "user_id": f"soak-user-{number % 7}",
            "input": raw_input,
            **plan.fields,
        }
        if route.deadline_seconds is not None:
            message.setdefault("deadline_seconds", route.deadline_seconds)
        prompt_key = None
        if plan.calls != 0:
            definition = registry.get(plan.job_type)
            prompt_key = prompt_hash(definition.render_prompt(definition.parse_input(raw_input)).user)
        jobs.append(PlannedJob(job_id, plan, route, message, rng.choice((2, 3)), prompt_key))
    return jobs


# --- the harness around the engine ----------------------------------------------------------------


class ClampedQueue(JobQueue):
    """The engine's JobQueue with every visibility change capped, and the delays asked for counted."""

    def __init__(self, queue_url: str, client: Any, clamp_seconds: int) -> None:
        super().__init__(queue_url, client)
        self.clamp_seconds = clamp_seconds
        self.asked: Counter[int] = Counter()
        self._lock = threading.Lock()

    def change_visibility(self, receipt_handle: str, seconds: int) -> None:
        with self._lock:
            self.asked[seconds] += 1
        super().change_visibility(receipt_handle, min(seconds, self.clamp_seconds))


def build_soak_worker(
    settings: Settings, session: boto3.Session, clamp_seconds: int
) -> tuple[WorkerHandler, list[ClampedQueue]]:
    """engine.wiring.build_worker, with the quick job type and the clamp on each lane's queue."""
    registry = JobRegistry([*BUILTIN_DEFINITIONS, QUICK_CLASSIFY])
    registry.load_modules(settings.aijobs_job_modules)
    sqs = Aws(settings, session).client("sqs")
    assert settings.jobs_background_queue_url is not None  # create_stack_resources makes the queue
    queues = {
        Lane.INTERACTIVE: ClampedQueue(settings.jobs_queue_url, sqs, clamp_seconds),
        Lane.BACKGROUND: ClampedQueue(settings.jobs_background_queue_url, sqs, clamp_seconds),
    }
    worker = WorkerHandler(*build_worker(settings, session, registry=registry, queue=JobQueues(queues)))
    return worker, list(queues.values())


class WorkerFunction:
    """The worker function, an execution environment of its own per poller thread, as Lambda runs one
    invocation at a time in each: a batch's records each have a thread at once. So an invocation killed in
    a pipeline's advance stops there for that pipeline only; it dies once its other records are done (none
    claimed and left unrun), and its batch comes back whole."""

    def __init__(self, settings: Settings, session: boto3.Session, clamp_seconds: int) -> None:
        self._settings = settings
        self._session = session
        self._clamp_seconds = clamp_seconds
        self._local = threading.local()
        self._lock = threading.Lock()
        self.queues: list[ClampedQueue] = []

    def handle(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        handler: WorkerHandler | None = getattr(self._local, "handler", None)
        if handler is None:
            with self._lock:  # a boto3 session makes one client at a time
                handler, queues = build_soak_worker(self._settings, self._session, self._clamp_seconds)
                self.queues += queues
            self._local.handler = handler
        return handler.handle(event, context)


class LogTally(logging.Handler):
    """Counts the engine's warnings and errors, and remembers the first lines of each kind."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.levels: Counter[str] = Counter()
        self.messages: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        self.messages[f"{record.levelname}: {record.getMessage()}"] += 1


@contextlib.contextmanager
def engine_output_to(path: str, tally: LogTally) -> Iterator[None]:
    """The engine's log lines (and Powertools' metric dumps on stdout) go to a file while the soak runs."""
    engine_logger = logging.getLogger("aijobs")
    previous_level = engine_logger.level
    with open(path, "w") as sink, contextlib.redirect_stdout(sink):
        streams = [handler for handler in engine_logger.handlers if isinstance(handler, logging.StreamHandler)]
        originals = [handler.setStream(sink) for handler in streams]
        engine_logger.setLevel(logging.WARNING)
        engine_logger.addHandler(tally)
        try:
            yield
        finally:
            engine_logger.removeHandler(tally)
            engine_logger.setLevel(previous_level)
            for handler, original in zip(streams, originals, strict=True):
                if original is not None:
                    handler.setStream(original)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A job's message, the queue it goes to and how many times it is sent."""

    queue_url: str
    message: dict[str, Any]
    copies: int


@dataclass(frozen=True, slots=True)
class Delivery:
    queue_url: str
    body: str
    delay_seconds: int


def delivery_order(messages: Sequence[Outgoing], rng: random.Random) -> list[Delivery]:
    """Every job's message 2-3 times, to its route's queue: a second copy close behind the first (it
    meets the job held or just finished), a third anywhere later (it meets the job long finished);
    extra copies delayed 0-3 s."""
    keyed: list[tuple[float, Delivery]] = []
    for position, outgoing in enumerate(rng.sample(list(messages), len(messages))):
        queue_url, body = outgoing.queue_url, json.dumps(outgoing.message)
        keyed.append((position, Delivery(queue_url, body, 0)))
        later = (rng.uniform(0, 20), rng.uniform(0, len(messages)))
        keyed.extend(
            (position + later[copy - 1], Delivery(queue_url, body, rng.randint(0, 3)))
            for copy in range(1, outgoing.copies)
        )
    keyed.sort(key=lambda pair: pair[0])
    return [delivery for _, delivery in keyed]


class Feeder(threading.Thread):
    """Sends the deliveries in order, keeping at most `depth` messages on the queues together.

    Jobs arrive over time, as they would; and moto's SQS requests cost time in proportion to the
    messages on the queue, so a queue thousands deep would measure moto rather than the engine.
    """

    def __init__(self, sqs: Any, deliveries: Sequence[Delivery], depth: int) -> None:
        super().__init__(name="soak-feeder", daemon=True)
        self._sqs = sqs
        self._queue_urls = list(dict.fromkeys(delivery.queue_url for delivery in deliveries))
        self._deliveries = deliveries
        self._depth = depth
        self.sent = 0
        self.error: Exception | None = None
        self._stopping = threading.Event()

    @property
    def done(self) -> bool:
        return self.sent == len(self._deliveries)

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)

    def run(self) -> None:
        try:
            while not self.done and not self._stopping.is_set():
                room = self._depth - sum(queue_depth(self._sqs, queue_url) for queue_url in self._queue_urls)
                while room >= 10 and not self.done:
                    room -= self._send(self._deliveries[self.sent : self.sent + 10])
                # Each look at the queue's depth costs moto a pass over its messages: look twice a second.
                self._stopping.wait(0.5)
        except Exception as exc:  # reported in the table: the run cannot pass without every message
            self.error = exc

    def _send(self, chunk: Sequence[Delivery]) -> int:
        """Send the chunk's deliveries, one request per queue."""
        for queue_url in dict.fromkeys(delivery.queue_url for delivery in chunk):
            entries = [
                {"Id": str(index), "MessageBody": delivery.body, "DelaySeconds": delivery.delay_seconds}
                for index, delivery in enumerate(chunk)
                if delivery.queue_url == queue_url
            ]
            response = self._sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"SQS refused messages: {response['Failed'][:1]}")
        self.sent += len(chunk)
        return len(chunk)


class StatusReader:
    """Which jobs are not terminal yet: BatchGetItem over the ones still pending, behind the engine's lock."""

    def __init__(self, table_name: str, client: Any, job_ids: Sequence[str]) -> None:
        self._table_name = table_name
        self._client = client
        self.pending = set(job_ids)

    def refresh(self) -> int:
        """Re-read the pending jobs; the number still pending."""
        pending = sorted(self.pending)
        for start in range(0, len(pending), 100):
            keys: list[dict[str, Any]] = [job_key(job_id) for job_id in pending[start : start + 100]]
            while keys:
                request = {
                    self._table_name: {
                        "Keys": keys,
                        "ConsistentRead": True,
                        "ProjectionExpression": "job_id, #status",
                        "ExpressionAttributeNames": {"#status": "status"},
                    }
                }
                response = self._client.batch_get_item(RequestItems=request)
                for item in response["Responses"].get(self._table_name, []):
                    if JobStatus(item["status"]["S"]).is_terminal:
                        self.pending.discard(item["job_id"]["S"])
                keys = response.get("UnprocessedKeys", {}).get(self._table_name, {}).get("Keys", [])
        return len(self.pending)


def reveal(sqs: Any, queue_url: str, event: Mapping[str, Any], seconds: int) -> None:
    """Make the messages of an invocation's batch visible again after `seconds`."""
    entries = [
        {"Id": str(index), "ReceiptHandle": record["receiptHandle"], "VisibilityTimeout": seconds}
        for index, record in enumerate(event.get("Records", []))
    ]
    if entries:
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)


def queue_depth(sqs: Any, queue_url: str) -> int:
    """Messages on the queue: visible, in flight and delayed."""
    names = [f"ApproximateNumberOfMessages{kind}" for kind in ("", "NotVisible", "Delayed")]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, 0)) for name in names)


def wait_for(predicate: Callable[[], bool], seconds: float, on_tick: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + seconds
    next_tick = time.monotonic() + PROGRESS_SECONDS
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        if on_tick is not None and time.monotonic() >= next_tick:
            on_tick()
            next_tick += PROGRESS_SECONDS
        time.sleep(1.0)
    return True


# --- the outcome -----------------------------------------------------------------------------------


def evaluate(
    report: Report,
    jobs: Sequence[PlannedJob],
    contents: TableContents,
    provider_log: Sequence[ServedRequest],
    children: Sequence[Job] = (),
) -> list[str]:
    """Add the outcome's rows to `report`; the ids of the jobs that broke a per-job check. The usage of
    the pipelines' `children` joins the jobs' in the reconciliation with the provider's log (a pipeline's
    own is theirs again: bench.soak_pipelines checks it)."""
    by_prompt: dict[str, CallTally] = defaultdict(CallTally)
    for entry in provider_log:
        by_prompt[entry.prompt_hash].add(entry)
    found = [contents.jobs.get(job.job_id) for job in jobs]
    terminal = sum(1 for job in found if job is not None and job.status.is_terminal)
    report.check("terminal", "100%", f"{terminal / len(jobs):.1%}", terminal == len(jobs))

    expected_status = Counter(job.plan.status.value for job in jobs)
    actual_status = Counter(job.status.value if job else "missing" for job in found)
    for status in [*(status.value for status in JobStatus), "missing"]:
        if expected_status[status] or actual_status[status]:
            report.check(f"status {status}", expected_status[status], actual_status[status])
    expected_codes = Counter(job.plan.code.value for job in jobs if job.plan.code)
    actual_codes = Counter(job.error.code.value for job in found if job and job.status.is_terminal and job.error)
    for code in sorted(set(expected_codes) | set(actual_codes)):
        report.check(f"error {code}", expected_codes[code], actual_codes[code])

    off_plan, off_attempts, off_calls, duplicate_answers, double_success, off_usage = [], [], [], 0, [], []
    off_batch_usage, late = [], []
    spare: dict[Route, list[float]] = defaultdict(list)
    for planned, job in zip(jobs, found, strict=True):
        plan = planned.plan
        tally = by_prompt.get(planned.prompt_key or "", CallTally())
        attempts = contents.attempts.get(planned.job_id, [])
        if (
            job is None
            or job.status is not plan.status
            or (job.error.code if job.error else None) != plan.code
            or job.lane is not planned.route.lane
        ):
            off_plan.append(planned.job_id)
        if job is not None and plan.attempts is not None and job.attempt_count != plan.attempts:
            off_attempts.append(f"{planned.job_id} ({plan.label}: {job.attempt_count})")
        if planned.prompt_key is not None and (
            (plan.calls is not None and tally.calls != plan.calls) or tally.batch_calls not in plan.batch_calls
        ):
            off_calls.append(f"{planned.job_id} ({plan.label}: {tally.calls}, {tally.batch_calls} via a batch)")
        duplicate_answers += max(0, tally.valid_answers - 1)
        if sum(1 for attempt in attempts if attempt.get("outcome") == "succeeded") > 1:
            double_success.append(planned.job_id)
        recorded = usage_tokens(job.usage) if job else (0, 0, 0, 0)
        itemized = total_tokens(item_tokens(attempt) for attempt in attempts)
        cost = job.usage.cost_usd if job else Decimal(0)
        if planned.prompt_key is not None and not (recorded == itemized == tally.tokens and cost == tally.cost):
            off_usage.append(planned.job_id)
        if recorded_batch_attempts(attempts) != tally.batch_attempts():
            off_batch_usage.append(planned.job_id)
        if job is not None and plan.code is not ErrorCode.DEADLINE_EXCEEDED:
            if not ended_in_time(job):
                late.append(planned.job_id)
            elif job.deadline_at is not None and job.finished_at is not None:
                spare[planned.route].append((job.deadline_at - job.finished_at) / 1000)
    report.check("jobs off plan (status, code, lane)", 0, len(off_plan), not off_plan)
    report.check("attempt counts off plan", 0, len(off_attempts), not off_attempts)
    report.check("provider calls off plan (per job: all, via a batch)", 0, len(off_calls), not off_calls)
    report.check("duplicate successful provider calls", 0, duplicate_answers)
    report.check("jobs with >1 succeeded attempt record", 0, len(double_success))
    report.check("jobs ended after their deadline (but those meant to)", 0, len(late))
    report.figure(
        f"least time to spare before a deadline (s): {' / '.join(route.value for route in Route)}",
        " / ".join(f"{min(spare[route]):.0f}" if spare[route] else "-" for route in Route),
    )

    billed = total_tokens(logged_tokens(entry) for entry in provider_log)
    calling = [*(job for job in found if job), *children]
    on_jobs = total_tokens(usage_tokens(job.usage) for job in calling)
    all_attempts = [attempt for items in contents.attempts.values() for attempt in items]
    on_attempts = total_tokens(item_tokens(attempt) for attempt in all_attempts)
    report.check(
        "tokens in/out/cached/reasoning: jobs' usage = provider log", format_tokens(billed), format_tokens(on_jobs)
    )
    report.check(
        "tokens in/out/cached/reasoning: attempt items = provider log",
        format_tokens(billed),
        format_tokens(on_attempts),
    )
    priced = sum((call_cost(entry) for entry in provider_log), Decimal(0))
    report.check("cost USD: jobs' usage = provider log x price", priced, sum(job.usage.cost_usd for job in calling))
    report.check(
        "cost USD: attempt items = provider log x price",
        priced,
        sum((Decimal(attempt["cost_usd"]) for attempt in all_attempts), Decimal(0)),
    )
    report.check(
        "attempts: jobs' usage = attempt items",
        len(all_attempts),
        sum(job.usage.attempts for job in calling),
    )
    report.check("jobs whose usage (tokens, cost) differs from their calls", 0, len(off_usage))
    report.check(
        "jobs whose attempts via a batch differ from its line (batch price) + re-asks", 0, len(off_batch_usage)
    )
    suspects = [*off_plan, *off_attempts, *off_calls, *double_success, *late, *off_usage, *off_batch_usage]
    return list(dict.fromkeys(job_id.split(" ", 1)[0] for job_id in suspects))


def evaluate_batches(
    report: Report,
    jobs: Sequence[PlannedJob],
    contents: TableContents,
    provider_log: Sequence[ServedRequest],
    files_left: int,
) -> None:
    """Add the batches' rows to `report`: every batch recorded and ended, its files gone, and what it did."""
    lines = [entry for entry in provider_log if entry.batch_id is not None]
    answered = {entry.batch_id for entry in lines}
    recorded = {str(record["batch_id"]) for record in contents.batches if record.get("batch_id")}
    report.check(
        "provider batches: recorded = in the provider's log", len(answered), len(recorded), answered == recorded
    )
    in_flight = sum(1 for record in contents.batches if record["phase"] != BatchPhase.ENDED)
    report.check("batch records not ended", 0, in_flight)
    report.check("batch parts and manifests left in the payload bucket", 0, files_left)
    finished = sum(int(record.get("finished", 0)) for record in contents.batches)
    returned = sum(int(record.get("returned", 0)) for record in contents.batches)
    failed = sum(1 for entry in lines if entry.status != 200)
    report.figure(
        "batches / lines answered (failed) / jobs finished / handed back",
        f"{len(recorded)} / {len(lines)} ({failed}) / {finished} / {returned}",
    )
    prompts = {job.prompt_key for job in jobs if job.route is Route.BATCH}
    batches_per_prompt = Counter(
        entry.prompt_hash for entry in {(entry.prompt_hash, entry.batch_id): entry for entry in lines}.values()
    )
    through_batch = sum(
        1 for job in jobs if any(attempt.get("batch_id") for attempt in contents.attempts.get(job.job_id, []))
    )
    report.figure(
        "jobs with an attempt via a batch (jobs sent to batch)",
        f"{through_batch} ({sum(1 for job in jobs if job.route is Route.BATCH)})",
    )
    report.figure(
        "handed-back jobs batched again by a duplicate copy",
        sum(1 for prompt, count in batches_per_prompt.items() if prompt in prompts and count > 1),
    )
    at_batch_price = sum((call_cost(entry) for entry in lines), Decimal(0))
    in_real_time = sum((call_cost(entry, batch_price=False) for entry in lines), Decimal(0))
    report.figure("batch lines' cost USD (the same calls in real time)", f"{at_batch_price} ({in_real_time})")


def explain(job: PlannedJob, contents: TableContents, provider_log: Sequence[ServedRequest]) -> list[str]:
    """What happened to one job: its end, its attempt records, and its calls in the provider's log."""
    found = contents.jobs.get(job.job_id)
    if found is None:
        end = "missing"
    else:
        error = f" {found.error.code.value}: {found.error.message}" if found.error else ""
        end = f"{found.status.value}{error} (attempt_count {found.attempt_count})"
    lines = [f"{job.job_id} [{job.plan.label}, {job.route.value}, {job.copies} copies] -> {end}"]
    for attempt in sorted(contents.attempts.get(job.job_id, []), key=lambda item: int(item["attempt"])):
        lines.append(
            f"    attempt {attempt['attempt']}: {attempt['outcome']} {attempt.get('error_code') or ''}"
            f" calls {attempt.get('calls')} tokens {attempt['input_tokens']}/{attempt['output_tokens']}"
            f" via {attempt.get('via', 'realtime')} cost {attempt['cost_usd']}"
        )
    calls = [
        f"{'batch:' * bool(entry.batch_id)}{entry.fault or 'answer'}/{entry.status}{'/re-ask' * entry.repair}"
        for entry in provider_log
        if job.prompt_key is not None and entry.prompt_hash == job.prompt_key
    ]
    lines.append(f"    provider: {', '.join(calls) or 'no calls'}")
    return lines


def explained(console: Console, what: str, job_ids: Sequence[str], explain: Callable[[str], list[str]]) -> None:
    """The first few of `job_ids`, each as `explain` tells what happened to it."""
    if job_ids:
        console.print(f"{what}: {len(job_ids)}; the first few:")
        for job_id in job_ids[:5]:
            for line in explain(job_id):
                console.print(f"  {line}", markup=False, highlight=False)


def ended_in_time(job: Job) -> bool:
    """Whether a job ended by its deadline (a job failed for its message before it had one has none)."""
    return job.finished_at is not None and (job.deadline_at is None or job.finished_at <= job.deadline_at)


# --- the run ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="number of jobs (default 1000)")
    parser.add_argument(
        "--pipelines",
        type=int,
        default=None,
        help=f"pipelines sent among the jobs (default: one per {JOBS_PER_PIPELINE} jobs, at least {MIN_PIPELINES})",
    )
    parser.add_argument("--fault-share", type=float, default=0.2, help="share of jobs given a fault (default 0.2)")
    parser.add_argument(
        "--batch-share", type=float, default=0.2, help="share of jobs sent as background jobs to batch (default 0.2)"
    )
    parser.add_argument(
        "--background-share",
        type=float,
        default=0.2,
        help="share of jobs sent as background jobs too near their deadline for a batch (default 0.2)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=3, help="pollers of the jobs queue, the interactive lane's (default 3)"
    )
    parser.add_argument(
        "--background-concurrency", type=int, default=2, help="pollers of the background queue (default 2)"
    )
    parser.add_argument(
        "--budget", type=float, default=420.0, help="seconds until every job must be terminal (default 420)"
    )
    parser.add_argument("--visibility-clamp", type=int, default=2, help="cap on the visibility the engine sets (s)")
    parser.add_argument("--queue-depth", type=int, default=200, help="messages kept on the queues while feeding")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    shares = (args.fault_share, args.batch_share, args.background_share)
    if args.jobs < 1 or min(args.concurrency, args.background_concurrency) < 1 or args.visibility_clamp < 0:
        parser.error("--jobs and the concurrencies must be positive, the clamp >= 0")
    if args.pipelines is None:
        args.pipelines = max(MIN_PIPELINES, args.jobs // JOBS_PER_PIPELINE)
    if args.pipelines < 0:
        parser.error("--pipelines must be 0 or more")
    if not all(0 <= share <= 1 for share in shares) or args.batch_share + args.background_share > 1:
        parser.error("the shares must be within 0..1, --batch-share and --background-share 1 at most together")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console, progress = Console(width=max(Console().width, 120)), Console(stderr=True, soft_wrap=True)
    rng = random.Random(args.seed)
    tally = LogTally()
    log_path = os.path.join(tempfile.gettempdir(), f"aijobs-soak-{os.getpid()}.log")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the moto server's access log
    aws = LocalAws().start()  # moto fitted by aijobs.local.moto_patches
    endpoint = aws.endpoint_url
    # Credentials that go nowhere but the local endpoint: the soak never touches a real account.
    session = local_session()
    stack = create_stack_resources("soak", session=session, endpoint_url=endpoint)
    template = load_template()
    provider = LocalProvider(
        api_key=API_KEY,
        latency_seconds=PROVIDER_LATENCY_SECONDS,
        retry_after_seconds=1,
        hang_seconds=HANG_SECONDS,
        reasoning_tokens=REASONING_TOKENS,
        batch_delay_seconds=BATCH_DELAY_SECONDS,
    ).start()
    report = Report()
    suspects: list[str] = []
    broken: list[str] = []
    try:
        environment = (
            {"AWS_ENDPOINT_URL": endpoint}
            | stack.environment()
            | {
                "AI_BASE_URL": provider.url,
                "AI_API_KEY": API_KEY,
                "AI_MODEL_PRIMARY": MODEL,
                # json_object mode: the schema rides in the system message (after SCHEMA_PREAMBLE), from
                # which the local provider answers any job type, soak_quick_classify included.
                "AI_STRUCTURED_OUTPUT": "json_object",
                "AIJOBS_PRICES": json.dumps(
                    {MODEL: {**{kind: str(price) for kind, price in PRICES.items()}, "batch": str(BATCH_PRICE_SHARE)}}
                ),
                "AIJOBS_BATCH_API": "on",
                "AIJOBS_BATCH_WINDOW_SECONDS": str(BATCH_WINDOW_SECONDS),
                "AIJOBS_BATCH_POLL_SECONDS": str(BATCH_POLL_SECONDS),
                "AIJOBS_BATCH_RESCUE_SECONDS": str(BATCH_RESCUE_SECONDS),
            }
        )
        settings = load_settings(environment)
        registry = JobRegistry([*BUILTIN_DEFINITIONS, QUICK_CLASSIFY])
        shares = Shares(args.fault_share, args.batch_share, args.background_share)
        jobs = plan_jobs(args.jobs, shares, rng, registry)
        # Their own random numbers: the jobs' plans stay those of the same seed without pipelines.
        pipelines = plan_pipelines(args.pipelines, random.Random(args.seed + 1))
        kills = PipelineKills(pipelines)
        sqs = session.client("sqs", endpoint_url=endpoint)
        dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        queue_urls = {
            Route.INTERACTIVE: stack.queue_url,
            Route.BACKGROUND: stack.background_queue_url,
            Route.BATCH: stack.background_queue_url,
        }
        lane_urls = {Lane.INTERACTIVE: stack.queue_url, Lane.BACKGROUND: stack.background_queue_url}
        deliveries = delivery_order(
            [Outgoing(queue_urls[job.route], job.message, job.copies) for job in jobs]
            + [Outgoing(lane_urls[pipeline.lane], pipeline.message, pipeline.copies) for pipeline in pipelines],
            rng,
        )
        feeder = Feeder(sqs, deliveries, args.queue_depth)
        children_ids = [job_id for pipeline in pipelines for job_id in pipeline.children]
        all_ids = [*(job.job_id for job in jobs), *(pipeline.job_id for pipeline in pipelines), *children_ids]
        # The soak's own reads and reviews, on a session of its own.
        store = build_store(settings, Aws(settings, session))
        reviewer = Reviewer(AiJobsClient.from_settings(settings, session), store, pipelines)

        with engine_output_to(log_path, tally):
            # The worker and the events function on sessions of their own, where their kills are armed.
            worker_session, events_session = local_session(), local_session()
            kills.worker.install(worker_session)
            kills.events.install(events_session)
            worker = WorkerFunction(settings, worker_session, args.visibility_clamp)

            def revealed(queue_url: str) -> Callable[[dict[str, Any]], None]:
                """What Lambda does with a dead invocation's batch: it comes back, here after the clamp
                rather than the queue's visibility timeout."""
                return lambda event: reveal(sqs, queue_url, event, args.visibility_clamp)

            # One worker function with an event source mapping per lane, as the template has them.
            mappings = [
                EventSourceMapping(
                    queue_url,
                    kills.worker_function(worker.handle, revealed(queue_url)),
                    sqs_client=sqs,
                    concurrency=concurrency,
                    wait_seconds=1,
                    batching_window_seconds=batching_window(template, "WorkerFunction", queue),
                    function_timeout_seconds=function_timeout(template, "WorkerFunction"),
                )
                for queue_url, queue, concurrency in (
                    (stack.queue_url, "JobsQueue", args.concurrency),
                    (stack.background_queue_url, "BackgroundJobsQueue", args.background_concurrency),
                )
            ]
            # The batcher on its schedule, as the embedded stack runs it (every minute in AWS).
            batcher = Schedule(
                scheduled(build_batcher(settings, session).run, "Batches"),
                LOCAL_BATCHER_SECONDS,
                function_timeout(template, "BatchFunction"),
                "soak-batches",
            )
            # The events function on the table's stream, as deployed: one completion event per job (every
            # record delivered two or three times).
            events = TableStream(
                stack.table_name,
                kills.events_function(events_handler(*build_events(settings, events_session))),
                session,
                endpoint,
                copies=StreamCopies(seed=args.seed),
            )
            reader = StatusReader(stack.table_name, dynamodb, all_ids)
            started = time.monotonic()

            def show_progress() -> None:
                if not feeder.done:
                    reader.refresh()  # once the feeder is done, the wait below refreshes every second
                stats = [mapping.stats for mapping in mappings]
                progress.print(
                    f"  {time.monotonic() - started:5.0f}s  sent {feeder.sent}/{len(deliveries)}"
                    f"  terminal {len(all_ids) - len(reader.pending)}/{len(all_ids)}"
                    f"  invocations {sum(stat.batches for stat in stats)}"
                    f"  records {sum(stat.records for stat in stats)}  deleted {sum(stat.deleted for stat in stats)}"
                    f"  batcher passes {batcher.invocations}  provider calls {len(provider.log)}",
                    highlight=False,
                )

            def queues_empty() -> bool:
                return all(
                    queue_depth(sqs, queue_url) == 0 for queue_url in (stack.queue_url, stack.background_queue_url)
                )

            feeder.start()
            for mapping in mappings:
                mapping.start()
            batcher.start()
            events.start()
            reviewer.start()
            try:
                # Reading 1000 jobs' status holds moto's lock for a while: only once all are sent.
                all_terminal = wait_for(lambda: feeder.done and reader.refresh() == 0, args.budget, show_progress)
                terminal_at = time.monotonic() - started
                drained = wait_for(lambda: feeder.done and queues_empty(), DRAIN_SECONDS, show_progress)
                events_read = EventsTap(sqs, stack.events_queue_url).collect(
                    set(all_ids), EVENTS_WAIT_SECONDS, late_seconds=2
                )
            finally:
                reviewer.stop()
                feeder.stop()
                batcher.stop()
                for mapping in mappings:
                    mapping.stop(timeout=30)
                events.stop()
        elapsed = time.monotonic() - started

        contents = read_table(dynamodb, stack.table_name)
        provider_log = provider.log
        children = [job for job_id in children_ids if (job := contents.jobs.get(job_id)) is not None]
        history = stream_history(read_stream(session, endpoint, stack.table_name))
        routes = Counter(job.route for job in jobs)
        report.figure(
            "jobs: interactive / background in real time / background to batch",
            f"{len(jobs)} ({sum(1 for job in jobs if job.plan.faulty)} with a fault): {routes[Route.INTERACTIVE]}"
            f" / {routes[Route.BACKGROUND]} / {routes[Route.BATCH]}",
        )
        planned_lanes = Counter(job.route.lane for job in jobs)
        for pipeline in pipelines:
            planned_lanes[pipeline.lane] += 1 + len(pipeline.children)
        recorded_lanes = Counter(job.lane for job in contents.jobs.values())
        report.check(
            "jobs per lane: interactive / background",
            " / ".join(str(planned_lanes[lane]) for lane in Lane),
            " / ".join(str(recorded_lanes[lane]) for lane in Lane),
        )
        report.check("messages sent (2-3 copies a job, some delayed)", len(deliveries), feeder.sent)
        suspects = evaluate(report, jobs, contents, provider_log, children)
        keys = prompt_keys(store, registry, children)
        broken = evaluate_pipelines(report, pipelines, contents, provider_log, history, keys)
        report.check(
            "invocations killed as planned: worker / events function",
            f"{kills.planned['worker']} / {kills.planned['events']}",
            f"{kills.made['worker']} / {kills.made['events']}",
        )
        report.figure(
            "events function: records delivered / copies delivered again",
            f"{events.delivered} / {events.copies_delivered}",
        )
        report.figure(
            "reviews decided by the soak: " + " / ".join(decision.value for decision in Decision),
            " / ".join(str(reviewer.decided[decision]) for decision in Decision),
        )
        report.check("reviews the soak could not give", 0, len(reviewer.errors))
        s3 = session.client("s3", endpoint_url=endpoint)
        files_left = sum(
            s3.list_objects_v2(Bucket=stack.payload_bucket, Prefix=prefix)["KeyCount"]
            for prefix in (PARTS_PREFIX, MANIFESTS_PREFIX)
        )
        evaluate_batches(report, jobs, contents, provider_log, files_left)
        report.check("dead letters recorded in the table", 0, contents.dead_letters)
        report.check("messages on the dead-letter queue", 0, queue_depth(sqs, stack.dlq_url))
        report.check(
            f"messages left on the queues ({DRAIN_SECONDS:.0f}s drain)",
            0,
            queue_depth(sqs, stack.queue_url) + queue_depth(sqs, stack.background_queue_url),
        )
        report.check(
            "worker invocations failed as a whole (the killed ones)",
            kills.deaths["worker"],
            sum(mapping.stats.batch_errors for mapping in mappings),
        )
        for lane, mapping in zip(Lane, mappings, strict=True):
            stats = mapping.stats
            report.figure(
                f"{lane.value} invocations / records / deleted / returned",
                f"{stats.batches} / {stats.records} / {stats.deleted} / {stats.failed}",
            )
        report.figure("batcher passes", batcher.invocations)
        asked = sum((queue.asked for queue in worker.queues), Counter[int]())
        clamped = sum(count for seconds, count in asked.items() if seconds > args.visibility_clamp)
        report.figure(
            f"visibility changes / capped at {args.visibility_clamp}s (longest asked)",
            f"{sum(asked.values())} / {clamped} ({max(asked, default=0)}s)",
        )
        statuses = Counter("none" if entry.status is None else str(entry.status) for entry in provider_log)
        report.figure(
            "provider requests by status",
            ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items())),
        )
        report.figure("engine warnings / errors logged", f"{tally.levels['WARNING']} / {tally.levels['ERROR']}")
        report.figure("all terminal after", f"{terminal_at:.1f}s" if all_terminal else "never (budget spent)")
        report.check("queues drained", True, drained)
        # Delivery is at least once (the stream's copies repeat events): a consumer tells them apart by event_id.
        unique = list({event["detail"]["event_id"]: event for event in events_read}.values())
        # A review decided makes a `Job Reviewed` before its job's completion event: counted apart.
        distinct = [event for event in unique if event.get("detail-type") != REVIEWED]
        reviews = Counter(event["detail"]["job_id"] for event in unique if event.get("detail-type") == REVIEWED)
        per_job = Counter(event["detail"]["job_id"] for event in distinct)
        report.figure("completion events received / distinct", f"{len(events_read)} / {len(distinct)}")
        reviewed = [pipeline.job_id for pipeline in pipelines if pipeline.plan.job_type == EXTRACT_REVIEWED]
        report.check(
            "reviewed pipelines with exactly one Job Reviewed event",
            len(reviewed),
            sum(reviews[job_id] == 1 for job_id in reviewed),
        )
        report.check(
            "Job Reviewed events of jobs not reviewed",
            0,
            sum(reviews.values()) - sum(reviews[job_id] for job_id in reviewed),
        )
        report.check(
            "jobs with exactly one completion event (pipelines and children too)",
            len(all_ids),
            sum(per_job[job_id] == 1 for job_id in all_ids),
        )
        lanes = {job.job_id: job.route.lane.value for job in jobs} | {
            job_id: pipeline.lane.value for pipeline in pipelines for job_id in (pipeline.job_id, *pipeline.children)
        }
        report.check(
            "completion events not of their job's lane",
            0,
            sum(1 for event in distinct if event["detail"].get("lane") != lanes.get(event["detail"]["job_id"])),
        )
        report.check(
            "completion events of jobs not planned",
            0,
            sum(count for job_id, count in per_job.items() if job_id not in lanes),
        )
        report.figure("elapsed", f"{elapsed:.1f}s")
    finally:
        provider.stop()
        aws.stop()

    caption = (
        "Harness: moto fitted by aijobs.local.moto_patches (DynamoDB operations one at a time,"
        " transaction rollback of the touched items only, server routing cached)"
        + f"; engine-set visibilities capped at {args.visibility_clamp}s (a batched job's duplicates included:"
        f" they would wait for its batch's lease); messages fed keeping at most {args.queue_depth} on the queues;"
        f" the batcher run every {LOCAL_BATCHER_SECONDS:g}s (every minute in AWS), batch windows of"
        f" {BATCH_WINDOW_SECONDS}s polled every {BATCH_POLL_SECONDS}s with a rescue time of {BATCH_RESCUE_SECONDS}s,"
        f" and batches answered {BATCH_DELAY_SECONDS:g}s after their creation; the events function's stream"
        f" delivering every record 2-3 times; killed worker invocations' messages back after {args.visibility_clamp}s,"
        f" one to die before its pipeline waits given {KILLED_INVOCATION_SECONDS:g}s. Engine log: {log_path}"
    )
    title = (
        f"aijobs soak: {args.jobs} jobs, {args.fault_share:.0%} faults, {args.batch_share:.0%} batched,"
        f" {args.background_share:.0%} background in real time; {args.pipelines} pipelines"
    )
    console.print(report.table(title, caption))
    planned = {job.job_id: job for job in jobs}
    by_id = {pipeline.job_id: pipeline for pipeline in pipelines}
    explained(
        console,
        "jobs that broke a per-job check",
        suspects,
        lambda job_id: explain(planned[job_id], contents, provider_log),
    )
    explained(
        console,
        "pipelines that broke a check",
        broken,
        lambda job_id: explain_pipeline(by_id[job_id], contents, history),
    )
    top = tally.messages.most_common(5)
    if top:
        console.print("most frequent engine log lines:")
        for line, count in top:
            console.print(f"  {count:6d} x {line[:150]}")
    console.print("[green]soak passed[/green]" if report.passed else "[bold red]soak FAILED[/bold red]")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
