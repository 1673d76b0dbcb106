"""Anthropic's Messages wire format for the local provider: a request checked and read, its replies.

`parse_message_body` refuses what Anthropic's validation refuses (a 400 `invalid_request_error`
naming the field, as `messages.0.content.1.source.media_type: ...`): a body that is not an object or
holds a lone UTF-16 surrogate, a field the API does not know, no model, `max_tokens` below 1, no or
empty `messages`, a role other than `user`, `assistant` or `system`, an empty text, a content block
of a type its role does not take or without its own fields, an image or a document whose base64 is
not what its `media_type` says, a tool without a valid name or an `input_schema` of type object, a
`tool_choice` naming no tool of the request, an `output_config.format` that is not a JSON schema, a
`cache_control` that is not `ephemeral` (or more than four of them). The SDK's request types
(`anthropic.types.message_create_params.MessageCreateParamsNonStreaming`) are the reference
(tests/unit/test_local_messages.py).

A checked request is read as the provider reads a chat completion request (aijobs.local.protocol's
ChatRequest): its output schema is its forced tool's `input_schema` or its JSON output format's
schema, its job type the X-Aijobs-Job-Type header or else the tool's name, its prompt the first user
turn's first text; its images and PDFs are billed as Anthropic bills them (an image's pixels / 750,
resized to its bounds; a PDF's pages as images, and their text). Its cacheable prefix is what comes
before its last `cache_control` breakpoint among its tools and system blocks (Anthropic caches
tools, then system, then messages).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from typing import Any

from aijobs.local.attachments import PAGE_DPI, POINTS_PER_INCH, ReadAttachments, page_texts, text_tokens
from aijobs.local.faults import FaultKind
from aijobs.local.protocol import ChatRequest, Reply, estimate_tokens
from aijobs.local.refusals import InvalidRequestError
from engine.attachments.inspection import inspect, media_type_of
from engine.core.attachments import AttachmentRef, MediaType
from engine.core.errors import AttachmentInvalidError
from engine.gateway.attachment_tokens import image_tokens
from engine.text import json_value_problem

MESSAGES_PATH = "/v1/messages"
# What MessageCreateParamsNonStreaming holds: any other field is refused, as Anthropic refuses it.
KNOWN_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "output_config",
        "metadata",
        "stop_sequences",
        "stream",
        "thinking",
        "service_tier",
        "cache_control",
        "container",
        "inference_geo",
        "speed",
    }
)
BLOCK_TYPES = {
    "user": ("text", "image", "document", "tool_result"),
    "assistant": ("text", "tool_use"),
    "system": ("text",),
}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_CHOICES = ("auto", "any", "tool", "none")
MAX_BREAKPOINTS = 4


def error_reply(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None, delay_seconds: float = 0.0
) -> Reply:
    """An error response in Anthropic's shape."""
    body = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": f"req_{uuid.uuid4().hex}"}
    return Reply(status, body, headers or {}, delay_seconds)


def refused(exc: InvalidRequestError) -> Reply:
    """The 400 Anthropic answers a request it refuses."""
    return error_reply(400, "invalid_request_error", str(exc))


def fault_reply(fault: FaultKind | None, latency: float, retry_after_seconds: int, hang_seconds: float) -> Reply | None:
    """The reply of a fault that gives no answer, as Anthropic gives it; None for the faults that answer."""
    match fault:
        case FaultKind.RATE_LIMITED:
            headers = {"retry-after": str(retry_after_seconds)}
            return error_reply(
                429, "rate_limit_error", "Number of requests has exceeded your rate limit", headers, latency
            )
        case FaultKind.SERVER_ERROR:
            return error_reply(500, "api_error", "Internal server error", None, latency)
        case FaultKind.UNAVAILABLE:
            return error_reply(529, "overloaded_error", "Overloaded", None, latency)
        case FaultKind.HANG:
            return Reply(None, delay_seconds=hang_seconds)
        case FaultKind.DROP:
            return Reply(None, delay_seconds=latency)
        case _:
            return None


def parse_message_request(raw: bytes, job_type: str | None = None) -> ChatRequest:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError("The request body is not valid JSON.") from exc
    return parse_message_body(body, job_type)


def parse_message_body(body: object, job_type: str | None = None) -> ChatRequest:
    """The request whose JSON body is `body` (a batch request's `params` carries it parsed);
    InvalidRequestError for a request Anthropic would refuse."""
    body = _object(body, "body")
    problem = json_value_problem(body, "body")
    if problem is not None:
        # A lone surrogate is no Unicode: Anthropic's JSON parser refuses it.
        raise InvalidRequestError(f"The request body is not valid JSON: {problem}")
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise InvalidRequestError(f"{unknown[0]}: Extra inputs are not permitted")
    model = _required(body, "model", str, "a string")
    max_tokens = _required(body, "max_tokens", int, "an integer")
    if isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequestError("max_tokens: Input should be greater than or equal to 1")
    if body.get("stream") not in (None, False):
        raise InvalidRequestError("stream: the local provider does not stream")
    breakpoints = 0
    prefix: list[str] = []
    cached_through: int | None = None
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: Input should be a valid list")
    names: list[str] = []
    for index, tool in enumerate(tools):
        names.append(_tool(tool, f"tools.{index}"))
        prefix.append(json.dumps({key: value for key, value in tool.items() if key != "cache_control"}))
        if _breakpoint(tool, f"tools.{index}"):
            breakpoints, cached_through = breakpoints + 1, len(prefix)
    forced = _tool_choice(body.get("tool_choice"), names)
    system = _system(body.get("system"))
    for index, block in enumerate(system):
        prefix.append(block["text"])
        if _breakpoint(block, f"system.{index}"):
            breakpoints, cached_through = breakpoints + 1, len(prefix)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: at least one message is required")
    turns: list[tuple[str, str]] = []
    attachments = ReadAttachments()
    for index, message in enumerate(messages):
        role, text, read, marks = _message(message, f"messages.{index}", model)
        turns.append((role, text))
        attachments = ReadAttachments(
            attachments.tokens + read.tokens,
            "\n".join(filter(None, (attachments.text, read.text))),
            attachments.count + read.count,
        )
        breakpoints += marks
    if breakpoints > MAX_BREAKPOINTS:
        raise InvalidRequestError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}."
        )
    json_schema = _output_format(body.get("output_config"))
    schema = json_schema if json_schema is not None else _schema_of(tools, forced)
    users = [text for role, text in turns if role == "user"]
    system_text = "\n".join(block["text"] for block in system)
    return ChatRequest(
        model=model,
        system=system_text,
        prompt=users[0] if users else "",
        schema=schema,
        schema_name=forced or job_type,
        job_type=job_type or None,
        repair=len(users) > 1 or any(role == "assistant" for role, _ in turns),
        prompt_tokens=estimate_tokens("".join(prefix) + "".join(text for _, text in turns)) + attachments.tokens,
        max_tokens=max_tokens,
        attachments=attachments,
        tool=forced,
        cache_prefix="".join(prefix[:cached_through]) if cached_through else None,
        api="anthropic",
    )


def message_body(
    content: str, request: ChatRequest, number: int, input_tokens: int, output_tokens: int, read: int, written: int
) -> dict[str, Any]:
    """A Message; as Anthropic's, its `input_tokens` count neither the cache reads nor the cache writes."""
    answer = _json_object(content) if request.tool else None
    if request.tool and answer is not None:
        blocks: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_local_{number}", "name": request.tool, "input": answer}
        ]
        stop_reason = "tool_use"
    else:
        blocks, stop_reason = [{"type": "text", "text": content}], "end_turn"
    return {
        "id": f"msg_local_{number}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens - read - written,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        },
    }


def _json_object(content: str) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- the request's parts ---


def _object(value: object, at: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{at}: Input should be a valid dictionary")
    return value


def _required(holder: dict[str, Any], field: str, kind: type, described: str) -> Any:
    if field not in holder:
        raise InvalidRequestError(f"{field}: Field required")
    value = holder[field]
    if not isinstance(value, kind) or (kind is str and not value):
        raise InvalidRequestError(f"{field}: Input should be {described}")
    return value


def _text(value: object, at: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{at}: Input should be a valid string")
    if not value:
        raise InvalidRequestError(f"{at}: text content blocks must be non-empty")
    return value


def _breakpoint(holder: dict[str, Any], at: str) -> bool:
    """Whether a block is a cache breakpoint; InvalidRequestError for a cache_control of another kind."""
    control = holder.get("cache_control")
    if control is None:
        return False
    if (
        not isinstance(control, dict)
        or control.get("type") != "ephemeral"
        or control.get("ttl", "5m") not in ("5m", "1h")
    ):
        raise InvalidRequestError(f"{at}.cache_control: Input should be {{'type': 'ephemeral'}}")
    return True


def _tool(tool: object, at: str) -> str:
    tool = _object(tool, at)
    name = tool.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise InvalidRequestError(f"{at}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidRequestError(f"{at}.input_schema.type: Input should be 'object'")
    return name


def _tool_choice(choice: object, names: list[str]) -> str | None:
    """The tool a `tool_choice` forces, if any."""
    if choice is None:
        return None
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    if kind not in TOOL_CHOICES:
        raise InvalidRequestError("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    if kind != "tool":
        return None
    name = choice.get("name")
    if not isinstance(name, str) or name not in names:
        raise InvalidRequestError(f"tool_choice.name: Tool '{str(name)[:128]}' not found in the request's tools")
    return name


def _system(system: object) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    if not isinstance(system, list):
        raise InvalidRequestError("system: Input should be a valid string or a list of text blocks")
    for index, block in enumerate(system):
        block = _object(block, f"system.{index}")
        if block.get("type") != "text":
            raise InvalidRequestError(f"system.{index}.type: Input should be 'text'")
        _text(block.get("text"), f"system.{index}.text")
    return system


def _output_format(config: object) -> dict[str, Any] | None:
    """The JSON schema an `output_config.format` asks the answer to meet, if any."""
    if config is None:
        return None
    form = _object(config, "output_config").get("format")
    if form is None:
        return None
    form = _object(form, "output_config.format")
    if form.get("type") != "json_schema" or not isinstance(form.get("schema"), dict):
        raise InvalidRequestError("output_config.format: Input should be {'type': 'json_schema', 'schema': {...}}")
    schema: dict[str, Any] = form["schema"]
    return schema


def _schema_of(tools: list[dict[str, Any]], forced: str | None) -> dict[str, Any] | None:
    tool = next((tool for tool in tools if tool["name"] == forced), None)
    return tool["input_schema"] if tool is not None else None


def _message(message: object, at: str, model: str) -> tuple[str, str, ReadAttachments, int]:
    """A message's role, its text, its images' and PDFs' bills, and its cache breakpoints."""
    message = _object(message, at)
    role = message.get("role")
    if role not in BLOCK_TYPES:
        raise InvalidRequestError(f"{at}.role: Input should be 'user', 'assistant' or 'system'")
    content = message.get("content")
    if isinstance(content, str):
        return role, _text(content, f"{at}.content"), ReadAttachments(), 0
    if not isinstance(content, list) or not content:
        raise InvalidRequestError(f"{at}.content: Input should be a non-empty string or list of content blocks")
    texts: list[str] = []
    tokens, pdf_texts, count, marks = 0, [], 0, 0
    for number, block in enumerate(content):
        where = f"{at}.content.{number}"
        block = _object(block, where)
        kind = block.get("type")
        if kind not in BLOCK_TYPES[role]:
            taken = ", ".join(f"'{name}'" for name in BLOCK_TYPES[role])
            raise InvalidRequestError(f"{where}.type: Input should be one of {taken} in a {role} message")
        marks += _breakpoint(block, where)
        if kind == "text":
            texts.append(_text(block.get("text"), f"{where}.text"))
        elif kind == "image":
            tokens += _image(block.get("source"), f"{where}.source", model)
            count += 1
        elif kind == "document":
            bill, text = _document(block.get("source"), f"{where}.source", model)
            tokens += bill
            pdf_texts.append(text)
            count += 1
        else:
            texts.append(json.dumps(block.get("input", block.get("content", ""))))
    read = ReadAttachments(tokens, "\n".join(pdf_texts), count) if count else ReadAttachments()
    return role, "".join(texts), read, marks


def _decoded(source: object, at: str, media_types: tuple[str, ...]) -> tuple[str, bytes]:
    """A base64 source's media type and bytes."""
    source = _object(source, at)
    if source.get("type") == "url":
        raise InvalidRequestError(f"{at}.url: the local provider fetches no URL (send a base64 source)")
    if source.get("type") != "base64":
        raise InvalidRequestError(f"{at}.type: Input should be 'base64'")
    media_type = source.get("media_type")
    if media_type not in media_types:
        listed = ", ".join(f"'{name}'" for name in media_types)
        raise InvalidRequestError(f"{at}.media_type: Input should be {listed}")
    data = source.get("data")
    try:
        return media_type, base64.b64decode(data if isinstance(data, str) else "", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"{at}.data: the base64 data is not valid") from exc


def _image(source: object, at: str, model: str) -> int:
    media_type, data = _decoded(source, at, IMAGE_TYPES)
    found = media_type_of(data)
    if found is None or found.value != media_type:
        raise InvalidRequestError(f"{at}: Image does not match the provided media type {media_type}")
    try:
        info = inspect(AttachmentRef("request", at), data).info
    except AttachmentInvalidError as exc:
        raise InvalidRequestError(f"{at}: Could not process image ({exc})") from exc
    return image_tokens("anthropic", model, info.width or 1, info.height or 1)


def _document(source: object, at: str, model: str) -> tuple[int, str]:
    """A PDF's bill (each page an image at 150 DPI, and its text) and its text."""
    _, data = _decoded(source, at, (MediaType.PDF.value,))
    if media_type_of(data) is not MediaType.PDF:
        raise InvalidRequestError(f"{at}: The PDF specified was not valid")
    try:
        pdf = inspect(AttachmentRef("request", at), data)
    except AttachmentInvalidError as exc:
        raise InvalidRequestError(f"{at}: The PDF specified could not be read ({exc})") from exc
    dots = PAGE_DPI / POINTS_PER_INCH
    pages = sum(
        image_tokens("anthropic", model, max(1, round(width * dots)), max(1, round(height * dots)))
        for width, height in pdf.page_sizes
    )
    text = "\n".join(page_texts(data))
    return pages + text_tokens(text), text
