"""A provider's batch API in memory, for tests of the batching decisions, queues that record what is
sent to them, and batch records as the batcher keeps them, for the tests of what lists them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core import Lane
from engine.core.batches import BatchPhase, BatchRecord, BatchState
from engine.core.errors import JobError
from engine.gateway import Completion
from engine.gateway.batches import BatchAnswer, BatchLine, BatchStatus
from engine.queue import Resend
from tests.support.providers import VALID_OUTPUTS

# What a line is answered with: an output (dict), raw content (str), an error, or None (no answer).
LineScript = Callable[[BatchLine], dict[str, Any] | str | JobError | None]


def valid_line(line: BatchLine) -> dict[str, Any]:
    return VALID_OUTPUTS[line.request.schema_name]


@dataclass
class ScriptedBatch:
    batch_id: str
    lines: list[BatchLine]
    metadata: dict[str, str]
    state: BatchState = BatchState.PENDING
    # The lines answered so far (by custom_id); `finish` answers the rest.
    answered: dict[str, BatchAnswer] = field(default_factory=dict)
    # More result lines, read after those (a line answered twice, an error line beside a completion).
    extra: list[BatchAnswer] = field(default_factory=list)


class ScriptedBatchProvider:
    """Batches held as the test says: `answer(batch, ids)` answers lines, `end(batch, state)` ends it."""

    name = "scripted"

    def __init__(
        self,
        script: LineScript = valid_line,
        *,
        min_lines: int = 1,
        max_lines: int = 50_000,
        max_bytes: int = 200 * 1024 * 1024,
        input_tokens: int = 1000,
        output_tokens: int = 200,
    ) -> None:
        self.script = script
        self.min_lines = min_lines
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.batches: dict[str, ScriptedBatch] = {}
        self.submits = 0
        self.cancels: list[str] = []
        self.refuse_submit: JobError | None = None
        self._lock = threading.Lock()

    def line_bytes(self, line: BatchLine) -> int:
        return len(line.request.user.encode()) + 200

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        with self._lock:
            self.submits += 1
            if self.refuse_submit is not None:
                raise self.refuse_submit
            batch_id = f"batch_{len(self.batches) + 1}"
            self.batches[batch_id] = ScriptedBatch(batch_id, list(lines), dict(metadata))
            return batch_id

    def status(self, batch_id: str) -> BatchStatus:
        batch = self.batches[batch_id]
        failed = sum(1 for answer in batch.answered.values() if answer.error is not None)
        return BatchStatus(batch_id, batch.state, batch.state.value, len(batch.answered) - failed, failed)

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        batch = self.batches[batch_id]
        yield from batch.answered.values()
        yield from batch.extra

    def cancel(self, batch_id: str) -> None:
        self.cancels.append(batch_id)

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        found = [b.batch_id for b in self.batches.values() if all(b.metadata.get(k) == v for k, v in metadata.items())]
        return list(reversed(found))

    # --- what the test does ---------------------------------------------------------------------

    @property
    def only(self) -> ScriptedBatch:
        assert len(self.batches) == 1, f"{len(self.batches)} batches"
        return next(iter(self.batches.values()))

    def answer(self, batch: ScriptedBatch, count: int | None = None) -> None:
        """Answer the first `count` lines not answered yet (all by default) with the script."""
        waiting = [line for line in batch.lines if line.custom_id not in batch.answered]
        for line in waiting[:count]:
            answer = self.script(line)
            if answer is None:
                continue
            if isinstance(answer, JobError):
                batch.answered[line.custom_id] = BatchAnswer(line.custom_id, error=answer)
                continue
            content = answer if isinstance(answer, str) else json.dumps(answer)
            completion = Completion(content, line.request.model, self.input_tokens, self.output_tokens, latency_ms=0)
            batch.answered[line.custom_id] = BatchAnswer(line.custom_id, completion=completion)

    def end(self, batch: ScriptedBatch, state: BatchState = BatchState.COMPLETED) -> None:
        if state is BatchState.COMPLETED:
            self.answer(batch)
        batch.state = state


class RecordingQueue:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.resent: list[Resend] = []

    def send(self, body: dict[str, Any], group_id: str | None = None) -> str:
        self.sent.append(body)
        return f"sent-{len(self.sent)}"

    def resend(self, messages: Sequence[Resend]) -> list[Resend]:
        self.resent.extend(messages)
        return []


class RecordingQueues:
    """Each lane's recording queue."""

    def __init__(self) -> None:
        self.lanes = {Lane.INTERACTIVE: RecordingQueue(), Lane.BACKGROUND: RecordingQueue()}

    def __getitem__(self, lane: Lane) -> RecordingQueue:
        return self.lanes[lane]


def batch_record(window: str, first_part: str, now_ms: int, batch_id: str, **changes: Any) -> BatchRecord:
    """A batch record as the batcher keeps one in flight: of `window`'s parts from `first_part` on, its
    provider's batch created ten minutes before `now_ms` and pending, its rescue time an hour away;
    `changes` replace any of its fields."""
    record = BatchRecord(
        key=f"{window}.0a1b2c3d.{first_part}",
        model="gpt-4o-mini",
        provider="openai",
        lines=2,
        phase=BatchPhase.PENDING,
        created_at=now_ms - 600_000,
        updated_at=now_ms,
        rescue_at=now_ms + 3_600_000,
        abandon_at=now_ms + 4_200_000,
        batch_id=batch_id,
        state=BatchState.PENDING,
        detail="in_progress",
    )
    return replace(record, **changes)


def ended_batch(record: BatchRecord, ended_at: int, **changes: Any) -> BatchRecord:
    """`record` once its batch completed and the batcher concluded it at `ended_at`."""
    ended = {"phase": BatchPhase.ENDED, "state": BatchState.COMPLETED, "detail": "completed", "ended_at": ended_at}
    return replace(record, **(ended | changes))
