"""strict_json_schema: the output models in OpenAI's strict subset (closed objects, all required)."""

from __future__ import annotations

import copy
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from engine.definitions import BUILTIN_DEFINITIONS
from engine.gateway.schema import strict_json_schema

STRIPPED = {"default", "minLength", "maxLength", "title"}


def objects_in(node: Any) -> list[dict[str, Any]]:
    """Every schema node of type object, however deep."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append(node)
        for key, value in node.items():
            if key == "properties":
                for child in value.values():
                    found.extend(objects_in(child))
            else:
                found.extend(objects_in(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(objects_in(item))
    return found


def keywords_in(node: Any) -> set[str]:
    """Every schema keyword used (property names are not keywords)."""
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(key)
            children = value.values() if key in {"properties", "$defs"} else [value]
            for child in children:
                keys |= keywords_in(child)
    elif isinstance(node, list):
        for item in node:
            keys |= keywords_in(item)
    return keys


@pytest.mark.parametrize("definition", BUILTIN_DEFINITIONS, ids=lambda d: d.name)
def test_every_builtin_output_schema_is_closed_and_fully_required(definition: Any) -> None:
    schema = strict_json_schema(definition.output_model.model_json_schema())

    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == list(definition.output_model.model_fields)
    assert not keywords_in(schema) & STRIPPED


def test_the_classify_schema_keeps_its_numeric_bounds() -> None:
    schema = strict_json_schema(BUILTIN_DEFINITIONS[1].output_model.model_json_schema())

    assert schema["properties"] == {
        "label": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0.0, "maximum": 1.0},
    }


def test_the_answer_schema_keeps_its_array_shape() -> None:
    schema = strict_json_schema(BUILTIN_DEFINITIONS[2].output_model.model_json_schema())

    assert schema["properties"]["citations"]["type"] == "array"
    assert schema["properties"]["citations"]["items"] == {"type": "string"}
    assert schema["properties"]["citations"]["minItems"] == 1


class Source(BaseModel):
    id: str
    quote: Annotated[str, Field(max_length=500)] = ""


class Finding(BaseModel):
    claim: str
    sources: list[Source]
    primary: Source | None = None


class Report(BaseModel):
    title: str  # a property named like a stripped keyword
    default: int = 0
    findings: list[Finding]
    summary: Annotated[str, Field(min_length=1)]


def test_nested_models_are_closed_and_fully_required_at_every_level() -> None:
    schema = strict_json_schema(Report.model_json_schema())

    objects = objects_in(schema)
    assert {tuple(obj["required"]) for obj in objects} == {
        ("title", "default", "findings", "summary"),
        ("claim", "sources", "primary"),
        ("id", "quote"),
    }
    assert all(obj["additionalProperties"] is False for obj in objects)
    assert not keywords_in(schema) & STRIPPED


def test_property_names_that_look_like_keywords_are_kept() -> None:
    schema = strict_json_schema(Report.model_json_schema())

    assert list(schema["properties"]) == ["title", "default", "findings", "summary"]
    assert schema["properties"]["title"] == {"type": "string"}


def test_references_to_nested_models_survive() -> None:
    schema = strict_json_schema(Report.model_json_schema())

    assert set(schema["$defs"]) == {"Finding", "Source"}
    assert schema["properties"]["findings"]["items"] == {"$ref": "#/$defs/Finding"}


def test_the_input_schema_is_not_modified() -> None:
    original = Report.model_json_schema()
    before = copy.deepcopy(original)

    strict_json_schema(original)

    assert original == before
