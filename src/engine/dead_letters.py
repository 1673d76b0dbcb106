"""Dead letters: what reached the dead-letter queue is kept, and its job ends `failed`.

Every message is first stored durably (body, attributes, receive count) — also garbage that
names no job. A message that cannot be stored raises, so that it stays on the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from engine.config import get_settings
from engine.definitions import JobRegistry
from engine.errors import ErrorCode
from engine.intake import BadMessageError, parse_message
from engine.models import JobErrorInfo, JobStatus
from engine.observability import logger, metrics
from engine.store import JobStore


class DeadLetterRecorder:
    def __init__(self, store: JobStore, registry: JobRegistry, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._registry = registry
        self._clock = clock

    def handle_record(self, record: SQSRecord) -> str:
        """The record handler of the dead-letter queue's batch processor."""
        receive_count = int(record.attributes.approximate_receive_count or 0)
        outcome = self.record(
            record.message_id, record.body, dict(record.raw_event.get("attributes") or {}), receive_count
        )
        metrics.add_metric(name="Jobs_dead_lettered", unit=MetricUnit.Count, value=1)
        return outcome

    def record(self, message_id: str, body: str, attributes: dict[str, str], receive_count: int) -> str:
        now = self._now_ms()
        reason = f"reached the dead-letter queue after {receive_count} receives"
        self._store.record_dead_letter(message_id, body, attributes, receive_count, reason, now)
        job_id: str | None
        request_hash: str | None = None
        try:
            request = parse_message(body, message_id, self._registry)
            job_id, carried_input = request.job_id, request.raw_input
            request_hash = request.new_job.request_hash if request.new_job else None
        except BadMessageError as bad:
            job_id, carried_input = bad.job_id, None
        job = self._store.get_job(job_id) if job_id else None
        if job is None or job.status.is_terminal:
            return "recorded"
        if request_hash is not None and request_hash != job.request_hash:
            return "recorded"  # another request under the same id: the job is not this message's
        if job.lease_remaining_ms(now) > 0:
            return "held"  # a worker still runs it and will finish it
        if job.cancel_requested:
            return "cancelled" if self._store.settle_job(job, JobStatus.CANCELLED, None, now) else "recorded"
        error = JobErrorInfo(ErrorCode.DEAD_LETTERED, reason, retryable=False)
        store_input = carried_input if not job.input_stored else None
        if self._store.settle_job(job, JobStatus.FAILED, error, now, store_input):
            logger.warning("job failed as dead-lettered", extra={"job_id": job.job_id, "message_id": message_id})
            return "failed"
        return "recorded"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


@lru_cache(maxsize=1)
def get_recorder() -> DeadLetterRecorder:
    settings = get_settings()
    return DeadLetterRecorder(JobStore.from_settings(settings), JobRegistry.from_settings(settings))
