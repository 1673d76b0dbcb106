"""The soak: N jobs with injected faults and duplicated deliveries, through the whole stack in one process.

A moto server holds the template's queues and table, the local OpenAI-compatible provider answers,
and the worker runs behind the local event source mapping with several pollers. One job in five
carries a fault: a `fault:<kind>[*K]` marker the provider obeys, or a message the engine must
reject, so each job's final status, error code, attempt count and provider calls are known in
advance. Every message is sent two or three times, the extra copies delayed a little. The run ends
when every job is terminal (or the time budget passes); the queue is then drained, the completion
events the events function made from the table's stream are counted (exactly one per job), and
one table compares what happened with the plan. The exit status is 1 when any check fails.

Concessions to the harness, none to the engine (the table's caption repeats them):
- moto is fitted as everywhere else (aijobs.local.moto_patches): DynamoDB operations one at a time
  (moto alone is not linearizable), transaction rollbacks of the touched items only and server
  routing cached (same results, far less time); messages are fed keeping at most --queue-depth on
  the queue, because moto's SQS requests cost time in proportion to the queue's depth;
- the visibility the engine sets (backoff, Retry-After, a held duplicate's remaining lease) is capped
  at --visibility-clamp seconds, so that retries happen within the run; the table counts the capped
  ones and the longest delay asked for;
- the engine asks for `json_object` output (AI_STRUCTURED_OUTPUT): the schema then travels in the
  system message, and the local provider answers from it alone, the soak's own quick classify type
  (1 s timeout, for the hangs) like any other.

Usage: python -m bench.soak [--jobs 1000] [--concurrency 3] [--budget 300] [--seed 7] (or make soak)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from rich.console import Console
from rich.table import Table

from aijobs.events import EventsTap
from aijobs.local.aws import LocalAws
from aijobs.local.devstack import local_session
from aijobs.local.faults import prompt_hash
from aijobs.local.poller import EventSourceMapping
from aijobs.local.provider import LocalProvider, ServedRequest
from aijobs.local.streams import TableStream
from aijobs.stack import StackResources, create_stack_resources
from engine.config import Settings, load_settings
from engine.core import ErrorCode, Job, JobStatus, Usage
from engine.definitions import BUILTIN_DEFINITIONS, JobRegistry
from engine.definitions.classify import CLASSIFY
from engine.queue import JobQueue
from engine.store.items import from_item, job_from_item, job_key
from engine.wiring import Aws, build_events, build_worker
from engine.worker import Worker

if TYPE_CHECKING:
    pass

API_KEY = "sk-soak"
MODEL = "local-model"
REGION = "us-east-1"
# USD per million input, cached input and output tokens of the local model, so that costs reconcile
# too; the local provider's prompt cache and reasoning tokens make every kind count.
PRICES = {"input": Decimal("0.15"), "cached_input": Decimal("0.075"), "output": Decimal("0.60")}
REASONING_TOKENS = 8
# classify with a 1 s provider timeout: a hanging provider (3 s) costs an attempt about a second.
QUICK_CLASSIFY = replace(CLASSIFY, name="soak_quick_classify", timeout_seconds=1.0)
HANG_SECONDS = 3.0
PROVIDER_LATENCY_SECONDS = 0.01
# The shortest deadline a message may set (docs/messages.md): how long a job rate-limited for ever lasts.
SHORT_DEADLINE_SECONDS = 60
DRAIN_SECONDS = 30.0
# Every ended job's completion event has arrived within this long after the queue drained.
EVENTS_WAIT_SECONDS = 30.0
PROGRESS_SECONDS = 5.0


# --- the plan --------------------------------------------------------------------------------------


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
CLEAN_PLANS: tuple[Plan, ...] = tuple(
    Plan("no fault", job_type) for job_type in ("classify", "summarize", "answer_with_citations")
)


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job_id: str
    plan: Plan
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


def plan_jobs(count: int, fault_share: float, rng: random.Random, registry: JobRegistry) -> list[PlannedJob]:
    """`count` jobs; a `fault_share` of them, spread at random, take the fault plans in turn."""
    faulty = set(rng.sample(range(count), round(count * fault_share)))
    fault_cycle = iter(FAULT_PLANS * (len(faulty) // len(FAULT_PLANS) + 1))
    jobs = []
    for number in range(count):
        job_id = f"soak-{number:05d}"
        plan = next(fault_cycle) if number in faulty else CLEAN_PLANS[number % len(CLEAN_PLANS)]
        raw_input = job_input(plan.job_type, job_id, plan.marker, plan.bad_input)
        message = {
            "job_id": job_id,
            "job_type": plan.job_type,
            "user_id": f"soak-user-{number % 7}",
            "input": raw_input,
            **plan.fields,
        }
        prompt_key = None
        if plan.calls != 0:
            definition = registry.get(plan.job_type)
            prompt_key = prompt_hash(definition.render_prompt(definition.parse_input(raw_input)).user)
        jobs.append(PlannedJob(job_id, plan, message, rng.choice((2, 3)), prompt_key))
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


def build_soak_worker(settings: Settings, session: boto3.Session, clamp_seconds: int) -> tuple[Worker, ClampedQueue]:
    """engine.wiring.build_worker, with the quick job type and the clamp."""
    registry = JobRegistry([*BUILTIN_DEFINITIONS, QUICK_CLASSIFY])
    registry.load_modules(settings.aijobs_job_modules)
    queue = ClampedQueue(settings.jobs_queue_url, Aws(settings, session).client("sqs"), clamp_seconds)
    return build_worker(settings, session, registry=registry, queue=queue), queue


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
class Delivery:
    body: str
    delay_seconds: int


def delivery_order(jobs: Sequence[PlannedJob], rng: random.Random) -> list[Delivery]:
    """Every job's message 2-3 times: a second copy close behind the first (it meets the job held or
    just finished), a third anywhere later (it meets the job long finished); extra copies delayed 0-3 s."""
    keyed: list[tuple[float, Delivery]] = []
    for position, job in enumerate(rng.sample(list(jobs), len(jobs))):
        body = json.dumps(job.message)
        keyed.append((position, Delivery(body, 0)))
        later = (rng.uniform(0, 20), rng.uniform(0, len(jobs)))
        keyed.extend((position + later[copy - 1], Delivery(body, rng.randint(0, 3))) for copy in range(1, job.copies))
    keyed.sort(key=lambda pair: pair[0])
    return [delivery for _, delivery in keyed]


class Feeder(threading.Thread):
    """Sends the deliveries in order, keeping at most `depth` messages on the queue.

    Jobs arrive over time, as they would; and moto's SQS requests cost time in proportion to the
    messages on the queue, so a queue thousands deep would measure moto rather than the engine.
    """

    def __init__(self, sqs: Any, queue_url: str, deliveries: Sequence[Delivery], depth: int) -> None:
        super().__init__(name="soak-feeder", daemon=True)
        self._sqs = sqs
        self._queue_url = queue_url
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
                room = self._depth - queue_depth(self._sqs, self._queue_url)
                while room >= 10 and not self.done:
                    room -= self._send(self._deliveries[self.sent : self.sent + 10])
                # Each look at the queue's depth costs moto a pass over its messages: look twice a second.
                self._stopping.wait(0.5)
        except Exception as exc:  # reported in the table: the run cannot pass without every message
            self.error = exc

    def _send(self, chunk: Sequence[Delivery]) -> int:
        entries = [
            {"Id": str(index), "MessageBody": delivery.body, "DelaySeconds": delivery.delay_seconds}
            for index, delivery in enumerate(chunk)
        ]
        response = self._sqs.send_message_batch(QueueUrl=self._queue_url, Entries=entries)
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


@dataclass
class TableContents:
    jobs: dict[str, Job] = field(default_factory=dict)
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    dead_letters: int = 0


def read_table(client: Any, table_name: str) -> TableContents:
    contents = TableContents()
    kwargs: dict[str, Any] = {"TableName": table_name, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        for raw in page.get("Items", []):
            sk, pk = raw["sk"]["S"], raw["pk"]["S"]
            if sk == "JOB":
                job = job_from_item(raw)
                contents.jobs[job.job_id] = job
            elif sk.startswith("ATTEMPT#"):
                item = from_item(raw)
                contents.attempts[str(item["job_id"])].append(item)
            elif pk.startswith("DEADLETTER#"):
                contents.dead_letters += 1
        if "LastEvaluatedKey" not in page:
            return contents
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass
class CallTally:
    """A prompt's calls in the provider's log."""

    calls: int = 0
    valid_answers: int = 0
    tokens: Tokens = (0, 0, 0, 0)

    def add(self, entry: ServedRequest) -> None:
        self.calls += 1
        self.valid_answers += entry.status == 200 and entry.fault is None
        self.tokens = add_tokens(self.tokens, logged_tokens(entry))


# Token counts as (input, output, cached input, reasoning): how the engine records them, and how
# the provider's log bills them.
Tokens = tuple[int, int, int, int]
TOKEN_KINDS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


def logged_tokens(entry: ServedRequest) -> Tokens:
    return (entry.prompt_tokens, entry.completion_tokens, entry.cached_tokens, entry.reasoning_tokens)


def usage_tokens(usage: Usage) -> Tokens:
    return (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)


def item_tokens(attempt: Mapping[str, Any]) -> Tokens:
    """The token kinds of an attempt item (kinds it did not have are absent from it)."""
    input_tokens, output_tokens, cached, reasoning = (int(attempt.get(name, 0)) for name in TOKEN_KINDS)
    return (input_tokens, output_tokens, cached, reasoning)


def add_tokens(a: Tokens, b: Tokens) -> Tokens:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def total_tokens(counts: Iterable[Tokens]) -> Tokens:
    total = (0, 0, 0, 0)
    for item in counts:
        total = add_tokens(total, item)
    return total


class Report:
    """The rows of the table: a check (expected vs actual) or a figure (no expectation)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, bool | None]] = []

    def check(self, name: str, expected: object, actual: object, ok: bool | None = None) -> None:
        self.rows.append((name, str(expected), str(actual), (expected == actual) if ok is None else ok))

    def figure(self, name: str, value: object) -> None:
        self.rows.append((name, "", str(value), None))

    @property
    def passed(self) -> bool:
        return all(ok is not False for *_, ok in self.rows)

    def table(self, title: str, caption: str) -> Table:
        table = Table(title=title, caption=caption, caption_justify="left")
        table.add_column("check")
        table.add_column("expected", justify="right")
        table.add_column("actual", justify="right")
        table.add_column("", justify="center")
        for name, expected, actual, ok in self.rows:
            mark = "" if ok is None else "[green]ok[/green]" if ok else "[bold red]FAIL[/bold red]"
            table.add_row(name, expected, actual, mark)
        return table


def evaluate(
    report: Report,
    jobs: Sequence[PlannedJob],
    contents: TableContents,
    provider_log: Sequence[ServedRequest],
) -> list[str]:
    """Add the outcome's rows to `report`; the ids of the jobs that broke a per-job check."""
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
    for planned, job in zip(jobs, found, strict=True):
        plan = planned.plan
        tally = by_prompt.get(planned.prompt_key or "", CallTally())
        attempts = contents.attempts.get(planned.job_id, [])
        if job is None or job.status is not plan.status or (job.error.code if job.error else None) != plan.code:
            off_plan.append(planned.job_id)
        if job is not None and plan.attempts is not None and job.attempt_count != plan.attempts:
            off_attempts.append(f"{planned.job_id} ({plan.label}: {job.attempt_count})")
        if plan.calls is not None and planned.prompt_key is not None and tally.calls != plan.calls:
            off_calls.append(f"{planned.job_id} ({plan.label}: {tally.calls})")
        duplicate_answers += max(0, tally.valid_answers - 1)
        if sum(1 for attempt in attempts if attempt.get("outcome") == "succeeded") > 1:
            double_success.append(planned.job_id)
        recorded = usage_tokens(job.usage) if job else (0, 0, 0, 0)
        itemized = total_tokens(item_tokens(attempt) for attempt in attempts)
        if planned.prompt_key is not None and not recorded == itemized == tally.tokens:
            off_usage.append(planned.job_id)
    report.check("jobs off plan (status, code)", 0, len(off_plan), not off_plan)
    report.check("attempt counts off plan", 0, len(off_attempts), not off_attempts)
    report.check("provider calls off plan (per job)", 0, len(off_calls), not off_calls)
    report.check("duplicate successful provider calls", 0, duplicate_answers)
    report.check("jobs with >1 succeeded attempt record", 0, len(double_success))

    billed = total_tokens(logged_tokens(entry) for entry in provider_log)
    on_jobs = total_tokens(usage_tokens(job.usage) for job in found if job)
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
    report.check(
        "cost USD: jobs' usage = provider log x price", priced, sum(job.usage.cost_usd for job in found if job)
    )
    report.check(
        "cost USD: attempt items = provider log x price",
        priced,
        sum((Decimal(attempt["cost_usd"]) for attempt in all_attempts), Decimal(0)),
    )
    report.check(
        "attempts: jobs' usage = attempt items",
        len(all_attempts),
        sum(job.usage.attempts for job in found if job),
    )
    report.check("jobs whose usage differs from their calls", 0, len(off_usage))
    suspects = [*off_plan, *off_attempts, *off_calls, *double_success, *off_usage]
    return list(dict.fromkeys(job_id.split(" ", 1)[0] for job_id in suspects))


def explain(job: PlannedJob, contents: TableContents, provider_log: Sequence[ServedRequest]) -> list[str]:
    """What happened to one job: its end, its attempt records, and its calls in the provider's log."""
    found = contents.jobs.get(job.job_id)
    if found is None:
        end = "missing"
    else:
        error = f" {found.error.code.value}: {found.error.message}" if found.error else ""
        end = f"{found.status.value}{error} (attempt_count {found.attempt_count})"
    lines = [f"{job.job_id} [{job.plan.label}, {job.copies} copies] -> {end}"]
    for attempt in sorted(contents.attempts.get(job.job_id, []), key=lambda item: int(item["attempt"])):
        lines.append(
            f"    attempt {attempt['attempt']}: {attempt['outcome']} {attempt.get('error_code') or ''}"
            f" calls {attempt.get('calls')} tokens {attempt['input_tokens']}/{attempt['output_tokens']}"
        )
    calls = [
        f"{entry.fault or 'answer'}/{entry.status}{'/re-ask' if entry.repair else ''}"
        for entry in provider_log
        if job.prompt_key is not None and entry.prompt_hash == job.prompt_key
    ]
    lines.append(f"    provider: {', '.join(calls) or 'no calls'}")
    return lines


def call_cost(entry: ServedRequest) -> Decimal:
    """What one logged call costs at the soak's prices, rounded as the engine's price table rounds."""
    uncached = entry.prompt_tokens - entry.cached_tokens
    cost = (
        uncached * PRICES["input"]
        + entry.cached_tokens * PRICES["cached_input"]
        + entry.completion_tokens * PRICES["output"]
    ) / 1_000_000
    return cost.quantize(Decimal("0.000000001"))


def format_tokens(counts: tuple[int, ...]) -> str:
    return " / ".join(f"{count:,}" for count in counts)


# --- the run ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="number of jobs (default 1000)")
    parser.add_argument("--fault-share", type=float, default=0.2, help="share of jobs given a fault (default 0.2)")
    parser.add_argument("--concurrency", type=int, default=3, help="pollers of the event source mapping (default 3)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds until every job must be terminal")
    parser.add_argument("--visibility-clamp", type=int, default=2, help="cap on the visibility the engine sets (s)")
    parser.add_argument("--queue-depth", type=int, default=200, help="messages kept on the queue while feeding")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.jobs < 1 or not 0 <= args.fault_share <= 1 or args.concurrency < 1 or args.visibility_clamp < 0:
        parser.error("--jobs and --concurrency must be positive, --fault-share within 0..1, the clamp >= 0")
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
    stack: StackResources = create_stack_resources("soak", session=session, endpoint_url=endpoint)
    provider = LocalProvider(
        api_key=API_KEY,
        latency_seconds=PROVIDER_LATENCY_SECONDS,
        retry_after_seconds=1,
        hang_seconds=HANG_SECONDS,
        reasoning_tokens=REASONING_TOKENS,
    ).start()
    report = Report()
    suspects: list[str] = []
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
                "AIJOBS_PRICES": json.dumps({MODEL: {kind: str(price) for kind, price in PRICES.items()}}),
            }
        )
        settings = load_settings(environment)
        registry = JobRegistry([*BUILTIN_DEFINITIONS, QUICK_CLASSIFY])
        jobs = plan_jobs(args.jobs, args.fault_share, rng, registry)
        sqs = session.client("sqs", endpoint_url=endpoint)
        dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        deliveries = delivery_order(jobs, rng)
        feeder = Feeder(sqs, stack.queue_url, deliveries, args.queue_depth)

        with engine_output_to(log_path, tally):
            worker, queue = build_soak_worker(settings, session, args.visibility_clamp)
            mapping = EventSourceMapping(
                stack.queue_url,
                worker.handle,
                sqs_client=sqs,
                concurrency=args.concurrency,
                wait_seconds=1,
                batching_window_seconds=1.0,
                function_timeout_seconds=300,
            )
            # The events function on the table's stream, as deployed: one completion event per job.
            events = TableStream(stack.table_name, build_events(settings, session).handle, session, endpoint)
            reader = StatusReader(stack.table_name, dynamodb, [job.job_id for job in jobs])
            started = time.monotonic()

            def show_progress() -> None:
                if not feeder.done:
                    reader.refresh()  # once the feeder is done, the wait below refreshes every second
                stats = mapping.stats
                progress.print(
                    f"  {time.monotonic() - started:5.0f}s  sent {feeder.sent}/{len(deliveries)}"
                    f"  terminal {len(jobs) - len(reader.pending)}/{len(jobs)}  invocations {stats.batches}"
                    f"  records {stats.records}  deleted {stats.deleted}  provider calls {len(provider.log)}",
                    highlight=False,
                )

            feeder.start()
            mapping.start()
            events.start()
            try:
                # Reading 1000 jobs' status holds moto's lock for a while: only once all are sent.
                all_terminal = wait_for(lambda: feeder.done and reader.refresh() == 0, args.budget, show_progress)
                terminal_at = time.monotonic() - started
                drained = wait_for(
                    lambda: feeder.done and queue_depth(sqs, stack.queue_url) == 0, DRAIN_SECONDS, show_progress
                )
                events_read = EventsTap(sqs, stack.events_queue_url).collect(
                    {job.job_id for job in jobs}, EVENTS_WAIT_SECONDS, late_seconds=2
                )
                per_job = Counter(event["detail"]["job_id"] for event in events_read)
            finally:
                feeder.stop()
                mapping.stop(timeout=30)
                events.stop()
        elapsed = time.monotonic() - started

        contents = read_table(dynamodb, stack.table_name)
        provider_log = provider.log
        report.figure("jobs", f"{len(jobs)} ({sum(1 for job in jobs if job.plan.label != 'no fault')} with a fault)")
        report.check("messages sent (2-3 copies a job, some delayed)", len(deliveries), feeder.sent)
        suspects = evaluate(report, jobs, contents, provider_log)
        report.check("dead letters recorded in the table", 0, contents.dead_letters)
        report.check("messages on the dead-letter queue", 0, queue_depth(sqs, stack.dlq_url))
        report.check(f"messages left on the queue ({DRAIN_SECONDS:.0f}s drain)", 0, queue_depth(sqs, stack.queue_url))
        stats = mapping.stats
        report.check("invocations failed as a whole", 0, stats.batch_errors)
        report.figure(
            "invocations / records / deleted / returned",
            f"{stats.batches} / {stats.records} / {stats.deleted} / {stats.failed}",
        )
        asked = queue.asked
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
        report.check("queue drained", True, drained)
        report.check("jobs with exactly one completion event", len(jobs), sum(per_job[job.job_id] == 1 for job in jobs))
        report.check(
            "completion events of jobs not planned",
            0,
            sum(count for job_id, count in per_job.items() if job_id not in {job.job_id for job in jobs}),
        )
        report.figure("elapsed", f"{elapsed:.1f}s")
    finally:
        provider.stop()
        aws.stop()

    caption = (
        "Harness: moto fitted by aijobs.local.moto_patches (DynamoDB operations one at a time,"
        " transaction rollback of the touched items only, server routing cached)"
        + f"; engine-set visibilities capped at {args.visibility_clamp}s; messages fed keeping at most"
        f" {args.queue_depth} on the queue. Engine log: {log_path}"
    )
    console.print(report.table(f"aijobs soak: {args.jobs} jobs, {args.fault_share:.0%} faults", caption))
    planned = {job.job_id: job for job in jobs}
    if suspects:
        console.print(f"jobs that broke a per-job check: {len(suspects)}; the first few:")
        for job_id in suspects[:5]:
            for line in explain(planned[job_id], contents, provider_log):
                console.print(f"  {line}", markup=False, highlight=False)
    top = tally.messages.most_common(5)
    if top:
        console.print("most frequent engine log lines:")
        for line, count in top:
            console.print(f"  {count:6d} x {line[:150]}")
    console.print("[green]soak passed[/green]" if report.passed else "[bold red]soak FAILED[/bold red]")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
