"""engine.text: valid Unicode, bounded reasons, and JSON values checked before anything stores them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.text import MAX_JSON_DEPTH, bounded, json_value_problem, one_line, valid_text
from tests.support.strategies import any_text


@given(any_text(max_size=60))
@settings(max_examples=300)
def test_valid_text_always_encodes_and_leaves_valid_text_alone(text: str) -> None:
    fixed = valid_text(text)

    fixed.encode()
    if "\ufffd" not in fixed:
        assert len(fixed) <= len(text)
    try:
        text.encode()
    except UnicodeEncodeError:
        return
    assert fixed == text


def test_valid_text_joins_a_pair_written_as_two_escapes_and_replaces_a_lone_one() -> None:
    assert valid_text("a\ud83d\ude00b") == "a\U0001f600b"
    assert valid_text("a\ud800b") == "a\ufffdb"
    assert valid_text("\udc00") == "\ufffd"


@given(any_text(max_size=3000), st.integers(min_value=40, max_value=2000))
@settings(max_examples=300)
def test_bounded_never_exceeds_its_limit_and_says_what_it_cut(text: str, limit: int) -> None:
    result = bounded(text, limit)

    assert len(result) <= limit
    result.encode()
    if len(valid_text(text)) > limit:
        assert result.endswith("more characters cut]")


def test_one_line_has_no_line_break() -> None:
    assert one_line("a\nb\rc") == "a\\nb\\rc"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_a_value_within_the_depth_bound_passes_and_a_deeper_one_is_named() -> None:
    assert json_value_problem({"a": nested(MAX_JSON_DEPTH - 1)}, "input") is None
    assert "nested deeper" in str(json_value_problem({"a": nested(MAX_JSON_DEPTH + 1)}, "input"))


def test_a_value_nested_near_the_parsers_own_limit_does_not_recurse() -> None:
    # json.loads parses ~900 levels; the walk is iterative, so it answers rather than overflowing.
    deep = json.loads("[" * 900 + "]" * 900)

    assert "nested deeper" in str(json_value_problem(deep, "input"))


def test_the_problem_names_a_position_never_the_text() -> None:
    problem = json_value_problem({"documents": [{"id": "d1", "text": "secret \ud800"}]}, "input")

    assert problem is not None
    assert problem.startswith("input.documents[0].text:")
    assert "secret" not in problem


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_a_number_the_parser_read_as_infinite_is_named(number: str) -> None:
    # Given JSON whose number Python's parser reads as infinity (JSON itself has no infinity)
    value = json.loads(f'{{"totals": [1.5, {number}]}}')

    # Then it is named by its position, as no store can hold it
    assert (
        json_value_problem(value, "output")
        == f"output.totals[1]: a number out of range ({float(number)}), which JSON cannot hold"
    )
    assert json_value_problem({"total": 1e308}, "output") is None
