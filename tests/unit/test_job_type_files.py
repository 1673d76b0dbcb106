"""Job type files refused at push (docs/jobtypes.md, "Job types as data"): `check_job_type` takes a
file whole or refuses it with JobTypeFileError, one line naming the field or part at fault, and the
client's reader (`parse_document`, `read_job_type`) refuses what no check could read.

Each refusal is a file that is the demo's valid one (aijobs.demo_canary.FILE) but for one fault, so
the line is the fault's own. A property test holds the whole contract: whatever JSON-like document
comes in, the check returns a checked file or raises JobTypeFileError, never anything else.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aijobs import job_types as reader
from aijobs.demo_canary import FILE
from aijobs.job_types import document_yaml, parse_document, read_job_type
from engine.core.errors import BusinessValidationError, InputValidationError, JobTypeFileError, SchemaValidationError
from engine.core.reuse import MAX_REUSE_SECONDS, MIN_REUSE_SECONDS
from engine.definitions import json_schemas
from engine.definitions.data import (
    MAX_EXAMPLES,
    MAX_FILE_BYTES,
    MAX_NUMBER_DIGITS,
    MAX_RULES,
    MAX_TEMPLATE_CHARS,
    DataJobDefinition,
    JobTypeFile,
    canonical_json,
    check_job_type,
    compile_job_type,
)
from engine.definitions.json_schemas import (
    DRAFT_2020_12,
    MAX_ENUM_VALUES,
    MAX_OBJECT_DEPTH,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    STRICT_FORMATS,
    STRICT_KEYWORDS,
)
from engine.definitions.rules import MAX_CHECK_CHARS, MAX_MACROS, MAX_MESSAGE_CHARS, MAX_RULE_STEPS

CODE_NAMES = ("classify",)
# The demo's input schema without its maxLength: room for an example as long as a bound needs.
OPEN_TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


# The demo's file with a field named by a number.
NUMBER_KEYED: dict[Any, Any] = {**FILE}
NUMBER_KEYED[1] = "one"


def file_with(**fields: Any) -> dict[str, Any]:
    """The demo's valid file with `fields` in place of its own."""
    document: dict[str, Any] = copy.deepcopy(FILE)
    document.update(fields)
    return document


def closed(properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema as strict structured output takes it: closed, every property required."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def refusal(document: Any, code_names: tuple[str, ...] = CODE_NAMES) -> str:
    """The one line `document` is refused with (JobTypeFileError itself, no subclass, no other type)."""
    with pytest.raises(JobTypeFileError) as caught:
        check_job_type(document, code_names)
    assert type(caught.value) is JobTypeFileError
    message = str(caught.value)
    assert message
    assert "\n" not in message
    assert "\r" not in message
    return message


def unread(text: str) -> str:
    """The one line the reader refuses `text` with."""
    with pytest.raises(JobTypeFileError) as caught:
        parse_document(text)
    message = str(caught.value)
    assert "\n" not in message
    return message


def nested_arrays(levels: int) -> dict[str, Any]:
    """An input schema whose `text` is an array `levels` deep: as JSON, `levels + 3` containers deep."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return {"type": "object", "properties": {"text": node}}


def nested_objects(levels: int) -> dict[str, Any]:
    """A strict output schema of `levels` closed objects, each the property `a` of the one around it."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = closed({"a": node})
    return node


def sized(total: int, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A valid file (without the fields `drop` names) padded to `total` bytes as canonical JSON."""
    document = file_with(input_schema=OPEN_TEXT, examples=[{"input": {"text": ""}, "output": {"topic": "billing"}}])
    for name in drop:
        del document[name]
    document["examples"][0]["input"]["text"] = "x" * (total - len(canonical_json(document).encode()))
    assert len(canonical_json(document).encode()) == total
    return document


def keywords(schema: Any) -> Iterator[str]:
    """Every keyword a schema uses, in its subschemas too (names under properties and $defs are not)."""
    if isinstance(schema, list):
        for item in schema:
            yield from keywords(item)
    elif isinstance(schema, dict):
        for keyword, value in schema.items():
            yield keyword
            if keyword in ("properties", "$defs"):
                for child in value.values():
                    yield from keywords(child)
            elif keyword in ("items", "anyOf"):
                yield from keywords(value)


# --- the valid file ---


def test_the_demo_file_passes_and_comes_back_checked() -> None:
    # Given the demo's file, as a dict, as JSON text and as YAML text
    # When each is checked
    checked = check_job_type(FILE, CODE_NAMES)
    from_json = check_job_type(parse_document(json.dumps(FILE)), CODE_NAMES)
    from_yaml = check_job_type(parse_document(document_yaml(FILE)), CODE_NAMES)

    # Then each is the same checked file, and its stored form checks again to the same digest
    assert isinstance(checked, JobTypeFile)
    assert checked.name == FILE["name"]
    assert checked.template_fields == ("text",)
    assert from_json.sha256 == from_yaml.sha256 == checked.sha256
    assert check_job_type(checked.document()).sha256 == checked.sha256


def test_the_input_schema_need_not_be_one_strict_output_takes() -> None:
    # Given an input schema that is open, leaves a property optional and uses keywords strict output lacks
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "extra": {"type": "integer"}},
        "minProperties": 1,
        "unevaluatedProperties": False,
    }

    # When it is checked, then it passes: only the output schema is sent as strict structured output
    assert check_job_type(file_with(input_schema=schema)).input_schema == schema


def test_an_output_schema_using_every_keyword_strict_output_serves_passes() -> None:
    # Given an output schema that uses each keyword of STRICT_KEYWORDS, and $schema at its root
    schema = {
        "$schema": DRAFT_2020_12,
        "$comment": "every keyword",
        "title": "t",
        "description": "d",
        "$defs": {"leaf": {"type": "string"}},
        **closed(
            {
                "topic": {"type": "string", "pattern": "^[a-z]+$", "minLength": 1, "maxLength": 20},
                "when": {"type": "string", "format": "date", "default": "2026-01-31", "examples": ["2026-01-31"]},
                "score": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 10,
                    "exclusiveMinimum": -1,
                    "exclusiveMaximum": 11,
                    "multipleOf": 0.5,
                },
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 0, "maxItems": 3},
                "kind": {"enum": ["a", "b"]},
                "fixed": {"const": 1},
                "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "leaf": {"$ref": "#/$defs/leaf"},
            }
        ),
    }
    assert set(keywords(schema)) - {"$schema"} == STRICT_KEYWORDS
    example = {
        "input": {"text": "a note"},
        "output": {
            "topic": "billing",
            "when": "2026-01-31",
            "score": 2.5,
            "tags": [],
            "kind": "a",
            "fixed": 1,
            "either": None,
            "leaf": "x",
        },
    }

    # When it is checked, then it passes, its example with it
    assert check_job_type(file_with(output_schema=schema, examples=[example])).output_schema == schema


# --- invalid JSON Schema ---


@pytest.mark.parametrize(
    ("where", "schema", "at"),
    [
        (
            "input_schema",
            {"type": "object", "properties": {"text": {"type": "strng"}}},
            "input_schema.properties.text.type",
        ),
        ("input_schema", {"type": "strng"}, "input_schema.type"),
        ("output_schema", closed({"topic": {"type": "strng"}}), "output_schema.properties.topic.type"),
        ("output_schema", {**closed({"topic": {"type": "string"}}), "required": "topic"}, "output_schema.required"),
        (
            "input_schema",
            {"type": "object", "properties": {"text": {"type": "string", "pattern": "("}}},
            "input_schema.properties.text.pattern",
        ),
        (
            "input_schema",
            {"type": "object", "properties": {"text": {"type": "string", "maxLength": -1}}},
            "input_schema.properties.text.maxLength",
        ),
    ],
    ids=["input-type", "input-root-type", "output-type", "output-required", "input-pattern", "input-negative-bound"],
)
def test_an_invalid_json_schema_is_refused_naming_its_field_and_position(
    where: str, schema: dict[str, Any], at: str
) -> None:
    # Given a file one of whose schemas is not valid Draft 2020-12
    # When it is checked, then the line names the field and the keyword at fault in it, then says why
    message = refusal(file_with(**{where: schema}))

    assert message.startswith(f"{at}: ")
    assert len(message) > len(at) + 2


@pytest.mark.parametrize("where", ["input_schema", "output_schema"])
@pytest.mark.parametrize("root", [{"type": "string"}, {"type": "array"}, {"type": ["object", "null"]}, {}])
def test_a_schema_whose_root_is_not_an_object_is_refused(where: str, root: dict[str, Any]) -> None:
    assert refusal(file_with(**{where: root})) == f"{where}: its root must be of type object"


@pytest.mark.parametrize("where", ["input_schema", "output_schema"])
def test_a_schema_of_another_draft_is_refused(where: str) -> None:
    schema = {**closed({"text": {"type": "string"}}), "$schema": "http://json-schema.org/draft-07/schema#"}

    assert refusal(file_with(**{where: schema})) == (
        f"{where}.$schema: the schemas of a job type are Draft 2020-12 ({DRAFT_2020_12})"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"$ref": "https://example.com/s.json"}, "$ref https://example.com/s.json is not #/$defs/NAME"),
        ({"$ref": "#/properties/other"}, "$ref #/properties/other is not #/$defs/NAME"),
        ({"$ref": "#/$defs/nope"}, "$ref #/$defs/nope names nothing in $defs"),
        ({"$anchor": "a", "type": "string"}, "$anchor is not supported"),
        ({"$dynamicRef": "#a"}, "$dynamicRef is not supported"),
        ({"$dynamicAnchor": "a", "type": "string"}, "$dynamicAnchor is not supported"),
        ({"$id": "https://example.com/t", "type": "string"}, "$id is not supported"),
    ],
    ids=["remote", "not-defs", "nothing", "anchor", "dynamic-ref", "dynamic-anchor", "id"],
)
def test_a_reference_that_leaves_the_schema_or_names_nothing_is_refused(text: dict[str, Any], expected: str) -> None:
    # Given an input schema whose `text` property references outside its own $defs (or moves resolution)
    schema = {"type": "object", "properties": {"text": text}, "$defs": {"leaf": {"type": "string"}}}

    # When it is checked, then the line names the reference and where it is
    message = refusal(file_with(input_schema=schema))

    assert message.startswith("input_schema: ")
    assert expected in message
    assert message.endswith(" at properties.text")


def test_a_reference_into_the_schema_s_own_defs_passes() -> None:
    schema = {"type": "object", "properties": {"text": {"$ref": "#/$defs/leaf"}}, "$defs": {"leaf": {"type": "string"}}}

    assert check_job_type(file_with(input_schema=schema)).input_schema == schema


def test_a_reference_with_a_trailing_newline_is_refused() -> None:
    # Given a $ref that is a local one but for a newline after it
    schema = closed({"topic": {"$ref": "#/$defs/leaf\n"}}) | {"$defs": {"leaf": {"type": "string"}}}

    # When it is checked, then it is refused as a reference that names nothing
    assert "$ref" in refusal(file_with(output_schema=schema))


# --- patterns, matched in linear time ---

# What a backtracking matcher (Python's re) takes hours on: each `a` doubles the ways to split the run.
NESTED_QUANTIFIER = "^(a+)+$"
CATASTROPHIC_TEXT = "a" * 60 + "!"


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(ab)\\1", "backreferences are not supported"),
        ("^(?!draft)", "look-around, including look-ahead and look-behind, is not supported"),
    ],
    ids=["backreference", "look-ahead"],
)
@pytest.mark.parametrize("where", ["input_schema", "output_schema"])
def test_a_pattern_that_needs_backtracking_is_refused_naming_it_and_why(where: str, pattern: str, reason: str) -> None:
    # Given a schema holding a pattern only a backtracking matcher can run
    schema = closed({"topic": {"type": "string", "pattern": pattern}})

    # When the file is checked, then it is refused in one line naming the pattern, where it is and why
    assert refusal(file_with(**{where: schema}, examples=[])) == (
        f"{where}: pattern {pattern!r} at properties.topic is not one the linear-time matcher runs ({reason}); "
        "write it without backreferences or look-around"
    )


def test_an_input_a_backtracking_matcher_would_take_hours_on_is_refused_at_once() -> None:
    # Given a pushed job type whose input schema holds a nested quantifier, in a pattern and a patternProperties
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": NESTED_QUANTIFIER}},
        "patternProperties": {NESTED_QUANTIFIER: {"type": "integer"}},
        "required": ["text"],
    }
    definition = compile_job_type(check_job_type(file_with(input_schema=schema, examples=[])).document(), 1)

    # When inputs made to backtrack are checked, then each ends (linear time) refused in one line, or taken
    with pytest.raises(InputValidationError, match=r"^input\.text: does not match the schema's pattern$"):
        definition.parse_input({"text": CATASTROPHIC_TEXT})
    assert definition.parse_input({"text": "aaa", CATASTROPHIC_TEXT: "not an integer"}).model_dump() == {
        "text": "aaa",
        CATASTROPHIC_TEXT: "not an integer",
    }
    with pytest.raises(InputValidationError, match=r"^input\.aaa: must be of type integer$"):
        definition.parse_input({"text": "aaa", "aaa": "not an integer"})


def test_an_input_holding_a_lone_surrogate_is_refused_in_one_line_naming_where() -> None:
    # Given a pushed job type, when an input with a lone surrogate in a nested value is checked
    definition = labelled_job_type("size(input.labels) > 0")

    # Then it is refused as an invalid input naming the value, not with the encoder's error
    with pytest.raises(InputValidationError) as refused:
        definition.parse_input({"text": "t", "labels": ["a", "b\ud800"]})
    assert str(refused.value) == "input.labels[1]: holds a lone UTF-16 surrogate, which is not valid Unicode"


def test_an_answer_a_backtracking_matcher_would_take_hours_on_fails_the_output_schema_at_once() -> None:
    # Given a pushed job type whose output schema holds a nested quantifier
    schema = closed({"topic": {"type": "string", "pattern": NESTED_QUANTIFIER}})
    definition = compile_job_type(check_job_type(file_with(output_schema=schema, examples=[])).document(), 1)
    job_input = definition.parse_input({"text": "The invoice is overdue."})

    # When the model answers a string made to backtrack, then it fails schema validation (the re-ask's line)
    with pytest.raises(SchemaValidationError, match=r"^output\.topic: does not match the schema's pattern$"):
        definition.validate_output(job_input, json.dumps({"topic": CATASTROPHIC_TEXT}))
    assert definition.validate_output(job_input, json.dumps({"topic": "aaaa"})).model_dump() == {"topic": "aaaa"}


# --- the output schema strict structured output takes ---


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            {"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]},
            "strict structured output needs additionalProperties: false at the root",
        ),
        (
            closed({"topic": {"type": "string"}}) | {"additionalProperties": True},
            "strict structured output needs additionalProperties: false at the root",
        ),
        (
            closed({"topic": {"type": "string"}}) | {"additionalProperties": {"type": "string"}},
            "strict structured output needs additionalProperties: false at the root",
        ),
        (
            closed({"topic": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}}}),
            "strict structured output needs additionalProperties: false at properties.topic.items",
        ),
        (
            closed({"topic": {"type": "string"}}) | {"$defs": {"open": {"type": "object"}}},
            # $defs is named by its length: key_label shows identifier-like keys only
            "strict structured output needs additionalProperties: false at <key of 5 characters>.open",
        ),
        (
            closed({"topic": {"type": "string"}, "note": {"type": "string"}}) | {"required": ["topic"]},
            "strict structured output needs every property in required at the root",
        ),
        (
            closed({"topic": {"type": "string"}}) | {"required": ["topic", "ghost"]},
            "strict structured output needs every property in required at the root",
        ),
        (
            closed({"topic": closed({"a": {"type": "string"}, "b": {"type": "string"}}) | {"required": ["a"]}}),
            "strict structured output needs every property in required at properties.topic",
        ),
        (
            closed({"topic": {"maxLength": 20}}),
            "strict structured output needs a type at properties.topic",
        ),
    ],
    ids=[
        "open-root",
        "additional-true",
        "additional-schema",
        "open-nested-object",
        "open-object-in-defs",
        "optional-property",
        "required-names-no-property",
        "optional-nested-property",
        "no-type",
    ],
)
def test_an_output_schema_a_strict_provider_would_reject_is_refused(schema: dict[str, Any], expected: str) -> None:
    # Given an output schema valid as JSON Schema but not as strict structured output
    # When it is checked, then the line names output_schema, the rule broken and where
    assert refusal(file_with(output_schema=schema, examples=[])) == f"output_schema: {expected}"


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("minProperties", 1),
        ("uniqueItems", True),
        ("oneOf", [{"type": "string"}]),
        ("allOf", [{"type": "string"}]),
        ("not", {"type": "null"}),
        ("if", {"type": "string"}),
        ("prefixItems", [{"type": "string"}]),
        ("contentEncoding", "base64"),
        ("deprecated", True),
    ],
)
def test_a_keyword_strict_output_does_not_serve_is_refused_in_the_output_schema(keyword: str, value: Any) -> None:
    # Given the output's property holding a keyword outside STRICT_KEYWORDS
    assert keyword not in STRICT_KEYWORDS
    schema = closed({"topic": {"type": "string", keyword: value}})

    # When it is checked, then the line names the keyword and where it is
    assert refusal(file_with(output_schema=schema)) == (
        f"output_schema: strict structured output does not support {keyword} at properties.topic"
    )


@pytest.mark.parametrize("fmt", ["bogus", "uri", "regex"])
def test_a_format_strict_output_does_not_serve_is_refused_in_the_output_schema(fmt: str) -> None:
    # Given an output schema naming a string format outside those strict structured output serves
    schema = closed({"topic": {"type": "string", "format": fmt}})

    # When it is checked, then it is refused in one line naming the format and those served
    assert refusal(file_with(output_schema=schema, examples=[])) == (
        f"output_schema: strict structured output does not support the format {fmt!r} at properties.topic "
        f"(it takes {', '.join(STRICT_FORMATS)})"
    )


@pytest.mark.parametrize("fmt", STRICT_FORMATS)
def test_every_format_strict_output_serves_passes(fmt: str) -> None:
    schema = closed({"topic": {"type": "string", "format": fmt}})

    assert check_job_type(file_with(output_schema=schema, examples=[])).output_schema == schema


def test_schema_is_served_at_the_output_schema_s_root_only() -> None:
    nested = closed({"topic": {"type": "string", "$schema": DRAFT_2020_12}})

    check_job_type(file_with(output_schema=closed({"topic": {"type": "string"}}) | {"$schema": DRAFT_2020_12}))
    # A keyword that is not an identifier is named by its length (key_label)
    assert refusal(file_with(output_schema=nested)) == (
        "output_schema: strict structured output does not support <key of 7 characters> at properties.topic"
    )


def test_objects_nested_deeper_than_strict_output_takes_are_refused() -> None:
    # Given output schemas of MAX_OBJECT_DEPTH and one more object levels
    deepest = nested_objects(MAX_OBJECT_DEPTH)
    deeper = nested_objects(MAX_OBJECT_DEPTH + 1)

    # When each is checked, then the first passes and the second is refused, naming the depth
    check_job_type(file_with(output_schema=deepest, rules=[], examples=[]))
    message = refusal(file_with(output_schema=deeper, rules=[], examples=[]))
    assert message.startswith(
        f"output_schema: objects nest {MAX_OBJECT_DEPTH + 1} levels deep; strict structured output takes at most "
        f"{MAX_OBJECT_DEPTH} at properties.a."
    )


def test_more_enum_values_than_strict_output_takes_are_refused_counted_over_the_schema() -> None:
    # Given MAX_ENUM_VALUES values in one enum, and one more spread over two
    at_bound = closed({"topic": {"type": "integer", "enum": list(range(MAX_ENUM_VALUES))}})
    over = closed({"topic": {"enum": list(range(MAX_ENUM_VALUES - 1))}, "kind": {"enum": ["a", "b"]}})

    check_job_type(file_with(output_schema=at_bound, rules=[], examples=[]))
    assert refusal(file_with(output_schema=over, rules=[], examples=[])) == (
        f"output_schema: has {MAX_ENUM_VALUES + 1} enum values; strict structured output takes {MAX_ENUM_VALUES}"
    )


def test_more_properties_than_strict_output_takes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given MAX_PROPERTIES lowered to 3 (at 5000, no schema within MAX_SCHEMA_BYTES holds that many)
    monkeypatch.setattr(json_schemas, "MAX_PROPERTIES", 3)
    at_bound = closed({"topic": closed({"a": {"type": "string"}, "b": {"type": "string"}})})
    over = closed({"topic": closed({"a": {"type": "string"}, "b": {"type": "string"}}), "c": {"type": "string"}})

    # When each is checked, then properties are counted in every object, and one more than the bound is refused
    check_job_type(file_with(output_schema=at_bound, rules=[], examples=[]))
    assert refusal(file_with(output_schema=over, rules=[], examples=[])) == (
        "output_schema: has 4 properties; strict structured output takes 3"
    )


# --- schema bounds ---


@pytest.mark.parametrize("where", ["input_schema", "output_schema"])
def test_a_schema_larger_than_its_bound_is_refused_and_one_at_it_passes(where: str) -> None:
    # Given a schema padded by a description to exactly MAX_SCHEMA_BYTES compact JSON, and one byte more
    def padded(size: int) -> dict[str, Any]:
        schema = closed({"topic": {"type": "string", "description": ""}, "text": {"type": "string"}})
        room = size - len(json.dumps(schema, separators=(",", ":")))
        schema["properties"]["topic"]["description"] = "x" * room
        return schema

    fields: dict[str, Any] = {"rules": [], "examples": []}
    check_job_type(file_with(**{where: padded(MAX_SCHEMA_BYTES)}, **fields))
    assert refusal(file_with(**{where: padded(MAX_SCHEMA_BYTES + 1)}, **fields)) == (
        f"{where}: is {MAX_SCHEMA_BYTES + 1} bytes as JSON; a schema holds at most {MAX_SCHEMA_BYTES}"
    )


def test_a_schema_nested_deeper_than_its_bound_is_refused_and_one_at_it_passes() -> None:
    # Given an input schema exactly MAX_SCHEMA_DEPTH containers deep, and one a level deeper
    at_bound = nested_arrays(MAX_SCHEMA_DEPTH - 3)
    deeper = nested_arrays(MAX_SCHEMA_DEPTH - 2)

    check_job_type(file_with(input_schema=at_bound, examples=[]))
    assert refusal(file_with(input_schema=deeper, examples=[])) == (
        f"input_schema: is nested {MAX_SCHEMA_DEPTH + 1} levels deep; a schema holds at most {MAX_SCHEMA_DEPTH}"
    )


# --- the template ---


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("Note: {nope}", "prompt.user: {nope} is not a property of input_schema"),
        ("Note: {text} {ticket}", "prompt.user: {ticket} is not a property of input_schema"),
        ("Note: {text.body}", "prompt.user: field {text.body} is not a property name (no dots, indexes or blanks)"),
        ("Note: {text[0]}", "prompt.user: field {text[0]} is not a property name (no dots, indexes or blanks)"),
        ("Note: {0}", "prompt.user: field {0} is not a property name (no dots, indexes or blanks)"),
        ("Note: {}", "prompt.user: field {} is not a property name (no dots, indexes or blanks)"),
        ("Note: {te\nxt}", "prompt.user: field {te\\nxt} is not a property name (no dots, indexes or blanks)"),
        ("Note: {text!r}", "prompt.user: field {text} has a conversion or format; write {text}"),
        ("Note: {text:>20}", "prompt.user: field {text} has a conversion or format; write {text}"),
        (
            "Note: {text",
            "prompt.user: is not a valid template: expected '}' before end of string (write a brace as {{ or }})",
        ),
        ("Note: text}", "prompt.user: is not a valid template: Single '}' encountered in format string"),
        ("", "prompt.user: String should have at least 1 character"),
    ],
    ids=[
        "unknown",
        "second-unknown",
        "dotted",
        "indexed",
        "positional",
        "empty",
        "newline",
        "conversion",
        "format",
        "open-brace",
        "lone-close",
        "no-user",
    ],
)
def test_a_template_field_the_input_schema_lacks_or_cannot_render_is_refused(user: str, expected: str) -> None:
    # Given a user template whose field is not a plain top-level property of the input schema
    # When it is checked, then the line names prompt.user and the field
    message = refusal(file_with(prompt={"system": "s", "user": user}))

    assert message.startswith(expected)


def test_doubled_braces_are_text_not_fields() -> None:
    checked = check_job_type(file_with(prompt={"system": "s", "user": 'Answer as {{"topic": ...}}. Note: {text}'}))

    assert checked.template_fields == ("text",)


# --- rules ---


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ("size(output.topic > ", "rules[1].check: does not compile: 1:21: Syntax error: "),
        ("output.topic ==", "rules[1].check: does not compile: "),
        ("(" * 200 + "true" + ")" * 200, "rules[1].check: does not compile: "),
        ("size(topic) > 0", "rules[1].check: names topic; a rule reads only input and output"),
        ("req.a == ctx.b", "rules[1].check: names ctx, req; a rule reads only input and output"),
        ("\n\nfoo", "rules[1].check: names foo; a rule reads only input and output"),
    ],
    ids=["syntax", "unfinished", "too-deep-to-parse", "unknown-variable", "two-unknown-variables", "after-newlines"],
)
def test_a_rule_that_does_not_compile_or_reads_an_unknown_variable_is_refused(check: str, expected: str) -> None:
    # Given a file whose second rule is not a CEL expression over input and output alone
    rules = [FILE["rules"][0], {"check": check, "message": "broken"}]  # type: ignore[index]

    # When it is checked, then the line names that rule by its position
    assert refusal(file_with(rules=rules)).startswith(expected)


def test_a_rule_using_more_comprehension_macros_than_its_bound_is_refused() -> None:
    # Given a rule with MAX_MACROS macros and one with one more (a macro in a string literal counts too)
    at_bound = "input.text.size() > 0 && [1].all(x, x > 0) && [2].exists(y, y > 1)"
    over = at_bound + " && '.map(z' != ''"

    check_job_type(file_with(rules=[{"check": at_bound, "message": "m"}]))
    assert refusal(file_with(rules=[{"check": over, "message": "m"}])) == (
        f"rules[0].check: uses {MAX_MACROS + 1} comprehension macros; a rule uses at most {MAX_MACROS}"
    )


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"check": "true" + " " * (MAX_CHECK_CHARS - 3), "message": "m"}, "rules.0.check: String should have at most"),
        ({"check": "true", "message": "m" * (MAX_MESSAGE_CHARS + 1)}, "rules.0.message: String should have at most"),
        ({"check": "", "message": "m"}, "rules.0.check: String should have at least 1 character"),
        ({"check": "true", "message": ""}, "rules.0.message: String should have at least 1 character"),
        ({"check": "true"}, "rules.0.message: Field required"),
        ({"check": "true", "message": "m", "severity": "low"}, "rules.0.severity: Extra inputs are not permitted"),
    ],
    ids=["check-too-long", "message-too-long", "empty-check", "empty-message", "no-message", "unknown-field"],
)
def test_a_rule_out_of_its_bounds_is_refused(rule: dict[str, Any], expected: str) -> None:
    assert refusal(file_with(rules=[rule])).startswith(expected)


def labelled_job_type(check: str, **fields: Any) -> DataJobDefinition:
    """A pushed job type whose input is `labels` and whose one rule is `check` (`fields` replace the file's)."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}, "labels": {"type": "array"}}}
    rule = {"check": check, "message": "labels are known"}
    document = file_with(input_schema=schema, rules=[rule], examples=[], **fields)
    compiled = compile_job_type(check_job_type(document).document(), 1)
    assert isinstance(compiled, DataJobDefinition)
    return compiled


def test_a_rule_too_costly_for_its_job_s_input_is_not_run_and_refuses_the_answer_saying_why() -> None:
    # Given a rule of two nested macros and a list walk inside them (cubic in the labels), an input of
    # 100 labels that passes, and an answer of 300 words
    words = closed({"topic": {"type": "string"}, "words": {"type": "array", "items": {"type": "string"}}})
    definition = labelled_job_type(
        "input.labels.all(a, input.labels.all(b, a in input.labels))", output_schema=words, max_tokens=256
    )
    job_input = definition.parse_input({"labels": [f"label-{n}" for n in range(100)]})
    answer = {"topic": "billing", "words": ["word"] * 300}

    # When the answer is validated, then the rule is not run (it would take the better part of an hour):
    # the answer is refused at once, in one line naming the rule and the bound
    steps = (2 + 100 + 3 + 300) ** 3  # the input object, its list and labels; the answer's
    with pytest.raises(BusinessValidationError) as refused:
        definition.validate_output(job_input, json.dumps(answer))
    assert str(refused.value) == (
        f"rule 1 (labels are known) is not run: it could take {steps} steps on this input and answer, "
        f"more than {MAX_RULE_STEPS}"
    )


def test_an_input_a_rule_would_be_too_costly_on_is_refused_before_any_call() -> None:
    # Given the same rule and 3,000 labels, when the input is checked, then it is refused in one line
    definition = labelled_job_type("input.labels.all(a, input.labels.all(b, a in input.labels))")

    steps = (2 + 3000 + 1) ** 3  # the input object, its list and labels, and an answer of one value
    with pytest.raises(InputValidationError) as refused:
        definition.parse_input({"labels": [f"label-{n}" for n in range(3000)]})
    assert str(refused.value) == (
        f"input: rule 1 (labels are known) could take {steps} steps on it, more than {MAX_RULE_STEPS}: "
        "no answer could be checked"
    )


def test_a_costly_rule_on_a_small_input_runs() -> None:
    # Given the same rule and ten labels, when an answer is validated, then the rule runs and holds
    definition = labelled_job_type("input.labels.all(a, input.labels.all(b, a in input.labels))")
    job_input = definition.parse_input({"labels": [f"label-{n}" for n in range(10)]})

    assert definition.validate_output(job_input, json.dumps({"topic": "billing"})).model_dump() == {"topic": "billing"}


def test_a_rule_without_macros_runs_on_the_largest_input() -> None:
    # Given a rule that walks no list more than once, and 40,000 labels: it runs, however long the list
    definition = labelled_job_type("size(input.labels) > 1 && 'label-7' in input.labels")
    job_input = definition.parse_input({"labels": [f"label-{n}" for n in range(40_000)]})

    assert definition.validate_output(job_input, json.dumps({"topic": "billing"})).model_dump() == {"topic": "billing"}


def test_a_rule_at_its_length_bound_passes() -> None:
    rule = {"check": "true" + " " * (MAX_CHECK_CHARS - 4), "message": "m" * MAX_MESSAGE_CHARS}

    assert len(check_job_type(file_with(rules=[rule])).rules[0].check) == MAX_CHECK_CHARS


def test_a_variable_a_macro_binds_read_outside_the_macro_is_refused() -> None:
    rule = {"check": "[1].all(x, x > 0) && x == 1", "message": "m"}

    assert "x" in refusal(file_with(rules=[rule], examples=[]))


# --- examples ---


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ({"input": {"text": "a"}, "output": {"topic": 5}}, "examples[0].output.topic: must be of type string"),
        ({"input": {"text": "a"}, "output": {}}, "examples[0].output: lacks the required property topic"),
        (
            {"input": {"text": "a"}, "output": {"topic": "a", "more": 1}},
            "examples[0].output: has a property the schema does not allow",
        ),
        (
            {"input": {"text": "a"}, "output": {"topic": "x" * 201}},
            "examples[0].output.topic: has more than 200 characters",
        ),
        ({"input": {"text": 5}, "output": {"topic": "a"}}, "examples[0].input.text: must be of type string"),
        ({"input": {}, "output": {"topic": "a"}}, "examples[0].input: lacks the required property text"),
    ],
    ids=["output-type", "output-missing", "output-extra", "output-too-long", "input-type", "input-missing"],
)
def test_an_example_that_fails_a_schema_is_refused_naming_the_example_and_position(
    example: dict[str, Any], expected: str
) -> None:
    # Given a file whose one example does not fit its schemas
    # When it is checked, then the line names the example, the side and the position
    assert refusal(file_with(examples=[example])) == expected


@pytest.mark.parametrize(
    ("check", "reason"),
    [
        ("size(output.topic) > 0", "is false"),
        ("output.topic != '' || output['miss' + 'ing'] == 1", "errors: KeyError: 'missing'"),
        ("output.topic != '' ? true : output.topic", "gives a str, not true or false"),
        ("output.topic != '' || 1 / 0 == 1", "errors: ZeroDivisionError: division by zero in CEL expression"),
    ],
    ids=["false", "errors", "not-a-boolean", "divides-by-zero"],
)
def test_an_example_that_fails_a_rule_is_refused_naming_the_example_the_rule_and_its_message(
    check: str, reason: str
) -> None:
    # Given a second example whose answer is refused by the second rule (the first example passes it)
    rules = [{"check": "true", "message": "always"}, {"check": check, "message": "the topic is wrong"}]
    examples = [FILE["examples"][0], {"input": {"text": "a"}, "output": {"topic": ""}}]  # type: ignore[index]

    # When it is checked, then the line names both, why, and the rule's message
    assert refusal(file_with(rules=rules, examples=examples)) == (f"examples[1]: rule 2 (the topic is wrong) {reason}")


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ("output.lable == 'x'", "rules[0].check: reads output.lable, which output_schema does not have (it has topic)"),
        ("size(input.txt) > 0", "rules[0].check: reads input.txt, which input_schema does not have (it has text)"),
        (
            "output.topic.all(c, c != '') && input . nope == 1",
            "rules[0].check: reads input.nope, which input_schema does not have (it has text)",
        ),
    ],
    ids=["output-typo", "input-typo", "spaced"],
)
def test_a_rule_reading_a_field_its_closed_schema_lacks_is_refused_without_an_example(
    check: str, expected: str
) -> None:
    # Given a rule that reads a field neither schema has (which would refuse every answer), and no example
    rules = [{"check": check, "message": "reads a typo"}]

    # When the file is checked, then it is refused in one line naming the field and the fields there are
    assert refusal(file_with(rules=rules, examples=[])) == expected


def test_a_rule_may_read_a_field_an_open_input_schema_allows_or_name_one_in_a_string() -> None:
    # Given an input schema that allows other properties, and a rule naming a field only in a string
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    rules = [
        {"check": "!has(input.extra) || input.extra != ''", "message": "extra is not empty"},
        {"check": "output.topic != 'output.nothing'", "message": "a topic, not a field's name"},
    ]

    # When the file is checked, then it passes
    assert check_job_type(file_with(input_schema=schema, rules=rules)).rules[0].check.startswith("!has")


# --- the name ---


def test_a_name_a_code_job_type_holds_is_refused() -> None:
    assert refusal(file_with(name="classify"), code_names=("classify",)) == "name: classify is a code job type"
    assert check_job_type(file_with(name="classify"), code_names=()).name == "classify"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Triage", "name: String should match pattern"),
        ("triage-ticket", "name: String should match pattern"),
        ("", "name: String should have at least 1 character"),
        ("a" * 65, "name: String should have at most 64 characters"),
        (7, "name: Input should be a valid string"),
    ],
)
def test_a_name_out_of_its_bounds_is_refused(name: Any, expected: str) -> None:
    assert refusal(file_with(name=name)).startswith(expected)


# --- bounds of the file ---


def test_a_file_larger_than_its_bound_as_canonical_json_is_refused_and_one_at_it_passes() -> None:
    check_job_type(sized(MAX_FILE_BYTES))
    assert refusal(sized(MAX_FILE_BYTES + 1)) == (
        f"the file is {MAX_FILE_BYTES + 1} bytes as canonical JSON; a job type file holds at most {MAX_FILE_BYTES}"
    )


def test_the_defaults_a_file_leaves_out_count_toward_its_bound() -> None:
    # Given a file at the bound that leaves out fields with defaults (its stored form spells them out)
    document = sized(MAX_FILE_BYTES, drop=("description", "model_tier", "max_tokens"))

    # When it is checked, then the stored form is over the bound and the file is refused
    message = refusal(document)
    assert message.startswith("the file is ")
    assert message.endswith(f" bytes as canonical JSON; a job type file holds at most {MAX_FILE_BYTES}")
    assert int(message.split()[3]) > MAX_FILE_BYTES


@pytest.mark.parametrize("part", ["user", "system"])
def test_a_template_longer_than_its_bound_is_refused_and_one_at_it_passes(part: str) -> None:
    def prompt(size: int) -> dict[str, str]:
        text = "{text}" + "x" * (size - len("{text}"))
        return {"system": "s", "user": "Note: {text}"} | {part: text}

    check_job_type(file_with(prompt=prompt(MAX_TEMPLATE_CHARS)))
    assert refusal(file_with(prompt=prompt(MAX_TEMPLATE_CHARS + 1))) == (
        f"prompt.{part}: String should have at most {MAX_TEMPLATE_CHARS} characters"
    )


def test_more_rules_than_the_bound_are_refused_and_as_many_pass() -> None:
    rule = {"check": "size(output.topic) > 0", "message": "the topic is empty"}

    assert len(check_job_type(file_with(rules=[rule] * MAX_RULES)).rules) == MAX_RULES
    assert refusal(file_with(rules=[rule] * (MAX_RULES + 1))) == (
        f"rules: List should have at most {MAX_RULES} items after validation, not {MAX_RULES + 1}"
    )


def test_more_examples_than_the_bound_are_refused_and_as_many_pass() -> None:
    example = FILE["examples"][0]  # type: ignore[index]

    assert len(check_job_type(file_with(examples=[example] * MAX_EXAMPLES)).examples) == MAX_EXAMPLES
    assert refusal(file_with(examples=[example] * (MAX_EXAMPLES + 1))) == (
        f"examples: List should have at most {MAX_EXAMPLES} items after validation, not {MAX_EXAMPLES + 1}"
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 10**MAX_NUMBER_DIGITS}, "max_tokens"),
        ({"max_tokens": -(10**MAX_NUMBER_DIGITS)}, "max_tokens"),
        (
            {"input_schema": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10**60}}}},
            "input_schema.properties.text.maxLength",
        ),
        (
            {"examples": [{"input": {"text": "a"}, "output": {"topic": "a", "n": [10**5000]}}]},
            "examples[0].output.n[0]",
        ),
    ],
    ids=["39-digits", "negative", "in-a-schema", "past-int-to-text-limit"],
)
def test_a_number_of_more_digits_than_its_bound_is_refused_before_anything_reads_it(
    fields: dict[str, Any], expected: str
) -> None:
    assert refusal(file_with(**fields)) == f"{expected}: is a number of more than {MAX_NUMBER_DIGITS} digits"


def test_a_number_of_as_many_digits_as_the_bound_passes() -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10**MAX_NUMBER_DIGITS - 1}}}

    check_job_type(file_with(input_schema=schema))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"temperature": 0.2}, "temperature: Extra inputs are not permitted"),
        ({"prompt": {"system": "s", "user": "{text}", "assistant": "a"}}, "prompt.assistant: Extra inputs"),
        (
            {"examples": [{"input": {"text": "a"}, "output": {"topic": "a"}, "why": "w"}]},
            "examples.0.why: Extra inputs are not permitted",
        ),
        ({"attachments": {"max_count": 1, "size": 3}}, "attachments.size: Extra inputs are not permitted"),
    ],
    ids=["top-level", "a-model-setting", "in-prompt", "in-an-example", "in-attachments"],
)
def test_an_unknown_field_is_refused_naming_it(fields: dict[str, Any], expected: str) -> None:
    assert refusal(file_with(**fields)).startswith(expected)


@pytest.mark.parametrize("seconds", [MIN_REUSE_SECONDS, 3600, MAX_REUSE_SECONDS])
def test_reuse_seconds_within_its_bounds_is_kept_and_compiled(seconds: int) -> None:
    # Given the demo's file reusing answers for `seconds`
    # When it is checked and compiled
    file = check_job_type(file_with(reuse_seconds=seconds))
    definition = compile_job_type(file.document(), 1)

    # Then the stored form keeps it (a new version's content), and the definition reuses for that long
    assert file.document()["reuse_seconds"] == seconds
    assert file.sha256 != check_job_type(file_with()).sha256
    assert definition.reuse_seconds == seconds


def test_a_file_without_reuse_seconds_reuses_nothing() -> None:
    file = check_job_type(file_with())

    assert "reuse_seconds" not in file.document()
    assert compile_job_type(file.document(), 1).reuse_seconds is None


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, f"reuse_seconds: Input should be greater than or equal to {MIN_REUSE_SECONDS}"),
        (-60, f"reuse_seconds: Input should be greater than or equal to {MIN_REUSE_SECONDS}"),
        (MAX_REUSE_SECONDS + 1, f"reuse_seconds: Input should be less than or equal to {MAX_REUSE_SECONDS}"),
        (10**MAX_NUMBER_DIGITS, f"reuse_seconds: is a number of more than {MAX_NUMBER_DIGITS} digits"),
        (60.5, "reuse_seconds: Input should be a valid integer"),
        ("3600", "reuse_seconds: Input should be a valid integer"),
        (True, "reuse_seconds: Input should be a valid integer"),
    ],
    ids=["zero", "negative", "past-30-days", "huge", "fraction", "text", "boolean"],
)
def test_reuse_seconds_out_of_its_bounds_or_not_a_whole_number_is_refused_in_one_line(
    seconds: Any, expected: str
) -> None:
    assert refusal(file_with(reuse_seconds=seconds)) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": "64"}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": True}, "max_tokens: Input should be a valid integer"),
        ({"model_tier": "large"}, "model_tier: Input should be 'primary' or 'fallback'"),
        ({"timeout_seconds": 0.5}, "timeout_seconds: Input should be greater than or equal to 1"),
        ({"description": "d" * 1001}, "description: String should have at most 1000 characters"),
        ({"prompt": "Note: {text}"}, "prompt: Input should be a valid dictionary or instance of PromptFile"),
        ({"input_schema": None}, "input_schema: Input should be a valid dictionary"),
        ({"attachments": {"max_count": 1, "media_types": ["text/html"]}}, "attachments.media_types.0: Input should"),
    ],
    ids=[
        "no-tokens",
        "tokens-as-text",
        "tokens-as-boolean",
        "tier",
        "timeout",
        "description",
        "prompt",
        "schema",
        "type",
    ],
)
def test_a_field_of_the_wrong_kind_or_out_of_range_is_refused_naming_it(fields: dict[str, Any], expected: str) -> None:
    assert refusal(file_with(**fields)).startswith(expected)


@pytest.mark.parametrize(
    ("attachments", "expected"),
    [
        (
            {"max_count": 2, "required_unless": "nope"},
            "attachments.required_unless: nope is not a required string property of input_schema",
        ),
        (
            {"max_count": 0, "required_unless": "text"},
            "attachments.required_unless: the job type takes no attachments (max_count is 0)",
        ),
    ],
)
def test_attachments_required_unless_a_property_the_input_lacks_is_refused(
    attachments: dict[str, Any], expected: str
) -> None:
    check_job_type(file_with(attachments={"max_count": 2, "required_unless": "text"}))
    assert refusal(file_with(attachments=attachments)) == expected


# --- what JSON cannot hold ---


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"description": "topic \ud800"}, "description: holds a lone UTF-16 surrogate, which is not valid Unicode"),
        (
            {"examples": [{"input": {"text": "\udfff"}, "output": {"topic": "a"}}]},
            "examples[0].input.text: holds a lone UTF-16 surrogate, which is not valid Unicode",
        ),
        (
            {"input_schema": {"type": "object", "properties": {"\ud83d": {"type": "string"}}}},
            "input_schema.properties: key number 1 holds a lone UTF-16 surrogate",
        ),
        ({"timeout_seconds": float("nan")}, "timeout_seconds: is nan, which is not a JSON number"),
        (
            {"input_schema": {"type": "object", "properties": {"text": {"type": "number", "maximum": float("inf")}}}},
            "input_schema.properties.text.maximum: is inf, which is not a JSON number",
        ),
        ({"max_tokens": float("-inf")}, "max_tokens: is -inf, which is not a JSON number"),
        ({"description": {"a", "b"}}, "description: is a set, not a JSON value (quote it to make it a string)"),
        ({"description": b"bytes"}, "description: is a bytes, not a JSON value (quote it to make it a string)"),
        ({"description": ("a",)}, "description: is a tuple, not a JSON value (quote it to make it a string)"),
        (
            {"examples": [{"input": {"text": "a"}, "output": {"topic": datetime.date(2026, 1, 31)}}]},
            "examples[0].output.topic: is a date, not a JSON value (quote it to make it a string)",
        ),
        ({"input_schema": {"type": "object", 1: "one"}}, "input_schema: has a key that is a int, not a string"),
        ({"description": json.loads("[" * 70 + "]" * 70)}, "nested deeper than 64 levels"),
    ],
    ids=[
        "surrogate",
        "surrogate-in-an-example",
        "surrogate-in-a-key",
        "nan",
        "infinity",
        "minus-infinity",
        "set",
        "bytes",
        "tuple",
        "date",
        "number-as-key",
        "too-deep",
    ],
)
def test_a_value_json_cannot_hold_is_refused_naming_where_it_is(fields: dict[str, Any], expected: str) -> None:
    assert expected in refusal(file_with(**fields))


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ([FILE], "a job type file is a mapping of its fields, not a list"),
        ("name: demo", "a job type file is a mapping of its fields, not a str"),
        (None, "a job type file is a mapping of its fields, not a NoneType"),
        (NUMBER_KEYED, "the file has a field named by a int, not a string"),
    ],
    ids=["list", "text", "nothing", "number-as-field-name"],
)
def test_a_document_that_is_not_a_mapping_of_named_fields_is_refused(document: Any, expected: str) -> None:
    assert refusal(document) == expected


def test_a_field_name_holding_a_lone_surrogate_is_refused() -> None:
    assert "surrogate" in refusal({**FILE, "topic\ud800": 1})


def test_a_lone_surrogate_the_reader_lets_through_is_refused_by_the_check() -> None:
    # Given a JSON file with a lone surrogate escaped in a value (valid JSON text, not valid Unicode)
    text = json.dumps(file_with(description="cut \ud83d"))
    document = parse_document(text)

    # When it is checked, then the check names the field
    assert refusal(document) == "description: holds a lone UTF-16 surrogate, which is not valid Unicode"


# --- the reader ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": NaN}', "the job type file is not valid JSON: NaN is not a JSON number"),
        ('{"name": -Infinity}', "the job type file is not valid JSON: -Infinity is not a JSON number"),
        ('{"name": 1e400}', "name: inf is not a JSON number"),
        ('{"name": ' + "9" * 5000 + "}", "the job type file is not valid JSON: Exceeds the limit"),
        ('{"name": }', "the job type file is not valid JSON: Expecting value (line 1, column 10)"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "the job type file nests deeper than 64 levels"),
        ("name: .nan\n", "name: nan is not a JSON number"),
        ("name: -.inf\n", "name: -inf is not a JSON number"),
        ("name: !!binary aGVsbG8=\n", "name: a bytes is not a JSON value (quote it)"),
        ("name: !!set {a, b}\n", "name: a set is not a JSON value (quote it)"),
        (
            "name: !!python/object:os.system x\n",
            "the job type file is not valid YAML: could not determine a constructor",
        ),
        ("1: one\n", "the document: the key 1 is not a string (quote it)"),
        ("prompt:\n  ~: x\n", "prompt: the key None is not a string (quote it)"),
        ("name: [a\n", "the job type file is not valid YAML: expected ',' or ']', but got '<stream end>' (line 2"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "the job type file nests deeper than 64 levels"),
        ("", "the job type file is empty, not a mapping of fields"),
        ("- a\n- b\n", "the job type file is a list, not a mapping of fields"),
        ("just text\n", "the job type file is a string, not a mapping of fields"),
        ('{"a": "' + "x" * reader.MAX_FILE_BYTES + '"}', f"is more than {reader.MAX_FILE_BYTES} bytes"),
    ],
    ids=[
        "json-nan",
        "json-infinity",
        "json-overflow",
        "json-too-many-digits",
        "json-syntax",
        "json-too-deep",
        "yaml-nan",
        "yaml-infinity",
        "yaml-binary",
        "yaml-set",
        "yaml-python-object",
        "yaml-number-key",
        "yaml-null-key",
        "yaml-syntax",
        "yaml-too-deep",
        "empty",
        "list",
        "scalar",
        "too-large",
    ],
)
def test_text_no_check_could_read_is_refused_by_the_reader(text: str, expected: str) -> None:
    assert expected in unread(text)


def test_a_yaml_integer_past_python_s_digit_limit_is_refused_by_the_reader() -> None:
    assert "digits" in unread("max_tokens: " + "9" * 5000 + "\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: topic\nname: other\n",
            "not valid YAML: the key 'name' is written twice in one mapping (line 2, column 1)",
        ),
        ("prompt: {system: a, system: b}\n", "not valid YAML: the key 'system' is written twice in one mapping"),
        ('{"name": "topic", "name": "other"}', 'not valid JSON: the key "name" is written twice in one object'),
        ('{"prompt": {"user": "a", "user": "b"}}', 'not valid JSON: the key "user" is written twice in one object'),
    ],
    ids=["yaml", "yaml-nested", "json", "json-nested"],
)
def test_a_key_written_twice_is_refused_by_the_reader_rather_than_one_value_dropped(text: str, expected: str) -> None:
    # Given a file that writes one key twice in a mapping, when it is read, then it is refused naming the key
    assert expected in unread(text)


def test_yaml_aliases_that_expand_past_a_file_s_bound_are_refused_by_the_reader() -> None:
    # Given a file of a few hundred bytes whose aliases of aliases hold 9**9 strings ("billion laughs")
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{name}: &{name} [{', '.join([f'*{before}'] * 9)}]")
    text = "\n".join(levels) + "\nname: topic\n"

    # When it is read, then it is refused in one line, its size as JSON past the bound a file holds
    assert unread(text) == (
        f"the job type file holds more than {MAX_FILE_BYTES} bytes as JSON (a YAML alias counts all it "
        "names again); a job type file holds at most that"
    )


def test_yaml_aliases_within_the_bound_are_read_as_what_they_name() -> None:
    assert parse_document("x: &x {type: string}\ny: [*x, *x]\n") == {
        "x": {"type": "string"},
        "y": [{"type": "string"}, {"type": "string"}],
    }


def test_a_yaml_merge_may_still_be_overridden() -> None:
    assert parse_document("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n") == {"base": {"x": 1}, "c": {"x": 2}}


def test_a_yaml_date_stays_the_text_written() -> None:
    assert parse_document("when: 2026-01-31\n") == {"when": "2026-01-31"}


def test_a_schema_at_its_depth_bound_can_be_read_from_a_file() -> None:
    # Given a file whose input schema is as deep as the check allows, which the check passes
    document = file_with(input_schema=nested_arrays(MAX_SCHEMA_DEPTH - 3), examples=[])
    check_job_type(document)

    # When it is read from its JSON text, then the reader gives it back
    assert parse_document(json.dumps(document)) == document


def test_read_job_type_reads_a_file_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    # Given a valid YAML file, a missing one, a directory, one not UTF-8 and one too large
    valid = tmp_path / "topic.yaml"
    valid.write_text(document_yaml(FILE), encoding="utf-8")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    large = tmp_path / "large.json"
    large.write_bytes(b" " * (reader.MAX_FILE_BYTES + 1))

    def refused(path: Path) -> str:
        with pytest.raises(JobTypeFileError) as caught:
            read_job_type(path)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    # When each is read, then the valid one checks and each other is one line naming it
    assert check_job_type(read_job_type(valid)).sha256 == check_job_type(FILE).sha256
    assert check_job_type(read_job_type(str(valid))).name == FILE["name"]
    assert refused(tmp_path / "none.yaml") == f"cannot read {tmp_path / 'none.yaml'}: no such file"
    assert refused(tmp_path) == f"cannot read {tmp_path}: is a directory"
    assert refused(latin) == f"{latin} is not UTF-8 text (byte 9)"
    assert refused(large) == f"{large} is {reader.MAX_FILE_BYTES + 1} bytes; a job type file is at most 400000"


# --- whatever comes in ---

# Strings include lone surrogates and fragments of a job type (template fields, type names), and so
# do keys.
TEXTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "{text}", "{nope}", "object", "string", "#/$defs/x", "output.topic"]),
)
KEYS = st.one_of(
    st.text(max_size=8),
    st.just("topic\ud800"),
    st.sampled_from([*FILE, "type", "properties", "required", "additionalProperties", "items", "$ref", "$defs"]),
    st.integers(0, 3),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.just(10**40), st.floats(), st.just(-(10**MAX_NUMBER_DIGITS)), TEXTS
)
JSON_LIKE = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=20,
)
# Places inside the demo's file where a value is replaced: schemas, the template, a rule, an example.
SPOTS: list[tuple[str | int, ...]] = [
    ("input_schema", "properties", "text"),
    ("input_schema", "required"),
    ("output_schema", "properties", "topic"),
    ("output_schema", "required"),
    ("output_schema", "additionalProperties"),
    ("prompt", "user"),
    ("rules", 0),
    ("rules", 0, "check"),
    ("examples", 0, "input"),
    ("examples", 0, "output", "topic"),
]


@st.composite
def mutated_files(draw: st.DrawFn) -> dict[str, Any]:
    """The demo's file with one top-level field (known, optional or random) set to a random value."""
    document = file_with()
    field = draw(
        st.one_of(
            st.sampled_from([*FILE, "timeout_seconds", "max_attempts", "attachments", "reuse_seconds"]),
            st.text(max_size=8),
        )
    )
    document[field] = draw(JSON_LIKE)
    return document


@st.composite
def deeply_mutated_files(draw: st.DrawFn) -> dict[str, Any]:
    """The demo's file with the value at one of SPOTS replaced by a random one."""
    document = file_with()
    *parents, last = draw(st.sampled_from(SPOTS))
    node: Any = document
    for part in parents:
        node = node[part]
    node[last] = draw(JSON_LIKE)
    return document


@settings(max_examples=200, deadline=None)
@given(document=st.one_of(JSON_LIKE, mutated_files(), deeply_mutated_files()))
def test_any_document_is_checked_or_refused_in_one_line_and_nothing_else(document: Any) -> None:
    # Given any JSON-like document, or the valid file with one part replaced by anything
    # When it is checked
    refused: str | None = None
    try:
        checked = check_job_type(document, CODE_NAMES)
    except JobTypeFileError as exc:
        refused = str(exc)
    if refused is not None:
        # Then a refusal is one line
        assert refused
        assert "\n" not in refused
    else:
        # Or the file is checked, and its stored form checks again to the same content
        assert isinstance(checked, JobTypeFile)
        assert check_job_type(checked.document(), CODE_NAMES).sha256 == checked.sha256
