"""The batch port: many model calls sent together through a provider's batch API, answered later.

OpenAI-compatible providers (engine.gateway.openai_batch: the Files and Batches APIs) and Amazon
Bedrock (engine.gateway.bedrock_batch: batch inference jobs on the payload bucket) sell the same
calls at about half price, answered within a completion window (24 h) and most often in minutes.
An adapter submits a batch of requests, each under a `custom_id` of the caller's, reports its
status, reads its answers (and per-line errors) once it has ended, cancels it, and finds batches
by the metadata they were created with (so that a batch created by a worker that died before
recording it can be adopted or cancelled). docs/batches.md has the design.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.core.batches import BatchState
from engine.core.errors import JobError, ProviderRejectedError
from engine.gateway.provider import Completion, CompletionRequest


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch, under the caller's id (unique within the batch, at most 64 characters)."""

    custom_id: str
    request: CompletionRequest


@dataclass(frozen=True, slots=True)
class BatchStatus:
    batch_id: str
    state: BatchState
    # What the provider says of it, for the operator ("in_progress", "validating", ...).
    detail: str = ""
    # Lines answered and failed so far, when the provider says.
    answered: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class BatchAnswer:
    """The outcome of one line: its completion, or the error the provider gave it (as the engine's
    typed errors, as a real-time call's would be)."""

    custom_id: str
    completion: Completion | None = None
    error: JobError | None = None


class BatchProvider(Protocol):
    name: str
    # The fewest and most lines a batch may hold, and the most bytes of its input (the provider's
    # limits: Bedrock's batch inference needs a minimum of records; OpenAI's takes 50,000 lines, 200 MB).
    min_lines: int
    max_lines: int
    max_bytes: int

    def line_bytes(self, line: BatchLine) -> int:
        """What a line adds to the batch's input, in bytes (to keep a batch within max_bytes)."""
        ...

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        """Create a batch of `lines` tagged with `metadata`; its provider id. Raises the engine's
        typed errors (a RetryableError when it may work later)."""
        ...

    def status(self, batch_id: str) -> BatchStatus: ...

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        """The lines answered or failed, of a batch that has ended (completed, expired or cancelled)."""
        ...

    def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch; lines it answered meanwhile can still be read."""
        ...

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        """The provider ids of the batches created with this metadata (and maybe more), newest first."""
        ...


def stop_unless_ended(stop: Callable[[], object], status: Callable[[], BatchStatus]) -> None:
    """`stop()` a batch (an adapter's `cancel`); a refusal is no error when the batch has ended meanwhile
    (nothing is left to stop), and stands otherwise."""
    try:
        stop()
    except ProviderRejectedError:
        if not status().state.ended:
            raise
