"""JSON schemas for structured output, generated from a job type's output model."""

from __future__ import annotations

import copy
import json
from typing import Any

# Where a request cannot name a schema for the answer (OpenAI's json_object mode, a Bedrock batch
# record), the system message carries it: this line, then the schema as compact JSON on the next line.
SCHEMA_PREAMBLE = "Answer with one JSON object that is valid against this JSON schema:"

# Keywords OpenAI's strict structured output refuses; pydantic still checks them on the answer.
_UNSUPPORTED_IN_STRICT = frozenset({"default", "minLength", "maxLength", "title"})
# Keywords whose values are data, not schemas: kept exactly as they are (an enum of the labels offered).
_VALUES = frozenset({"enum", "const"})
# Keywords whose values map names to schemas: the names are kept, whatever they are.
_NAMED_SCHEMAS = frozenset({"properties", "$defs"})


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` in the strict subset: closed objects, every property required."""
    strict: dict[str, Any] = _strict(schema)
    return strict


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _UNSUPPORTED_IN_STRICT:
            continue
        if key in _VALUES:
            result[key] = copy.deepcopy(value)
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            result[key] = {name: _strict(child) for name, child in value.items()}
        else:
            result[key] = _strict(value)
    if node.get("type") == "object":
        result["additionalProperties"] = False
        result["required"] = list(node.get("properties", {}))
    return result


def system_with_schema(system: str, schema: dict[str, Any]) -> str:
    """A system message that asks for an answer valid against `schema`: the prompt's, then
    SCHEMA_PREAMBLE and the schema."""
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return f"{system}\n\n{SCHEMA_PREAMBLE}\n{compact}" if system else f"{SCHEMA_PREAMBLE}\n{compact}"
