"""The official OpenAI SDK's request type as a validator: what OpenAI's own client would send.

pydantic validates the SDK's iterables lazily: `materialized` consumes them (and so validates them),
and a body equal to its validated self has no field the SDK does not know and no value it had to coerce.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from pydantic import TypeAdapter, ValidationError

SDK_REQUEST = TypeAdapter(CompletionCreateParamsNonStreaming)


def materialized(value: Any) -> Any:
    """`value` with every lazily validated iterable consumed into a list."""
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    if isinstance(value, Iterator | list):
        return [materialized(item) for item in value]
    return value


def sdk_request(body: object) -> dict[str, Any]:
    """`body` as the SDK's request type validates it, strictly and all the way down (ValidationError
    when the SDK's types refuse it)."""
    validated: dict[str, Any] = materialized(SDK_REQUEST.validate_python(body, strict=True))
    return validated


def sdk_takes(body: object) -> bool:
    try:
        sdk_request(body)
    except ValidationError:
        return False
    return True
