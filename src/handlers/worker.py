"""Lambda entry point of the jobs queues: SQS records in, a partial batch response out.

The engine's worker runs the batch (engine.worker). This module handles the Lambda side: records become
deliveries, each Retry hides its message for its time (as far as SQS allows), and Powertools reports
those records as batch item failures.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.config import Settings
from engine.core import Lane, Retry
from engine.observability import Event, Handle, count, log_unexpected
from engine.queue import JobQueue, JobQueues
from engine.retry import MAX_DELAY_SECONDS
from engine.wiring import build_worker, entry_point
from engine.worker import BATCH_CONCURRENCY, Worker
from handlers.invocation import remaining_time
from handlers.sqs import delivery_of

# The worker function's Timeout in template.yaml, and the jobs queue's VisibilityTimeout (6 x it,
# as AWS advises for SQS event sources); a test ties both to the template.
FUNCTION_TIMEOUT_SECONDS = 300
QUEUE_VISIBILITY_SECONDS = 6 * FUNCTION_TIMEOUT_SECONDS
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


class WorkerHandler:
    """The worker function: a batch of one queue's records through the engine's worker."""

    def __init__(self, worker: Worker, queue: JobQueue | JobQueues, clock: Callable[[], float] = time.time) -> None:
        self._worker = worker
        self._queues = JobQueues.of(queue)
        self._clock = clock
        self._hiding = ThreadPoolExecutor(max_workers=BATCH_CONCURRENCY, thread_name_prefix="aijobs-hide")

    def handle(self, event: Event, context: LambdaContext | None) -> dict[str, Any]:
        invoked_at = self._clock()
        records = event.get("Records") or []
        # A batch comes from one queue: its lane is the lane of the jobs its messages do not say.
        lane = self._queues.lane_of(records[0].get("eventSourceARN") if records else None)
        deliveries = [delivery_of(SQSRecord(record), lane) for record in records]
        # A processor per call: it holds the batch's state, and local workers call concurrently.
        processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
        with self._worker.running(deliveries, remaining_time(context)) as dispositions:
            of_record = {id(record): disposition for record, disposition in zip(records, dispositions, strict=True)}

            async def record_handler(record: SQSRecord) -> str:
                disposition = await asyncio.wrap_future(of_record[id(record.raw_event)])
                count(f"Jobs_{disposition.fate.value}")
                if isinstance(disposition, Retry):
                    limit = visibility_limit_seconds(record, invoked_at, self._clock())
                    seconds = min(disposition.visibility_seconds, limit)
                    await asyncio.get_running_loop().run_in_executor(self._hiding, self._hide, record, lane, seconds)
                    raise RecordRetryError(disposition.reason)
                return disposition.fate.value

            return dict(async_process_partial_response(event, record_handler, processor, context))

    def _hide(self, record: SQSRecord, lane: Lane, seconds: int) -> None:
        try:
            self._queues[lane].change_visibility(record.receipt_handle, seconds)
        except Exception as exc:
            # The record still comes back, after the queue's own visibility timeout.
            log_unexpected("could not set the message's visibility", exc, message_id=record.message_id)


def build(settings: Settings) -> Handle:
    worker, queues = build_worker(settings)
    return WorkerHandler(worker, queues).handle


lambda_handler = entry_point(build)
