"""A data job type's `steps` (docs/jobtypes.md, "Pipelines as files"): a pipeline written as a file.

```yaml
steps:
  - {name: fields, run: extract}                                   # a job type
  - {name: lines, map: {over: items, as: text, with: {max_words: 40}}, run: summarize, max_failed: 2}
  - {name: approve, review: {timeout_seconds: 3600}}               # a person decides
```

- A `run` step runs its job type once. The first step's input is the pipeline's; a later one's is the
  previous step's output (after a map: `{<as, default "items">: [each part's output, in order]}`),
  either way with the step's `with` fields added.
- A `map` step runs its job type once per item of the input's array field `over` (at most MAX_PARTS):
  with `as`, each item becomes that field of the child's input; without, each item (an object) is the
  child's input. `with` adds constant fields; `max_failed` children may fail without failing it.
- A `review` waits for a person (`timeout_seconds`, 1 s to 30 days, default 24 h). A review is the last
  step, never the first, and a map is neither the last step nor the one a review reviews (its output
  is a list, a pipeline's is an object).

`check_steps` refuses a file with one line naming the step at fault: a name repeated or malformed, a
step that is not exactly one kind, a review out of place, a map over a field the input schema lacks or
that is not an array, too many steps, a `run` of a job type the stack does not know, of the pipeline
itself or of another pipeline (a step runs a job type that calls a model: pipelines do not nest, so no
cycle can form), and an output schema the last step's job type cannot answer (where its output schema
is known: a data job type's, or a code job type's that does not depend on the input). `build_steps`
makes the engine's steps (engine.definitions.pipelines) that the worker and the events function run
like the built-ins'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine.core.errors import InputValidationError, JobTypeFileError
from engine.definitions.pipelines import MAX_PARTS, MAX_REVIEW_SECONDS, MapStep, ReviewStep, Step, ThenStep
from engine.messages import JobTypeName
from engine.text import key_label, one_line

MAX_STEPS = 10
# What a map step's parts are called in the input of a `run` step after it, unless it says (`as`).
DEFAULT_LIST_FIELD = "items"

_FILE = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)
StepName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
FieldName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class MapFile(BaseModel):
    model_config = _FILE

    over: FieldName
    as_: Annotated[FieldName | None, Field(alias="as")] = None
    with_: Annotated[dict[str, Any], Field(alias="with")] = {}


class ReviewFile(BaseModel):
    model_config = _FILE

    timeout_seconds: Annotated[int, Field(ge=1, le=MAX_REVIEW_SECONDS)] = 86_400


class StepFile(BaseModel):
    model_config = _FILE

    name: StepName
    run: JobTypeName | None = None
    map: MapFile | None = None
    review: ReviewFile | None = None
    # A `run` step's: the field its list of a map's outputs is given as, and constant fields it adds.
    as_: Annotated[FieldName | None, Field(alias="as")] = None
    with_: Annotated[dict[str, Any] | None, Field(alias="with")] = None
    max_failed: Annotated[int, Field(ge=0, le=MAX_PARTS)] = 0


@dataclass(frozen=True, slots=True)
class StepTarget:
    """What a step's `run` names, as a push sees it: whether it is a pipeline, and its output schema when
    known (None: it depends on the input, as `extract`'s does)."""

    pipeline: bool
    output_schema: dict[str, Any] | None


# A job type's name -> what it is, or None for a name the stack does not know.
JobTypeLookup = Callable[[str], StepTarget | None]


def check_steps(
    name: str,
    steps: list[StepFile],
    input_schema: Mapping[str, Any],
    output_schema: Mapping[str, Any],
    lookup: JobTypeLookup | None,
) -> None:
    """JobTypeFileError (one line) for the first thing wrong with `steps`; `lookup` None checks no `run`
    name (`aijobs types test`, which has no stack to ask)."""
    if not steps:
        raise JobTypeFileError("steps: a pipeline has at least one step")
    if len(steps) > MAX_STEPS:
        raise JobTypeFileError(f"steps: {len(steps)} steps; a pipeline has at most {MAX_STEPS}")
    seen: set[str] = set()
    for index, step in enumerate(steps):
        where = f"steps[{index}] ({step.name})"
        if step.name in seen:
            raise JobTypeFileError(f"{where}: the name {step.name} is taken by an earlier step")
        seen.add(step.name)
        reviewed = index + 1 < len(steps) and steps[index + 1].review is not None
        _check_kind(step, where, index, len(steps), reviewed)
        if step.map is not None:
            _check_map(step.map, where, input_schema)
        if step.run is not None and lookup is not None:
            _check_run(step.run, where, name, lookup)
    last = steps[-2] if steps[-1].review is not None else steps[-1]
    if last.run is not None and lookup is not None:
        target = lookup(last.run)
        if target is not None and target.output_schema is not None:
            _check_output(output_schema, target.output_schema, last.run)


def _check_kind(step: StepFile, where: str, index: int, count: int, reviewed: bool) -> None:
    if (step.run is None) == (step.review is None):
        raise JobTypeFileError(f"{where}: a step has either `run` (with `map` for a map) or `review`")
    if step.review is not None:
        if step.map is not None or step.with_ is not None or step.as_ is not None or step.max_failed:
            raise JobTypeFileError(f"{where}: a review takes `timeout_seconds` only")
        if index == 0:
            raise JobTypeFileError(f"{where}: a review reviews a step's output, so it cannot come first")
        if index != count - 1:
            raise JobTypeFileError(f"{where}: a review is a pipeline's last step")
        return
    if step.map is None:
        if step.max_failed:
            raise JobTypeFileError(f"{where}: max_failed is a map's (a run step makes one child)")
        return
    if step.as_ is not None or step.with_ is not None:
        raise JobTypeFileError(f"{where}: a map's `as` and `with` go in its `map`")
    if index == count - 1:
        raise JobTypeFileError(f"{where}: a map cannot end a pipeline (its output is a list): add a run step after it")
    if reviewed:
        raise JobTypeFileError(f"{where}: a review cannot review a map's outputs (a list): add a run step between")


def _check_map(spec: MapFile, where: str, input_schema: Mapping[str, Any]) -> None:
    node = input_schema.get("properties", {}).get(spec.over)
    label = key_label(spec.over)
    if not isinstance(node, Mapping):
        raise JobTypeFileError(f"{where}: map.over: {label} is not a property of input_schema")
    if node.get("type") != "array":
        raise JobTypeFileError(f"{where}: map.over: {label} is not an array in input_schema (type: array)")
    if spec.as_ is not None and not spec.as_.isidentifier():
        raise JobTypeFileError(f"{where}: map.as: {key_label(spec.as_)} is not a field name")
    if spec.as_ is None and not _items_are_objects(node):
        raise JobTypeFileError(
            f"{where}: map: each item of {label} becomes a child's input only if it is an object: "
            "give `as: FIELD` to make it a field of the input"
        )


def _items_are_objects(node: Mapping[str, Any]) -> bool:
    items = node.get("items")
    return isinstance(items, Mapping) and items.get("type") == "object"


def _check_run(run: str, where: str, name: str, lookup: JobTypeLookup) -> None:
    if run == name:
        raise JobTypeFileError(
            f"{where}: run: {run} is this pipeline itself; a step runs a job type that calls a model"
        )
    target = lookup(run)
    if target is None:
        raise JobTypeFileError(f"{where}: run: no job type {run} is registered or pushed")
    if target.pipeline:
        raise JobTypeFileError(f"{where}: run: {run} is a pipeline; a step runs a job type that calls a model")


def _check_output(output_schema: Mapping[str, Any], answered: Mapping[str, Any], run: str) -> None:
    """The pipeline's output schema against the last step's: what it requires is answered, of the same
    type, and what the step always answers is allowed."""
    wanted = output_schema.get("properties", {})
    given = answered.get("properties", {})
    for field_name in output_schema.get("required", []):
        if field_name not in given:
            label = key_label(field_name)
            raise JobTypeFileError(
                f"output_schema: requires {label}, which the last step's job type ({run}) does not answer"
            )
    for field_name, node in wanted.items():
        theirs = given.get(field_name)
        if not (isinstance(node, Mapping) and isinstance(theirs, Mapping) and "type" in node and "type" in theirs):
            continue
        if node["type"] != theirs["type"]:
            label = key_label(field_name)
            raise JobTypeFileError(
                f"output_schema: {label} is {node['type']}, but {run} answers it as {theirs['type']}"
            )
    if output_schema.get("additionalProperties") is False:
        for field_name in answered.get("required", []):
            if field_name not in wanted:
                raise JobTypeFileError(
                    f"output_schema: {run} always answers {key_label(field_name)}, which output_schema does not allow"
                )


# --- the engine's steps ------------------------------------------------------------------------------


def build_steps(steps: list[StepFile]) -> tuple[Step, ...]:
    """The checked file's steps as the engine runs them."""
    built: list[Step] = []
    for index, step in enumerate(steps):
        if step.review is not None:
            built.append(ReviewStep(name=step.name, timeout_seconds=step.review.timeout_seconds))
            continue
        assert step.run is not None
        if step.map is not None:
            parts = partial(_list_parts, step.map.over, step.map.as_, dict(step.map.with_))
            built.append(MapStep(name=step.name, run=step.run, parts=parts, max_failed=step.max_failed))
            continue
        after_map = index > 0 and steps[index - 1].map is not None
        then = partial(_then_input, index == 0, after_map, step.as_ or DEFAULT_LIST_FIELD, dict(step.with_ or {}))
        built.append(ThenStep(name=step.name, run=step.run, input=then))
    return tuple(built)


def _list_parts(over: str, as_: str | None, with_: dict[str, Any], job_input: BaseModel) -> list[dict[str, Any]]:
    items = job_input.model_dump(mode="json").get(over)
    if not isinstance(items, list):
        raise InputValidationError(f"input.{key_label(over)}: a map's field must be a list")
    if len(items) > MAX_PARTS:
        raise InputValidationError(
            f"input.{key_label(over)}: {len(items)} items; a map makes at most {MAX_PARTS} parts"
        )
    if as_ is not None:
        return [{as_: item, **with_} for item in items]
    for number, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputValidationError(
                f"input.{key_label(over)}[{number}]: an item mapped without `as` must be an object"
            )
    return [{**item, **with_} for item in items]


def _then_input(
    first: bool,
    after_map: bool,
    list_field: str,
    with_: dict[str, Any],
    job_input: BaseModel,
    outputs: list[dict[str, Any]],
) -> dict[str, Any]:
    if first:
        return {**job_input.model_dump(mode="json"), **with_}
    if after_map:
        return {list_field: outputs, **with_}
    return {**(outputs[-1] if outputs else {}), **with_}


def map_fields(steps: list[StepFile]) -> tuple[str, ...]:
    """The input fields the pipeline's maps go over (their lengths are checked at intake)."""
    return tuple(step.map.over for step in steps if step.map is not None)


def check_map_lengths(fields: tuple[str, ...], job_input: Mapping[str, Any]) -> None:
    """InputValidationError (one line) for a map's list of more than MAX_PARTS items, or of none."""
    for field_name in fields:
        items = job_input.get(field_name)
        if isinstance(items, list) and len(items) > MAX_PARTS:
            raise InputValidationError(
                one_line(f"input.{key_label(field_name)}: {len(items)} items; a map makes at most {MAX_PARTS} parts")
            )
        if isinstance(items, list) and not items:
            raise InputValidationError(f"input.{key_label(field_name)}: an empty list: a map needs at least one item")
