"""Background jobs through a provider's batch API, on moto and the local provider's Files and Batches APIs.

The worker claims background jobs into a batch window and keeps them in the payload bucket; the
batcher (its clock moved on by the test, the provider's in real time) gathers the window into a
recorded batch, creates it over HTTP, polls it, and ends every job: with the batch's answer at the
batch price, or handed back to real time (failed lines, an expired batch's unanswered half, a batch
stalled past its rescue time), whose messages the worker then runs at once.
"""

from __future__ import annotations

import random
import time
from typing import Any

import boto3
import pytest

from aijobs.local.provider import LocalProvider
from aijobs.stack import StackResources
from engine.batching.batcher import Batcher
from engine.batching.files import BatchFiles
from engine.batching.intake import BatchIntake, BatchTiming
from engine.core import JobStatus, Lane, Via
from engine.core.batches import BatchPhase
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import ModelGateway, ModelProvider, ModelTiers, PriceTable
from engine.gateway.batches import BatchProvider
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.gateway.openai_batch import OpenAIBatchProvider
from engine.queue import JobQueue, JobQueues
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.batches import BatchTable
from engine.store.payloads import PayloadStore
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record

MODEL = "gpt-4o-mini"
TIMING = BatchTiming(window_ms=60_000, poll_ms=1_000, rescue_ms=600_000)
BACKGROUND_ARN = "arn:aws:sqs:us-east-1:123456789012:aijobs-background-jobs"
WAIT_SECONDS = 20.0


class Clock:
    """The engine's clock: real time plus what the test moved it on by."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> float:
        return time.time() + self.offset_ms / 1000

    def now_ms(self) -> int:
        return int(self() * 1000)


class Stack:
    """The worker, runner and batcher on moto, calling the local provider through the OpenAI-compatible
    adapters, or through the ones given (`realtime`, `batches`, and the model they are asked for)."""

    def __init__(
        self,
        stack: StackResources,
        provider: LocalProvider,
        requests: RequestCounter,
        dynamodb: Any,
        realtime: ModelProvider | None = None,
        batches: BatchProvider | None = None,
        model: str = MODEL,
    ) -> None:
        self.resources = stack
        self.provider = provider
        self.requests = requests
        self.clock = Clock()
        sqs = boto3.client("sqs")
        self.sqs = sqs
        s3 = boto3.client("s3")
        payloads = PayloadStore(stack.payload_bucket, lambda: s3)
        self.store = DynamoJobStore(stack.table_name, client=dynamodb, payloads=payloads)
        self.registry = JobRegistry()
        realtime = realtime or OpenAICompatibleProvider(provider.url, static_api_key("k"))
        self.gateway = ModelGateway(realtime, ModelTiers(model))
        recorder = DeadLetterRecorder(self.store, self.registry)
        self.runner = JobRunner(
            self.store, self.gateway, self.registry, recorder, clock=self.clock, rng=random.Random(7)
        )
        self.queues = JobQueues(
            {
                Lane.INTERACTIVE: JobQueue(stack.queue_url, sqs),
                Lane.BACKGROUND: JobQueue(stack.background_queue_url, sqs),
            }
        )
        files = BatchFiles(payloads)
        intake = BatchIntake(files, self.gateway.plan, TIMING, clock=self.clock)
        self.worker = WorkerHandler(Worker(self.runner, batching=intake), self.queues)
        self.records = BatchTable(stack.table_name, dynamodb)
        # The test's own reads, on a client whose requests are not counted.
        reader = boto3.client("dynamodb")
        self.reader = DynamoJobStore(stack.table_name, client=reader, payloads=payloads)
        self.reader_records = BatchTable(stack.table_name, reader)
        self.batches = batches or OpenAIBatchProvider(provider.url, static_api_key("k"))
        self.batcher = Batcher(
            self.records,
            files,
            self.batches,
            self.gateway,
            self.registry,
            self.runner,
            self.store,
            self.queues,
            TIMING,
            clock=self.clock,
        )

    def submit(self, count: int, text: str = "Win a free cruise now!") -> list[str]:
        ids = [f"bg-{n}" for n in range(count)]
        records = [
            sqs_record(
                job_message("classify", job_id, input={"text": f"{text} ({job_id})", "labels": ["spam", "ham"]}),
                queue_arn=BACKGROUND_ARN,
            )
            for job_id in ids
        ]
        result = self.worker.handle(sqs_event(*records), InvocationContext())
        assert result == {"batchItemFailures": []}
        assert [self.reader.get_job(job_id).batch for job_id in ids] == [TIMING.window_of(self.clock.now_ms())] * count  # type: ignore[union-attr]
        return ids

    def gather(self) -> None:
        """Move the engine's clock past the window and its grace, and run a pass."""
        self.clock.offset_ms += TIMING.closes_at(TIMING.window_of(self.clock.now_ms())) - self.clock.now_ms()
        self.batcher.run()

    def until_ended(self) -> int:
        """Run passes (the clock moved a poll on each) until no batch is in flight; how many ran."""
        deadline = time.monotonic() + WAIT_SECONDS
        passes = 0
        while self.reader_records.listed():
            assert time.monotonic() < deadline, f"batches still in flight: {self.reader_records.listed()}"
            time.sleep(0.1)
            self.clock.offset_ms += TIMING.poll_ms
            self.batcher.run()
            passes += 1
        return passes

    def run_handed_back(self) -> int:
        """Deliver the messages waiting in the background queue (handed back: marked for real time)."""
        delivered = 0
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            messages = self.sqs.receive_message(
                QueueUrl=self.resources.background_queue_url,
                MaxNumberOfMessages=10,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            ).get("Messages", [])
            if not messages:
                if delivered or not self._delayed():
                    return delivered
                time.sleep(0.5)
                continue
            from aijobs.local.lambda_events import received_record

            event = sqs_event(*(received_record(message, BACKGROUND_ARN) for message in messages))
            result = self.worker.handle(event, InvocationContext())
            assert result == {"batchItemFailures": []}
            for message in messages:
                self.sqs.delete_message(
                    QueueUrl=self.resources.background_queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
            delivered += len(messages)
        raise AssertionError("handed-back messages did not arrive")

    def _delayed(self) -> bool:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.resources.background_queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessagesDelayed"]) > 0

    def vias(self, job_id: str) -> list[Via]:
        return [attempt.via for attempt in self.reader.attempts(job_id)]


@pytest.fixture
def fleet(
    stack: StackResources, local_provider: LocalProvider, dynamodb_requests: RequestCounter, dynamodb: Any
) -> Stack:
    return Stack(stack, local_provider, dynamodb_requests, dynamodb)


def test_a_completed_batch_finishes_its_jobs_at_half_the_price_with_two_requests_a_job(fleet: Stack) -> None:
    fleet.requests.reset()
    ids = fleet.submit(10)
    fleet.gather()
    passes = fleet.until_ended() + 1
    engine_requests = dict(fleet.requests.operations)

    for job_id in ids:
        job = fleet.reader.get_job(job_id)
        assert job is not None
        assert job.status is JobStatus.SUCCEEDED
        [attempt] = fleet.reader.attempts(job_id)
        assert attempt.via is Via.BATCH
        assert attempt.batch_id is not None
        realtime = PriceTable().cost(
            MODEL, _tokens(attempt.input_tokens, attempt.output_tokens, attempt.cached_input_tokens)
        )
        assert attempt.cost_usd == realtime.usd / 2
    served = [entry for entry in fleet.provider.log if entry.status == 200]
    assert len(served) == 10
    assert all(entry.batch_id is not None for entry in served)  # no real-time call
    # Each job: its claim and its finish; the batch: one read of its jobs, its record written when
    # created and on each pass that moved it, a Query of the records in flight a pass.
    assert engine_requests.pop("UpdateItem") == 10
    assert engine_requests.pop("TransactWriteItems") == 10
    assert engine_requests.pop("BatchGetItem") == 1
    assert engine_requests.pop("Query") == passes
    assert engine_requests.pop("GetItem") == 1  # is the batch recorded already?
    assert engine_requests.pop("PutItem") <= passes + 3
    assert engine_requests == {}
    [record] = fleet.reader_records.listed(in_flight_only=False)
    assert record.phase is BatchPhase.ENDED
    assert record.finished == 10


def test_an_expired_batch_s_unanswered_half_runs_in_real_time(fleet: Stack) -> None:
    fleet.provider.batch_fault = "expire_half"
    ids = fleet.submit(4)
    fleet.gather()
    fleet.until_ended()

    assert fleet.run_handed_back() == 2
    assert [fleet.reader.get_job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 4  # type: ignore[union-attr]
    assert sorted(via for job_id in ids for via in fleet.vias(job_id)) == [Via.BATCH] * 2 + [Via.REALTIME] * 2


def test_failed_lines_run_in_real_time_and_the_answered_ones_keep_their_batch_answer(fleet: Stack) -> None:
    fleet.provider.batch_fault = "failed_lines"
    ids = fleet.submit(4)
    fleet.gather()
    fleet.until_ended()

    assert fleet.run_handed_back() == 2
    for job_id in ids:
        job = fleet.reader.get_job(job_id)
        assert job is not None
        assert job.status is JobStatus.SUCCEEDED
        assert job.attempt_count == 1  # a failed line's attempt was refunded
        assert len(fleet.vias(job_id)) == 1


def test_a_stalled_batch_is_cancelled_at_its_rescue_time_and_every_job_ends_before_its_deadline(fleet: Stack) -> None:
    fleet.provider.batch_fault = "stall"
    ids = fleet.submit(3)
    fleet.gather()
    [record] = fleet.reader_records.listed()
    fleet.batcher.run()
    assert fleet.reader_records.listed()[0].phase is BatchPhase.PENDING  # stalled, before its rescue time

    fleet.clock.offset_ms += record.rescue_at - fleet.clock.now_ms()
    fleet.until_ended()

    assert fleet.run_handed_back() == 3
    for job_id in ids:
        job = fleet.reader.get_job(job_id)
        assert job is not None
        assert job.status is JobStatus.SUCCEEDED
        assert job.finished_at is not None
        assert job.deadline_at is not None
        assert job.finished_at < job.deadline_at
        assert fleet.vias(job_id) == [Via.REALTIME]  # one answer paid: the real-time one
    [ended] = fleet.reader_records.listed(in_flight_only=False)
    assert ended.returned == 3


def test_an_answer_that_fails_validation_is_re_asked_in_real_time(fleet: Stack) -> None:
    ids = fleet.submit(2, text="fault:repairable")
    fleet.gather()
    fleet.until_ended()

    for job_id in ids:
        job = fleet.reader.get_job(job_id)
        assert job is not None
        assert job.status is JobStatus.SUCCEEDED
        [attempt] = fleet.reader.attempts(job_id)
        assert attempt.via is Via.BATCH
        assert attempt.calls == 2
    repairs = [entry for entry in fleet.provider.log if entry.repair]
    assert len(repairs) == 2
    assert all(entry.batch_id is None for entry in repairs)


def test_a_batch_created_but_not_recorded_is_adopted_from_the_provider(fleet: Stack) -> None:
    ids = fleet.submit(2)
    submit = fleet.batches.submit

    def created_then_stopped(lines: Any, metadata: Any) -> str:
        submit(lines, metadata)
        raise OSError("the pass stopped before it recorded the batch's id")

    fleet.batches.submit = created_then_stopped  # type: ignore[method-assign]
    fleet.gather()
    fleet.batches.submit = submit  # type: ignore[method-assign]
    fleet.until_ended()

    assert [fleet.reader.get_job(job_id).status for job_id in ids] == [JobStatus.SUCCEEDED] * 2  # type: ignore[union-attr]
    assert len({entry.batch_id for entry in fleet.provider.log if entry.batch_id}) == 1


def _tokens(input_tokens: int, output_tokens: int, cached: int) -> Any:
    from engine.gateway import Completion

    return Completion("", MODEL, input_tokens, output_tokens, latency_ms=0, cached_input_tokens=cached)
