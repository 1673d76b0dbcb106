"""A pipeline's parts on one in-memory store, for the tests of pipelines' decisions: the worker's claim
and advance, a child's attempt (a provider call counted) and its stream record, the reconciler."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from engine.attachments.pages import PageRanges
from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    ErrorCode,
    Failed,
    Job,
    JobErrorInfo,
    NewJob,
    Succeeded,
    Usage,
)
from engine.core.attachments import AttachmentRef
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.pipelines import PipelineDefinition
from engine.definitions.registry import BUILTIN_DEFINITIONS
from engine.intake import request_hash
from engine.pipelines import ChildEnds, Pipelines, children_ids
from engine.queue import JobQueues
from engine.reconciler import Reconciler
from engine.testing import InMemoryJobStore, MemoryAttachments

T0 = 1_800_000_000_000
LEASE_MS = 60_000
BUCKET = "payloads"
BROKEN = JobErrorInfo(ErrorCode.SCHEMA_VALIDATION_FAILED, "output: not JSON", retryable=False)


class PartsBucket:
    """The payload bucket the parts of a PDF are written to, over the attachments' objects."""

    bucket = BUCKET

    def __init__(self, objects: MemoryAttachments) -> None:
        self._objects = objects
        self.written: list[str] = []

    def put_new(self, key: str, data: bytes, content_type: str) -> bool:
        if key in self.written:
            return False
        self.written.append(key)
        self._objects.put(BUCKET, key, data)
        return True


class RecordingQueue:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, body: dict[str, Any], group_id: str | None = None) -> str:
        self.sent.append(body["job_id"])
        return str(len(self.sent))


class Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> float:
        return self.ms / 1000

    def tick(self, ms: int = 1000) -> int:
        self.ms += ms
        return self.ms


class Stack:
    """A pipeline's parts on one in-memory store: the worker's advance, the stream's counts, a queue."""

    def __init__(self, definitions: Iterable[JobDefinition] = ()) -> None:
        self.store = InMemoryJobStore()
        self.queue = RecordingQueue()
        self.clock = Clock()
        self.registry = JobRegistry((*BUILTIN_DEFINITIONS, *definitions))
        self.objects = MemoryAttachments()
        self.parts = PartsBucket(self.objects)
        pages = PageRanges(
            self.objects, self.parts, {BUCKET}, max_bytes=50 * 1024 * 1024, max_parts=1000, max_part_pages=100
        )
        queues = JobQueues.of(self.queue)  # type: ignore[arg-type]
        self.pipelines = Pipelines(self.store, queues, self.registry, self.clock, documents=pages)
        self.ends = ChildEnds(self.store, queues, self.registry, self.clock)
        self.reconciler = self.reconciling()
        self.calls: list[str] = []  # the children that ran (one provider call each)
        self.answers: dict[str, dict[str, Any]] = {}  # a job type's answer (summarize's names its job)

    def reconciling(self, max_jobs: int = 1000) -> Reconciler:
        return Reconciler(self.store, self.queue, clock=self.clock, pipelines=self.ends, max_jobs=max_jobs)  # type: ignore[arg-type]

    def submit(
        self,
        definition: PipelineDefinition,
        job_input: dict[str, Any],
        job_id: str = "p",
        attachments: tuple[AttachmentRef, ...] = (),
    ) -> None:
        new_job = NewJob(
            definition.name,
            "u-1",
            1,
            3,
            86_400,
            request_hash(definition.name, "u-1", job_input),
            attachments=attachments,
            job_type_version=definition.job_type_version,
        )
        self.store.create_job(job_id, new_job, job_input, self.clock.tick())

    def advance(self, job_id: str = "p") -> None:
        """The worker's claim of a pipeline's message, and its advance."""
        parent = self.store.claim_job(job_id, "w-p", LEASE_MS, self.clock.tick(), None)
        definition = self.registry.definition(parent.job_type or "", None)
        assert isinstance(definition, PipelineDefinition)
        raw = self.store.get_input(job_id) or {}
        self.pipelines.advance(parent, definition, definition.parse_input(raw), raw)

    def run_child(self, job_id: str, *, fail: bool = False, counted: bool = True, tokens: int = 100) -> Job:
        """A child's attempt (one provider call), and (with `counted`) its stream record counted."""
        claimed = self.store.claim_job(job_id, f"w-{job_id}", LEASE_MS, self.clock.tick(), None)
        self.calls.append(job_id)
        attempt = AttemptRecord(
            job_id=job_id,
            attempt=claimed.claim_count,
            user_id="u-1",
            job_type=claimed.job_type,
            started_at=self.clock.ms,
            finished_at=self.clock.ms,
            outcome=AttemptOutcome.FAILED if fail else AttemptOutcome.SUCCEEDED,
            input_tokens=tokens,
            output_tokens=tokens // 10,
            cost_usd=Decimal("0.00001") * tokens,
        )
        output = self.answers.get(claimed.job_type or "", {"total": 120.5})
        if claimed.job_type == "summarize":
            output = {"summary": f"summary of {job_id}"}
        outcome = Failed(BROKEN) if fail else Succeeded(output, "h")
        self.store.finish_job(claimed, outcome, self.clock.tick(), attempt)
        ended = self.job(job_id)
        if counted:
            self.ends.ended([ended])
        return ended

    def job(self, job_id: str = "p") -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job

    def children(self, job_id: str = "p") -> list[Job]:
        return [self.job(child) for step in children_ids(self.job(job_id)) for child in step]

    def retry(self, job_id: str = "p") -> None:
        """`aijobs retry`: the job back to queued, then its message's claim."""
        self.store.requeue_failed_job(job_id, self.clock.tick())
        self.advance(job_id)


def summed(children: list[Job]) -> Usage:
    total = Usage()
    for child in children:
        total = total.add(child.usage)
    return total
