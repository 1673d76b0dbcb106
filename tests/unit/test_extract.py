"""`extract`: its input (the fields asked), the output schema narrowed to them (strict structured output,
Bedrock's tool input schema), and the answers it takes and refuses."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from engine.core import ErrorCode
from engine.core.errors import InputValidationError, SchemaValidationError
from engine.definitions import JobRegistry
from engine.definitions.extract import EXTRACT, MAX_FIELDS, ExtractInput
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.bedrock import BedrockConverseProvider
from engine.gateway.schema import strict_json_schema
from tests.unit.test_prompt_blocks import TEXT
from tests.unit.test_schema import STRIPPED, keywords_in, objects_in

TYPES = ("string", "number", "integer", "boolean", "date")
NAME_CHARS = "ABCXYZabcxyz0189_"
# A property's name as Anthropic's tool schemas (Claude on Bedrock) take it.
TOOL_PROPERTY_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")

names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=64)
field_lists = st.lists(
    st.builds(
        lambda name, description, kind: {"name": name, "description": description, "type": kind},
        names,
        st.text(max_size=40),
        st.sampled_from(TYPES),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda field: field["name"],
)


def field(name: str, kind: str, description: str = "") -> dict[str, str]:
    return {"name": name, "description": description, "type": kind}


INVOICE = [
    field("invoice_number", "string", "as printed"),
    field("total", "number", "the amount due"),
    field("lines", "integer", "how many lines"),
    field("paid", "boolean"),
    field("due", "date", "when it is due"),
]


def invoice_input(**extra: Any) -> ExtractInput:
    job_input = EXTRACT.parse_input({"fields": INVOICE, "text": "Invoice 4711", **extra})
    assert isinstance(job_input, ExtractInput)
    return job_input


def answer(**values: Any) -> str:
    answered = {"invoice_number": "4711", "total": 120.5, "lines": 3, "paid": False, "due": "2026-01-31"}
    return json.dumps({**answered, **values})


def refused(content: str, job_input: ExtractInput | None = None) -> SchemaValidationError:
    with pytest.raises(SchemaValidationError) as caught:
        EXTRACT.validate_output(job_input or invoice_input(), content)
    assert caught.value.code is ErrorCode.SCHEMA_VALIDATION_FAILED
    assert "\n" not in caught.value.message
    return caught.value


# --- the input ------------------------------------------------------------------------------------


def test_extract_is_a_built_in() -> None:
    assert JobRegistry().get("extract") is EXTRACT


@given(fields=field_lists, text=st.none() | st.text(max_size=30))
@settings(max_examples=200, deadline=None)
def test_any_list_of_distinct_names_and_known_types_is_taken(fields: list[dict[str, str]], text: str | None) -> None:
    job_input = EXTRACT.parse_input({"fields": fields, **({"text": text} if text is not None else {})})

    # Then the output schema asks for those fields, in their order, and the prompt lists each
    assert list(EXTRACT.output_schema(job_input)["properties"]) == [spec["name"] for spec in fields]
    assert f"text: {json.dumps(fields, ensure_ascii=False)}\n" in EXTRACT.render_prompt(job_input).user


@given(fields=field_lists, data=st.data())
@settings(max_examples=100, deadline=None)
def test_a_name_given_twice_is_refused_whatever_else_differs(fields: list[dict[str, str]], data: st.DataObject) -> None:
    repeated = data.draw(st.sampled_from(fields))
    again = {**repeated, "type": data.draw(st.sampled_from(TYPES)), "description": "another"}
    position = data.draw(st.integers(min_value=0, max_value=len(fields)))

    with pytest.raises(InputValidationError) as caught:
        EXTRACT.parse_input({"fields": [*fields[:position], again, *fields[position:]]})

    assert caught.value.message == "input.fields: Value error, field names must be distinct"


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"fields": []}, "input.fields"),
        ({"fields": [field(f"f{n}", "string") for n in range(MAX_FIELDS + 1)]}, "input.fields"),
        ({"fields": [field("", "string")]}, "input.fields.0.name"),
        ({"fields": [field("x" * 65, "string")]}, "input.fields.0.name"),
        ({"fields": [field("due date", "date")]}, "input.fields.0.name"),
        ({"fields": [field("total-due", "number")]}, "input.fields.0.name"),
        ({"fields": [field("café", "string")]}, "input.fields.0.name"),
        ({"fields": [field("total", "float")]}, "input.fields.0.type"),
        ({"fields": [field("total", "array")]}, "input.fields.0.type"),
        ({"fields": [{"name": "total", "type": "number"}]}, "input.fields.0.description"),
        ({"fields": [{**field("total", "number"), "required": True}]}, "input.fields.0.required"),
        ({"fields": [field("total", "number", "x" * 2_001)]}, "input.fields.0.description"),
        ({"fields": [field("total", "number")], "text": "x" * 200_001}, "input.text"),
        ({"fields": [field("total", "number")], "instructions": ""}, "input.instructions"),
        ({"fields": [field("total", "number")], "schema": {}}, "input.schema"),
        ({"text": "no fields"}, "input.fields"),
    ],
)
def test_an_input_outside_the_bounds_is_refused_naming_where(raw: dict[str, Any], where: str) -> None:
    with pytest.raises(InputValidationError) as caught:
        EXTRACT.parse_input(raw)

    assert caught.value.message.startswith(f"{where}: ")


def test_the_bounds_themselves_are_taken() -> None:
    EXTRACT.parse_input({"fields": [field(f"f{n}", "string") for n in range(MAX_FIELDS)], "text": "x" * 200_000})
    EXTRACT.parse_input({"fields": [field("x" * 64, "date", "d" * 2_000)], "instructions": "i" * 10_000})


@given(
    fields=st.lists(
        st.builds(lambda name, text, kind: field(name, kind, text), names, TEXT, st.sampled_from(TYPES)),
        min_size=1,
        max_size=6,
        unique_by=lambda spec: spec["name"],
    ),
    instructions=st.none() | TEXT,
    text=st.none() | TEXT,
    attachments=st.integers(min_value=0, max_value=3),
)
@settings(max_examples=200, deadline=None)
def test_the_instructions_fields_and_text_stay_inside_their_blocks(
    fields: list[dict[str, str]], instructions: str | None, text: str | None, attachments: int
) -> None:
    # Given descriptions, instructions and a text made of the characters that would close a block
    job_input = EXTRACT.parse_input({"fields": fields, "instructions": instructions, "text": text})

    prompt = EXTRACT.render_prompt(job_input, attachments).user

    # Then the template's five lines are intact, each value one JSON literal in its own
    first, blank, asked, other_blank, last = prompt.split("\n")
    assert (blank, other_blank) == ("", "")
    assert json.loads(first.removeprefix("Instructions: ")) == instructions
    assert json.loads(asked.split(": ", 1)[1]) == fields
    assert json.loads(last.removeprefix("Text: ")) == text


# --- the output schema ----------------------------------------------------------------------------


def test_the_schema_is_exactly_the_fields_asked_each_nullable() -> None:
    schema = EXTRACT.output_schema(invoice_input())

    assert schema == {
        "type": "object",
        "properties": {
            "invoice_number": {"type": ["string", "null"]},
            "total": {"type": ["number", "null"]},
            "lines": {"type": ["integer", "null"]},
            "paid": {"type": ["boolean", "null"]},
            "due": {"type": ["string", "null"], "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        },
        "required": ["invoice_number", "total", "lines", "paid", "due"],
        "additionalProperties": False,
    }


@given(fields=field_lists)
@settings(max_examples=100, deadline=None)
def test_the_schema_is_in_openai_s_strict_subset_as_it_is(fields: list[dict[str, str]]) -> None:
    schema = EXTRACT.output_schema(EXTRACT.parse_input({"fields": fields}))

    # Strict structured output's rules (tests/unit/test_schema.py): closed objects, every property
    # required, none of the keywords it refuses; so the gateway's strict copy is the schema itself
    assert strict_json_schema(schema) == schema
    assert all(node["additionalProperties"] is False for node in objects_in(schema))
    assert not keywords_in(schema) & STRIPPED
    assert schema["required"] == list(schema["properties"])
    # And nullable the way strict mode says it: a type list with "null", no anyOf at the root
    assert all(node["type"][-1] == "null" for node in schema["properties"].values())
    assert "anyOf" not in schema
    # And a JSON schema by the 2020-12 meta-schema
    Draft202012Validator.check_schema(schema)


@given(fields=field_lists)
@settings(max_examples=100, deadline=None)
def test_the_schema_is_a_bedrock_tool_input_schema(fields: list[dict[str, str]]) -> None:
    schema = EXTRACT.output_schema(EXTRACT.parse_input({"fields": fields}))

    # Converse's ToolInputSchema: the top level is an object; Claude's property names are 1-64 of these
    assert schema["type"] == "object"
    assert all(TOOL_PROPERTY_NAME.match(name) for name in schema["properties"])
    assert json.loads(json.dumps(schema)) == schema


@pytest.fixture
def bedrock_stubber() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_an_extract_job_through_bedrock_sends_the_narrowed_schema_as_the_tool_s_input(
    bedrock_stubber: tuple[Any, Stubber],
) -> None:
    # Given an extract job, and Bedrock answering with the tool's input (botocore checks the request)
    client, stubber = bedrock_stubber
    job_input = invoice_input()
    answered = json.loads(answer())
    stubber.add_response(
        "converse",
        {
            "output": {
                "message": {
                    "role": "assistant",
                    "content": [{"toolUse": {"toolUseId": "t1", "name": "extract", "input": answered}}],
                }
            },
            "stopReason": "tool_use",
            "usage": {"inputTokens": 300, "outputTokens": 40, "totalTokens": 340},
            "metrics": {"latencyMs": 42},
        },
        expected_params={
            "modelId": "amazon.nova-lite-v1:0",
            "system": ANY,
            "messages": ANY,
            "inferenceConfig": ANY,
            "toolConfig": {
                "tools": [
                    {
                        "toolSpec": {
                            "name": "extract",
                            "description": ANY,
                            "inputSchema": {"json": EXTRACT.output_schema(job_input)},
                        }
                    }
                ],
                "toolChoice": {"tool": {"name": "extract"}},
            },
        },
    )
    gateway = ModelGateway(BedrockConverseProvider(lambda _: client), ModelTiers("amazon.nova-lite-v1:0"))

    execution = gateway.execute(EXTRACT, job_input)

    # Then the answer is the job's output
    assert execution.error is None
    assert execution.output is not None
    assert EXTRACT.stored_output(execution.output) == answered


# --- answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "stored"),
    [
        (answer(), json.loads(answer())),
        (
            answer(invoice_number=None, total=None, lines=None, paid=None, due=None),
            dict.fromkeys(("invoice_number", "total", "lines", "paid", "due")),
        ),
        # A whole number is a number, and 3.0 is an integer (as JSON Schema says), stored as 3
        (answer(total=120, lines=3.0), {**json.loads(answer()), "total": 120, "lines": 3}),
        (
            answer(due="2024-02-29", invoice_number=""),
            {**json.loads(answer()), "due": "2024-02-29", "invoice_number": ""},
        ),
    ],
    ids=["every type", "all null", "whole numbers", "leap day, empty string"],
)
def test_an_answer_of_exactly_the_fields_each_of_its_type_or_null_is_stored(
    content: str, stored: dict[str, Any]
) -> None:
    output = EXTRACT.validate_output(invoice_input(), content)

    assert EXTRACT.stored_output(output) == stored
    assert list(EXTRACT.stored_output(output)) == [spec["name"] for spec in INVOICE]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (answer(invoice_number=4711), "output.invoice_number: Input should be a valid string"),
        (answer(total="120.50"), "output.total: Input should be a number"),
        (answer(total=True), "output.total: Input should be a number"),
        (answer(total=[120.5]), "output.total: Input should be a number"),
        (answer(lines=2.5), "output.lines: Input should be a whole number"),
        (answer(lines="3"), "output.lines: Input should be a number"),
        (answer(paid="no"), "output.paid: Input should be a valid boolean"),
        (answer(paid=0), "output.paid: Input should be a valid boolean"),
        (answer(extra="x"), "output.extra: Extra inputs are not permitted"),
        (json.dumps({k: v for k, v in json.loads(answer()).items() if k != "due"}), "output.due: Field required"),
        ('["4711", 120.5, 3, false, "2026-01-31"]', "output: Input should be an object"),
    ],
    ids=[
        "number for a string",
        "string for a number",
        "boolean for a number",
        "list for a number",
        "fraction for an integer",
        "string for an integer",
        "string for a boolean",
        "number for a boolean",
        "a field not asked",
        "a field missing",
        "not an object",
    ],
)
def test_an_answer_off_its_fields_fails_the_schema_naming_the_field(content: str, reason: str) -> None:
    assert refused(content).message == reason


@pytest.mark.parametrize(
    "due",
    [
        "31.01.2026",
        "2026-1-31",
        "20260131",
        "2026-01-31T00:00:00",
        "2026-01-31 ",
        "2026-01-31\n",
        "January 31, 2026",
        # What pydantic's own date type takes for a Unix timestamp, even in strict mode
        "0",
        "1700000000",
        20260131,
        True,
    ],
)
def test_a_date_not_written_yyyy_mm_dd_fails_the_schema(due: Any) -> None:
    assert refused(answer(due=due)).message == "output.due: Input should be a date written YYYY-MM-DD"


@pytest.mark.parametrize("due", ["2023-02-29", "2026-13-01", "2026-00-10", "2026-04-31", "0000-01-01"])
def test_a_date_written_so_that_is_no_day_of_the_calendar_fails_the_schema(due: str) -> None:
    assert refused(answer(due=due)).message == "output.due: Input should be a day of the calendar"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_json_cannot_hold_fails_the_schema(literal: str) -> None:
    content = answer(total=0).replace('"total": 0', f'"total": {literal}')

    assert refused(content).message == "output.total: Input should be a finite number"


def test_each_input_is_answered_against_its_own_fields() -> None:
    # Given two inputs whose fields share a name but not its type
    as_number = EXTRACT.parse_input({"fields": [field("amount", "number")], "text": "t"})
    as_string = EXTRACT.parse_input({"fields": [field("amount", "string")], "text": "t"})

    # Then each answer is valid for one of them only
    assert EXTRACT.stored_output(EXTRACT.validate_output(as_number, '{"amount": 5}')) == {"amount": 5}
    assert EXTRACT.stored_output(EXTRACT.validate_output(as_string, '{"amount": "5"}')) == {"amount": "5"}
    assert refused('{"amount": "5"}', as_number).message == "output.amount: Input should be a number"  # type: ignore[arg-type]
    assert refused('{"amount": 5}', as_string).message == "output.amount: Input should be a valid string"  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["json", "model_config", "root", "_private", "__class__", "2nd", "schema", "copy"])
def test_names_a_model_would_take_for_its_own_are_fields_like_any_other(name: str) -> None:
    job_input = EXTRACT.parse_input({"fields": [field(name, "string"), field("other", "integer")]})

    output = EXTRACT.validate_output(job_input, json.dumps({name: "v", "other": 1}))

    assert EXTRACT.stored_output(output) == {name: "v", "other": 1}
    refused(json.dumps({name: "v", "other": 1, "root": 2} if name != "root" else {"other": 1}), job_input)  # type: ignore[arg-type]


# --- the schema and the validation agree ------------------------------------------------------------

JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.dates().map(datetime.date.isoformat),
    st.text(alphabet="0123456789-", min_size=10, max_size=10),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


# A value of each type, as a model would answer it (null included), dates the pattern takes included.
TYPED_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "string": st.none() | st.text(max_size=12),
    "number": st.none() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
    "integer": st.none() | st.integers() | st.integers(min_value=-(2**52), max_value=2**52).map(float),
    "boolean": st.none() | st.booleans(),
    "date": st.none()
    | st.dates().map(datetime.date.isoformat)
    | st.text(alphabet="0123456789", min_size=8, max_size=8).map(lambda d: f"{d[:4]}-{d[4:6]}-{d[6:]}"),
}


def is_calendar_date(value: Any) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


@given(fields=field_lists, data=st.data())
@settings(max_examples=300, deadline=None)
def test_an_answer_is_taken_exactly_when_the_schema_sent_says_it_is_valid(
    fields: list[dict[str, str]], data: st.DataObject
) -> None:
    # Given an answer of values of their types, now and then one of any JSON value, a field missing or
    # one not asked
    job_input = EXTRACT.parse_input({"fields": fields})
    now_and_then = st.integers(min_value=0, max_value=7).map(lambda roll: roll == 0)
    answered = {
        spec["name"]: data.draw(JSON_VALUES if data.draw(now_and_then) else TYPED_VALUES[spec["type"]])
        for spec in fields
    }
    if data.draw(now_and_then):
        answered.pop(data.draw(st.sampled_from(fields))["name"])
    if data.draw(now_and_then):
        answered[data.draw(names)] = data.draw(JSON_VALUES)
    schema = EXTRACT.output_schema(job_input)
    # (a date the pattern takes, such as 2023-02-29, may still be no day of the calendar)
    dates_real = all(
        is_calendar_date(answered[spec["name"]])
        for spec in fields
        if spec["type"] == "date" and isinstance(answered.get(spec["name"]), str)
    )
    # (and Python's `$`, unlike a provider's, matches before a final newline: the schema would take one)
    assume(not any("\n" in value for value in answered.values() if isinstance(value, str)))

    # When the engine validates it
    try:
        EXTRACT.validate_output(job_input, json.dumps(answered))
        taken = True
    except SchemaValidationError:
        taken = False

    # Then it takes what the schema the provider was sent allows, and nothing else
    assert taken == (Draft202012Validator(schema).is_valid(answered) and dates_real)
