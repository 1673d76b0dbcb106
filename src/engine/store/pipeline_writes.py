"""The pipelines' writes (docs/pipelines.md): a child's end counted on its parent once, the parent made
ready for its next step once, and a person's review decided once.

- count_child: one UpdateItem of the parent, adding the child's part to the step's `pipeline_ended`
  (and `pipeline_failed`) number sets and its usage to the parent's, conditional on the parent
  waiting on that step and the part not counted yet: a stream record delivered again counts nothing.
- make_ready: `waiting -> queued`, conditional on the step: however many callers see the step end,
  one moves the parent on (and sends its message).
- decide_review: `waiting -> succeeded | failed`, fenced on the job as it was read.
"""

from __future__ import annotations

import json
from decimal import Decimal

from engine.core import Counted, Job, JobErrorInfo, JobStatus, Review
from engine.core.errors import ConditionRefusedError, PipelineStateError
from engine.store.expressions import Expression
from engine.store.items import review_document
from engine.store.table import JobTable


class PipelineWrites(JobTable):
    def count_child(self, child: Job, now_ms: int) -> Counted:
        """Count an ended child on its parent, with its usage: once, whoever asks again."""
        assert child.parent is not None
        assert child.status.is_terminal
        parent = child.parent
        expr = Expression()
        part = {parent.part}
        expr.add("pipeline_ended", part)
        if child.status is not JobStatus.SUCCEEDED:
            expr.add("pipeline_failed", part)
        usage = child.usage
        expr.add("input_tokens", usage.input_tokens)
        expr.add("output_tokens", usage.output_tokens)
        expr.add("cost_usd", Decimal(usage.cost_usd))
        expr.add("standard_cost_usd", Decimal(usage.standard_cost_usd))
        expr.add("usage_attempts", usage.attempts)
        for name in ("cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens"):
            if count := getattr(usage, name):
                expr.add(name, count)
        expr.set("updated_at", now_ms)
        ended = expr.name("pipeline_ended")
        expr.condition = (
            f"{expr.name('status')} = {expr.value('waiting', JobStatus.WAITING.value)}"
            f" AND {expr.name('pipeline_step')} = {expr.value('step', parent.step_index)}"
            f" AND NOT contains({ended}, {expr.value('part', parent.part)})"
        )
        try:
            return Counted(self._update(expr, parent.parent_id), True)
        except ConditionRefusedError as exc:
            return Counted(exc.job, False)

    def make_ready(self, parent: Job, now_ms: int) -> bool:
        """Move a waiting parent whose step ended (or failed past what it tolerates) to `queued`, once:
        False when it was moved already, or changed."""
        assert parent.pipeline is not None
        expr = self._transition(JobStatus.QUEUED, None, now_ms)
        expr.condition = (
            f"{expr.name('status')} = {expr.value('waiting', JobStatus.WAITING.value)}"
            f" AND {expr.name('pipeline_step')} = {expr.value('step', parent.pipeline.step)}"
        )
        try:
            self._update(expr, parent.job_id)
        except ConditionRefusedError:
            return False
        return True

    def decide_review(
        self,
        job: Job,
        review: Review,
        output: dict[str, object] | None,
        output_hash: str | None,
        error: JobErrorInfo | None,
        now_ms: int,
    ) -> Job:
        """End a pipeline waiting for its review: `succeeded` with `output`, or `failed` with `error`, the
        decision kept on the job. Fenced on the job as it was read: PipelineStateError when it changed."""
        status = JobStatus.SUCCEEDED if error is None else JobStatus.FAILED
        expr = self._transition(status, error, now_ms)
        expr.set("review", review_document(review))
        if output is not None and output_hash is not None:
            expr.set("output", json.dumps(output, separators=(",", ":"), ensure_ascii=False))
            expr.set("output_hash", output_hash)
        expr.condition = self._fenced_on_read(expr, job) + f" AND attribute_exists({expr.name('review')})"
        try:
            return self._update(expr, job.job_id)
        except ConditionRefusedError as exc:
            now = exc.job.status.value if exc.job else "gone"
            raise PipelineStateError(f"job {job.job_id} changed while its review was decided (now {now})") from exc
