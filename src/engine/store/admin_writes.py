"""Administration in DynamoDB: submissions, cancels, retries, and the reconciler's re-enqueue mark."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from engine.core import DEFAULT_DEADLINE_SECONDS, Job, JobStatus, NewJob
from engine.core.errors import (
    ConditionRefusedError,
    JobConflictError,
    JobNotFailedError,
    JobNotFoundError,
    JobStateError,
)
from engine.store.expressions import Expression
from engine.store.items import input_item, job_from_item, job_key, to_item
from engine.store.table import JobTable, creation_attributes, is_condition_failure


class AdminWrites(JobTable):
    def create_job(self, job_id: str, new_job: NewJob, job_input: dict[str, Any], now_ms: int) -> tuple[Job, bool]:
        """Create a `queued` job and store its input once; idempotent on the job id.

        Returns the job and whether this call created it. Raises JobConflictError when the id is
        taken by a different request.
        """
        deadline_at = now_ms + new_job.deadline_seconds * 1000
        input_put = Expression()
        input_put.condition = (
            f"attribute_not_exists({input_put.name('pk')})"
            f" OR {input_put.name('request_hash')} = {input_put.value('request_hash', new_job.request_hash)}"
        )
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=input_item(
                    job_id, self._stored_input(job_id, job_input), new_job.request_hash, self._expiry(deadline_at)
                ),
                **input_put.condition_params(),
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                raise JobConflictError(job_id) from exc
            raise
        attributes = creation_attributes(job_id, new_job, now_ms) | {
            "status": JobStatus.QUEUED.value,
            "attempt_count": 0,
            "claim_count": 0,
            "input_stored": True,
            "updated_at": now_ms,
        }
        item = job_key(job_id) | to_item(attributes)
        existing = self._put_if_absent(item)
        if existing is None:
            return job_from_item(item), True
        if existing.request_hash != new_job.request_hash:
            raise JobConflictError(job_id)
        return existing, False

    def request_cancel(self, job_id: str, now_ms: int) -> Job:
        """Cancel a job: a queued one, a waiting pipeline (whose children the events function then
        cancels) or one waiting in a provider's batch ends at once; a running one at its finishing fence.

        Returns the job after the request; a finished job is returned unchanged.
        """
        for _ in range(3):
            queued = self._transition(JobStatus.CANCELLED, None, now_ms)
            queued.set("cancel_requested", True)
            status = queued.name("status")
            queued.condition = (
                f"{status} = {queued.value('queued', JobStatus.QUEUED.value)}"
                f" OR {status} = {queued.value('waiting', JobStatus.WAITING.value)}"
                f" OR ({status} = {queued.value('running', JobStatus.RUNNING.value)}"
                f" AND attribute_exists({queued.name('batch')}))"
            )
            try:
                return self._update(queued, job_id)
            except ConditionRefusedError as exc:
                if exc.job is None:
                    raise JobNotFoundError(job_id) from exc
                if exc.job.status.is_terminal:
                    return exc.job
            running = Expression()
            running.set("cancel_requested", True)
            running.set("updated_at", now_ms)
            running.condition = f"{running.name('status')} = {running.value('running', JobStatus.RUNNING.value)}"
            try:
                return self._update(running, job_id)
            except ConditionRefusedError:
                continue  # it was released or finished meanwhile: look again
        raise ConditionRefusedError(f"job {job_id} kept changing while it was being cancelled", None)

    def requeue_failed_job(self, job_id: str, now_ms: int) -> Job:
        """Put a failed job back to `queued` with a fresh attempt budget and deadline (`aijobs retry`).

        Only a job whose input is stored can run again; the input's lifetime restarts with the new
        deadline (its item's TTL, and its payload's when it is in the bucket). The caller enqueues
        its message. A pipeline is marked to run again what did not succeed (`pipeline_rerun`, read by
        its next claim: engine.pipelines).
        """
        response = self._client.get_item(TableName=self.table_name, Key=job_key(job_id), ConsistentRead=True)
        if "Item" not in response:
            raise JobNotFoundError(job_id)
        job = job_from_item(response["Item"])
        deadline_at = now_ms + (job.deadline_seconds or DEFAULT_DEADLINE_SECONDS) * 1000
        expr = self._requeued(job_id, deadline_at, now_ms)
        if job.pipeline is not None:
            expr.set("pipeline_rerun", True)
        expr.condition = (
            f"{expr.name('status')} = {expr.value('failed', JobStatus.FAILED.value)}"
            f" AND {expr.name('input_stored')} = {expr.value('true', True)}"
        )
        try:
            requeued = self._update(expr, job_id)
        except ConditionRefusedError as exc:
            current = exc.job or job
            if current.status is not JobStatus.FAILED:
                raise JobNotFailedError(
                    f"job {job_id} is {current.status.value}; only a failed job can be retried"
                ) from exc
            raise JobStateError(f"job {job_id} has no stored input to run again") from exc
        self._extend_input(job_id, self._expiry(deadline_at))
        return requeued

    def touch_job(self, job: Job, now_ms: int) -> bool:
        """Mark an open job as just re-enqueued; False when it changed since it was read.

        Fenced on the status and claim count it was read with: a worker that claimed it meanwhile wins.
        """
        expr = Expression()
        expr.set("updated_at", now_ms)
        expr.condition = self._fenced_on_read(expr, job)
        try:
            self._update(expr, job.job_id)
        except ConditionRefusedError:
            return False
        return True
