"""Faults on demand: the kinds a `LocalProvider` can serve, and the `fault:<kind>[*<count>]` prompt marker.

A request's prompt (the first user message, so: the job's input) may hold a marker, `fault:<kind>`
(every time, re-asks included) or `fault:<kind>*<count>` (the first <count> times that prompt is
asked, then a normal answer), e.g. a classify job whose text says `fault:unavailable*2`. Such counts
are kept per `prompt_hash`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    RATE_LIMITED = "rate_limited"  # 429 with Retry-After
    SERVER_ERROR = "server_error"  # 500
    UNAVAILABLE = "unavailable"  # 503
    HANG = "hang"  # no answer until the client has given up
    DROP = "drop"  # the connection closes without a response
    NON_JSON = "non_json"  # 200; the content is prose, not JSON
    WRONG_SHAPE = "wrong_shape"  # 200; JSON, but not the output model's shape
    BUSINESS_INVALID = "business_invalid"  # 200; breaks the job type's business rule
    REFERENCE_INVALID = "reference_invalid"  # 200; cites a document the input does not hold
    REPAIRABLE = "repairable"  # 200; invalid when first asked, valid when re-asked with the error
    # 429 "Resource Unavailable" to a request for the flex tier; a request for the standard tier is served.
    FLEX_UNAVAILABLE = "flex_unavailable"


# What a real provider does now and then, and a retry gets past: the default random faults.
TRANSIENT_FAULTS: tuple[FaultKind, ...] = (
    FaultKind.RATE_LIMITED,
    FaultKind.SERVER_ERROR,
    FaultKind.UNAVAILABLE,
    FaultKind.DROP,
)

_MARKER = re.compile(
    r"fault:(" + "|".join(kind.value for kind in FaultKind) + r")(?![a-z_])(?:\*(\d+))?",
)


@dataclass(frozen=True, slots=True)
class FaultMarker:
    kind: FaultKind
    # How many times the fault is served for one prompt; None: every time.
    count: int | None = None


def find_fault_marker(text: str) -> FaultMarker | None:
    """The first `fault:<kind>[*<count>]` in `text`."""
    match = _MARKER.search(text)
    if match is None:
        return None
    count = match.group(2)
    return FaultMarker(FaultKind(match.group(1)), int(count) if count is not None else None)


def prompt_hash(prompt: str) -> str:
    """The key under which `*<count>` markers are counted: the rendered user prompt's hash."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]
