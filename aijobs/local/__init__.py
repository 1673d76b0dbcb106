"""Local stand-ins for the stack's outside services: an OpenAI-compatible model provider."""

from aijobs.local.answers import answer_for, faulty_content
from aijobs.local.faults import TRANSIENT_FAULTS, FaultKind, FaultMarker, find_fault_marker, prompt_hash
from aijobs.local.protocol import completion_body, estimate_tokens
from aijobs.local.provider import DEFAULT_MODEL, LocalProvider, ServedRequest

__all__ = [
    "DEFAULT_MODEL",
    "TRANSIENT_FAULTS",
    "FaultKind",
    "FaultMarker",
    "LocalProvider",
    "ServedRequest",
    "answer_for",
    "completion_body",
    "estimate_tokens",
    "faulty_content",
    "find_fault_marker",
    "prompt_hash",
]
