"""Pipelines as files (docs/jobtypes.md, "Pipelines as files"): a data job type's `steps` checked whole at
push, each refusal one line naming the step at fault, and compiled into a pipeline the worker runs like
the built-ins: `invoice_reviewed` (`extract`, then a review) run on the in-memory store to its approval."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aijobs.job_types import document_yaml, run_examples
from engine.core import JobStatus
from engine.core.errors import JobTypeFileError, PipelineStateError
from engine.definitions.data import DataPipelineDefinition, check_job_type, compile_job_type
from engine.definitions.data_steps import MAX_STEPS, StepTarget
from engine.definitions.pipelines import PipelineDefinition, ReviewStep, ThenStep
from engine.definitions.registry import BUILTIN_DEFINITIONS
from engine.pipelines import children_ids, decided_review
from tests.support.pipelines import Stack

CODE = {definition.name: definition for definition in BUILTIN_DEFINITIONS}
# A data job type pushed before: its production version's output schema.
PUSHED = {"triage": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}}
INVOICE = {
    "text": "Invoice 4711: EUR 120.50.",
    "fields": [{"name": "total", "description": "the total", "type": "number"}],
}


def lookup(name: str) -> StepTarget | None:
    """What the client's push asks the stack: a code job type, or a data one pushed before."""
    if name in CODE:
        definition = CODE[name]
        known = definition.output_model_for is None and definition.output_schema_for is None
        return StepTarget(isinstance(definition, PipelineDefinition), definition.output_json_schema if known else None)
    if name in PUSHED:
        return StepTarget(False, PUSHED[name])
    return None


def invoice_reviewed() -> dict[str, Any]:
    """The pipeline of docs/jobtypes.md: `extract` on the input, then a person approves the fields."""
    return {
        "name": "invoice_reviewed",
        "description": "Extract an invoice's fields, approved by a person.",
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "fields": {"type": "array", "items": {"type": "object"}}},
            "required": ["text", "fields"],
        },
        "output_schema": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]},
        "steps": [{"name": "fields", "run": "extract"}, {"name": "approve", "review": {"timeout_seconds": 3600}}],
        "examples": [{"input": INVOICE, "output": {"total": 120.5}}],
    }


def changed(**edits: Any) -> dict[str, Any]:
    document = copy.deepcopy(invoice_reviewed())
    document.update(edits)
    return document


def with_steps(*steps: dict[str, Any]) -> dict[str, Any]:
    return changed(steps=list(steps))


def test_a_steps_file_is_checked_and_compiled_into_a_pipeline_of_its_steps() -> None:
    checked = check_job_type(invoice_reviewed(), code_names=CODE, job_types=lookup)

    definition = compile_job_type(checked.document(), 3)

    assert isinstance(definition, DataPipelineDefinition)
    assert definition.job_type_version == 3
    assert [type(step) for step in definition.steps] == [ThenStep, ReviewStep]
    assert definition.steps[1].timeout_seconds == 3600  # type: ignore[union-attr]
    assert definition.child_types() == {"extract"}
    # and its stored form keeps the file's own words (`as`, `with`)
    mapped = with_steps(
        {"name": "each", "map": {"over": "fields", "with": {"text": "x"}}, "run": "extract"},
        {"name": "all", "run": "triage", "as": "items"},
    )
    mapped |= {"output_schema": PUSHED["triage"], "examples": []}
    stored = check_job_type(mapped, job_types=lookup).document()
    assert stored["steps"][0]["map"] == {"over": "fields", "with": {"text": "x"}}
    assert stored["steps"][1]["as"] == "items"


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "an unknown job type",
        with_steps({"name": "a", "run": "nothing_here"}),
        "steps[0] (a): run: no job type nothing_here",
    ),
    ("itself", with_steps({"name": "a", "run": "invoice_reviewed"}), "is this pipeline itself"),
    ("a pipeline", with_steps({"name": "a", "run": "summarize_long"}), "summarize_long is a pipeline"),
    ("a name repeated", with_steps({"name": "a", "run": "extract"}, {"name": "a", "run": "extract"}), "is taken"),
    ("a malformed name", with_steps({"name": "A b", "run": "extract"}), "steps.0.name"),
    ("two kinds", with_steps({"name": "a", "run": "extract", "review": {}}), "either `run`"),
    ("no kind", with_steps({"name": "a"}), "either `run`"),
    ("a review first", with_steps({"name": "r", "review": {}}, {"name": "a", "run": "extract"}), "cannot come first"),
    (
        "a review not last",
        with_steps({"name": "a", "run": "extract"}, {"name": "r", "review": {}}, {"name": "b", "run": "extract"}),
        "is a pipeline's last step",
    ),
    (
        "no field",
        with_steps(
            {"name": "m", "map": {"over": "nope", "as": "t"}, "run": "extract"}, {"name": "b", "run": "extract"}
        ),
        "nope is not a property",
    ),
    (
        "not an array",
        with_steps(
            {"name": "m", "map": {"over": "text", "as": "t"}, "run": "extract"}, {"name": "b", "run": "extract"}
        ),
        "not an array",
    ),
    (
        "items not objects",
        changed(
            input_schema={"type": "object", "properties": {"l": {"type": "array"}}},
            steps=[{"name": "m", "map": {"over": "l"}, "run": "extract"}, {"name": "b", "run": "extract"}],
        ),
        "give `as: FIELD`",
    ),
    (
        "a map last",
        with_steps({"name": "a", "run": "extract"}, {"name": "m", "map": {"over": "fields"}, "run": "extract"}),
        "cannot end a pipeline",
    ),
    (
        "a map reviewed",
        with_steps({"name": "m", "map": {"over": "fields"}, "run": "extract"}, {"name": "r", "review": {}}),
        "cannot review a map",
    ),
    ("too many", with_steps(*({"name": f"s{n}", "run": "extract"} for n in range(MAX_STEPS + 1))), "at most 10"),
    ("max_failed on a run", with_steps({"name": "a", "run": "extract", "max_failed": 1}), "max_failed is a map's"),
    (
        "an unanswered field",
        changed(steps=[{"name": "a", "run": "triage"}]),
        "requires total, which the last step's job type (triage)",
    ),
    (
        "another type",
        changed(
            output_schema={"type": "object", "properties": {"label": {"type": "number"}}},
            steps=[{"name": "a", "run": "triage"}],
        ),
        "label is number, but triage answers it as string",
    ),
    ("a prompt too", changed(prompt={"system": "s", "user": "u"}), "prompt: a pipeline (steps) calls no model itself"),
    ("reuse too", changed(reuse_seconds=600), "reuse_seconds: a pipeline (steps) calls no model itself"),
    ("neither", {k: v for k, v in invoice_reviewed().items() if k != "steps"}, "prompt: a job type has a prompt"),
    (
        "a review's extra",
        with_steps({"name": "a", "run": "extract"}, {"name": "r", "review": {"timeout": 3}}),
        "steps.1.review.timeout",
    ),
    (
        "a long review",
        with_steps({"name": "a", "run": "extract"}, {"name": "r", "review": {"timeout_seconds": 31 * 86400}}),
        "timeout_seconds",
    ),
]


@pytest.mark.parametrize(
    ("document", "says"), [(document, says) for _, document, says in REFUSED], ids=[i for i, _, _ in REFUSED]
)
def test_a_steps_file_is_refused_in_one_line_naming_what_is_wrong(document: dict[str, Any], says: str) -> None:
    with pytest.raises(JobTypeFileError) as refused:
        check_job_type(document, code_names=CODE, job_types=lookup)

    message = str(refused.value)
    assert says in message
    assert "\n" not in message


def test_a_file_checked_with_no_stack_to_ask_leaves_its_steps_job_types_unchecked() -> None:
    document = with_steps({"name": "a", "run": "pushed_elsewhere"})

    assert check_job_type(document | {"output_schema": {"type": "object"}}).steps is not None


def test_invoice_reviewed_runs_extract_then_waits_for_a_person_whose_edit_its_schema_checks() -> None:
    definition = compile_job_type(check_job_type(invoice_reviewed(), job_types=lookup).document(), 1)
    assert isinstance(definition, DataPipelineDefinition)
    stack = Stack([definition])
    stack.submit(definition, INVOICE)
    stack.advance()
    (fields,) = children_ids(stack.job())[0]
    assert stack.store.get_input(fields) == INVOICE
    stack.run_child(fields)
    stack.advance()
    waiting = stack.job()
    assert waiting.status is JobStatus.WAITING
    assert waiting.pipeline is not None
    assert waiting.pipeline.review is not None
    assert waiting.pipeline.review.output == {"total": 120.5}
    assert waiting.pipeline.review.timeout_ms == 3_600_000
    job_input = definition.parse_input(INVOICE)

    with pytest.raises(PipelineStateError, match=r"the edited output is refused: output.total: must be of type number"):
        decided_review(waiting, definition, job_input, True, {"total": "lots"}, None, "ana", stack.clock.ms)
    # a number Python's parser read as infinity (`--output '{"total": 1e999}'`) is no JSON number either
    with pytest.raises(PipelineStateError, match=r"the edited output is refused: output.total: a number out of range"):
        decided_review(waiting, definition, job_input, True, {"total": math.inf}, None, "ana", stack.clock.ms)
    review, kept, error = decided_review(
        waiting, definition, job_input, True, {"total": 121}, None, "ana", stack.clock.ms
    )
    done = stack.store.decide_review(waiting, review, kept, "h", error, stack.clock.tick())

    assert done.status is JobStatus.SUCCEEDED
    assert done.output == {"total": 121}


def test_types_test_checks_a_pipeline_files_examples_against_its_schemas() -> None:
    document = invoice_reviewed()
    document["examples"].append({"input": INVOICE, "output": {"total": "a lot"}})

    with pytest.raises(JobTypeFileError, match=r"examples\[1\]\.output"):
        run_examples(document)
    document["examples"].pop()
    name, runs = run_examples(document)

    assert name == "invoice_reviewed"
    assert [(run.number, run.passed) for run in runs] == [(1, True)]
    assert runs[0].detail == "input and output fit; its steps (fields, approve) run on a stack"


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
STEP_KEYS = st.sampled_from(["name", "run", "map", "review", "as", "with", "max_failed", "over", "timeout_seconds"])


@st.composite
def hostile_pipelines(draw: st.DrawFn) -> dict[str, Any]:
    """invoice_reviewed with its steps replaced by random ones: known keys, any values, any order."""
    steps = draw(
        st.lists(
            st.dictionaries(
                STEP_KEYS, VALUES | st.sampled_from(["extract", "summarize", "fields", "text"]), max_size=4
            ),
            max_size=MAX_STEPS + 2,
        )
    )
    return changed(steps=steps)


@settings(max_examples=200, deadline=None)
@given(document=hostile_pipelines())
def test_any_steps_are_checked_or_refused_in_one_line_and_a_checked_file_compiles(document: dict[str, Any]) -> None:
    refused: str | None = None
    try:
        checked = check_job_type(document, code_names=CODE, job_types=lookup)
    except JobTypeFileError as exc:
        refused = str(exc)
    if refused is not None:
        assert refused
        assert "\n" not in refused
        return
    definition = compile_job_type(checked.document(), 1)
    assert isinstance(definition, DataPipelineDefinition)
    assert check_job_type(checked.document(), code_names=CODE, job_types=lookup).sha256 == checked.sha256


def test_a_pipeline_file_as_types_show_prints_it_is_pushed_again_as_the_same_version() -> None:
    # Given a pipeline file checked and stored
    stored = check_job_type(invoice_reviewed(), code_names=CODE, job_types=lookup)

    # When its stored form is printed as `aijobs types show NAME --version N` prints it, and read back
    shown = yaml.safe_load(document_yaml(stored.document()))

    # Then it holds none of the fields a pipeline may not have (no defaults of a prompt's)
    assert not {"prompt", "rules", "model_tier", "max_tokens"} & set(shown)
    # and pushing it again is accepted, with the same content: no new version
    again = check_job_type(shown, code_names=CODE, job_types=lookup)
    assert again.sha256 == stored.sha256
