"""A provider's own rate limit, as the local provider enforces it: requests and tokens per minute.

Each is a GCRA (generic cell rate algorithm), as providers commonly meter: a request conforms when
it arrives no earlier than the theoretical arrival time less the burst allowance, and moves that
time on by its cost (one request; its prompt tokens plus max_tokens, as OpenAI counts a request
against its tokens per minute before answering it). A request that does not conform is refused
with how long until it would.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

# How much of its rate a limit lets through at once, in seconds: as providers quantize a
# per-minute limit into shorter periods.
DEFAULT_BURST_SECONDS = 1.0


class ProviderRateLimit:
    def __init__(
        self,
        rpm: int | None = None,
        tpm: int | None = None,
        burst_seconds: float = DEFAULT_BURST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (rpm is not None and rpm < 1) or (tpm is not None and tpm < 1):
            raise ValueError("a rate limit is at least 1 a minute")
        self._request_cost = 60.0 / rpm if rpm else None
        self._token_cost = 60.0 / tpm if tpm else None
        self._burst = burst_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._request_at = self._token_at = 0.0

    def admit(self, tokens: int) -> int | None:
        """None when a request of `tokens` conforms (and it is counted), else the whole seconds until it would."""
        with self._lock:
            now = self._clock()
            earliest = max(
                self._request_at - self._burst if self._request_cost else now,
                self._token_at - self._burst if self._token_cost else now,
            )
            if earliest > now:
                return max(1, math.ceil(earliest - now))
            if self._request_cost:
                self._request_at = max(self._request_at, now) + self._request_cost
            if self._token_cost:
                self._token_at = max(self._token_at, now) + tokens * self._token_cost
            return None
