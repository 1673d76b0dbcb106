"""The soak's pipeline checks (bench.soak_pipelines) fail when they should: a step advanced twice, a child
inserted twice, a child run twice at once, a parent's usage one nano-dollar off its children's, a child's
off the provider's log. And its plans make what they say: texts of the planned parts with the fault in
one part only, every kind of kill planned where it applies."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from aijobs.local.provider import ServedRequest
from bench.soak_ledger import Report, TableContents, call_cost
from bench.soak_pipelines import (
    PIPELINE_PLANS,
    Kill,
    PlannedPipeline,
    StreamHistory,
    ended_as_planned,
    evaluate_pipelines,
    long_text,
    plan_pipelines,
    run_twice_at_once,
    stream_history,
)
from engine.core import ChildOf, ErrorCode, Job, JobErrorInfo, JobStatus, Lane, PipelineState, Usage
from engine.definitions import JobRegistry
from engine.definitions.pipelines import split_text
from engine.store.items import job_key, to_item

THREE_PARTS = next(plan for plan in PIPELINE_PLANS if plan.label == "summarize_long, 3 parts")
FAILING = next(plan for plan in PIPELINE_PLANS if plan.code is ErrorCode.STEP_FAILED)
T0 = 1_800_000_000_000


# --- the plans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", [plan for plan in PIPELINE_PLANS if plan.job_type == "summarize_long"])
def test_a_planned_text_has_its_parts_and_its_fault_in_its_part_alone(plan: Any) -> None:
    text = long_text("soak-p0001", plan.parts, plan.marker, plan.marked_part)

    parts = split_text(text)

    assert len(parts) == plan.parts
    if plan.marker is not None:
        assert [index for index, part in enumerate(parts) if plan.marker in part] == [plan.marked_part]
    assert all("soak-p0001" in part for part in parts)


def test_the_planned_pipelines_are_valid_messages_with_every_kill_where_it_applies() -> None:
    pipelines = plan_pipelines(60, random.Random(3))
    registry = JobRegistry()

    for pipeline in pipelines:
        definition = registry.get(pipeline.plan.job_type)
        definition.parse_input(pipeline.message["input"])
        assert all(kind.applies(pipeline.plan) for kind in pipeline.kills)
        assert sum(kind.in_worker for kind in pipeline.kills) <= 1
    assert {kind for pipeline in pipelines for kind in pipeline.kills} == set(Kill)
    assert {pipeline.plan.label for pipeline in pipelines} == {plan.label for plan in PIPELINE_PLANS}
    assert {pipeline.lane for pipeline in pipelines} == set(Lane)


# --- the table's stream ------------------------------------------------------------------------------


def image(job_id: str, status: JobStatus, **attributes: Any) -> dict[str, Any]:
    return job_key(job_id) | to_item({"job_id": job_id, "status": status.value, "created_at": T0, **attributes})


def record(new: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    change: dict[str, Any] = {"Keys": {"pk": new["pk"], "sk": new["sk"]}, "NewImage": new}
    if old is not None:
        change["OldImage"] = old
    return {"eventName": "MODIFY" if old else "INSERT", "dynamodb": change}


def moves(job_id: str, steps: list[tuple[JobStatus, int | None]]) -> list[dict[str, Any]]:
    """The records of a job going through `steps` (status, pipeline step), from its insertion."""
    images = [
        image(job_id, status, **({} if step is None else {"pipeline_step": step, "pipeline_children": 1}))
        for status, step in steps
    ]
    keys_only = job_key(job_id)  # moto records an item an UpdateItem makes twice, its keys alone first
    return [record(keys_only), record(images[0])] + [record(new, old) for old, new in itertools.pairwise(images)]


R, W, Q, S = JobStatus.RUNNING, JobStatus.WAITING, JobStatus.QUEUED, JobStatus.SUCCEEDED


def test_the_stream_history_reads_each_step_entered_and_left_once() -> None:
    records = moves("p", [(R, None), (W, 0), (Q, 0), (R, 0), (W, 1), (Q, 1), (R, 1), (S, 1)])
    child = image("p:s0:0", Q, parent_id="p", step="parts", step_index=0, part=0)

    history = stream_history([*records, record(child)])

    assert history.entered["p"] == [0, 1]
    assert history.left["p"] == [0, 1]
    assert history.inserted == Counter({"p": 1, "p:s0:0": 1})
    assert history.children == {"p:s0:0"}


def test_the_stream_history_shows_a_step_entered_twice() -> None:
    records = moves("p", [(R, None), (W, 0), (R, 0), (W, 0), (Q, 0)])

    history = stream_history(records)

    assert history.entered["p"] == [0, 0]


# --- running twice at once ---------------------------------------------------------------------------


def call(at_ms: int, batch_id: str | None = None) -> ServedRequest:
    return ServedRequest(at_ms / 1000, "local-model", None, None, 200, 100, 10, "key", batch_id=batch_id)


def attempt(started: int, finished: int) -> dict[str, Any]:
    return {"started_at": started, "finished_at": finished}


@pytest.mark.parametrize(
    ("attempts", "calls", "twice"),
    [
        ([attempt(0, 100), attempt(200, 300)], [call(50), call(250)], False),
        ([attempt(0, 100), attempt(100, 300)], [call(50), call(250)], False),  # one ends as the next begins
        ([attempt(0, 100), attempt(50, 300)], [call(20), call(250)], True),  # overlapping attempts
        ([attempt(0, 100)], [call(50), call(150)], True),  # a call outside every attempt
        ([attempt(0, 100)], [call(50), call(5000, batch_id="batch-1")], False),  # a batch's line is the provider's
    ],
)
def test_a_child_runs_twice_at_once_when_its_attempts_overlap_or_a_call_falls_outside_them(
    attempts: list[dict[str, Any]], calls: list[ServedRequest], twice: bool
) -> None:
    assert run_twice_at_once(attempts, calls) is twice


# --- the pipelines' rows -----------------------------------------------------------------------------


def child_call(job_id: str, started: int) -> ServedRequest:
    return ServedRequest(
        (started + 10) / 1000, "local-model", "summarize", None, 200, 4000, 40, f"key-{job_id}", reasoning_tokens=8
    )


def usage_of(entry: ServedRequest) -> Usage:
    return Usage(entry.prompt_tokens, entry.completion_tokens, call_cost(entry), 1, reasoning_tokens=8)


def scenario() -> tuple[PlannedPipeline, TableContents, list[ServedRequest], StreamHistory, dict[str, str]]:
    """A summarize_long of three parts that went as planned, as the table, its stream and the provider's
    log show it."""
    pipeline = PlannedPipeline("p", THREE_PARTS, Lane.INTERACTIVE, {}, 2)
    contents, log = TableContents(), []
    total = Usage()
    for number, job_id in enumerate(pipeline.children):
        started = T0 + 1000 * number
        entry = child_call(job_id, started)
        log.append(entry)
        usage = usage_of(entry)
        total = Usage(
            total.input_tokens + usage.input_tokens,
            total.output_tokens + usage.output_tokens,
            total.cost_usd + usage.cost_usd,
            total.attempts + 1,
            reasoning_tokens=total.reasoning_tokens + usage.reasoning_tokens,
        )
        step = 0 if number < 3 else 1
        contents.jobs[job_id] = Job(
            job_id, "summarize", "u", JobStatus.SUCCEEDED, T0, T0, output={"summary": f"summary {number}"},
            usage=usage, parent=ChildOf("p", "parts" if step == 0 else "summary", step, number % 3),
        )  # fmt: skip
        contents.attempts[job_id].append(
            {
                "started_at": started,
                "finished_at": started + 100,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "reasoning_tokens": usage.reasoning_tokens,
                "cost_usd": usage.cost_usd,
            }
        )
    contents.jobs["p"] = Job(
        "p", "summarize_long", "u", JobStatus.SUCCEEDED, T0, T0, output={"summary": "summary 3"}, usage=total,
        pipeline=PipelineState(1, 1, frozenset({0}), counts=(3, 1)),
    )  # fmt: skip
    history = StreamHistory()
    history.inserted.update(pipeline.children)
    history.children.update(pipeline.children)
    history.entered["p"] = [0, 1]
    history.left["p"] = [0, 1]
    keys = {job_id: f"key-{job_id}" for job_id in pipeline.children}
    return pipeline, contents, log, history, keys


def test_a_pipeline_that_went_as_planned_passes_every_row() -> None:
    pipeline, contents, log, history, keys = scenario()
    report = Report()

    broken = evaluate_pipelines(report, [pipeline], contents, log, history, keys)

    assert broken == []
    assert report.passed
    assert any(name.startswith("parents whose usage") for name, *_ in report.rows)


Mutation = Callable[[TableContents, list[ServedRequest], StreamHistory], None]


def parent_usage_off(contents: TableContents, *_: Any) -> None:
    parent = contents.jobs["p"]
    usage = replace(parent.usage, cost_usd=parent.usage.cost_usd + Decimal("0.000000001"))
    contents.jobs["p"] = replace(parent, usage=usage)


def step_entered_twice(_: TableContents, __: list[ServedRequest], history: StreamHistory) -> None:
    history.entered["p"] = [0, 0, 1]


def child_inserted_twice(_: TableContents, __: list[ServedRequest], history: StreamHistory) -> None:
    history.inserted["p:s0:1"] += 1


def child_run_twice_at_once(contents: TableContents, *_: Any) -> None:
    first = contents.attempts["p:s0:0"][0]
    contents.attempts["p:s0:0"].append({**first, "started_at": first["started_at"] + 50, "input_tokens": 0})


def provider_billed_more(_: TableContents, log: list[ServedRequest], __: StreamHistory) -> None:
    log.append(replace(log[0], at=log[0].at + 0.02, prompt_tokens=1, completion_tokens=0))


def counts_off(contents: TableContents, *_: Any) -> None:
    parent = contents.jobs["p"]
    assert parent.pipeline is not None
    contents.jobs["p"] = replace(parent, pipeline=replace(parent.pipeline, counts=(4, 1)))


def failed_instead(contents: TableContents, *_: Any) -> None:
    error = JobErrorInfo(ErrorCode.STEP_FAILED, "step 'parts': child p:s0:1 failed", False)
    contents.jobs["p"] = replace(contents.jobs["p"], status=JobStatus.FAILED, error=error)


@pytest.mark.parametrize(
    ("mutation", "row"),
    [
        (parent_usage_off, "parents whose usage differs from their children's summed"),
        (step_entered_twice, "steps advanced twice or out of order (the stream: entered, left)"),
        (child_inserted_twice, "children inserted twice, or not planned"),
        (child_run_twice_at_once, "children run twice at once (attempts overlapping, calls outside them)"),
        (provider_billed_more, "children whose usage differs from the provider's log"),
        (counts_off, "pipelines whose children per step differ from the split's count"),
        (failed_instead, "pipelines off plan (status, code, step and child named, output, lane)"),
    ],
)
def test_each_broken_promise_fails_its_row(mutation: Mutation, row: str) -> None:
    pipeline, contents, log, history, keys = scenario()
    mutation(contents, log, history)
    report = Report()

    broken = evaluate_pipelines(report, [pipeline], contents, log, history, keys)

    failed = [name for name, _, _, ok in report.rows if ok is False]
    assert row in failed
    assert not report.passed
    assert broken == ["p"]


def test_a_step_failed_must_name_the_step_and_the_failing_child() -> None:
    pipeline = PlannedPipeline("p", FAILING, Lane.INTERACTIVE, {}, 2)
    failing = pipeline.failing_child
    assert failing == f"p:s0:{FAILING.marked_part}"

    def ended(message: str) -> Job:
        error = JobErrorInfo(ErrorCode.STEP_FAILED, message, False)
        return Job("p", "summarize_long", "u", JobStatus.FAILED, T0, T0, error=error)

    assert ended_as_planned(pipeline, ended(f"step 'parts': child {failing} failed (schema_validation_failed: x)"), {})
    assert not ended_as_planned(pipeline, ended("step 'parts': child p:s0:0 failed (schema_validation_failed: x)"), {})
    assert not ended_as_planned(pipeline, ended(f"step 'summary': child {failing} failed (x)"), {})
