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


def validated(adapter: TypeAdapter[Any], body: object) -> dict[str, Any]:
    """`body` as `adapter` (an SDK's type) validates it, strictly and all the way down (ValidationError
    when the SDK's types refuse it)."""
    value: dict[str, Any] = materialized(adapter.validate_python(body, strict=True))
    return value


def takes(adapter: TypeAdapter[Any], body: object) -> bool:
    """Whether the SDK's type `adapter` takes `body`."""
    try:
        validated(adapter, body)
    except ValidationError:
        return False
    return True


def sdk_request(body: object) -> dict[str, Any]:
    """`body` as the SDK's request type validates it."""
    return validated(SDK_REQUEST, body)


def sdk_takes(body: object) -> bool:
    return takes(SDK_REQUEST, body)
