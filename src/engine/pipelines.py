"""Moving pipelines on (docs/pipelines.md): a parent's steps as child jobs, exactly once.

- Pipelines.advance: a claimed parent (the worker holds its lease) starts its next step. It reads the
  children of the step that ended, fails with `step_failed` when more of them failed than the step
  tolerates, else makes the next step's children (idempotent on their ids), writes itself `waiting`
  (its claim refunded), then sends the children's messages. After its last step it succeeds with
  that step's output. A review step leaves it `waiting` for a person, its message hidden until the
  review's timeout, when it comes back to end the review `review_timeout` if no one decided.
- ChildEnds: the table's stream, in the events function. A child that ended is counted on its parent
  once (a conditional write: engine.store.pipeline_writes), and the one count that ends the step (or
  fails it past what it tolerates) moves the parent to `queued` and sends its message. A parent that
  ended early (cancelled, failed, past its deadline) cancels its children of the step still open.

The order of the parent's writes is what makes a crash at any point safe: children are made before
the parent waits (a parent that waits has every child of its step), and their messages are sent
after (a child counted is one of the step the parent waits on); a child made whose message was
lost is queued with its input stored, which the reconciler sends again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from pydantic import BaseModel

from engine.attachments.pages import PartKey, part_key
from engine.core import (
    Ack,
    Cancelled,
    ChildOf,
    Disposition,
    Failed,
    Fate,
    Job,
    JobStatus,
    Lane,
    NewJob,
    PipelineState,
    Retry,
    Review,
    Succeeded,
    Usage,
    Waits,
)
from engine.core.attachments import AttachmentRef
from engine.core.errors import (
    AttachmentInvalidError,
    CancelRequestedError,
    InputValidationError,
    LeaseLostError,
    OutputTooLargeError,
    PermanentError,
    PipelineStateError,
    ReviewRejectedError,
    ReviewTimeoutError,
    StepFailedError,
)
from engine.core.ports import PipelineStore
from engine.decisions import output_hash
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.base import storable_output
from engine.definitions.pipelines import MAX_PARTS, MapStep, PipelineDefinition, ReviewStep
from engine.intake import request_hash
from engine.messages import MIN_DEADLINE_SECONDS
from engine.observability import log_unexpected, logger
from engine.queue import JobQueues
from engine.retry import MAX_DELAY_SECONDS
from engine.text import json_value_problem, one_line

# Job ids are at most 128 characters: a child's is its parent's with its step and part, or, for a
# parent whose id leaves no room, its digest's.
MAX_JOB_ID = 128


# A child's input, and the attachments it reads (its part of a PDF).
Part = tuple[dict[str, Any], tuple[AttachmentRef, ...]]


class DocumentPages(Protocol):
    """A PDF attachment cut into page ranges, each written as a PDF (engine.attachments.pages)."""

    def split(self, ref: AttachmentRef, pages_per_part: int, key: PartKey) -> list[AttachmentRef]: ...


def child_id(parent_id: str, step: int, part: int) -> str:
    suffix = f":s{step}:{part}"
    if len(parent_id) + len(suffix) <= MAX_JOB_ID:
        return parent_id + suffix
    return "p" + hashlib.sha256(parent_id.encode()).hexdigest()[:40] + suffix


def children_ids(job: Job) -> list[list[str]]:
    """A pipeline's children, by step (what `aijobs inspect` and the dashboard list)."""
    if job.pipeline is None:
        return []
    return [
        [child_id(job.job_id, step, part) for part in range(count)] for step, count in enumerate(job.pipeline.counts)
    ]


class Pipelines:
    def __init__(
        self,
        store: PipelineStore,
        queues: JobQueues,
        registry: JobRegistry,
        clock: Callable[[], float] = time.time,
        documents: DocumentPages | None = None,
    ) -> None:
        self._store = store
        self._queues = queues
        self._registry = registry
        self._clock = clock
        # What cuts a PDF attachment into page ranges (engine.attachments.pages.PageRanges).
        self._documents = documents

    def advance(
        self, job: Job, definition: PipelineDefinition, job_input: BaseModel, raw: dict[str, Any]
    ) -> Disposition:
        """Start a claimed pipeline's next step, or end it: what becomes of its message."""
        now = self._now_ms()
        state = job.pipeline
        outputs: list[dict[str, Any]] = []
        if state is not None:
            if state.rerun:
                return self._rerun(job, definition, job_input, raw, state, now)
            if state.review is not None:  # (a decided review ends the job: one left is still open)
                return self._end(job, Failed(ReviewTimeoutError("the review was not given").info()), raw)
            step = definition.steps[state.step]
            ids = children_ids(job)[state.step]
            children = self._store.get_jobs(ids)
            failed = [job_id for job_id in ids if job_id in children and _failed(children[job_id])]
            if len(failed) > step.max_failed:
                return self._end(job, Failed(step_failed(step.name, failed, children).info()), raw)
            open_ = [job_id for job_id in ids if job_id not in children or not children[job_id].status.is_terminal]
            if open_:
                missing = StepFailedError(f"step {step.name!r}: child {open_[0]} has not ended")
                return self._end(job, Failed(missing.info()), raw)
            outputs = [children[job_id].output or {} for job_id in ids if job_id not in failed]
        index = 0 if state is None else state.step + 1
        counts = () if state is None else state.counts
        if index == len(definition.steps):
            output = outputs[-1] if outputs else {}
            return self._end(job, Succeeded(output, output_hash(output)), raw)
        step = definition.steps[index]
        if isinstance(step, ReviewStep):
            return self._review(job, step, job_input, outputs[-1] if outputs else {}, (*counts, 0), raw, now)
        try:
            parts = (
                self._map(job, index, step, job_input)
                if isinstance(step, MapStep)
                else [(step.input(job_input, outputs), ())]
            )
            run = self._registry.resolve(step.run, job.user_id or "")
            if isinstance(run, PipelineDefinition):
                raise StepFailedError(
                    f"step {step.name!r}: {run.name} is a pipeline; a step runs a job type that calls a model"
                )
        except PermanentError as exc:
            return self._end(job, Failed(exc.info()), raw)
        made = [
            self._child(job, index, part, step.name, run, child_input, attachments, now)
            for part, (child_input, attachments) in enumerate(parts)
        ]
        written = self._finish(job, Waits(index, len(made), (*counts, len(made))), raw)
        if written is not None:
            return written
        for child in made:
            self._queues[child.lane].send({"job_id": child.job_id}, group_id=child.user_id)
        logger.info("pipeline step started", extra={"job_id": job.job_id, "step": step.name, "children": len(made)})
        return Ack(Fate.WAITING)

    def _review(
        self,
        job: Job,
        step: ReviewStep,
        job_input: BaseModel,
        proposed: dict[str, Any],
        counts: tuple[int, ...],
        raw: dict[str, Any],
        now: int,
    ) -> Disposition:
        """Wait for a person to decide on `proposed`: the review is the pipeline's last step."""
        timeout = step.timeout_for(job_input)
        review = Review(output=proposed, started_at=now, timeout_ms=timeout * 1000)
        written = self._finish(job, Waits(len(counts) - 1, 0, counts, review), raw)
        if written is not None:
            return written
        # The message comes back when the review's time is up, to end it if no one has.
        return Retry(Fate.WAITING, min(timeout, MAX_DELAY_SECONDS), "waiting for a review")

    def _rerun(
        self,
        job: Job,
        definition: PipelineDefinition,
        job_input: BaseModel,
        raw: dict[str, Any],
        state: PipelineState,
        now: int,
    ) -> Disposition:
        """A retried pipeline (`aijobs retry`): its step runs again what did not succeed. A review is given
        again, on the output proposed before. Else the step's succeeded children are kept (no new call),
        the others put back to `queued` with fresh attempts (same ids), and the parent waits on the same
        step with the kept ones counted and its usage made its children's sum again: the usage of a child
        counted before is taken back, since it is counted whole (with that earlier attempt) when it ends
        again, and a succeeded child's that was never counted (it ended after the parent) is added."""
        step = definition.steps[state.step]
        if isinstance(step, ReviewStep):
            proposed = state.review.output if state.review is not None else {}
            return self._review(job, step, job_input, proposed, state.counts, raw, now)
        ids = children_ids(job)[state.step]
        children = self._store.get_jobs(ids)
        if len(children) < len(ids):
            return self._end(job, Failed(step_failed(step.name, [], children).info()), raw)
        kept: set[int] = set()
        usage = Usage()
        again: list[Job] = []
        for part, job_id in enumerate(ids):
            child = children[job_id]
            if child.status is JobStatus.SUCCEEDED:
                kept.add(part)
                usage = usage if part in state.ended else usage.add(child.usage)
                continue
            usage = usage.add(child.usage, -1) if part in state.ended else usage
            if child.status.is_terminal:
                seconds = child.deadline_seconds or definition.deadline_seconds
                deadline_at = min(now + seconds * 1000, job.deadline_at or now + seconds * 1000)
                self._store.rerun_child(child, deadline_at, now)
            again.append(child)
        waits = Waits(state.step, len(ids), state.counts, ended=frozenset(kept), usage=usage)
        written = self._finish(job, waits, raw)
        if written is not None:
            return written
        for child in again:
            self._queues[child.lane].send({"job_id": child.job_id}, group_id=child.user_id)
        if not again:  # every child had succeeded: the step is over as soon as the parent waits
            moved = replace(job, pipeline=replace(state, ended=frozenset(kept), failed=frozenset()))
            if self._store.make_ready(moved, now):
                self._queues[Lane.INTERACTIVE].send({"job_id": job.job_id}, group_id=job.user_id)
        logger.info("pipeline step run again", extra={"job_id": job.job_id, "step": step.name, "children": len(again)})
        return Ack(Fate.WAITING)

    def on_waiting(self, job: Job) -> Disposition:
        """A message of a pipeline that waits: a review's timer (ended `review_timeout` once its time is
        up, else hidden until then), or a copy while its children run. Such a copy may be the message of
        an invocation that died after the pipeline waited and before it sent its children's messages:
        those of the children not counted ended are sent again (a child's claim makes a copy harmless)."""
        review = job.pipeline.review if job.pipeline else None
        if review is None:
            self._send_open_children(job)
        if review is None or review.decision is not None:
            return Ack(Fate.DUPLICATE)
        now = self._now_ms()
        if now < review.expires_at:
            seconds = min(max((review.expires_at - now) // 1000 + 1, 1), MAX_DELAY_SECONDS)
            return Retry(Fate.WAITING, seconds, "waiting for a review")
        timeout = ReviewTimeoutError(f"no review within {review.timeout_ms // 1000} s").info()
        decided = Review(**{**_fields(review), "decision": "timed_out", "at": now})
        try:
            self._store.decide_review(job, decided, None, None, timeout, now)
        except PipelineStateError:
            return Retry(Fate.RACED, 1, f"job {job.job_id} changed while its review was ended")
        return Ack(Fate.FAILED)

    def _map(self, job: Job, index: int, step: MapStep, job_input: BaseModel) -> list[Part]:
        """A map step's parts: a PDF attachment's page ranges (each a PDF of its own), or what the step
        makes of the pipeline's input (a text's parts, a list's items). PermanentError when none can be."""
        if step.pages is not None and job.attachments:
            if self._documents is None:
                raise AttachmentInvalidError("this stack reads no attachments")
            if getattr(job_input, "text", ""):
                raise InputValidationError(f"input.text: {job.job_type} maps a text or a PDF's pages, not both")
            refs = self._documents.split(
                job.attachments[0],
                step.pages.pages,
                lambda part, first, last: part_key(child_id(job.job_id, index, part), first, last),
            )
            return [(step.pages.input(job_input, len(refs)), (ref,)) for ref in refs]
        inputs = step.parts(job_input)
        if not inputs:
            raise InputValidationError(f"step {step.name!r}: nothing to map (no part, no item)")
        if len(inputs) > MAX_PARTS:
            raise InputValidationError(f"step {step.name!r}: {len(inputs)} parts; a map makes at most {MAX_PARTS}")
        return [(child_input, ()) for child_input in inputs]

    def _send_open_children(self, job: Job) -> None:
        state = job.pipeline
        steps = children_ids(job)
        if state is None or state.step >= len(steps):
            return
        for part, job_id in enumerate(steps[state.step]):
            if part not in state.ended:
                self._queues[job.lane].send({"job_id": job_id}, group_id=job.user_id)

    def _child(
        self,
        parent: Job,
        step: int,
        part: int,
        name: str,
        run: JobDefinition,
        child_input: dict[str, Any],
        attachments: tuple[AttachmentRef, ...],
        now: int,
    ) -> Job:
        user = parent.user_id or ""
        remaining = max(((parent.deadline_at or now) - now) // 1000, MIN_DEADLINE_SECONDS)
        new_job = NewJob(
            job_type=run.name,
            user_id=user,
            schema_version=run.schema_version,
            max_attempts=run.max_attempts,
            deadline_seconds=min(run.deadline_seconds, remaining),
            request_hash=request_hash(run.name, user, child_input, attachments),
            lane=parent.lane,
            job_type_version=run.job_type_version,
            attachments=attachments,
            parent=ChildOf(parent.job_id, name, step, part),
        )
        child, _ = self._store.create_job(child_id(parent.job_id, step, part), new_job, child_input, now)
        return child

    def _end(self, job: Job, outcome: Succeeded | Failed, raw: dict[str, Any]) -> Disposition:
        written = self._finish(job, outcome, raw)
        assert written is not None  # (only a wait written is None)
        return written

    def _finish(self, job: Job, outcome: Succeeded | Failed | Waits, raw: dict[str, Any]) -> Disposition | None:
        """Write the parent's outcome; None when written, else (its lease lost, a cancel requested
        meanwhile) what becomes of its message."""
        store_input = raw if not job.input_stored else None
        try:
            self._store.finish_job(job, outcome, self._now_ms(), store_input=store_input)
        except CancelRequestedError:
            self._store.finish_job(job, Cancelled(), self._now_ms())
            return Ack(Fate.CANCELLED)
        except LeaseLostError:
            return Ack(Fate.LEASE_LOST)
        if isinstance(outcome, Waits):
            return None
        return Ack(Fate.SUCCEEDED if isinstance(outcome, Succeeded) else Fate.FAILED)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _failed(child: Job) -> bool:
    return child.status.is_terminal and child.status is not JobStatus.SUCCEEDED


def step_failed(step: str, failed: Sequence[str], children: dict[str, Job]) -> StepFailedError:
    """`step_failed`, naming the step and its first failed child (with that child's error)."""
    if not failed:
        return StepFailedError(f"step {step!r}: a child of the step is missing")
    first = children[failed[0]]
    # A child cancelled alone has no error: its status says it all ("cancelled", not "cancelled (cancelled)").
    why = f" ({first.error.code.value}: {first.error.message})" if first.error else ""
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    return StepFailedError(one_line(f"step {step!r}: child {first.job_id} {first.status.value}{why}{more}"))


def _fields(review: Review) -> dict[str, Any]:
    return {name: getattr(review, name) for name in Review.__dataclass_fields__}


def decided_review(
    job: Job,
    definition: JobDefinition,
    job_input: BaseModel,
    approve: bool,
    output: dict[str, Any] | None,
    reason: str | None,
    by: str | None,
    now_ms: int,
) -> tuple[Review, dict[str, Any] | None, Any]:
    """A person's decision on a pipeline waiting for its review: the review to record, the output to
    keep (the proposed one, or an edited one its output schema accepts, of valid Unicode and no larger
    than a job stores) and the error to end with
    (None when approved). PipelineStateError when the job waits for no review or the output is refused."""
    review = job.pipeline.review if job.pipeline else None
    if job.status is JobStatus.WAITING and review is None:
        raise PipelineStateError(f"job {job.job_id} is waiting on its step's children, not for a review")
    if job.status is not JobStatus.WAITING or review is None or review.decision is not None:
        raise PipelineStateError(f"job {job.job_id} is {job.status.value}, not waiting for a review")
    if not approve:
        if not reason or not reason.strip():
            raise PipelineStateError("a rejection needs a reason (--reason TEXT)")
        decided = Review(
            **{**_fields(review), "decision": "rejected", "by": by, "at": now_ms, "reason": one_line(reason)}
        )
        return decided, None, ReviewRejectedError(one_line(f"rejected: {reason}")).info()
    kept = review.output
    if output is not None:
        if not isinstance(definition, PipelineDefinition):
            raise PipelineStateError(f"job {job.job_id} is not a pipeline's")
        if problem := json_value_problem(output, "output"):
            raise PipelineStateError(one_line(f"the edited output is refused: {problem}"))
        try:
            kept = storable_output(definition.edited_output(job_input, output))
        except (ValueError, OutputTooLargeError) as exc:
            raise PipelineStateError(one_line(f"the edited output is refused: {exc}")) from exc
    decided = Review(
        **{**_fields(review), "decision": "approved", "by": by, "at": now_ms, "changed": kept != review.output}
    )
    return decided, kept, None


class ChildEnds:
    """The events function's part that moves pipelines on: ended children counted on their parents,
    parents whose step ended sent on, children of an ended parent cancelled."""

    def __init__(
        self, store: PipelineStore, queues: JobQueues, registry: JobRegistry, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._queues = queues
        self._registry = registry
        self._clock = clock

    def ended(self, jobs: Sequence[Job]) -> None:
        """Jobs the stream saw end, in order. Errors propagate: the stream delivers the batch again, and
        what was counted is not counted twice."""
        for job in jobs:
            if job.parent is not None:
                self._count(job)
            if job.pipeline is not None and job.status is not JobStatus.SUCCEEDED:
                self._cancel_children(job)

    def recount(self, parent: Job) -> bool:
        """A waiting parent's step counted again from its children (the reconciler, when their stream
        records were lost): each ended child not counted yet is counted, with the stream's own
        conditional write, so that nothing is counted twice whoever counts first. True when that moved
        the parent on."""
        state = parent.pipeline
        if parent.status is not JobStatus.WAITING or state is None or state.review is not None:
            return False
        steps = children_ids(parent)
        ids = steps[state.step] if state.step < len(steps) else []
        uncounted = [job_id for part, job_id in enumerate(ids) if part not in state.ended]
        moved = False
        for child in self._store.get_jobs(uncounted).values():
            if child.status.is_terminal and child.parent is not None:
                moved = self._count(child) or moved
        return moved

    def _count(self, child: Job) -> bool:
        """Count an ended child on its parent; True when the parent's message was sent (moved on)."""
        assert child.parent is not None
        now = int(self._clock() * 1000)
        counted = self._store.count_child(child, now)
        parent = counted.parent
        if parent is None or parent.pipeline is None or parent.pipeline.step != child.parent.step_index:
            return False  # gone, or moved on (or ended) since
        if parent.status is JobStatus.WAITING:
            if not self._step_over(parent):
                return False
            if not self._store.make_ready(parent, now):
                return False  # another count moved it on
        elif not (parent.status is JobStatus.QUEUED and not counted.counted):
            return False
        # Sent again when a count is seen again with the parent queued: its claim makes a duplicate harmless.
        # Moving a pipeline on calls no model: its message takes the interactive queue whatever its lane
        # (no batching window to wait out); its children keep its lane.
        self._queues[Lane.INTERACTIVE].send({"job_id": parent.job_id}, group_id=parent.user_id)
        return True

    def _step_over(self, parent: Job) -> bool:
        """Whether the parent's step has ended, or failed past what it tolerates."""
        state = parent.pipeline
        assert state is not None
        if state.step_ended:
            return True
        if not state.failed:
            return False
        definition = self._registry.definition(parent.job_type or "", parent.job_type_version)
        tolerated = definition.steps[state.step].max_failed if isinstance(definition, PipelineDefinition) else 0
        return len(state.failed) > tolerated

    def _cancel_children(self, parent: Job) -> None:
        assert parent.pipeline is not None
        now = int(self._clock() * 1000)
        steps = children_ids(parent)
        for job_id in steps[parent.pipeline.step] if parent.pipeline.step < len(steps) else []:
            try:
                self._store.request_cancel(job_id, now)
            except Exception as exc:
                log_unexpected("a child of an ended pipeline could not be cancelled", exc, job_id=job_id)
