"""The soak's pipelines (docs/pipelines.md): `summarize_long` and `extract_reviewed` jobs sent among the
soak's others (bench.soak), under duplicated stream records and killed invocations, and the checks of how
they went.

- The plans: summarize_long of texts of one to five parts, clean, or with one part whose child fails
  once (`fault:server_error*1`: it is retried, the pipeline succeeds) or for good (`fault:non_json`: the
  pipeline ends `step_failed`, naming its step and that child); extract_reviewed approved (as proposed,
  or edited) or rejected by the soak while it waits (`Reviewer`), or left to a review timeout of a few
  seconds. In both lanes: a background pipeline's children go through the provider's batch.
- The kills (aijobs.local.kills): about half the pipelines have one advance killed in the worker, about
  half have the events function die once while it counts their children (`Kill`). The invocation is
  delivered again, its batch whole. One that dies before its pipeline waits leaves the pipeline's lease
  behind: such an invocation is one that had KILLED_INVOCATION_SECONDS left (the soak gives that context
  to the invocations that carry the pipeline's message while its kill is armed), so that the lease ends
  soon after, as it would at the function's timeout.
- The checks (`evaluate_pipelines`): every pipeline ended as planned (its status and code, the step and
  child its `step_failed` names, its output); no step advanced twice (from the table's stream: each
  child's job item inserted once and none unplanned, the parent's steps entered and left once each, in
  order, and its children per step the split's count); no child run twice at once (its attempts' windows
  apart, each of its calls in real time inside one of them); usage summed exactly (each parent's usage
  equal to its children's summed, and each child's to what the provider's log billed for it: tokens of
  every kind, attempts, and the cost as an exact Decimal).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

import boto3

from aijobs.client import AiJobsClient
from aijobs.local.faults import prompt_hash
from aijobs.local.kills import KillPoint, Kills
from aijobs.local.lambda_events import InvocationContext
from aijobs.local.provider import ServedRequest
from bench.soak_ledger import (
    CallTally,
    Report,
    TableContents,
    format_tokens,
    item_tokens,
    total_tokens,
    usage_tokens,
)
from engine.core import ErrorCode, Job, JobStatus, Lane, Usage
from engine.core.errors import PipelineStateError
from engine.definitions import JobRegistry
from engine.definitions.pipelines import split_text
from engine.pipelines import child_id
from engine.store import DynamoJobStore
from engine.store.items import INPUT_SK, JOB_PREFIX, JOB_SK, job_from_item, job_key

SUMMARIZE_LONG, EXTRACT_REVIEWED = "summarize_long", "extract_reviewed"
# A text part is about 4000 tokens of 4 characters, each starting 200 tokens before the last one ended
# (engine.definitions.pipelines.split_text): a text of N parts is about this long.
PART_CHARS, OVERLAP_CHARS = 16_000, 800
REVIEW_TIMEOUT_SECONDS = 5
EDITED_OUTPUT = {"total": 4711.0}
REJECTION = "the soak rejects this total"
# What an invocation that dies before its pipeline waits had left: the lease it leaves behind.
KILLED_INVOCATION_SECONDS = 15.0
REVIEW_POLL_SECONDS = 0.5
FIELDS = [{"name": "total", "description": "the invoice's total", "type": "number"}]


class Decision(StrEnum):
    """What the soak decides on a pipeline waiting for its review."""

    APPROVE = "approved"
    EDIT = "approved with an edit"
    REJECT = "rejected"


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    label: str
    job_type: str
    status: JobStatus = JobStatus.SUCCEEDED
    code: ErrorCode | None = None
    # summarize_long: its text's parts, and the one that holds `marker` (a fault its child meets).
    parts: int = 1
    marker: str | None = None
    marked_part: int = 0
    # extract_reviewed: what the soak decides; None: nobody does, and its review times out.
    decision: Decision | None = None

    @property
    def reaches_summary(self) -> bool:
        """Whether a summarize_long gets to its second step (the summary of the summaries)."""
        return self.job_type == SUMMARIZE_LONG and self.status is JobStatus.SUCCEEDED

    @property
    def counts(self) -> tuple[int, ...]:
        """The children each step makes (a review makes none)."""
        if self.job_type == EXTRACT_REVIEWED:
            return (1, 0)
        return (self.parts, 1) if self.reaches_summary else (self.parts,)

    @property
    def entered(self) -> list[int]:
        """The steps the parent waits on, in order (a review is a step)."""
        return list(range(len(self.counts)))

    @property
    def left(self) -> list[int]:
        """The steps whose end moves the parent on (`waiting -> queued`): not a review's."""
        return [0] if self.job_type == EXTRACT_REVIEWED else self.entered


# How the child a `fault:non_json` part makes fails (its answer and its re-ask's are not JSON).
CHILD_FAILURE = ErrorCode.SCHEMA_VALIDATION_FAILED
PIPELINE_PLANS: tuple[PipelinePlan, ...] = (
    PipelinePlan("summarize_long, 3 parts", SUMMARIZE_LONG, parts=3),
    PipelinePlan("extract_reviewed, approved", EXTRACT_REVIEWED, decision=Decision.APPROVE),
    PipelinePlan(
        "summarize_long, a part failing",
        SUMMARIZE_LONG,
        JobStatus.FAILED,
        ErrorCode.STEP_FAILED,
        parts=4,
        marker="fault:non_json",
        marked_part=1,
    ),
    PipelinePlan(
        "extract_reviewed, rejected",
        EXTRACT_REVIEWED,
        JobStatus.FAILED,
        ErrorCode.REVIEW_REJECTED,
        decision=Decision.REJECT,
    ),
    PipelinePlan(
        "summarize_long, a part retried", SUMMARIZE_LONG, parts=4, marker="fault:server_error*1", marked_part=2
    ),
    PipelinePlan("extract_reviewed, approved with an edit", EXTRACT_REVIEWED, decision=Decision.EDIT),
    PipelinePlan("summarize_long, 5 parts", SUMMARIZE_LONG, parts=5),
    PipelinePlan("extract_reviewed, review timed out", EXTRACT_REVIEWED, JobStatus.FAILED, ErrorCode.REVIEW_TIMEOUT),
    PipelinePlan("summarize_long, 1 part", SUMMARIZE_LONG, parts=1),
)


class Kill(StrEnum):
    """Where an invocation dies, once per pipeline that has it."""

    INPUT_STORED = "advance: after a child's input, before its job"
    CHILDREN_MADE = "advance: after its children are made, before it waits"
    WAITED = "advance: after it waits, before its children's messages"
    FIRST_SENT = "advance: after its first child's message, before the others'"
    NEXT_MADE = "next step: after its child is made, before it waits"
    STEP_COUNTED = "counting: after the count that ends a step, before it moves on"
    MOVED_ON = "counting: after the parent moves on, before its message"
    PARENT_SENT = "counting: after the parent's message"

    @property
    def in_worker(self) -> bool:
        return self in WORKER_KILLS

    @property
    def holds_lease(self) -> bool:
        """Whether the pipeline is still the dead invocation's (claimed, not yet waiting)."""
        return self in (Kill.INPUT_STORED, Kill.CHILDREN_MADE, Kill.NEXT_MADE)

    def applies(self, plan: PipelinePlan) -> bool:
        if self is Kill.FIRST_SENT:
            return plan.counts[0] > 1
        if self is Kill.NEXT_MADE:
            return plan.reaches_summary
        return True


WORKER_KILLS = (Kill.INPUT_STORED, Kill.CHILDREN_MADE, Kill.WAITED, Kill.FIRST_SENT, Kill.NEXT_MADE)
EVENTS_KILLS = (Kill.STEP_COUNTED, Kill.MOVED_ON, Kill.PARENT_SENT)


@dataclass(frozen=True, slots=True)
class PlannedPipeline:
    job_id: str
    plan: PipelinePlan
    lane: Lane
    message: dict[str, Any]
    copies: int
    kills: tuple[Kill, ...] = ()

    @property
    def children(self) -> list[str]:
        return [
            child_id(self.job_id, step, part) for step, count in enumerate(self.plan.counts) for part in range(count)
        ]

    @property
    def failing_child(self) -> str | None:
        """The child whose failure fails the pipeline (`step_failed` names it)."""
        return child_id(self.job_id, 0, self.plan.marked_part) if self.plan.code is ErrorCode.STEP_FAILED else None


def long_text(job_id: str, parts: int, marker: str | None, marked_part: int) -> str:
    """A text of `parts` parts, every sentence naming the pipeline (no two children's prompts alike), and
    `marker` in one sentence of part `marked_part` that no other part overlaps."""
    length = PART_CHARS + (parts - 1) * (PART_CHARS - OVERLAP_CHARS) - 2 * OVERLAP_CHARS
    sentences: list[str] = []
    while sum(map(len, sentences)) < length:
        sentences.append(f"In {job_id}, sentence {len(sentences)} says the supplier was paid on the due date. ")
    if marker is None:
        return "".join(sentences)
    for number in range(len(sentences)):
        marked = [*sentences[:number], sentences[number].replace("paid", f"paid {marker}"), *sentences[number + 1 :]]
        text = "".join(marked)
        holding = [index for index, part in enumerate(split_text(text)) if marker in part]
        if holding == [marked_part] and len(split_text(text)) == parts:
            return text
    raise ValueError(f"no sentence of {job_id}'s text puts {marker} in part {marked_part} alone")


def plan_pipelines(count: int, rng: random.Random) -> list[PlannedPipeline]:
    """`count` pipelines taking the plans in turn, a quarter of them in the background lane; about half
    with one kill in the worker and half with one in the events function, their kinds taken in turn."""
    worker_kills, events_kills = list(WORKER_KILLS), list(EVENTS_KILLS)
    pipelines = []
    for number in range(count):
        plan = PIPELINE_PLANS[number % len(PIPELINE_PLANS)]
        job_id = f"soak-p{number:04d}"
        if plan.job_type == SUMMARIZE_LONG:
            job_input: dict[str, Any] = {
                "text": long_text(job_id, plan.parts, plan.marker, plan.marked_part),
                "max_words": 60,
            }
        else:
            job_input = {"text": f"Invoice {job_id}: EUR 120.50, due 2026-01-31.", "fields": FIELDS}
            if plan.decision is None:
                job_input["review_timeout_seconds"] = REVIEW_TIMEOUT_SECONDS
        message = {
            "job_id": job_id,
            "job_type": plan.job_type,
            "user_id": f"soak-user-{number % 7}",
            "input": job_input,
        }
        kills = []
        for kinds, share in ((worker_kills, 0.5), (events_kills, 0.5)):
            if rng.random() < share:
                kind = next((kind for kind in kinds if kind.applies(plan)), None)
                if kind is not None:
                    kinds.remove(kind)
                    kinds.append(kind)  # the kinds in turn
                    kills.append(kind)
        lane = Lane.BACKGROUND if rng.random() < 0.25 else Lane.INTERACTIVE
        pipelines.append(PlannedPipeline(job_id, plan, lane, message, rng.choice((2, 3)), tuple(kills)))
    return pipelines


# --- the kills -------------------------------------------------------------------------------------


def _pk(params: Mapping[str, Any], name: str) -> str:
    return str((params.get(name) or {}).get("pk", {}).get("S", ""))


def _sk(params: Mapping[str, Any], name: str) -> str:
    return str((params.get(name) or {}).get("sk", {}).get("S", ""))


def _message_names(job_id: str) -> Callable[[Mapping[str, Any], Mapping[str, Any] | None], bool]:
    def matches(params: Mapping[str, Any], _: Mapping[str, Any] | None) -> bool:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return bool(json.loads(params.get("MessageBody", "")).get("job_id") == job_id)
        return False

    return matches


def _item_put(job_id: str, sk: str) -> Callable[[Mapping[str, Any], Mapping[str, Any] | None], bool]:
    key = job_key(job_id)["pk"]["S"]
    return lambda params, _: _pk(params, "Item") == key and _sk(params, "Item") == sk


def _parent_written(
    job_id: str, written: Callable[[Job], bool]
) -> Callable[[Mapping[str, Any], Mapping[str, Any] | None], bool]:
    key = job_key(job_id)["pk"]["S"]

    def matches(params: Mapping[str, Any], parsed: Mapping[str, Any] | None) -> bool:
        if _pk(params, "Key") != key or _sk(params, "Key") != JOB_SK or not parsed or "Attributes" not in parsed:
            return False
        return written(job_from_item(parsed["Attributes"]))

    return matches


def _step_over(job: Job) -> bool:
    state = job.pipeline
    return (
        job.status is JobStatus.WAITING
        and state is not None
        and state.step == 0
        and (state.step_ended or bool(state.failed))
    )


def _moved_on(job: Job) -> bool:
    return job.status is JobStatus.QUEUED and job.pipeline is not None and job.pipeline.step == 0


def kill_point(kind: Kill, pipeline: PlannedPipeline) -> KillPoint:
    parent, last = pipeline.job_id, pipeline.plan.counts[0] - 1
    name = f"{pipeline.job_id}: {kind.value}"
    match kind:
        case Kill.INPUT_STORED:
            return KillPoint(name, "dynamodb PutItem", True, _item_put(child_id(parent, 0, last), INPUT_SK))
        case Kill.CHILDREN_MADE:
            return KillPoint(name, "dynamodb PutItem", True, _item_put(child_id(parent, 0, last), JOB_SK))
        case Kill.WAITED:
            return KillPoint(name, "sqs SendMessage", False, _message_names(child_id(parent, 0, 0)))
        case Kill.FIRST_SENT:
            return KillPoint(name, "sqs SendMessage", False, _message_names(child_id(parent, 0, 1)))
        case Kill.NEXT_MADE:
            return KillPoint(name, "dynamodb PutItem", True, _item_put(child_id(parent, 1, 0), JOB_SK))
        case Kill.STEP_COUNTED:
            return KillPoint(name, "dynamodb UpdateItem", True, _parent_written(parent, _step_over))
        case Kill.MOVED_ON:
            return KillPoint(name, "dynamodb UpdateItem", True, _parent_written(parent, _moved_on))
        case Kill.PARENT_SENT:
            return KillPoint(name, "sqs SendMessage", True, _message_names(parent))


Handler = Callable[[dict[str, Any], Any], Any]


class PipelineKills:
    """The pipelines' kills, armed on the worker's and the events function's sessions (`install` each
    before its function is built), and those functions as their event sources see them."""

    def __init__(self, pipelines: Sequence[PlannedPipeline]) -> None:
        self.worker, self.events = Kills(), Kills()
        # The kills that leave a pipeline's lease behind, by pipeline.
        self._lease_kills: dict[str, KillPoint] = {}
        for pipeline in pipelines:
            for kind in pipeline.kills:
                point = kill_point(kind, pipeline)
                (self.worker if kind.in_worker else self.events).arm(point)
                if kind.holds_lease:
                    self._lease_kills[pipeline.job_id] = point
        self.planned = Counter("worker" if kind.in_worker else "events" for p in pipelines for kind in p.kills)
        self.deaths: Counter[str] = Counter()
        self._lock = threading.Lock()

    def worker_function(self, handle: Handler, on_death: Callable[[dict[str, Any]], None]) -> Handler:
        """The worker's handler: killed where planned; an invocation that carries a pipeline whose kill
        leaves its lease behind has KILLED_INVOCATION_SECONDS left."""
        dying = self.worker.dying(handle, lambda event: self._died("worker", on_death, event))

        def invoke(event: dict[str, Any], context: Any) -> Any:
            if any(self._lease_kill_armed(_job_id(record)) for record in event.get("Records", [])):
                context = InvocationContext("aijobs-worker", KILLED_INVOCATION_SECONDS)
            return dying(event, context)

        return invoke

    def events_function(self, handle: Handler) -> Handler:
        return self.events.dying(handle, lambda event: self._died("events", None, event))

    def _lease_kill_armed(self, job_id: str | None) -> bool:
        point = self._lease_kills.get(job_id or "")
        return point is not None and self.worker.is_armed(point)

    def _died(self, function: str, then: Callable[[dict[str, Any]], None] | None, event: dict[str, Any]) -> None:
        with self._lock:
            self.deaths[function] += 1
        if then is not None:
            then(event)

    @property
    def made(self) -> Counter[str]:
        return Counter({"worker": len(self.worker.fired), "events": len(self.events.fired)})


def _job_id(record: Mapping[str, Any]) -> str | None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return str(json.loads(record.get("body", "")).get("job_id"))
    return None


# --- the person at the review step -------------------------------------------------------------------


class Reviewer(threading.Thread):
    """Decides each pipeline planned to be decided, as soon as it waits for its review."""

    def __init__(self, client: AiJobsClient, store: DynamoJobStore, pipelines: Sequence[PlannedPipeline]) -> None:
        super().__init__(name="soak-reviewer", daemon=True)
        self._client = client
        self._store = store
        self._pending = {p.job_id: p.plan.decision for p in pipelines if p.plan.decision is not None}
        self.decided: Counter[Decision] = Counter()
        self.errors: list[str] = []
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)

    def run(self) -> None:
        while self._pending and not self._stopping.wait(REVIEW_POLL_SECONDS):
            try:
                jobs = self._store.get_jobs(sorted(self._pending))
            except Exception as exc:  # the next look may do
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            for job_id, job in jobs.items():
                review = job.pipeline.review if job.pipeline else None
                if job.status is JobStatus.WAITING and review is not None and review.decision is None:
                    self._decide(job_id, self._pending[job_id])

    def _decide(self, job_id: str, decision: Decision) -> None:
        try:
            self._client.review(
                job_id,
                approve=decision is not Decision.REJECT,
                output=EDITED_OUTPUT if decision is Decision.EDIT else None,
                reason=REJECTION if decision is Decision.REJECT else None,
                by="soak",
            )
        except PipelineStateError:
            return  # it changed meanwhile: looked at again next time
        except Exception as exc:
            self.errors.append(f"{job_id}: {type(exc).__name__}: {exc}")
            return
        del self._pending[job_id]
        self.decided[decision] += 1


# --- the outcome -----------------------------------------------------------------------------------


def read_stream(session: boto3.Session, endpoint_url: str, table_name: str) -> list[dict[str, Any]]:
    """Every record the table's stream holds, in order."""
    dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
    streams = session.client("dynamodbstreams", endpoint_url=endpoint_url)
    arn = dynamodb.describe_table(TableName=table_name)["Table"]["LatestStreamArn"]
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")
        next_iterator: str | None = iterator["ShardIterator"]
        while next_iterator:
            page = streams.get_records(ShardIterator=next_iterator, Limit=1000)
            records += page.get("Records", [])
            next_iterator = page.get("NextShardIterator") if page.get("Records") else None
    return records


@dataclass
class StreamHistory:
    """What the table's stream says of the pipelines: the job items inserted (by job id), and each
    parent's steps, in order, as it entered `waiting` on each and as it left one for `queued`."""

    inserted: Counter[str] = field(default_factory=Counter)
    entered: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    left: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # Inserted job items that name a parent: their ids.
    children: set[str] = field(default_factory=set)


def stream_history(records: Iterable[Mapping[str, Any]]) -> StreamHistory:
    history = StreamHistory()
    for record in records:
        change = record.get("dynamodb", {})
        keys = change.get("Keys", {})
        if keys.get("sk", {}).get("S") != JOB_SK or not keys.get("pk", {}).get("S", "").startswith(JOB_PREFIX):
            continue
        if "NewImage" in change and "job_id" not in change["NewImage"]:
            continue  # moto records an item an UpdateItem makes twice, its keys alone first
        old = job_from_item(change["OldImage"]) if "OldImage" in change else None
        new = job_from_item(change["NewImage"]) if "NewImage" in change else None
        if new is None:
            continue
        if old is None:
            history.inserted[new.job_id] += 1
            if new.parent is not None:
                history.children.add(new.job_id)
        was_waiting = old is not None and old.status is JobStatus.WAITING
        if new.status is JobStatus.WAITING and not was_waiting and new.pipeline is not None:
            history.entered[new.job_id].append(new.pipeline.step)
        if was_waiting and new.status is JobStatus.QUEUED and old is not None and old.pipeline is not None:
            history.left[new.job_id].append(old.pipeline.step)
    return history


def prompt_keys(store: DynamoJobStore, registry: JobRegistry, jobs: Iterable[Job]) -> dict[str, str]:
    """The key the provider logs each job's calls under, from its stored input."""
    keys = {}
    for job in jobs:
        stored = store.get_input(job.job_id)
        if stored is not None and job.job_type:
            definition = registry.get(job.job_type)
            keys[job.job_id] = prompt_hash(definition.render_prompt(definition.parse_input(stored)).user)
    return keys


def ended_as_planned(pipeline: PlannedPipeline, job: Job | None, children: Mapping[str, Job]) -> bool:
    """The parent's status, code, the step and child its `step_failed` names, and its output."""
    plan = pipeline.plan
    if job is None or job.status is not plan.status or (job.error.code if job.error else None) is not plan.code:
        return False
    if job.lane is not pipeline.lane:
        return False
    message = job.error.message if job.error else ""
    review = job.pipeline.review if job.pipeline else None
    match plan.code:
        case ErrorCode.STEP_FAILED:
            return "step 'parts'" in message and f"child {pipeline.failing_child} " in message
        case ErrorCode.REVIEW_REJECTED:
            return REJECTION in message and review is not None and review.decision == "rejected"
        case ErrorCode.REVIEW_TIMEOUT:
            return review is not None and review.decision == "timed_out"
    last = children.get(pipeline.children[-1])
    if plan.job_type == SUMMARIZE_LONG:
        return bool(job.output and job.output.get("summary")) and last is not None and job.output == last.output
    if plan.decision is Decision.EDIT:
        return job.output == EDITED_OUTPUT and review is not None and review.changed
    return last is not None and job.output == last.output and review is not None and review.decision == "approved"


def child_as_planned(pipeline: PlannedPipeline, job_id: str, child: Job | None) -> bool:
    """A child's end: the failing one failed as its fault says; its siblings succeeded or (their pipeline
    ended early) were cancelled; any other child succeeded. In its pipeline's lane."""
    if child is None or child.lane is not pipeline.lane:
        return False
    code = child.error.code if child.error else None
    if job_id == pipeline.failing_child:
        return child.status is JobStatus.FAILED and code is CHILD_FAILURE
    if pipeline.failing_child is not None:
        return child.status in (JobStatus.SUCCEEDED, JobStatus.CANCELLED)
    return child.status is JobStatus.SUCCEEDED


def run_twice_at_once(attempts: Sequence[Mapping[str, Any]], calls: Sequence[ServedRequest]) -> bool:
    """Whether a job's attempts overlap in time, or a call of its in real time falls outside every one of
    them or inside two (a batch's line is the provider's, not a worker's: left out)."""
    windows = sorted((int(attempt["started_at"]), int(attempt["finished_at"])) for attempt in attempts)
    if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(windows)):
        return True
    return any(
        sum(start <= int(call.at * 1000) <= end for start, end in windows) != 1
        for call in calls
        if call.batch_id is None
    )


def usage_row(usage: Usage) -> tuple[tuple[int, int, int, int], int, Decimal]:
    return usage_tokens(usage), usage.attempts, usage.cost_usd


def summed(usages: Iterable[Usage]) -> tuple[tuple[int, int, int, int], int, Decimal]:
    rows = [usage_row(usage) for usage in usages]
    return total_tokens(row[0] for row in rows), sum(row[1] for row in rows), sum((row[2] for row in rows), Decimal(0))


def evaluate_pipelines(
    report: Report,
    pipelines: Sequence[PlannedPipeline],
    contents: TableContents,
    provider_log: Sequence[ServedRequest],
    history: StreamHistory,
    keys: Mapping[str, str],
) -> list[str]:
    """Add the pipelines' rows to `report`; the ids of the pipelines that broke a check."""
    by_prompt: dict[str, CallTally] = defaultdict(CallTally)
    for entry in provider_log:
        by_prompt[entry.prompt_hash].add(entry)
    planned_children = {job_id for pipeline in pipelines for job_id in pipeline.children}
    off_end, off_children, off_steps, off_counts, twice_at_once, off_parent_usage, off_child_usage = (
        [] for _ in range(7)
    )
    duplicate_answers = 0
    ends: Counter[str] = Counter()
    for pipeline in pipelines:
        parent = contents.jobs.get(pipeline.job_id)
        children = {job_id: job for job_id in pipeline.children if (job := contents.jobs.get(job_id)) is not None}
        ends[parent.error.code.value if parent and parent.error else parent.status.value if parent else "missing"] += 1
        if not ended_as_planned(pipeline, parent, children):
            off_end.append(pipeline.job_id)
        if not all(child_as_planned(pipeline, job_id, children.get(job_id)) for job_id in pipeline.children):
            off_children.append(pipeline.job_id)
        if (
            history.entered.get(pipeline.job_id, []) != pipeline.plan.entered
            or history.left.get(pipeline.job_id, []) != pipeline.plan.left
            or any(history.inserted[job_id] != 1 for job_id in pipeline.children)
        ):
            off_steps.append(pipeline.job_id)
        if parent is None or parent.pipeline is None or parent.pipeline.counts != pipeline.plan.counts:
            off_counts.append(pipeline.job_id)
        tallies = {job_id: by_prompt.get(keys.get(job_id, ""), CallTally()) for job_id in children}
        if any(run_twice_at_once(contents.attempts.get(job_id, []), tallies[job_id].entries) for job_id in children):
            twice_at_once.append(pipeline.job_id)
        duplicate_answers += sum(max(0, tally.valid_answers - 1) for tally in tallies.values())
        if parent is None or usage_row(parent.usage) != summed(child.usage for child in children.values()):
            off_parent_usage.append(pipeline.job_id)
        if any(
            job_id not in keys
            or usage_tokens(child.usage) != tallies[job_id].tokens
            or child.usage.cost_usd != tallies[job_id].cost
            or total_tokens(item_tokens(attempt) for attempt in contents.attempts.get(job_id, []))
            != tallies[job_id].tokens
            for job_id, child in children.items()
        ):
            off_child_usage.append(pipeline.job_id)

    kinds = Counter(pipeline.plan.job_type for pipeline in pipelines)
    lanes = Counter(pipeline.lane for pipeline in pipelines)
    report.figure(
        "pipelines: summarize_long / extract_reviewed (interactive / background); their children",
        f"{kinds[SUMMARIZE_LONG]} / {kinds[EXTRACT_REVIEWED]} ({lanes[Lane.INTERACTIVE]} / {lanes[Lane.BACKGROUND]});"
        f" {len(planned_children)}",
    )
    planned_ends = Counter(p.plan.code.value if p.plan.code else p.plan.status.value for p in pipelines)
    names = sorted(set(planned_ends) | set(ends))
    report.check(
        f"pipelines ended: {' / '.join(names)}",
        " / ".join(str(planned_ends[name]) for name in names),
        " / ".join(str(ends[name]) for name in names),
    )
    report.check("pipelines off plan (status, code, step and child named, output, lane)", 0, len(off_end))
    report.check("pipelines whose children ended off plan (status, code, lane)", 0, len(off_children))
    inserted_once = sum(1 for job_id in planned_children if history.inserted[job_id] == 1)
    report.check("children's job items inserted once each (the stream)", len(planned_children), inserted_once)
    report.check(
        "children inserted twice, or not planned",
        0,
        sum(1 for job_id in history.children if job_id not in planned_children or history.inserted[job_id] > 1),
    )
    report.check("steps advanced twice or out of order (the stream: entered, left)", 0, len(off_steps))
    report.check("pipelines whose children per step differ from the split's count", 0, len(off_counts))
    report.check("children run twice at once (attempts overlapping, calls outside them)", 0, len(twice_at_once))
    report.check("children with more than one valid answer", 0, duplicate_answers)
    report.check("parents whose usage differs from their children's summed", 0, len(off_parent_usage))
    report.check("children whose usage differs from the provider's log", 0, len(off_child_usage))
    found = [job for pipeline in pipelines if (job := contents.jobs.get(pipeline.job_id)) is not None]
    tokens, attempts, cost = summed(job.usage for job in found)
    report.figure(
        "pipelines' usage: tokens in/out/cached/reasoning; attempts; cost USD",
        f"{format_tokens(tokens)}; {attempts}; {cost}",
    )
    suspects = [*off_end, *off_children, *off_steps, *off_counts, *twice_at_once, *off_parent_usage, *off_child_usage]
    return list(dict.fromkeys(suspects))


def explain_pipeline(pipeline: PlannedPipeline, contents: TableContents, history: StreamHistory) -> list[str]:
    """What happened to one pipeline: its end, its steps as the stream saw them, and its children."""
    parent = contents.jobs.get(pipeline.job_id)
    end = "missing" if parent is None else parent.status.value
    if parent is not None and parent.error is not None:
        end += f" {parent.error.code.value}: {parent.error.message}"
    kills = ", ".join(kind.value for kind in pipeline.kills) or "no kill"
    lines = [
        f"{pipeline.job_id} [{pipeline.plan.label}, {pipeline.lane.value}, {kills}] -> {end}",
        f"    steps entered {history.entered.get(pipeline.job_id, [])}, left {history.left.get(pipeline.job_id, [])};"
        f" counts {parent.pipeline.counts if parent and parent.pipeline else None}",
    ]
    for job_id in pipeline.children:
        child = contents.jobs.get(job_id)
        state = "missing" if child is None else child.status.value
        if child is not None and child.error is not None:
            state += f" {child.error.code.value}"
        attempts = len(contents.attempts.get(job_id, []))
        lines.append(f"    {job_id}: {state}, inserted {history.inserted[job_id]}x, {attempts} attempt records")
    return lines
