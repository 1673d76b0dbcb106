"""Job types as data (docs/jobtypes.md): a file checked whole at push, stored canonical, compiled into a JobDefinition.

A job type file (YAML or JSON, parsed by the client) names an input schema, an output schema, a
prompt, rules and limits. Three steps use it:

- `check_job_type(document, code_names)` at push: the whole file, refused with one line naming
  what is wrong and where (JobTypeFileError): the fields and their bounds (JobTypeFile), both
  schemas (engine.definitions.json_schemas: valid Draft 2020-12, the output usable as strict
  structured output), every template field a top-level property of the input schema, every rule
  compiling over `input` and `output` only (engine.definitions.rules), and every example valid
  against both schemas with every rule true on it (`check_examples`). A name a code job type holds
  is refused. Anything a document holds that JSON cannot (NaN, a date, a lone surrogate, a number
  of more than MAX_NUMBER_DIGITS digits, a key that is not a string) is refused before anything
  reads it.
- `JobTypeFile.document()` is the form stored as a version, `.sha256` its digest (canonical JSON:
  sorted keys, compact), so pushing identical content, in any key order, makes no new version.
- `compile_job_type(document, version)` when a worker first serves that version: a
  `DataJobDefinition` the runner and the gateway use as they use a code job type. Its input is
  checked against the input schema at intake (InputValidationError), the answer against the
  output schema (SchemaValidationError) and then each rule in order (BusinessValidationError with
  the rule's message). The validators and the CEL programs are compiled once, here; no example
  runs (the document was checked at push).

A file may declare `steps` instead of a prompt: a pipeline (engine.definitions.data_steps checks its
steps at push and builds them), compiled into a `DataPipelineDefinition` that the worker and the events
function run as they run the built-in pipelines; it has no prompt, rules or model settings of its own.

The prompt's `user` template substitutes each field as a JSON literal (engine.definitions.base.Prompt);
a field the input lacks renders as `null`. `system` is sent as it is written. `reuse_seconds` makes
later jobs of the same request take an answer already paid for (docs/reuse.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import string
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Annotated, Any

from jsonschema.protocols import Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.core.attachments import ALL_TYPES, AttachmentPolicy, MediaType
from engine.core.errors import (
    BusinessValidationError,
    InputValidationError,
    JobTypeFileError,
    OutputTooLargeError,
    SchemaValidationError,
)
from engine.core.reuse import MAX_REUSE_SECONDS, MIN_REUSE_SECONDS
from engine.definitions.base import MAX_INPUT_BYTES, JobDefinition, ModelTier, Prompt, distinct, one_line_error
from engine.definitions.data_steps import (
    JobTypeLookup,
    StepFile,
    build_steps,
    check_map_lengths,
    check_steps,
    map_fields,
)
from engine.definitions.json_schemas import check_schema, instance_problem, validator
from engine.definitions.pipelines import PipelineDefinition, pipeline_prompt
from engine.definitions.rules import (
    MAX_CHECK_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_RULE_STEPS,
    CompiledRule,
    compile_rule,
    fields_read,
    rule_values,
)
from engine.messages import MAX_DEADLINE_SECONDS, MIN_DEADLINE_SECONDS, JobTypeName, MaxAttempts
from engine.text import json_value_problem, key_label, one_line

MAX_FILE_BYTES = 256 * 1024
MAX_TEMPLATE_CHARS = 32 * 1024
MAX_RULES = 20
MAX_EXAMPLES = 20
MAX_ATTACHMENTS = 20
MAX_TOKENS = 32_768
MAX_TIMEOUT_SECONDS = 900
# Integers of more digits than a DynamoDB number keeps are refused (and Python's int-to-text limit never met).
MAX_NUMBER_DIGITS = 38
_TOO_MANY_DIGITS = 10**MAX_NUMBER_DIGITS

# The limits of a code job type, which a file that names none keeps.
_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in fields(JobDefinition)}
_FILE = ConfigDict(extra="forbid", strict=True, frozen=True)


class PromptFile(BaseModel):
    model_config = _FILE

    system: Annotated[str, Field(max_length=MAX_TEMPLATE_CHARS)]
    user: Annotated[str, Field(min_length=1, max_length=MAX_TEMPLATE_CHARS)]


class RuleFile(BaseModel):
    model_config = _FILE

    check: Annotated[str, Field(min_length=1, max_length=MAX_CHECK_CHARS)]
    message: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS)]


class AttachmentsFile(BaseModel):
    """The attachments a job of the type takes; `media_types` absent: every type (engine.core.attachments)."""

    model_config = _FILE

    max_count: Annotated[int, Field(ge=0, le=MAX_ATTACHMENTS)]
    # Named by their values ("application/pdf"): not strict, so that a string becomes the MediaType.
    media_types: Annotated[list[Annotated[MediaType, Field(strict=False)]], distinct("media_types")] | None = None
    # A required string property of the input schema that can carry what the job reads instead.
    required_unless: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    def policy(self) -> AttachmentPolicy:
        types = ALL_TYPES if self.media_types is None else frozenset(self.media_types)
        return AttachmentPolicy(max_count=self.max_count, media_types=types, required_unless=self.required_unless)


class ExampleFile(BaseModel):
    model_config = _FILE

    input: dict[str, Any]
    output: dict[str, Any]


class JobTypeFile(BaseModel):
    """A job type file's fields and their bounds; what crosses fields is checked by `check_job_type`."""

    model_config = _FILE

    name: JobTypeName
    description: Annotated[str, Field(max_length=1000)] = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    # A job type that calls a model has a prompt; a pipeline has steps instead (engine.definitions.data_steps).
    prompt: PromptFile | None = None
    steps: list[StepFile] | None = None
    rules: Annotated[list[RuleFile], Field(max_length=MAX_RULES)] = []
    model_tier: ModelTier = "primary"
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 1024
    timeout_seconds: Annotated[float, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] | None = None
    max_attempts: MaxAttempts | None = None
    deadline_seconds: Annotated[int, Field(ge=MIN_DEADLINE_SECONDS, le=MAX_DEADLINE_SECONDS)] | None = None
    attachments: AttachmentsFile | None = None
    reuse_seconds: Annotated[int, Field(ge=MIN_REUSE_SECONDS, le=MAX_REUSE_SECONDS)] | None = None
    examples: Annotated[list[ExampleFile], Field(max_length=MAX_EXAMPLES)] = []

    def document(self) -> dict[str, Any]:
        """The canonical stored form: every field as JSON, the absent optional ones left out, and a
        pipeline's model fields too (its file may not have them: what `types show` prints pushes again)."""
        left_out = set(_MODEL_FIELDS) if self.steps is not None else None
        return self.model_dump(mode="json", exclude_none=True, by_alias=True, exclude=left_out)

    @property
    def sha256(self) -> str:
        """The digest of the canonical document: identical content, in any key order, has the same."""
        return hashlib.sha256(canonical_json(self.document()).encode()).hexdigest()

    @property
    def template_fields(self) -> tuple[str, ...]:
        """The fields the user template substitutes, in order of first use (the file is checked)."""
        user = self.prompt.user if self.prompt is not None else ""
        names = (name for _, name, _, _ in string.Formatter().parse(user) if name)
        return tuple(dict.fromkeys(names))


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_job_type(
    document: Mapping[str, Any], code_names: Collection[str] = (), job_types: JobTypeLookup | None = None
) -> JobTypeFile:
    """The checked file; JobTypeFileError (one line: what is wrong, and where) for anything refused.
    `job_types` says what a pipeline's steps may run (None: their names are not checked)."""
    if not isinstance(document, Mapping):
        raise JobTypeFileError(f"a job type file is a mapping of its fields, not a {type(document).__name__}")
    for key, value in document.items():
        if not isinstance(key, str):
            raise JobTypeFileError(f"the file has a field named by a {type(key).__name__}, not a string")
        if json_value_problem(key, "a field's name"):
            raise JobTypeFileError(f"the field {key_label(key)} has a name holding a lone surrogate: not valid text")
        if problem := _not_json(value, key_label(key)) or json_value_problem(value, key_label(key)):
            raise JobTypeFileError(problem)
    _check_size(dict(document))
    try:
        file = JobTypeFile.model_validate(dict(document))
    except ValidationError as exc:
        raise JobTypeFileError(one_line(one_line_error(exc, "").removeprefix(": "))) from exc
    _check_size(file.document())
    if file.name in code_names:
        raise JobTypeFileError(f"name: {file.name} is a code job type")
    check_schema(file.input_schema, "input_schema", strict=False)
    if file.steps is not None:
        # A pipeline's output is its last step's, never a model's answer: no strict structured output.
        _check_pipeline_fields(document)
        check_schema(file.output_schema, "output_schema", strict=False)
        check_steps(file.name, file.steps, file.input_schema, file.output_schema, job_types)
    else:
        if file.prompt is None:
            raise JobTypeFileError("prompt: a job type has a prompt (or, a pipeline, steps)")
        check_schema(file.output_schema, "output_schema", strict=True)
        _check_template(file)
        _check_attachments(file)
        for index, rule in enumerate(file.rules):
            compile_rule(rule.check, rule.message, f"rules[{index}].check")
            _check_rule_fields(file, rule.check, f"rules[{index}].check")
    check_examples(file)
    return file


# What a pipeline's file may not have: it calls no model itself, its steps' job types do (and reuse
# their answers by their own reuse_seconds).
_MODEL_FIELDS = ("prompt", "rules", "model_tier", "max_tokens", "timeout_seconds", "attachments", "reuse_seconds")


def _check_pipeline_fields(document: Mapping[str, Any]) -> None:
    for name in _MODEL_FIELDS:
        if name in document:
            raise JobTypeFileError(f"{name}: a pipeline (steps) calls no model itself, its steps do: remove {name}")


def _check_rule_fields(file: JobTypeFile, check: str, where: str) -> None:
    """A rule reads only fields its schemas have: `output.lable` for `label` would fail every answer,
    each after its re-asks. An input schema that allows other properties may have any."""
    for variable, name in sorted(fields_read(check)):
        schema = file.input_schema if variable == "input" else file.output_schema
        properties = schema.get("properties", {})
        if name not in properties and schema.get("additionalProperties") is False:
            known = ", ".join(key_label(key) for key in properties) or "none"
            raise JobTypeFileError(
                one_line(f"{where}: reads {variable}.{name}, which {variable}_schema does not have (it has {known})")
            )


def check_examples(file: JobTypeFile) -> None:
    """Every example's input valid against the input schema, its output against the output schema,
    and every rule true on it; JobTypeFileError naming the first that is not."""
    compiled = _Compiled.of(file)
    for index, example in enumerate(file.examples):
        where = f"examples[{index}]"
        if problem := instance_problem(compiled.input_validator, example.input, f"{where}.input"):
            raise JobTypeFileError(problem)
        if problem := instance_problem(compiled.output_validator, example.output, f"{where}.output"):
            raise JobTypeFileError(problem)
        values = rule_values(example.input, example.output)
        for number, rule in enumerate(compiled.rules):
            if problem := rule.problem(example.input, example.output, values):
                raise JobTypeFileError(one_line(f"{where}: rule {number + 1} ({rule.message}) {problem}"))


def compile_job_type(document: Mapping[str, Any], version: int) -> DataJobDefinition | DataPipelineDefinition:
    """The definition of a stored (checked) file's `version`: cheap, no example runs."""
    file = JobTypeFile.model_validate(dict(document))
    compiled = _Compiled.of(file)
    if file.steps is not None:
        return DataPipelineDefinition(
            name=file.name,
            input_model=DataInput,
            output_model=DataOutput,
            prompt=pipeline_prompt(file.name),
            job_type_version=version,
            steps=build_steps(file.steps),
            file=file,
            input_validator=compiled.input_validator,
            output_validator=compiled.output_validator,
            map_fields=map_fields(file.steps),
            max_attempts=_or_default(file.max_attempts, "max_attempts"),
            deadline_seconds=_or_default(file.deadline_seconds, "deadline_seconds"),
        )
    assert file.prompt is not None
    policy = file.attachments.policy() if file.attachments is not None else AttachmentPolicy()
    return DataJobDefinition(
        name=file.name,
        input_model=DataInput,
        output_model=DataOutput,
        prompt=Prompt(key=file.name, version=f"v{version}", system=file.prompt.system, user=file.prompt.user),
        model_tier=file.model_tier,
        max_tokens=file.max_tokens,
        prompt_fields=partial(_template_values, file.template_fields),
        attachments=policy,
        job_type_version=version,
        file=file,
        input_validator=compiled.input_validator,
        output_validator=compiled.output_validator,
        rules=compiled.rules,
        timeout_seconds=_or_default(file.timeout_seconds, "timeout_seconds"),
        max_attempts=_or_default(file.max_attempts, "max_attempts"),
        deadline_seconds=_or_default(file.deadline_seconds, "deadline_seconds"),
        reuse_seconds=file.reuse_seconds,
    )


class DataInput(BaseModel):
    """A data job's input: the object the input schema accepted, as it is (`model_dump` gives it back)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class DataOutput(BaseModel):
    """A data job's answer: the object the output schema and the rules accepted, as it is."""

    model_config = ConfigDict(extra="allow", frozen=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataJobDefinition(JobDefinition):
    """A JobDefinition compiled from a file: JSON Schema and CEL where a code job type has pydantic and Python."""

    file: JobTypeFile = field(repr=False, compare=False)
    input_validator: Validator = field(repr=False, compare=False)
    output_validator: Validator = field(repr=False, compare=False)
    rules: tuple[CompiledRule, ...] = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        # The base's reads the output model's schema and the input model's fields; a file has its own.
        object.__setattr__(self, "output_json_schema", self.file.output_schema)

    def parse_input(self, raw: Mapping[str, Any]) -> BaseModel:
        job_input = _checked_input(self.input_validator, raw)
        values = rule_values(job_input, {})
        for number, rule in enumerate(self.rules, start=1):
            # An input on which a rule would not run, whatever the answer: refused before any call.
            if (steps := rule.steps(values)) > MAX_RULE_STEPS:
                raise InputValidationError(
                    one_line(
                        f"input: rule {number} ({rule.message}) could take {steps} steps on it, more than "
                        f"{MAX_RULE_STEPS}: no answer could be checked"
                    )
                )
        return DataInput.model_validate(job_input)

    def validate_output(self, job_input: BaseModel, content: str) -> BaseModel:
        """The answer: bounded, strict JSON, valid against the output schema, then true on every rule."""
        if len(content) > self.max_answer_chars:
            raise OutputTooLargeError(
                f"the answer has {len(content)} characters; max_tokens {self.max_tokens} allows at most "
                f"{self.max_answer_chars}"
            )
        output = _parse_answer(content)
        if problem := instance_problem(self.output_validator, output, "output"):
            raise SchemaValidationError(problem)
        given = job_input.model_dump(mode="json")
        values = rule_values(given, output)
        for number, rule in enumerate(self.rules, start=1):
            if (problem := rule.problem(given, output, values)) is None:
                continue
            if rule.steps(values) > MAX_RULE_STEPS:  # not the answer's fault: say so
                raise BusinessValidationError(one_line(f"rule {number} ({rule.message}) {problem}"))
            raise BusinessValidationError(rule.message)
        return DataOutput.model_validate(output)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPipelineDefinition(PipelineDefinition):
    """A pipeline compiled from a file's steps: its input checked by the input schema (and each map's
    list bounded), an output a review edited by the output schema."""

    file: JobTypeFile = field(repr=False, compare=False)
    input_validator: Validator = field(repr=False, compare=False)
    output_validator: Validator = field(repr=False, compare=False)
    map_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super(DataPipelineDefinition, self).__post_init__()
        object.__setattr__(self, "output_json_schema", self.file.output_schema)

    def parse_input(self, raw: Mapping[str, Any]) -> BaseModel:
        job_input = _checked_input(self.input_validator, raw)
        check_map_lengths(self.map_fields, job_input)
        return DataInput.model_validate(job_input)

    def edited_output(self, job_input: BaseModel, output: dict[str, Any]) -> dict[str, Any]:
        if problem := instance_problem(self.output_validator, output, "output"):
            raise ValueError(problem)
        return dict(output)


@dataclass(frozen=True, slots=True)
class _Compiled:
    input_validator: Validator
    output_validator: Validator
    rules: tuple[CompiledRule, ...]

    @classmethod
    def of(cls, file: JobTypeFile) -> _Compiled:
        rules = tuple(
            compile_rule(rule.check, rule.message, f"rules[{index}].check") for index, rule in enumerate(file.rules)
        )
        return cls(validator(file.input_schema), validator(file.output_schema), rules)


def _checked_input(checker: Validator, raw: Mapping[str, Any]) -> dict[str, Any]:
    """A data job's input: text (no lone surrogate, which has no size in UTF-8), bounded, and valid
    against its input schema (InputValidationError, one line)."""
    if problem := json_value_problem(raw, "input"):
        raise InputValidationError(problem)
    size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_INPUT_BYTES:
        raise InputValidationError(f"input is {size} bytes; the limit is {MAX_INPUT_BYTES}")
    job_input = dict(raw)
    if problem := instance_problem(checker, job_input, "input"):
        raise InputValidationError(problem)
    return job_input


def _or_default(value: Any, name: str) -> Any:
    """A limit the file sets, else the one every job type has (JobDefinition's default)."""
    return value if value is not None else _DEFAULTS[name]


def _template_values(names: tuple[str, ...], job_input: BaseModel) -> dict[str, Any]:
    given = job_input.model_dump(mode="json")
    return {name: given.get(name) for name in names}


def _parse_answer(content: str) -> Any:
    try:
        output = json.loads(content, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        what = "is nested too deep" if isinstance(exc, RecursionError) else "is not valid JSON"
        raise SchemaValidationError(f"output: {what}") from exc
    if problem := json_value_problem(output, "output"):
        raise SchemaValidationError(problem)
    return output


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _check_size(document: dict[str, Any]) -> None:
    size = len(canonical_json(document).encode())
    if size > MAX_FILE_BYTES:
        raise JobTypeFileError(
            f"the file is {size} bytes as canonical JSON; a job type file holds at most {MAX_FILE_BYTES}"
        )


def _check_template(file: JobTypeFile) -> None:
    assert file.prompt is not None
    properties = file.input_schema.get("properties", {})
    try:
        parsed = list(string.Formatter().parse(file.prompt.user))
    except ValueError as exc:
        raise JobTypeFileError(f"prompt.user: is not a valid template: {exc} (write a brace as {{{{ or }}}})") from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        label = one_line(name, 80)
        if not name.isidentifier():
            raise JobTypeFileError(
                f"prompt.user: field {{{label}}} is not a property name (no dots, indexes or blanks)"
            )
        if conversion is not None or spec:
            raise JobTypeFileError(f"prompt.user: field {{{label}}} has a conversion or format; write {{{label}}}")
        if name not in properties:
            raise JobTypeFileError(f"prompt.user: {{{label}}} is not a property of input_schema")


def _check_attachments(file: JobTypeFile) -> None:
    if file.attachments is None or file.attachments.required_unless is None:
        return
    instead = file.attachments.required_unless
    node = file.input_schema.get("properties", {}).get(instead)
    if file.attachments.max_count == 0:
        raise JobTypeFileError("attachments.required_unless: the job type takes no attachments (max_count is 0)")
    if (
        not isinstance(node, dict)
        or node.get("type") != "string"
        or instead not in file.input_schema.get("required", [])
    ):
        raise JobTypeFileError(
            f"attachments.required_unless: {key_label(instead)} is not a required string property of input_schema"
        )


def _not_json(value: Any, name: str) -> str | None:
    """Why `value` holds what JSON cannot (walked without recursion), or None; paths name positions only."""
    stack: list[tuple[Any, str]] = [(value, name)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return f"{path}: has a key that is a {type(key).__name__}, not a string"
                stack.append((item, f"{path}.{key_label(key)}"))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(node))
        elif isinstance(node, bool) or node is None or isinstance(node, str):
            continue
        elif isinstance(node, int):
            if abs(node) >= _TOO_MANY_DIGITS:  # compared, never converted to text (which has a limit)
                return f"{path}: is a number of more than {MAX_NUMBER_DIGITS} digits"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return f"{path}: is {node}, which is not a JSON number"
        else:
            return f"{path}: is a {type(node).__name__}, not a JSON value (quote it to make it a string)"
    return None
