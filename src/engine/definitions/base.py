"""A job type: its input and output models, its prompt, its limits and its rules."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from engine.errors import (
    BusinessValidationError,
    InputValidationError,
    ReferenceValidationError,
    SchemaValidationError,
)

# DynamoDB items stop at 400 KB; the input item keeps headroom for its keys and attributes.
MAX_INPUT_BYTES = 256 * 1024

ModelTier = Literal["primary", "fallback"]
# A rule returns None when the output is acceptable, or one line saying what is wrong.
Rule = Callable[[Any, Any], str | None]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    key: str
    version: str
    system: str
    user: str


@dataclass(frozen=True, slots=True)
class Prompt:
    """A versioned prompt; `user` is a str.format template over the job type's prompt fields."""

    key: str
    version: str
    system: str
    user: str

    def render(self, fields: Mapping[str, str]) -> RenderedPrompt:
        return RenderedPrompt(self.key, self.version, self.system, self.user.format_map(fields))


def _default_prompt_fields(job_input: BaseModel) -> dict[str, str]:
    return {name: str(value) for name, value in job_input.model_dump().items()}


def _default_projection(output: BaseModel) -> dict[str, Any]:
    return output.model_dump(mode="json")


def one_line_error(exc: ValidationError, prefix: str) -> str:
    """The first pydantic error as one line, e.g. `input.labels: List should have at least 2 items`."""
    errors = exc.errors()
    first = errors[0]
    location = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{location}: {first['msg']}{more}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDefinition:
    name: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    prompt: Prompt
    schema_version: int = 1
    model_tier: ModelTier = "primary"
    max_tokens: int = 1024
    timeout_seconds: float = 60.0
    max_attempts: int = 3
    deadline_seconds: int = 86_400
    prompt_fields: Callable[[Any], Mapping[str, str]] = _default_prompt_fields
    business_rule: Rule | None = None
    reference_rule: Rule | None = None
    project: Callable[[Any], dict[str, Any]] = _default_projection
    output_json_schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_json_schema", self.output_model.model_json_schema())

    def parse_input(self, raw: Mapping[str, Any]) -> BaseModel:
        size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_INPUT_BYTES:
            raise InputValidationError(f"input is {size} bytes; the limit is {MAX_INPUT_BYTES}")
        try:
            return self.input_model.model_validate(raw)
        except ValidationError as exc:
            raise InputValidationError(one_line_error(exc, "input")) from exc

    def render_prompt(self, job_input: BaseModel) -> RenderedPrompt:
        return self.prompt.render(self.prompt_fields(job_input))

    def validate_output(self, job_input: BaseModel, content: str) -> BaseModel:
        """Parse the model's answer: JSON, then the output model, then the business and reference rules."""
        try:
            output = self.output_model.model_validate_json(content)
        except ValidationError as exc:
            raise SchemaValidationError(one_line_error(exc, "output")) from exc
        if self.business_rule and (problem := self.business_rule(job_input, output)):
            raise BusinessValidationError(problem)
        if self.reference_rule and (problem := self.reference_rule(job_input, output)):
            raise ReferenceValidationError(problem)
        return output
