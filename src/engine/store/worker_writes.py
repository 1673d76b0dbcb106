"""The worker's path in DynamoDB: the claim (one UpdateItem) and the finish (one fenced write)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from engine.aws_errors import CONDITION_FAILED, cancellation_codes
from engine.core import (
    TERMINAL_STATUSES,
    AttemptRecord,
    BatchTerms,
    Cancelled,
    ChildOf,
    Job,
    JobErrorInfo,
    JobStatus,
    Lane,
    NewJob,
    Outcome,
    Released,
    Reusable,
    Settlement,
    Succeeded,
    Usage,
    Waits,
    can_transition,
    explain_claim_refusal,
    outcome_error,
    target_status,
)
from engine.core.attachments import AttachmentInfo
from engine.core.errors import (
    CancelRequestedError,
    ClaimRefusedError,
    ConditionRefusedError,
    ConfigurationError,
    JobNotFoundError,
    LeaseLostError,
)
from engine.observability import log_unexpected
from engine.store.expressions import Expression
from engine.store.items import MAX_REFUSED_ANSWER_CHARS, Item, attempt_item, job_key, reuse_item, review_document
from engine.store.payloads import REUSE_INLINE_BYTES, refused_answer_key, reused_answer_key
from engine.store.table import JobTable, creation_attributes

# A child kept changing between ended and open while a late attempt's usage was kept: give up (the caller
# goes over it again).
_ORPHAN_TRIES = 3


class WorkerWrites(JobTable):
    def claim_job(
        self,
        job_id: str,
        owner: str,
        lease_ms: int,
        now_ms: int,
        new_job: NewJob | None,
        batch: BatchTerms | None = None,
    ) -> Job:
        """Take the job for `owner` until now + lease: one UpdateItem, ALL_NEW on success.

        With `new_job` the item is created when absent; without it the job must exist already.
        The condition is engine.core.job.claimable, written as a condition expression. With `batch`
        the job joins a provider's batch (docs/batches.md): only if its deadline is far enough, and
        held until the terms' time before its deadline.
        """
        expr = Expression()
        expr.set("status", JobStatus.RUNNING.value)
        expr.set("lease_owner", owner)
        if batch is None:
            expr.set("lease_expires_at", now_ms + lease_ms)
            expr.remove("batch")
        else:
            new_deadline = now_ms + new_job.deadline_seconds * 1000 if new_job else now_ms
            expr.subtract("lease_expires_at", batch.lease_before_deadline_ms, new_deadline, source="deadline_at")
            expr.set("batch", batch.window)
        expr.set("updated_at", now_ms)
        expr.set_if_absent("started_at", now_ms)
        expr.add("attempt_count", 1)
        expr.add("claim_count", 1)
        claimable = _claimable(expr, now_ms)
        if batch is not None:
            claimable += (
                f" AND {expr.name('deadline_at')} >= {expr.value('eligible_at', batch.eligible_at_ms)}"
                f" AND {expr.name('lane')} = {expr.value('background', Lane.BACKGROUND.value)}"
            )
        if new_job is None:
            expr.condition = f"attribute_exists({expr.name('pk')}) AND {claimable}"
        else:
            for attribute, value in creation_attributes(job_id, new_job, now_ms).items():
                expr.set_if_absent(attribute, value)
            expr.set_if_absent("input_stored", False)
            same_request = f"{expr.name('request_hash')} = {expr.value('request_hash', new_job.request_hash)}"
            expr.condition = f"attribute_not_exists({expr.name('pk')}) OR ({same_request} AND {claimable})"
        try:
            return self._update(expr, job_id)
        except ConditionRefusedError as exc:
            if exc.job is None:
                raise JobNotFoundError(job_id) from exc
            request_hash = new_job.request_hash if new_job else None
            raise ClaimRefusedError(exc.job, explain_claim_refusal(exc.job, now_ms, request_hash, batch)) from exc

    def finish_job(
        self,
        job: Job,
        outcome: Outcome,
        now_ms: int,
        attempt: AttemptRecord | None = None,
        store_input: dict[str, Any] | None = None,
        settlement: Settlement | None = None,
        attachments_read: tuple[AttachmentInfo, ...] = (),
    ) -> None:
        """Write the attempt's outcome, fenced on this worker's lease: one request.

        The job update, the attempt record, (for a failed job whose input only the message held) the
        input, (for a batched claim) its budget's settlement and (for an answer kept for reuse) the
        answer's item go together in one TransactWriteItems; alone, the update is an UpdateItem.
        `job.job_type_version` is recorded when the item lacks one.
        """
        target = target_status(outcome)
        if not can_transition(job.status, target):
            raise ValueError(f"job {job.job_id}: {job.status} -> {target} is not a transition")
        expr = self._transition(target, outcome_error(outcome), now_ms)
        match outcome:
            case Succeeded(output=output, output_hash=output_hash, reused_from=reused_from):
                expr.set("output", json.dumps(output, separators=(",", ":"), ensure_ascii=False))
                expr.set("output_hash", output_hash)
                expr.remove("error")
                if reused_from is not None:
                    expr.set("reused_from", reused_from)
            case Released(refund_attempt=True):
                expr.add("attempt_count", -1)
            case Waits(step=step, children=children, counts=counts, review=review, ended=ended, usage=usage):
                # Moving a pipeline on is not an attempt at a model: the claim is refunded.
                expr.add("attempt_count", -1)
                expr.set("pipeline_step", step)
                expr.set("pipeline_children", children)
                expr.set("pipeline_counts", list(counts))
                expr.remove("pipeline_failed")
                if ended:  # (a step run again keeps its succeeded children: a number set is never empty)
                    expr.set("pipeline_ended", set(ended))
                else:
                    expr.remove("pipeline_ended")
                if usage != Usage():
                    self._add_children_usage(expr, usage)
                if review is not None:
                    expr.set("review", review_document(review))
                else:
                    expr.remove("review")
        if attempt:
            self._add_usage(expr, attempt)
        if job.pipeline is not None and job.pipeline.rerun:
            expr.remove("pipeline_rerun")  # the retried pipeline's claim has read it
        if attachments_read:
            expr.set("attachments_read", [info.document() for info in attachments_read])
        if job.job_type_version is not None:
            # A job created without its data job type's version (a submission, then a message of only
            # its id) records the one its first claim ran; one it has already stays.
            expr.set_if_absent("job_type_version", job.job_type_version)
        expr.condition = (
            f"{expr.name('lease_owner')} = {expr.value('owner', job.lease_owner)}"
            f" AND {expr.name('status')} = {expr.value('running', JobStatus.RUNNING.value)}"
        )
        if not isinstance(outcome, Cancelled):
            # A cancel requested meanwhile wins over any other outcome (docs/architecture.md).
            expr.condition += f" AND {expr.name('cancel_requested')} = {expr.value('false', False)}"
        puts = [attempt_item(self._kept_whole(attempt), self._expiry(now_ms))] if attempt else []
        if isinstance(outcome, Succeeded) and outcome.kept is not None:
            puts += self._kept_answer(outcome.kept, job.job_id, now_ms)
        try:
            self._write(expr, job, puts, store_input, now_ms, settlement)
        except ConditionRefusedError as exc:
            current = exc.job
            if current and current.lease_owner == job.lease_owner and current.cancel_requested:
                raise CancelRequestedError(job.job_id) from exc
            raise LeaseLostError(f"job {job.job_id}: the lease of {job.lease_owner} was lost", current) from exc

    def _kept_whole(self, attempt: AttemptRecord) -> AttemptRecord:
        """The attempt with its refused answer, when too long for the record (which keeps its first
        MAX_REFUSED_ANSWER_CHARS), put whole in the payload bucket, where it expires with the table's
        retention. The answer is the attempt's detail, not its outcome: a put that fails leaves the
        record with the cut answer only, and the outcome is written all the same."""
        answer = attempt.refused_answer
        if answer is None or len(answer) <= MAX_REFUSED_ANSWER_CHARS or self._payloads is None:
            return attempt
        key = refused_answer_key(attempt.job_id, attempt.attempt)
        try:
            self._payloads.put(key, answer.encode("utf-8", "replace"), "text/plain; charset=utf-8")
        except (BotoCoreError, ClientError) as exc:
            log_unexpected("a refused answer could not be kept whole; its record keeps its start", exc)
            return attempt
        return replace(attempt, refused_answer_s3=f"s3://{self._payloads.bucket}/{key}")

    def _kept_answer(self, kept: Reusable, job_id: str, now_ms: int) -> list[Item]:
        """The item keeping a paid answer for reuse, put over any kept under its key: until its job type's
        reuse_seconds pass, within the table's retention (which the payload bucket's lifecycle follows).
        Past REUSE_INLINE_BYTES the answer goes to the payload bucket first; one that cannot go is not
        kept, and the finish is written all the same (a later job of the request calls the model)."""
        until = now_ms + min(kept.seconds * 1000, self._retention_ms)
        data = kept.answer.encode("utf-8", "replace")
        stored = {"answer": kept.answer}
        if len(data) > REUSE_INLINE_BYTES:
            key = reused_answer_key(kept.key, job_id)
            try:
                self._payload_store().put(key, data)
            except (BotoCoreError, ClientError, ConfigurationError) as exc:
                log_unexpected("a paid answer could not be kept for reuse; the job finishes all the same", exc)
                return []
            stored = {"answer_key": key}
        return [reuse_item(kept, job_id, stored, now_ms, until)]

    def end_job(
        self,
        job: Job,
        status: JobStatus,
        error: JobErrorInfo | None,
        now_ms: int,
        store_input: dict[str, Any] | None = None,
    ) -> bool:
        """End a job that no worker holds (spent, past its deadline, cancel requested).

        Fenced on the status and claim count it was read with; False when it changed meanwhile.
        """
        if not can_transition(job.status, status):
            raise ValueError(f"job {job.job_id}: {job.status} -> {status} is not a transition")
        expr = self._transition(status, error, now_ms)
        expr.condition = self._fenced_on_read(expr, job)
        try:
            self._write(expr, job, [], store_input, now_ms)
        except ConditionRefusedError:
            return False
        return True

    def record_orphan_attempt(
        self,
        attempt: AttemptRecord,
        now_ms: int,
        settlement: Settlement | None = None,
        parent: ChildOf | None = None,
    ) -> bool:
        """Keep the usage of an attempt whose result was discarded (its lease was lost, or its batch
        answered a job it no longer held): the job's usage, the attempt record put only where none of
        its number is, and the settlement, in one transaction. False when the record was there already
        (a write sent again, a batch's conclusion gone over again).

        A pipeline's child (`parent`) that has ended was counted on its parent (or will be, from the
        stream record of the write that ended it, which this usage is not in): the same transaction
        adds the usage to the parent too, so that the parent's usage stays its children's sum. Whether
        the child has ended is its condition, and a refusal, which returns the child as it is, says
        which write to send instead."""
        ended, tries = parent is not None, 1  # a child's late answer most often finds it ended with its pipeline
        while True:
            try:
                return self._record_orphan(attempt, now_ms, settlement, parent, ended)
            except ConditionRefusedError as exc:
                changed = parent is not None and exc.job is not None and exc.job.status.is_terminal is not ended
                if not changed or tries == _ORPHAN_TRIES:
                    raise
                ended, tries = not ended, tries + 1

    def _record_orphan(
        self, attempt: AttemptRecord, now_ms: int, settlement: Settlement | None, parent: ChildOf | None, ended: bool
    ) -> bool:
        expr = Expression()
        self._add_usage(expr, attempt)
        expr.condition = f"attribute_exists({expr.name('pk')})"
        if parent is not None:
            terminal = ", ".join(expr.value(status.value, status.value) for status in sorted(TERMINAL_STATUSES))
            test = f"{expr.name('status')} IN ({terminal})"
            expr.condition += f" AND {test}" if ended else f" AND NOT {test}"
        others = [self._settled(expr, settlement)] if settlement is not None else []
        record = {
            "Put": {
                "TableName": self.table_name,
                "Item": attempt_item(self._kept_whole(attempt), self._expiry(now_ms)),
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        if parent is not None and ended:
            counted = Expression()
            self._add_children_usage(counted, Usage().plus(attempt))
            counted.set("updated_at", now_ms)
            counted.condition = f"attribute_exists({counted.name('pk')})"
            others.append({"Update": counted.update_params(self.table_name, job_key(parent.parent_id))})
        try:
            self._transact(expr.update_params(self.table_name, job_key(attempt.job_id)), [], [record, *others])
        except ClientError as exc:
            if cancellation_codes(exc)[1:2] == [CONDITION_FAILED]:
                return False
            raise
        return True

    def settle_reservation(self, job_id: str, settlement: Settlement, now_ms: int) -> bool:
        """Give back a batched claim's reservation once: its claim marked settled on the job, and the
        budget moved, in one transaction fenced on the mark."""
        if not settlement.returned_usd:
            raise ValueError("a settlement of a reservation gives something back")
        expr = Expression()
        expr.condition = f"attribute_exists({expr.name('pk')})"
        others = [self._settled(expr, settlement)]
        try:
            self._transact(expr.update_params(self.table_name, job_key(job_id)), [], others)
        except ConditionRefusedError:
            return False
        return True


def _claimable(expr: Expression, now_ms: int) -> str:
    """engine.core.job.claimable as a condition expression."""
    status, lease = expr.name("status"), expr.name("lease_expires_at")
    now = expr.value("now", now_ms)
    return (
        f"({status} = {expr.value('queued', JobStatus.QUEUED.value)}"
        f" OR ({status} = {expr.value('running', JobStatus.RUNNING.value)} AND {lease} < {now}))"
        f" AND {expr.name('cancel_requested')} = {expr.value('false', False)}"
        f" AND {expr.name('attempt_count')} < {expr.name('max_attempts')}"
        f" AND {expr.name('deadline_at')} > {now}"
    )
