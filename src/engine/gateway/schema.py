"""JSON schemas for structured output, generated from a job type's output model."""

from __future__ import annotations

from typing import Any

# Keywords OpenAI's strict structured output refuses; pydantic still checks them on the answer.
_UNSUPPORTED_IN_STRICT = frozenset({"default", "minLength", "maxLength", "title"})


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` in the strict subset: closed objects, every property required."""
    strict: dict[str, Any] = _strict(schema)
    return strict


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {key: _strict(value) for key, value in node.items() if key not in _UNSUPPORTED_IN_STRICT}
    if "properties" in node:
        result["properties"] = {name: _strict(value) for name, value in node["properties"].items()}
    if node.get("type") == "object":
        result["additionalProperties"] = False
        result["required"] = list(node.get("properties", {}))
    return result
