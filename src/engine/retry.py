"""When to try again: pure functions of the attempt, the error, and what the message has left."""

from __future__ import annotations

import math
import random

from engine.core.errors import ProviderRateLimitedError, RetryableError

# SQS refuses a visibility timeout above 12 hours.
MAX_DELAY_SECONDS = 43_200
BASE_DELAY_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 900.0
# How far one receive reaches at least: the 12 hours SQS allows from the receive, less the longest
# invocation (the hide is set at its end: the worker's 300 s Timeout) and the worker's margin.
REACH_SECONDS = MAX_DELAY_SECONDS - 300 - 10
# Receives kept aside for what the engine does not choose: a crashed invocation's batch coming back
# after the visibility timeout, a duplicate held while another worker runs the job.
RESERVE_RECEIVES = 5
# The queue's maxReceiveCount (the template's MaxReceiveCount).
DEFAULT_MAX_RECEIVES = 100


def backoff_seconds(
    attempt: int, rng: random.Random, base: float = BASE_DELAY_SECONDS, cap: float = MAX_BACKOFF_SECONDS
) -> int:
    """Exponential backoff with full jitter: uniform in [1, min(cap, base * 2^(attempt-1))]."""
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return max(1, math.ceil(rng.uniform(0, ceiling)))


def retry_delay_seconds(error: RetryableError, attempt: int, rng: random.Random) -> int:
    """The delay before the next try: the provider's Retry-After when it gave one, else backoff."""
    retry_after = error.retry_after_seconds if isinstance(error, ProviderRateLimitedError) else None
    if retry_after is not None and math.isfinite(retry_after):
        delay = max(1, math.ceil(retry_after))
    else:
        delay = backoff_seconds(attempt, rng)
    return min(delay, MAX_DELAY_SECONDS)


def reach_floor_seconds(seconds_to_deadline: float, receive_count: int, max_receives: int) -> int:
    """The least a message must now be hidden for so that the receives it has left still reach its
    job's deadline, rather than send it to the dead-letter queue before then.

    After this receive, `max_receives - receive_count` receives are left (fewer the reserve); the
    last of them must come no earlier than the deadline, and each can hide the message for at most
    REACH_SECONDS. Far from running out this is 0 (the backoff decides); near it, hides grow so that
    the receives left span the time left. With none left, it is the whole time to the deadline."""
    left = max_receives - receive_count - RESERVE_RECEIVES
    return max(0, math.ceil(seconds_to_deadline - max(left - 1, 0) * REACH_SECONDS))
