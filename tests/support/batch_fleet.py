"""A worker's runner and batch intake and the batcher, on one in-memory store, clock and bucket, with
faults on call: the provider's batch API, SQS and the store failing when and as often as a test says.

The unit tests of the batching decisions (tests/unit/test_batching.py, test_batch_faults.py) drive
it as the scheduled function and the workers would: claims into a window, passes of the batcher, and
the messages it sends again delivered to a real-time worker.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from engine.attachments.loader import AttachmentLoader
from engine.batching.batcher import Batcher
from engine.batching.files import BatchFiles
from engine.batching.intake import Batched, BatchIntake, BatchTiming, NotKept, RunNow
from engine.core import Ack, Delivery, Disposition, Fate, Job, JobStatus, Lane
from engine.core.batches import BatchState
from engine.core.errors import InternalError, ProviderUnavailableError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.fleet.admission import Admission
from engine.fleet.budgets import Budgets
from engine.gateway import ModelGateway, ModelTiers, PriceTable
from engine.gateway.batches import BatchAnswer, BatchLine, BatchStatus
from engine.gateway.pricing import Cost
from engine.queue import Resend
from engine.runner import Claimed, JobRunner
from engine.testing import InMemoryBudgetStore, InMemoryJobStore, MemoryBatchRecords, MemoryObjects
from tests.support.batches import RecordingQueue, ScriptedBatchProvider, valid_line
from tests.support.clock import T0_MS as T0_MS  # the fleet's tests start their clock there
from tests.support.clock import Clock
from tests.support.events import job_message
from tests.support.providers import FakeProvider

MODEL = "gpt-4o-mini"
WINDOW_MS, POLL_MS, RESCUE_MS = 300_000, 60_000, 1_800_000
TIMING = BatchTiming(WINDOW_MS, POLL_MS, RESCUE_MS)
DAY_SECONDS = 86_400


class Faults:
    """Which calls fail next: a name's count of calls to fail (-1: every call), and with what."""

    def __init__(self) -> None:
        self._left: dict[str, int] = {}
        self._errors: dict[str, Exception] = {}
        self.failed: Counter[str] = Counter()

    def fail(self, name: str, error: Exception, times: int = -1) -> None:
        self._left[name] = times
        self._errors[name] = error

    def heal(self, name: str) -> None:
        self._left.pop(name, None)

    def check(self, name: str) -> None:
        left = self._left.get(name, 0)
        if left == 0:
            return
        if left > 0:
            self._left[name] = left - 1
        self.failed[name] += 1
        raise self._errors[name]


# What a scripted line answers, by name: a valid answer, one that fails validation, a failed line, or
# nothing at all (the batch ends without it).
LINE_OUTCOMES = ("valid", "invalid", "error", "none")


def answering(outcomes: Sequence[str]) -> Callable[[BatchLine], Any]:
    """A script answering the batch's lines in order of their jobs (j0000000000, j0000000001, ...) with
    the named outcomes (LINE_OUTCOMES)."""
    by_line = {f"j{index:010d}": outcome for index, outcome in enumerate(outcomes)}

    def script(line: BatchLine) -> Any:
        match by_line[line.custom_id]:
            case "valid":
                return valid_line(line)
            case "invalid":
                return "not json at all"
            case "error":
                return ProviderUnavailableError("the line failed")
            case _:
                return None

    return script


class FaultyBatchProvider(ScriptedBatchProvider):
    """The scripted batch API, each call of which may fail (`faults.fail("status", error)`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = Faults()

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        self.faults.check("submit")
        return super().submit(lines, metadata)

    def status(self, batch_id: str) -> BatchStatus:
        self.faults.check("status")
        return super().status(batch_id)

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        self.faults.check("answers")
        return super().answers(batch_id)

    def cancel(self, batch_id: str) -> None:
        self.faults.check("cancel")
        super().cancel(batch_id)

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        self.faults.check("find")
        return super().find(metadata)


class RefusingQueue(RecordingQueue):
    """A queue that refuses the next `refuse` messages sent again, as SQS answers a `Failed` entry."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = 0
        self.refused: list[Resend] = []

    def resend(self, messages: Sequence[Resend]) -> list[Resend]:
        refused = list(messages[: self.refuse])
        self.refuse -= len(refused)
        self.refused.extend(refused)
        self.resent.extend(messages[len(refused) :])
        return refused


class RefusingQueues:
    def __init__(self) -> None:
        self.lanes = {Lane.INTERACTIVE: RefusingQueue(), Lane.BACKGROUND: RefusingQueue()}

    def __getitem__(self, lane: Lane) -> RefusingQueue:
        return self.lanes[lane]


class FaultyStore(InMemoryJobStore):
    """The memory store, whose writes of the batcher's path may fail (`faults.fail("finish_job", ...)`)."""

    def __init__(self, budgets: InMemoryBudgetStore) -> None:
        super().__init__(budgets=budgets)
        self.faults = Faults()

    def finish_job(self, *args: Any, **kwargs: Any) -> None:
        self.faults.check("finish_job")
        super().finish_job(*args, **kwargs)

    def record_orphan_attempt(self, *args: Any, **kwargs: Any) -> bool:
        self.faults.check("record_orphan_attempt")
        return super().record_orphan_attempt(*args, **kwargs)

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        self.faults.check("get_jobs")
        return super().get_jobs(job_ids)


class Fleet:
    """A worker's runner and batch intake, and the batcher, on one in-memory store, clock and bucket."""

    def __init__(
        self,
        batch_provider: ScriptedBatchProvider | None = None,
        cap: str | None = None,
        attachments: AttachmentLoader | None = None,
        registry: JobRegistry | None = None,
    ) -> None:
        self.clock = Clock()
        self.budget_days = InMemoryBudgetStore()
        self.store = FaultyStore(self.budget_days)
        self.realtime = FakeProvider(input_tokens=1000, output_tokens=200)
        self.batches = batch_provider or FaultyBatchProvider()
        self.objects = MemoryObjects()
        self.files = BatchFiles(self.objects)
        self.records = MemoryBatchRecords()
        self.queues = RefusingQueues()
        self.registry = registry or JobRegistry()
        self.gateway = ModelGateway(self.realtime, ModelTiers(MODEL))
        recorder = DeadLetterRecorder(self.store, self.registry, clock=self.clock)
        self.runner = JobRunner(
            self.store,
            self.gateway,
            self.registry,
            recorder,
            clock=self.clock,
            rng=random.Random(7),
            attachments=attachments,
        )
        self.admission = None
        if cap is not None:
            budgets = Budgets(self.budget_days, Decimal(cap))
            self.admission = Admission(None, budgets, clock=self.clock, sleep=self.clock.sleep)
        self.intake = BatchIntake(self.files, self.gateway.plan, TIMING, clock=self.clock)
        self.batcher = Batcher(
            self.records,
            self.files,
            self.batches,
            self.gateway,
            self.registry,
            self.runner,
            self.store,
            self.queues,  # type: ignore[arg-type]
            TIMING,
            clock=self.clock,
        )
        self._messages = 0
        self.ids: list[str] = []

    @property
    def faulty(self) -> FaultyBatchProvider:
        assert isinstance(self.batches, FaultyBatchProvider)
        return self.batches

    def deliver(self, message: dict[str, Any], lane: Lane = Lane.BACKGROUND, realtime: bool = False) -> Any:
        """Claim a message's job as a background worker would (with the batch's terms), and keep it if
        it joined a batch: the claim's disposition, or the Claimed job that runs now."""
        self._messages += 1
        delivery = Delivery(f"m-{self._messages}", json.dumps(message), 1, lane=lane, realtime=realtime)
        step = self.runner.claim(delivery, batch=self.intake.terms() if lane is Lane.BACKGROUND else None)
        if isinstance(step, Claimed) and step.job.batch:
            [kept] = self.intake.keep([step], self.admission)
            return self._kept(step, kept)
        return step

    def _kept(self, step: Claimed, kept: Batched | RunNow | NotKept) -> Disposition:
        match kept:
            case Batched():
                return Ack(Fate.BATCHED)
            case RunNow(verdict=verdict):
                return self.runner.run(step, None, verdict)
            case NotKept():
                return self.runner.hand_back(step.job, InternalError("it could not be kept for its batch"))

    def submit(
        self, count: int, deadline_seconds: int = DAY_SECONDS, prefix: str = "bg", user: str = "user-1"
    ) -> list[str]:
        ids = [f"{prefix}-{n}" for n in range(count)]
        for job_id in ids:
            message = job_message(
                "classify", job_id, user_id=user, lane="background", deadline_seconds=deadline_seconds
            )
            assert self.deliver(message) == Ack(Fate.BATCHED)
            self.clock.now_ms += 1  # each in a part of its own, in this order
        self.ids += ids
        return ids

    def gather(self) -> Counter[str]:
        """Move past the window and its grace, and run a pass."""
        self.clock.now_ms = max(self.clock.now_ms, TIMING.closes_at(TIMING.window_of(self.clock.now_ms)))
        return self.batcher.run()

    def end_batch(self, state: BatchState = BatchState.COMPLETED) -> Counter[str]:
        """The provider ends the only batch in `state` (a completed one answers every line first); the
        batcher's next poll reads its end."""
        self.batches.end(self.batches.only, state)
        self.clock.now_ms += POLL_MS
        return self.batcher.run()

    def redeliver(self) -> list[Any]:
        """Deliver the messages the batcher sent again (as a real-time worker would), once each."""
        queue = self.queues[Lane.BACKGROUND]
        resent, queue.resent = queue.resent, []
        self.clock.now_ms += max((message.delay_seconds for message in resent), default=0) * 1000
        outcomes = []
        for message in resent:
            self._messages += 1
            delivery = Delivery(f"m-{self._messages}", message.body, 1, lane=Lane.BACKGROUND, realtime=True)
            outcomes.append(self.runner.process(delivery))
        return outcomes

    def job(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job

    def open_without_a_message(self) -> list[str]:
        """Queued jobs with no message on their way: none may ever be."""
        waiting = {json.loads(message.body)["job_id"] for message in self.queues[Lane.BACKGROUND].resent}
        jobs = InMemoryJobStore.get_jobs(self.store, self.ids)  # (past the faults a test injects)
        queued = [job.job_id for job in jobs.values() if job.status is JobStatus.QUEUED]
        return [job_id for job_id in queued if job_id not in waiting]


def realtime_cost() -> Cost:
    """What one classify call of 1000 input and 200 output tokens costs in real time."""
    return PriceTable().cost(MODEL, FakeProvider(input_tokens=1000, output_tokens=200).complete(_line().request))


def _line() -> BatchLine:
    gateway = ModelGateway(FakeProvider(), ModelTiers(MODEL))
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input(job_message("classify")["input"])
    return BatchLine("j0000000000", gateway.batch_request(definition, job_input))
