"""Model providers for tests: an in-memory scripted one, and answers shaped like OpenAI's."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from aijobs.local.protocol import completion_body
from engine.core.errors import JobError
from engine.gateway import Completion, CompletionRequest

# Valid answers for the built-in job types, as the model would return them.
VALID_OUTPUTS: dict[str, dict[str, Any]] = {
    "classify": {"label": "spam", "confidence": 0.93},
    "summarize": {"summary": "SQS delivers messages at least once."},
    "answer_with_citations": {"answer": "Up to 14 days.", "citations": ["d1"]},
}

Script = Callable[[CompletionRequest], Completion | JobError | str | dict[str, Any]]


def valid_answer(request: CompletionRequest) -> dict[str, Any]:
    return VALID_OUTPUTS[request.schema_name]


class FakeProvider:
    """Answers with `script(request)`: an output dict, raw content, a Completion, or an error to raise."""

    name = "fake"

    def __init__(self, script: Script = valid_answer, input_tokens: int = 100, output_tokens: int = 20) -> None:
        self.script = script
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.requests: list[CompletionRequest] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.requests)

    def complete(self, request: CompletionRequest) -> Completion:
        with self._lock:
            self.requests.append(request)
        answer = self.script(request)
        if isinstance(answer, JobError):
            raise answer
        if isinstance(answer, Completion):
            return answer
        content = answer if isinstance(answer, str) else json.dumps(answer)
        return Completion(content, request.model, self.input_tokens, self.output_tokens, latency_ms=5)


def openai_completion(
    content: str,
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    model: str = "gpt-4o-mini",
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """A Chat Completions response body, as the local provider serves it."""
    return completion_body(content, model, prompt_tokens, completion_tokens, 0, cached_tokens, reasoning_tokens)


# The classify output model's JSON schema, as pydantic generates it.
CLASSIFY_SCHEMA: dict[str, Any] = {
    "title": "ClassifyOutput",
    "type": "object",
    "properties": {
        "label": {"title": "Label", "type": "string", "minLength": 1},
        "confidence": {"title": "Confidence", "type": "number", "minimum": 0.0, "maximum": 1.0},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}


def completion_request(model: str = "gpt-4o-mini", **overrides: Any) -> CompletionRequest:
    """A provider request for the classify job type; any field can be overridden."""
    fields: dict[str, Any] = {
        "model": model,
        "system": "You classify texts.",
        "user": "Text: win a cruise",
        "schema_name": "classify",
        "output_schema": CLASSIFY_SCHEMA,
        "max_tokens": 256,
        "timeout_seconds": 30.0,
    }
    fields.update(overrides)
    return CompletionRequest(**fields)
