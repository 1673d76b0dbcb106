"""A job type: its input and output models, its prompt, its limits and its rules."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ValidationError

from engine.core.attachments import ALL_TYPES, MAX_ATTACHMENTS, NO_ATTACHMENTS, AttachmentPolicy
from engine.core.errors import (
    BusinessValidationError,
    InputValidationError,
    OutputTooLargeError,
    ReferenceValidationError,
    SchemaValidationError,
)
from engine.core.reuse import MAX_REUSE_SECONDS, MIN_REUSE_SECONDS
from engine.text import key_label

# The largest input a job takes, as compact JSON: what one SQS message can carry. Inputs too large
# for a DynamoDB item are kept in the payload bucket (engine.store.payloads).
MAX_INPUT_BYTES = 1024 * 1024
# The largest output a job stores (compact JSON): it shares the job's item, which stops at 400 KB.
MAX_OUTPUT_BYTES = 256 * 1024
# No tokenizer in use averages more characters per token than this, so an answer longer than
# max_tokens x 16 characters did not come from max_tokens tokens: it is refused before parsing.
MAX_CHARS_PER_TOKEN = 16

# What the built-ins that read documents take: up to 20 attachments of every kind, or a text instead.
DOCUMENTS_OR_TEXT = AttachmentPolicy(max_count=MAX_ATTACHMENTS, media_types=ALL_TYPES, required_unless="text")

ModelTier = Literal["primary", "fallback"]
# A rule returns None when the output is acceptable, or one line saying what is wrong.
Rule = Callable[[Any, Any], str | None]
# The output's JSON schema for one parsed input: the output model's, narrowed by what the input offers.
OutputSchemaFor = Callable[[Any], dict[str, Any]]
# The output model for one parsed input, when the input says what the answer holds (extract's fields).
OutputModelFor = Callable[[Any], type[BaseModel]]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    key: str
    version: str
    system: str
    user: str

    @property
    def sha256(self) -> str:
        """The digest of the text the model was sent (system, then user), as an attempt records it."""
        text = f"{self.system}\x00{self.user}"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Prompt:
    """A versioned prompt; `user` is a str.format template over the job type's prompt fields.

    Every field is substituted as a JSON literal (a string in quotes, a list in brackets): user
    content arrives in a block its own text cannot close, since JSON escapes every quote and
    newline in it. The template itself is the only text the model reads as instructions.
    """

    key: str
    version: str
    system: str
    user: str

    def render(self, fields: Mapping[str, Any]) -> RenderedPrompt:
        literals = {name: json.dumps(value, ensure_ascii=False) for name, value in fields.items()}
        return RenderedPrompt(self.key, self.version, self.system, self.user.format_map(literals))


def _default_prompt_fields(job_input: BaseModel) -> dict[str, Any]:
    fields: dict[str, Any] = job_input.model_dump(mode="json")
    return fields


def _default_projection(output: BaseModel) -> dict[str, Any]:
    return output.model_dump(mode="json")


def narrowed_schema(schema: Mapping[str, Any], path: tuple[str, ...], node: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `schema` whose node at `path` (keys from the root, e.g. ("properties", "label")) is `node`."""
    narrowed: dict[str, Any] = copy.deepcopy(dict(schema))
    parent = narrowed
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = dict(node)
    return narrowed


Item = TypeVar("Item")


def distinct(what: str, key: Callable[[Any], Hashable] = lambda item: item) -> AfterValidator:
    """A list validator (for Annotated) refusing two items with the same `key`: "`what` must be distinct"."""

    def check(items: list[Item]) -> list[Item]:
        if len({key(item) for item in items}) != len(items):
            raise ValueError(f"{what} must be distinct")
        return items

    return AfterValidator(check)


def storable_output(output: dict[str, Any]) -> dict[str, Any]:
    """`output` as a job stores it; OutputTooLargeError when it cannot fit the job's item."""
    size = len(json.dumps(output, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_OUTPUT_BYTES:
        raise OutputTooLargeError(f"the output is {size} bytes as JSON; a job stores at most {MAX_OUTPUT_BYTES}")
    return output


def one_line_error(exc: ValidationError, prefix: str) -> str:
    """The first pydantic error as one line, e.g. `input.labels: List should have at least 2 items`."""
    errors = exc.errors()
    first = errors[0]
    # Positions and identifier-like keys only: the message is stored and shown, and must quote no content.
    parts = (prefix, *(key_label(part) if isinstance(part, str) else str(part) for part in first["loc"]))
    location = ".".join(part for part in parts if part != "")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{location}: {first['msg']}{more}"


def check_reuse_seconds(name: str, seconds: int | None) -> None:
    """A job type's reuse_seconds is unset or a whole number of seconds within the bounds."""
    if seconds is None:
        return
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not MIN_REUSE_SECONDS <= seconds <= MAX_REUSE_SECONDS
    ):
        raise ValueError(
            f"job type {name!r}: reuse_seconds is a whole number from {MIN_REUSE_SECONDS} to {MAX_REUSE_SECONDS}"
        )


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
    prompt_fields: Callable[[Any], Mapping[str, Any]] = _default_prompt_fields
    business_rule: Rule | None = None
    reference_rule: Rule | None = None
    project: Callable[[Any], dict[str, Any]] = _default_projection
    # Narrows the output schema for an input (classify: the label is one of the labels offered).
    # None: every input gets `output_json_schema`. The rules still check the answer either way.
    output_schema_for: OutputSchemaFor | None = None
    # The output model an answer to an input is validated against, when the input says what the answer
    # holds (extract: exactly the fields asked). None: every answer is validated against `output_model`.
    output_model_for: OutputModelFor | None = None
    # The documents and images it takes (how many, which types): none by default.
    attachments: AttachmentPolicy = NO_ATTACHMENTS
    # The prompt of a job that carries attachments, worded for them (its own version, since its text
    # differs). None: `prompt`, with or without attachments.
    attachment_prompt: Prompt | None = None
    # A data job type's version (docs/jobtypes.md): the immutable version of its file this definition
    # was compiled from. None for a code job type, whose version is its deploy.
    job_type_version: int | None = None
    # The largest input it takes, as compact UTF-8 JSON: what one message carries, unless the job
    # type reads more (summarize_long: a submission stores it, in the payload bucket past 256 KiB).
    max_input_bytes: int = MAX_INPUT_BYTES
    # How long an answer it paid for is taken by later jobs of the same request instead of a call
    # (docs/reuse.md): from MIN_REUSE_SECONDS to MAX_REUSE_SECONDS; None: never (the default).
    reuse_seconds: int | None = None
    output_json_schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_json_schema", self.output_model.model_json_schema())
        check_reuse_seconds(self.name, self.reuse_seconds)
        instead = self.attachments.required_unless
        if instead is not None and (not self.attachments.takes_any or instead not in self.input_model.model_fields):
            raise ValueError(
                f"job type {self.name!r}: attachments required_unless {instead!r} names no field of its input "
                "model, or it takes no attachments"
            )

    @property
    def max_answer_chars(self) -> int:
        """The longest answer `max_tokens` tokens can be; a longer one is refused unparsed."""
        return self.max_tokens * MAX_CHARS_PER_TOKEN

    def parse_input(self, raw: Mapping[str, Any]) -> BaseModel:
        size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
        if size > self.max_input_bytes:
            raise InputValidationError(f"input is {size} bytes; the limit is {self.max_input_bytes}")
        try:
            return self.input_model.model_validate(raw)
        except ValidationError as exc:
            raise InputValidationError(one_line_error(exc, "input")) from exc

    def render_prompt(self, job_input: BaseModel, attachments: int = 0) -> RenderedPrompt:
        """The prompt for `job_input`, followed in the request by `attachments` attachments."""
        prompt = self.attachment_prompt if attachments and self.attachment_prompt is not None else self.prompt
        return prompt.render(self.prompt_fields(job_input))

    def output_schema(self, job_input: BaseModel) -> dict[str, Any]:
        """The JSON schema the answer to `job_input` must meet: what structured output asks the model for."""
        if self.output_schema_for is None:
            return self.output_json_schema
        return self.output_schema_for(job_input)

    def validate_output(self, job_input: BaseModel, content: str) -> BaseModel:
        """Parse the model's answer: JSON, then the output model, then the business and reference rules."""
        if len(content) > self.max_answer_chars:
            raise OutputTooLargeError(
                f"the answer has {len(content)} characters; max_tokens {self.max_tokens} allows at most "
                f"{self.max_answer_chars}"
            )
        model = self.output_model if self.output_model_for is None else self.output_model_for(job_input)
        try:
            output = model.model_validate_json(content)
        except ValidationError as exc:
            raise SchemaValidationError(one_line_error(exc, "output")) from exc
        if self.business_rule and (problem := self.business_rule(job_input, output)):
            raise BusinessValidationError(problem)
        if self.reference_rule and (problem := self.reference_rule(job_input, output)):
            raise ReferenceValidationError(problem)
        return output

    def stored_output(self, output: BaseModel) -> dict[str, Any]:
        """The projected output the job stores; OutputTooLargeError when it cannot fit the job's item."""
        return storable_output(self.project(output))
