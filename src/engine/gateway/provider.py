"""The provider port: one model call, in and out. Adapters raise the typed errors of engine.errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: Literal["assistant", "user"]
    content: str


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    system: str
    user: str
    schema_name: str
    output_schema: dict[str, Any]
    max_tokens: int
    timeout_seconds: float
    # Turns after the user prompt: a rejected answer and the re-ask that explains why.
    conversation: tuple[ChatTurn, ...] = ()


@dataclass(frozen=True, slots=True)
class Completion:
    content: str
    model: str
    input_tokens: int
    output_tokens: int
    latency_ms: int
    # Why the model stopped ("stop", "length", ...); explains an empty or cut-off answer.
    finish_reason: str = ""


class ModelProvider(Protocol):
    name: str

    def complete(self, request: CompletionRequest) -> Completion:
        """Call the model once; raise a RetryableError or PermanentError subclass on failure."""
        ...
