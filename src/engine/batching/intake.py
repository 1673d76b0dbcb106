"""The worker's side of batching: which claims go into a batch, and keeping them for it.

A background batch's records are claimed with the batch's terms (engine.core.BatchTerms): a job
whose deadline is far enough joins the current window, held until a third of the rescue time
before its deadline. Each job then has its user's budget reserved (no shared rate: the provider's
batch has limits of its own), and the batch's jobs are kept in one part per model; their messages
are acknowledged (`batched`). `keep` says what became of each (`Keeping`); the worker acts on it: a
job its budget holds waits as any other, jobs whose part could not be written go back to `queued`,
their messages retried after a backoff.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from engine.batching.entries import BatchEntry
from engine.batching.files import BatchFiles
from engine.core import BatchTerms
from engine.core.attachments import Attachment
from engine.definitions import JobDefinition
from engine.fleet.admission import Admission, Ask, Hold, Pass, Verdict
from engine.gateway import CallPlan
from engine.observability import log_unexpected
from engine.runner import Claimed

# A window's parts are gathered this long after it ends (or a window's length, when shorter).
CLOSE_GRACE_MS = 30_000
# What an attempt can use at most (engine.gateway.ModelGateway.plan).
Planner = Callable[[JobDefinition, BaseModel, Sequence[Attachment]], CallPlan]


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """The batch settings, in milliseconds (engine.config.Settings' aijobs_batch_*)."""

    window_ms: int
    poll_ms: int
    rescue_ms: int

    @property
    def eligible_ms(self) -> int:
        """How far a job's deadline must be for it to join a batch: rescue, window and poll, and a minute."""
        return self.rescue_ms + self.window_ms + self.poll_ms + 60_000

    def window_of(self, now_ms: int) -> str:
        """The window `now_ms` falls in, named by its start (13 digits: windows sort by name)."""
        return f"{now_ms - now_ms % self.window_ms:013d}"

    def window_end(self, window: str) -> int:
        return int(window) + self.window_ms

    def closes_at(self, window: str) -> int:
        """When a window's parts are gathered: a window's length after it ends (at most CLOSE_GRACE_MS),
        so that workers still writing theirs have finished."""
        return self.window_end(window) + min(CLOSE_GRACE_MS, self.window_ms)


@dataclass(frozen=True, slots=True)
class Batched:
    """Kept in its batch's part: its message can be acknowledged (the batch answers it)."""


@dataclass(frozen=True, slots=True)
class RunNow:
    """Not for a batch after all: run now, with its verdict (a Hold when its user's budget holds it;
    None when its job type's own code failed to plan it, where its attempt fails the same way)."""

    verdict: Verdict | None


@dataclass(frozen=True, slots=True)
class NotKept:
    """Its part could not be written: it goes back to `queued`, its message retried after a backoff."""


Keeping = Batched | RunNow | NotKept


class BatchIntake:
    def __init__(
        self,
        files: BatchFiles,
        planner: Planner,
        timing: BatchTiming,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._files = files
        self._planner = planner
        self._timing = timing
        self._clock = clock

    def terms(self) -> BatchTerms:
        """The terms of a claim into a batch made now."""
        now = self._now_ms()
        return BatchTerms(self._timing.window_of(now), now + self._timing.eligible_ms, self._timing.rescue_ms // 3)

    def keep(self, claimed: Sequence[Claimed], admission: Admission | None) -> list[Keeping]:
        """Keep jobs claimed into a batch for it, one part per window and model: what became of each."""
        keepings: list[Keeping | None] = [None] * len(claimed)
        planned: list[tuple[int, CallPlan]] = []
        for index, step in enumerate(claimed):
            try:
                planned.append((index, self._planner(step.definition, step.job_input, step.attachments)))
            except Exception as exc:
                log_unexpected("a batched job could not be planned", exc, job_id=step.job.job_id)
                keepings[index] = RunNow(None)
        asks = [Ask(claimed[index].job.user_id, plan, claimed[index].job.lane) for index, plan in planned]
        verdicts: list[Verdict] = admission.reserve(asks) if admission is not None else [Pass(0) for _ in asks]
        groups: dict[tuple[str, str], list[tuple[int, Pass]]] = defaultdict(list)
        for (index, plan), verdict in zip(planned, verdicts, strict=True):
            step = claimed[index]
            if isinstance(verdict, Hold):
                keepings[index] = RunNow(verdict)  # it waits for its user's budget
            else:
                groups[(step.job.batch or self._timing.window_of(self._now_ms()), plan.model)].append((index, verdict))
        for (window, model), members in groups.items():
            entries = [self._entry(claimed[index], verdict) for index, verdict in members]
            try:
                self._files.put_part(window, model, entries, self._now_ms())
            except Exception as exc:
                log_unexpected("batched jobs could not be kept for their batch", exc, window=window, model=model)
                if admission is not None:
                    admission.settle([verdict for _, verdict in members])
                for index, _ in members:
                    keepings[index] = NotKept()
                continue
            for index, _ in members:
                keepings[index] = Batched()
        return [keeping for keeping in keepings if keeping is not None]

    @staticmethod
    def _entry(step: Claimed, verdict: Pass) -> BatchEntry:
        job, delivery = step.job, step.delivery
        return BatchEntry(
            job_id=job.job_id,
            owner=job.lease_owner or "",
            claim_count=job.claim_count,
            lane=job.lane,
            user_id=job.user_id,
            job_type=step.definition.name,
            deadline_at=job.deadline_at or 0,
            job_input=step.raw_input if step.raw_input is not None else step.job_input.model_dump(mode="json"),
            message_id=delivery.message_id,
            body=delivery.body,
            receive_count=delivery.receive_count,
            reserved_usd=verdict.reserved_usd,
            reserved_day=verdict.day,
            attachments=job.attachments,
        )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
