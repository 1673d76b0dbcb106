"""Local stand-ins for the stack's outside services: an OpenAI-compatible model provider."""

from aijobs.local.provider import (
    DEFAULT_MODEL,
    TRANSIENT_FAULTS,
    FaultKind,
    FaultMarker,
    LocalProvider,
    ServedRequest,
    answer_for,
    estimate_tokens,
    find_fault_marker,
    prompt_hash,
)

__all__ = [
    "DEFAULT_MODEL",
    "TRANSIENT_FAULTS",
    "FaultKind",
    "FaultMarker",
    "LocalProvider",
    "ServedRequest",
    "answer_for",
    "estimate_tokens",
    "find_fault_marker",
    "prompt_hash",
]
