"""What the model answered when validation refused it: kept on the attempt (bounded), with the re-asks
and the prompt's digest, and shown as text by `aijobs inspect` (docs/jobtypes.md)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from aijobs.render import refused_answers
from engine.core import AttemptOutcome, ErrorCode
from engine.core.job import AttemptRecord
from engine.definitions import JobRegistry
from engine.gateway import Execution, ModelGateway, ModelTiers
from engine.store.items import MAX_REFUSED_ANSWER_CHARS, attempt_from_item, attempt_item
from engine.views import AttemptView
from tests.support.providers import VALID_OUTPUTS, FakeProvider, Script
from tests.unit.test_gateway import INPUTS, WRONG_LABEL, scripted


def execute(script: Script, repair_attempts: int = 1) -> Execution:
    provider = FakeProvider(script)
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini"), None, repair_attempts=repair_attempts)
    return gateway.execute(definition, definition.parse_input(INPUTS["classify"]), None)


def record(answer: str | None, reasks: int = 1) -> AttemptRecord:
    return AttemptRecord(
        job_id="job-1",
        attempt=1,
        user_id="u",
        job_type="classify",
        started_at=1,
        finished_at=2,
        outcome=AttemptOutcome.FAILED,
        error_code=ErrorCode.BUSINESS_VALIDATION_FAILED,
        prompt_key="classify",
        prompt_version="1",
        reasks=reasks,
        refused_answer=answer,
        prompt_sha256="ab" * 32 if answer is not None else None,
    )


def test_an_attempt_refused_in_the_end_keeps_the_last_answer_and_counts_its_re_asks() -> None:
    execution = execute(scripted("this is not json", WRONG_LABEL))

    assert execution.error is not None
    assert execution.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert execution.reasks == 1
    assert execution.refused_answer == json.dumps(WRONG_LABEL)
    assert len(execution.prompt.sha256) == 64


def test_a_repaired_attempt_counts_its_re_ask_and_keeps_no_refused_answer() -> None:
    execution = execute(scripted("this is not json", VALID_OUTPUTS["classify"]))

    assert execution.error is None
    assert (execution.reasks, execution.refused_answer) == (1, None)


def test_an_attempt_without_repairs_keeps_the_one_answer_refused() -> None:
    execution = execute(scripted("prose, not JSON"), repair_attempts=0)

    assert execution.error is not None
    assert execution.error.code is ErrorCode.SCHEMA_VALIDATION_FAILED
    assert (execution.reasks, execution.refused_answer) == (0, "prose, not JSON")


def test_the_prompt_digest_is_of_the_text_sent() -> None:
    definition = JobRegistry().get("classify")
    one = definition.render_prompt(definition.parse_input(INPUTS["classify"]), 0)
    other = definition.render_prompt(definition.parse_input({"text": "other", "labels": ["a", "b"]}), 0)

    assert one.sha256 != other.sha256
    assert one.sha256 == definition.render_prompt(definition.parse_input(INPUTS["classify"]), 0).sha256


def test_the_attempt_item_keeps_the_answer_its_re_asks_and_the_prompt_digest() -> None:
    kept = attempt_from_item(attempt_item(record('{"label": "eggs"}', reasks=2), 0))

    assert (kept.refused_answer, kept.reasks, kept.prompt_sha256) == ('{"label": "eggs"}', 2, "ab" * 32)


def test_an_attempt_with_nothing_refused_writes_none_of_it() -> None:
    item = attempt_item(record(None, reasks=0), 0)

    assert not {"refused_answer", "reasks", "prompt_sha256"} & set(item)


def test_a_2_mb_answer_is_kept_to_its_bound_saying_how_much_was_cut() -> None:
    kept = attempt_from_item(attempt_item(record("x" * 2_000_000), 0))

    assert kept.refused_answer is not None
    assert len(kept.refused_answer) == MAX_REFUSED_ANSWER_CHARS
    assert kept.refused_answer.endswith("more characters cut]")


@given(st.text(max_size=200))
def test_any_answer_is_stored_as_valid_text(answer: str) -> None:
    kept = attempt_from_item(attempt_item(record(answer), 0))

    assert kept.refused_answer is not None
    kept.refused_answer.encode()  # no lone surrogate survives


def test_inspect_shows_the_refused_answer_as_text_never_as_markup() -> None:
    answer = '[bold red]not markup[/] {"label": "eggs"}'
    console = Console(width=200, record=True, color_system=None)
    for part in refused_answers([AttemptView.from_record(record(answer))]):
        console.print(part)

    shown = console.export_text()
    assert answer in shown
    assert "business_validation_failed" in shown
    assert "sha256 abababababab" in shown
