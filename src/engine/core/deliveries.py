"""A delivery of a message, and what becomes of it: acknowledged, or returned to be seen again later."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from engine.core.job import Lane


@dataclass(frozen=True, slots=True)
class Delivery:
    """One SQS record, as the runner needs it."""

    message_id: str
    body: str
    receive_count: int = 1
    attributes: Mapping[str, str] = field(default_factory=dict)
    # The lane of the queue it came from: a message that names no lane runs in it.
    lane: Lane = Lane.INTERACTIVE
    # Sent back by a provider's batch that did not answer it: it runs in real time (docs/batches.md).
    realtime: bool = False


class Fate(StrEnum):
    """What became of a delivery; each is counted as the metric `Jobs_<fate>`."""

    # The message is done with (acknowledged).
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DUPLICATE = "duplicate"  # its job had ended already
    DEAD_LETTERED = "dead_lettered"  # kept as a dead letter (it named no usable job, or was given up on)
    BATCHED = "batched"  # its job waits in a provider's batch, which answers it (docs/batches.md)
    WAITING = "waiting"  # a pipeline's step started, or its review is pending (docs/pipelines.md)
    # The message comes back later (returned as a batch item failure).
    RETRIED = "retried"  # a retryable failure: the job is queued again
    HELD = "held"  # another worker holds the job
    RACED = "raced"  # the job changed while it was being claimed or ended
    DEFERRED = "deferred"  # too little time left in this invocation
    THROTTLED = "throttled"  # its model's shared rate limit has no capacity now (engine.fleet)
    OVER_BUDGET = "over_budget"  # its user's daily budget is spent (engine.fleet)
    LEASE_LOST = "lease_lost"  # this worker's lease ended before its finish
    ERROR = "error"  # nothing was recorded: an unexpected error, tried again


@dataclass(frozen=True, slots=True)
class Ack:
    """The message is done with: let the event source mapping delete it."""

    fate: Fate


@dataclass(frozen=True, slots=True)
class Retry:
    """Report the record as failed after hiding it for `visibility_seconds`."""

    fate: Fate
    visibility_seconds: int
    reason: str


Disposition = Ack | Retry


class DeadLetterFate(StrEnum):
    """What became of a dead letter and the job it names; on the dead-letter queue, each is counted
    as the metric `DeadLetters_<fate>`."""

    RECORDED = "recorded"  # kept; its job left as it was (none, finished, another request's)
    FAILED = "failed"  # kept; its job ended `failed` (or was created so)
    CANCELLED = "cancelled"  # kept; its job, cancel-requested, ended `cancelled`
    HELD = "held"  # kept; a worker holds its job and will finish it
    UNRECORDED = "unrecorded"  # the table did not take it: kept in the payload bucket, or left on its queue
