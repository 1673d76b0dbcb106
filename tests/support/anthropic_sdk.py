"""The official Anthropic SDK's request types as validators: what Anthropic's own client would send.

As with tests.support.openai_sdk: pydantic validates the SDK's iterables lazily, so they are consumed
(and so validated), and a body equal to its validated self has no field the SDK does not know and no
value it had to coerce.
"""

from __future__ import annotations

from typing import Any

from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from anthropic.types.messages import BatchCreateParams
from anthropic.types.messages.batch_create_params import Request
from pydantic import TypeAdapter

from tests.support.openai_sdk import takes, validated

SDK_REQUEST = TypeAdapter(MessageCreateParamsNonStreaming)
SDK_BATCH_REQUEST = TypeAdapter(Request)
SDK_BATCH = TypeAdapter(BatchCreateParams)


def sdk_request(body: object) -> dict[str, Any]:
    """`body` as the SDK's Messages request type validates it, strictly and all the way down."""
    return validated(SDK_REQUEST, body)


def sdk_batch_request(request: object) -> dict[str, Any]:
    """A request of a Message Batches create body, as the SDK's `Request` validates it."""
    return validated(SDK_BATCH_REQUEST, request)


def sdk_batch(body: object) -> dict[str, Any]:
    """A Message Batches create body, as the SDK's `BatchCreateParams` validates it."""
    return validated(SDK_BATCH, body)


def sdk_takes(body: object) -> bool:
    return takes(SDK_REQUEST, body)
