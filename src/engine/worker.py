"""The worker behind the Lambda handler: a batch of SQS records run concurrently through the runner.

Records of one batch run side by side in a thread pool (the provider call dominates), with
Powertools' batch processing reporting the ones to retry as `batchItemFailures`. With shared
limits or budgets configured (engine.fleet), the batch goes in three steps: its jobs are claimed
side by side, admitted together (one reservation per user, one take per model), each running as
soon as it is admitted, background jobs as capacity comes; when the batch is done, what the calls
did not use is settled. A batch comes from one lane's queue (docs/lanes.md): its retries are hidden
on that queue. With the providers' batch APIs on (docs/batches.md), a background batch's jobs whose
deadlines allow it are claimed into a provider's batch and kept for it (engine.batching.intake)
instead of run.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.batching.intake import Batched, BatchIntake, Keeping, NotKept, Planner, RunNow
from engine.core import Ack, BatchTerms, Delivery, Disposition, Fate, Lane, Retry
from engine.core.errors import InternalError
from engine.decisions import RETRY_SOON_SECONDS
from engine.fleet.admission import Admission, Ask, Verdict
from engine.observability import log_unexpected, metrics
from engine.queue import REALTIME_ROUTE, ROUTE_ATTRIBUTE, JobQueue, JobQueues
from engine.retry import MAX_DELAY_SECONDS, backoff_seconds
from engine.runner import FINISH_MARGIN_MS, Claimed, JobRunner, RemainingMs

# What the claim phase left for a record: the job to run, or already its disposition.
Step = Claimed | Disposition

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
    def __init__(
        self,
        runner: JobRunner,
        queue: JobQueue | JobQueues,
        concurrency: int = BATCH_CONCURRENCY,
        admission: Admission | None = None,
        planner: Planner | None = None,
        batching: BatchIntake | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._runner = runner
        self._queues = JobQueues.of(queue)
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="aijobs-record")
        # Shared limits and budgets (engine.fleet): None when neither is configured.
        self._admission = admission
        self._planner = planner
        # The providers' batch APIs (docs/batches.md): None when off.
        self._batching = batching
        self._rng = rng or random.Random()

    def handle(self, event: dict[str, Any], context: LambdaContext | None) -> dict[str, Any]:
        invoked_at = time.time()
        remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
        records = event.get("Records") or []
        # A batch comes from one queue: its lane is the lane of the jobs its messages do not say.
        lane = self._queues.lane_of(records[0].get("eventSourceARN") if records else None)
        # Shared limits, or someone capped: the batch is claimed, admitted and run in steps.
        admission = self._admission if self._admission is not None and self._admission.active() else None
        # Background jobs may go to a provider's batch: claimed with its terms, then kept for it.
        batching = self._batching if lane is Lane.BACKGROUND else None
        steps: dict[int, Step] = {}
        phased = admission is not None or batching is not None
        if phased:
            steps = self._claim(records, lane, remaining_ms, batching.terms() if batching else None)
        if batching is not None:
            steps |= self._keep_batched(batching, steps, admission, remaining_ms)
        verdicts = self._admit(admission, steps, remaining_ms) if admission else {}
        settled: set[int] = set()
        # A processor per call: it holds the batch's state, and local workers call concurrently.
        processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

        async def record_handler(record: SQSRecord) -> str:
            loop = asyncio.get_running_loop()
            step = steps.get(id(record.raw_event))
            if isinstance(step, Claimed):
                admitted = verdicts.get(id(step))
                verdict: Verdict | None = None
                if admitted is not None:
                    verdict = await asyncio.wrap_future(admitted)
                run = partial(self._runner.run, step, remaining_ms, verdict)
                disposition = await loop.run_in_executor(self._executor, run)
                if verdict is not None and admission is not None and isinstance(disposition, Retry):
                    # The job is queued again: what it holds of its user's budget goes back before its
                    # message can come back, lest its next claim find the budget still reserved.
                    settled.add(id(step))
                    await loop.run_in_executor(self._executor, admission.settle, [verdict])
            elif step is not None:  # decided when it was claimed (or kept for a provider's batch)
                disposition = step
            elif not phased:  # no shared limits, budgets or batches: each record runs whole
                disposition = await loop.run_in_executor(
                    self._executor, self._runner.process, delivery_of(record, lane), remaining_ms
                )
            else:  # not one of the event's records as claimed: nothing done, it comes back
                disposition = Retry(Fate.ERROR, RETRY_SOON_SECONDS, "record not claimed with its batch")
            metrics.add_metric(name=f"Jobs_{disposition.fate.value}", unit=MetricUnit.Count, value=1)
            if isinstance(disposition, Retry):
                limit = visibility_limit_seconds(record, invoked_at, time.time())
                seconds = min(disposition.visibility_seconds, limit)
                await loop.run_in_executor(self._executor, self._hide, record, lane, seconds)
                raise RecordRetryError(disposition.reason)
            return disposition.fate.value

        try:
            result: dict[str, Any] = dict(async_process_partial_response(event, record_handler, processor, context))
        finally:
            if admission is not None and verdicts:
                admission.settle(
                    [
                        admitted.result()
                        for key, admitted in verdicts.items()
                        if key not in settled and admitted.done() and admitted.exception() is None
                    ]
                )
        return result

    def _claim(
        self, records: list[dict[str, Any]], lane: Lane, remaining_ms: RemainingMs | None, batch: BatchTerms | None
    ) -> dict[int, Step]:
        """Claim the batch's jobs side by side: each record's claimed job, or already its disposition."""
        deliveries = [delivery_of(SQSRecord(record), lane) for record in records]
        claims = self._executor.map(partial(self._runner.claim, remaining_ms=remaining_ms, batch=batch), deliveries)
        return {id(record): step for record, step in zip(records, claims, strict=True)}

    def _keep_batched(
        self,
        batching: BatchIntake,
        steps: dict[int, Step],
        admission: Admission | None,
        remaining_ms: RemainingMs | None,
    ) -> dict[int, Step]:
        """The dispositions of the jobs claimed into a provider's batch, once kept for it."""
        batched = [(key, step) for key, step in steps.items() if isinstance(step, Claimed) and step.job.batch]
        if not batched:
            return {}
        kept = batching.keep([step for _, step in batched], admission)
        return {
            key: self._keeping(step, keeping, remaining_ms) for (key, step), keeping in zip(batched, kept, strict=True)
        }

    def _keeping(self, step: Claimed, keeping: Keeping, remaining_ms: RemainingMs | None) -> Disposition:
        """What becomes of a job claimed into a batch, once the intake said what it did with it."""
        match keeping:
            case Batched():
                return Ack(Fate.BATCHED)
            case RunNow(verdict=verdict):
                return self._runner.run(step, remaining_ms, verdict)
            case NotKept():
                # Queued again (it may not wait for a batch that does not know it); its message comes
                # back after a backoff, since its part could not be written.
                retry = Retry(Fate.ERROR, backoff_seconds(step.delivery.receive_count, self._rng), "not kept")
                try:
                    handed = self._runner.hand_back(step.job, InternalError("it could not be kept for its batch"))
                except Exception as exc:
                    log_unexpected("a job that could not be kept for its batch is still held", exc)
                    return retry
                return retry if isinstance(handed, Retry) else handed

    def _admit(
        self, admission: Admission, steps: dict[int, Step], remaining_ms: RemainingMs | None
    ) -> dict[int, Future[Verdict]]:
        """The batch's claimed jobs' budgets and capacity (engine.fleet.admission): a verdict each, as
        soon as it is known; those waiting for capacity that can come within the invocation wait."""
        claimed = [step for step in steps.values() if isinstance(step, Claimed)]
        if self._planner is None or not claimed:
            return {}
        planned: list[tuple[Claimed, Ask]] = []
        for step in claimed:
            try:
                plan = self._planner(step.definition, step.job_input, step.attachments)
            except Exception as exc:
                # The job type's own code (its prompt, its schema) failed: the job runs unadmitted,
                # where its attempt fails the same way before any call and the runner records it.
                log_unexpected("a job could not be planned", exc, job_id=step.job.job_id)
                continue
            planned.append((step, Ask(step.job.user_id, plan, step.job.lane)))
        if not planned:
            return {}
        call_within = None
        if remaining_ms is not None:
            # A job must call by then to have its timeout and the finishing write within the invocation.
            longest = max(step.definition.timeout_seconds for step, _ in planned) * 1000
            call_within = int(max(remaining_ms() - longest - FINISH_MARGIN_MS, 0))
        verdicts: list[Future[Verdict]] = [Future() for _ in planned]
        threading.Thread(
            target=admission.admit_as_capacity_comes,
            args=([ask for _, ask in planned], call_within, lambda index, verdict: verdicts[index].set_result(verdict)),
            name="aijobs-admission",
            daemon=True,
        ).start()
        return {id(step): verdict for (step, _), verdict in zip(planned, verdicts, strict=True)}

    def _hide(self, record: SQSRecord, lane: Lane, seconds: int) -> None:
        try:
            self._queues[lane].change_visibility(record.receipt_handle, seconds)
        except Exception as exc:
            # The record still comes back, after the queue's own visibility timeout.
            log_unexpected("could not set the message's visibility", exc, message_id=record.message_id)


def delivery_of(record: SQSRecord, lane: Lane = Lane.INTERACTIVE) -> Delivery:
    route = (record.raw_event.get("messageAttributes") or {}).get(ROUTE_ATTRIBUTE) or {}
    return Delivery(
        message_id=record.message_id,
        body=record.body,
        receive_count=int(record.attributes.approximate_receive_count or 1),
        attributes=dict(record.raw_event.get("attributes") or {}),
        lane=lane,
        realtime=route.get("stringValue") == REALTIME_ROUTE,
    )
