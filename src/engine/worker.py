"""The worker behind the Lambda handler: a batch of SQS records run concurrently through the runner.

Records of one batch run side by side in a thread pool (the provider call dominates), with
Powertools' batch processing reporting the ones to retry as `batchItemFailures`.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.core import Delivery, Retry
from engine.observability import log_unexpected, metrics
from engine.queue import JobQueue
from engine.retry import MAX_DELAY_SECONDS
from engine.runner import JobRunner

# The worker function's Timeout in template.yaml, and the jobs queue's VisibilityTimeout (6 x it,
# as AWS advises for SQS event sources); a test ties both to the template.
FUNCTION_TIMEOUT_SECONDS = 300
QUEUE_VISIBILITY_SECONDS = 6 * FUNCTION_TIMEOUT_SECONDS
# A batch holds at most 10 SQS records; each gets a thread of its own.
BATCH_CONCURRENCY = 10
# Kept back from what SQS would still accept, for the time between this reckoning and the call.
VISIBILITY_MARGIN_SECONDS = 10


def visibility_limit_seconds(record: SQSRecord, invoked_at: float, now: float) -> int:
    """The longest visibility SQS accepts for this receipt: 12 hours from when it was received.

    The receive itself is not in the record. It happened after the message's first receive, and
    no earlier than the queue's visibility timeout before this invocation (an older receipt has
    expired anyway), so the later of the two bounds it from below; on a first receive it is exact.
    """
    first_received = int(record.attributes.approximate_first_receive_timestamp or 0) / 1000
    received_after = max(first_received, invoked_at - QUEUE_VISIBILITY_SECONDS)
    elapsed = max(now - received_after, 0.0)
    return max(MAX_DELAY_SECONDS - math.ceil(elapsed) - VISIBILITY_MARGIN_SECONDS, 0)


class RecordRetryError(Exception):
    """Raised for a record that must come back later; Powertools reports it as a batch item failure."""


class Worker:
    def __init__(self, runner: JobRunner, queue: JobQueue, concurrency: int = BATCH_CONCURRENCY) -> None:
        self._runner = runner
        self._queue = queue
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="aijobs-record")

    def handle(self, event: dict[str, Any], context: LambdaContext | None) -> dict[str, Any]:
        invoked_at = time.time()
        remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
        # A processor per call: it holds the batch's state, and local workers call concurrently.
        processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

        async def record_handler(record: SQSRecord) -> str:
            loop = asyncio.get_running_loop()
            delivery = Delivery(
                message_id=record.message_id,
                body=record.body,
                receive_count=int(record.attributes.approximate_receive_count or 1),
                attributes=dict(record.raw_event.get("attributes") or {}),
            )
            disposition = await loop.run_in_executor(self._executor, self._runner.process, delivery, remaining_ms)
            metrics.add_metric(name=f"Jobs_{disposition.fate.value}", unit=MetricUnit.Count, value=1)
            if isinstance(disposition, Retry):
                limit = visibility_limit_seconds(record, invoked_at, time.time())
                seconds = min(disposition.visibility_seconds, limit)
                await loop.run_in_executor(self._executor, self._hide, record, seconds)
                raise RecordRetryError(disposition.reason)
            return disposition.fate.value

        result: dict[str, Any] = dict(async_process_partial_response(event, record_handler, processor, context))
        return result

    def _hide(self, record: SQSRecord, seconds: int) -> None:
        try:
            self._queue.change_visibility(record.receipt_handle, seconds)
        except Exception as exc:
            # The record still comes back, after the queue's own visibility timeout.
            log_unexpected("could not set the message's visibility", exc, message_id=record.message_id)
