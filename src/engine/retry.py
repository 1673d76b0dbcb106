"""When to try again: a pure function of the attempt and the error."""

from __future__ import annotations

import math
import random

from engine.core.errors import ProviderRateLimitedError, RetryableError

# SQS refuses a visibility timeout above 12 hours.
MAX_DELAY_SECONDS = 43_200
BASE_DELAY_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 900.0


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
