"""Anthropic's Messages API over httpx: `POST {base}/v1/messages`, its key in `x-api-key`.

The request (docs/gateway.md has the whole of it): the system prompt as one text block marked
`cache_control: ephemeral`, so that the stable prefix every job of a job type shares (the output's
tool definition, then the system prompt: Anthropic caches tools, system and messages in that order)
is read from the prompt cache at a tenth of the input price; the user turn as the prompt's text, then
each attachment as an `image` or `document` block with a base64 source (a text file as a text
block); then the re-ask conversation. Structured output is the model's JSON-schema output format
(`output_config.format`) for the models `AI_JSON_OUTPUT_MODELS` names, and one forced tool
(`tool_choice: {"type": "tool"}`) whose `input_schema` is the output schema for every other model:
the tool call's input is the answer.

The response's usage counts cache reads and writes apart from `input_tokens`; the engine's input
tokens include them (engine.gateway.provider.Completion). Errors are classified by their HTTP status
and, for a 200 whose body is an error, by the error's `type`; never by their text.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

import httpx

from engine.core.attachments import Attachment
from engine.core.errors import JobError, ProviderUnavailableError
from engine.gateway.openai import (
    ApiKeySource,
    Sent,
    default_client,
    output_name,
    parse_retry_after,
    provider_errors,
    read_bounded,
    request_headers,
    send_authorized,
)
from engine.gateway.parts import attachment_filename, attachment_text, base64_text
from engine.gateway.provider import ChatTurn, Completion, CompletionRequest, error_for_status, token_count

# The API version every request names (Anthropic's "Versioning" page: the current one).
ANTHROPIC_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
_CONNECT_TIMEOUT_SECONDS = 5.0
# Anthropic refuses a text block that is empty; an empty answer being re-asked about still needs a turn.
_EMPTY_TURN_TEXT = "(no answer)"
_TOOL_DESCRIPTION = "Give your answer by calling this tool; its input is the answer."
# The HTTP status each of Anthropic's error types comes with (its "Errors" page), for an error that
# arrives without one of its own: a 200 whose body is an error, a batch request's result.
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
# What the JSON-schema output format takes of a schema (Anthropic's "Structured outputs" page: simple
# regular expressions, but no numeric or length bounds; objects closed). The keywords it does not take
# go into the description, as the SDK's own transform puts them, and the engine checks them on the answer.
_SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "items", "anyOf", "allOf", "$defs", "$ref"})
# What the format's regular expressions lack: lookarounds, backreferences and word boundaries. A pattern
# with one of them is refused (HTTP 400), so it goes into the description instead.
_COMPLEX_PATTERN = re.compile(r"\\(?:[bBk1-9])|\(\?(?:=|!|<=|<!|P=)")
# What a dated version of a model adds to its name: claude-sonnet-4-5-20250929.
_DATED = re.compile(r"-\d{8}")
_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)


def api_root(base_url: str) -> str:
    """The API's root from AI_BASE_URL, with or without its `/v1` (the SDK's base URL has none)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1") if root.endswith("/v1") else root


def anthropic_credentials(key: str | None) -> dict[str, str]:
    """The headers every request carries: the key (none for a local endpoint without one) and the version."""
    return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}


# The models Anthropic documents its JSON-schema output format as generally available for (a name
# stands for its dated versions too); AI_JSON_OUTPUT_MODELS adds others (docs/gateway.md).
JSON_OUTPUT_MODELS = (
    "claude-opus-4-6",
    "claude-sonnet-4-6",
    "claude-opus-4-5",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
)


def takes_json_output(model: str, json_output_models: Sequence[str]) -> bool:
    """Whether `model` is one of (or a dated version of one of) the models given the JSON output format:
    those that have it (JSON_OUTPUT_MODELS) and those configured."""
    names = (*JSON_OUTPUT_MODELS, *json_output_models)
    return any(model == name or _DATED.fullmatch(model.removeprefix(name)) for name in names)


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self,
        base_url: str,
        api_key: ApiKeySource,
        *,
        json_output_models: Sequence[str] = (),
        client: httpx.Client | None = None,
    ) -> None:
        self._url = api_root(base_url) + MESSAGES_PATH
        self._api_key = api_key
        self._json_output_models = tuple(json_output_models)
        self._client = client or default_client()

    def complete(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        status, headers, content = send_authorized(
            self._api_key, lambda auth: self._post(request, auth), anthropic_credentials
        )
        latency_ms = int((time.perf_counter() - started) * 1000)
        return message_completion(status, content, request.model, latency_ms, headers.get("retry-after"))

    def body(self, request: CompletionRequest) -> dict[str, Any]:
        """What a real-time call posts, and a batch request carries as its `params`: in the JSON output
        format where the model has it and the schema is within the format's limits, else a forced tool."""
        json_output = takes_json_output(request.model, self._json_output_models) and within_json_output_limits(
            request.output_schema
        )
        return message_body(request, json_output)

    def _post(self, request: CompletionRequest, auth: dict[str, str]) -> Sent:
        timeout = httpx.Timeout(request.timeout_seconds, connect=min(_CONNECT_TIMEOUT_SECONDS, request.timeout_seconds))
        headers = {**request_headers(request), **auth}
        with (
            provider_errors(request.timeout_seconds),
            self._client.stream(
                "POST", self._url, json=self.body(request), headers=headers, timeout=timeout
            ) as response,
        ):
            return response.status_code, response.headers, read_bounded(response)


def message_body(request: CompletionRequest, json_output: bool) -> dict[str, Any]:
    """The Messages API request body for `request`: structured output by the JSON output format when
    `json_output`, else by one forced tool whose input schema is the output schema."""
    cached = {"type": "ephemeral"}
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": [
            {"role": "user", "content": user_blocks(request.user, request.attachments)},
            *(_turn(turn) for turn in request.conversation),
        ],
    }
    if request.system:
        # The breakpoint caches everything before it: the tool definition (when there is one) and the system.
        body["system"] = [{"type": "text", "text": request.system, "cache_control": cached}]
    if json_output:
        body["output_config"] = {"format": {"type": "json_schema", "schema": json_output_schema(request.output_schema)}}
        return body
    name = output_name(request.schema_name)
    tool: dict[str, Any] = {"name": name, "description": _TOOL_DESCRIPTION, "input_schema": request.output_schema}
    if not request.system:
        tool["cache_control"] = cached
    body["tools"] = [tool]
    body["tool_choice"] = {"type": "tool", "name": name}
    return body


def user_blocks(text: str, attachments: Sequence[Attachment]) -> list[dict[str, Any]]:
    """The user turn: its text, then each attachment as Anthropic takes it: an image as an `image` block,
    a PDF as a `document` block (base64 sources, the file's name as the document's title), a text
    file as a text block that names it."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text or _EMPTY_TURN_TEXT}]
    for attachment in attachments:
        source = {"type": "base64", "media_type": attachment.media_type.value, "data": base64_text(attachment.data)}
        if attachment.media_type.is_image:
            blocks.append({"type": "image", "source": source})
        elif attachment.media_type.is_document:
            blocks.append({"type": "document", "source": source, "title": attachment_filename(attachment)})
        else:
            blocks.append({"type": "text", "text": attachment_text(attachment)})
    return blocks


def _turn(turn: ChatTurn) -> dict[str, Any]:
    return {"role": turn.role, "content": turn.content if turn.content.strip() else _EMPTY_TURN_TEXT}


# The JSON output format's limits on one schema (Anthropic's structured outputs documentation): at most
# this many properties whose schema is a union (`anyOf`, or a list of types, such as a nullable field),
# and at most this many optional ones. A schema past either goes as a forced tool's input schema instead,
# which has neither limit (an `extract` of many nullable fields, say).
MAX_UNION_PROPERTIES = 16
MAX_OPTIONAL_PROPERTIES = 24


def within_json_output_limits(schema: dict[str, Any]) -> bool:
    """Whether `schema` (as json_output_schema sends it) keeps within the JSON output format's limits."""
    unions, optional = _property_counts(json_output_schema(schema))
    return unions <= MAX_UNION_PROPERTIES and optional <= MAX_OPTIONAL_PROPERTIES


def _property_counts(node: Any) -> tuple[int, int]:
    """(union properties, optional properties) of every object within `node`."""
    if isinstance(node, list):
        counts = [_property_counts(item) for item in node]
        return sum(count[0] for count in counts), sum(count[1] for count in counts)
    if not isinstance(node, dict):
        return 0, 0
    unions = optional = 0
    properties = node.get("properties")
    if isinstance(properties, dict):
        listed = node.get("required")
        required = listed if isinstance(listed, list) else []
        for name, child in properties.items():
            if isinstance(child, dict) and ("anyOf" in child or isinstance(child.get("type"), list)):
                unions += 1
            optional += name not in required
    # Schemas within: each property's and definition's (not their maps, whose keys are names), and
    # those under the other keywords (items, anyOf, ...).
    children = [
        child
        for key, value in node.items()
        for child in (value.values() if key in ("properties", "$defs") and isinstance(value, dict) else [value])
    ]
    inner = _property_counts(children)
    return unions + inner[0], optional + inner[1]


def json_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` as the JSON output format takes it: its objects closed, the keywords it does
    not take left out (the answer is still validated against the whole schema)."""
    result: dict[str, Any] = _json_output(schema)
    return result


def _json_output(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_output(item) for item in node]
    if not isinstance(node, dict):
        return node
    result: dict[str, Any] = {}
    left: dict[str, Any] = {}
    for key, value in node.items():
        if _kept_as_is(key, value):
            result[key] = value
        elif key in ("properties", "$defs") and isinstance(value, dict):
            result[key] = {name: _json_output(child) for name, child in value.items()}
        elif key in _SCHEMA_KEYWORDS:
            result[key] = _json_output(value)
        elif key == "oneOf" and "anyOf" not in node:
            # The format has no oneOf (pydantic's discriminated unions): as anyOf, as the SDK's transform
            # sends it; the engine's validation still holds the answer to exactly one.
            result["anyOf"] = _json_output(value)
        elif key not in ("additionalProperties", "title", "default"):
            left[key] = value
    if left:
        noted = json.dumps(left, ensure_ascii=False, separators=(", ", ": "))
        result["description"] = f"{result['description']}\n\n{noted}" if "description" in result else noted
    if node.get("type") == "object":
        result["additionalProperties"] = False
    return result


def _kept_as_is(key: str, value: object) -> bool:
    """Keywords whose values are data (an enum of the labels offered), and the bounds the format takes."""
    if key in ("enum", "const", "required", "description"):
        return True
    if key == "format":
        return isinstance(value, str) and value in _STRING_FORMATS
    if key == "pattern":
        return isinstance(value, str) and _simple_pattern(value)
    return key == "minItems" and type(value) is int and value in (0, 1)


def _simple_pattern(pattern: str) -> bool:
    """Whether the format's regular expressions take `pattern`: no lookaround, backreference or word
    boundary (an escaped backslash is a literal one, not the start of an escape)."""
    return _COMPLEX_PATTERN.search(pattern.replace("\\\\", "")) is None


def message_completion(
    status: int, body: bytes | object, model: str, latency_ms: int, retry_after: str | None = None
) -> Completion:
    """The answer in a Messages API response of HTTP `status` (a real-time call's, or a batch result's
    message), whose body is `body` (raw bytes, or already parsed JSON); the engine error otherwise."""
    if status >= 400:
        error_type = _error_type(body)
        raise error_for_status(
            status, "Anthropic", f"HTTP {status} {error_type}".rstrip(), parse_retry_after(retry_after)
        )
    try:
        message: Any = json.loads(body) if isinstance(body, bytes) else body
        if message.get("type") == "error":
            raise typed_error(message, parse_retry_after(retry_after))
        if message.get("type") != "message":
            raise TypeError("not a message")
        usage = message.get("usage") or {}
        # input_tokens counts neither the cache reads nor the cache writes; the engine's count holds both.
        cached = token_count(usage.get("cache_read_input_tokens"))
        written = token_count(usage.get("cache_creation_input_tokens"))
        input_tokens = token_count(token_count(usage.get("input_tokens")) + cached + written)
        output_tokens = token_count(usage.get("output_tokens"))
        content = _answer(message["content"])
        finish_reason = str(message.get("stop_reason") or "")
        answered_by = str(message.get("model") or model)
    except JobError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # A 2xx that is not a message is a provider fault, not the model's answer.
        raise ProviderUnavailableError("Anthropic answered with something other than a message") from exc
    return Completion(
        content=content,
        model=answered_by,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=latency_ms,
        finish_reason=finish_reason,
        cached_input_tokens=cached,
        cache_write_input_tokens=written,
    )


def typed_error(envelope: object, retry_after_seconds: float | None = None) -> JobError:
    """The engine error for an error body (`{"type": "error", "error": {"type": ...}}`), by its type; an
    unknown or missing type is the provider's fault."""
    error = envelope.get("error") if isinstance(envelope, dict) else None
    error_type = error.get("type") if isinstance(error, dict) else None
    status = ERROR_STATUS.get(error_type) if isinstance(error_type, str) else None
    return error_for_status(status, "Anthropic", str(error_type or "error of no type"), retry_after_seconds)


def _error_type(body: bytes | object) -> str:
    """The `error.type` of an error response, when its body says; "" otherwise (its message is not kept)."""
    try:
        envelope: Any = json.loads(body) if isinstance(body, bytes) else body
        error_type = envelope["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return ""
    return error_type if isinstance(error_type, str) and error_type.isidentifier() else ""


def _answer(blocks: object) -> str:
    """The first tool call's input as JSON; else the text blocks, so validation can say what came back."""
    if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
        raise TypeError("a message's content is a list of content blocks")
    for block in blocks:
        if block.get("type") == "tool_use":
            return json.dumps(block["input"])
    return "".join(str(block["text"]) for block in blocks if block.get("type") == "text")
