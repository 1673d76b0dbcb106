"""What a real provider refuses in a chat completion request, refused here the way OpenAI refuses it.

`check_chat_body` raises `InvalidRequestError` (400, `invalid_request_error`, with OpenAI's `param`
and `code`) for what OpenAI's validation refuses: a body that is not an object, no model, no or
empty `messages`, a message without a known role, without content (null content is an assistant
turn's only when it makes tool calls), a content part of a type its role does not take or without
its own fields (a file's data without its `filename`), a `response_format` of an unknown type or a
json_schema without a valid name, a json_object request whose messages never say "json",
`max_tokens` / `max_completion_tokens` below 1, a `temperature` outside [0, 2] and a `service_tier` of
none of its values. It keeps to such
refusals, so that a test fails here only on what OpenAI would refuse: a field it does not know
passes, as OpenAI-compatible servers take fields of their own (OpenAI refuses an unknown parameter;
tests/unit/test_openai_wire.py holds the engine's bodies to the SDK's types, field by field,
instead). The official SDK's request types (`openai.types.chat.completion_create_params`) are the
reference: tests/unit/test_local_refusals.py holds each refusal here to them, or marks it as one
only OpenAI's side checks. What an image's or a file's bytes are is checked after these, by
aijobs.local.attachments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

# The content part types each role takes; "function" (deprecated) takes a string or null only.
PART_TYPES: dict[str, tuple[str, ...]] = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
    "function": (),
}
# What a tool's (or a function's) message must name: the call it answers.
ANSWERS_TO = {"tool": "tool_call_id", "function": "name"}
RESPONSE_FORMATS = ("text", "json_schema", "json_object")
AUDIO_FORMATS = ("wav", "mp3")
IMAGE_DETAILS = ("auto", "low", "high", "original")
# The service tiers a request may ask for (`flex`: docs/cost.md).
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
# A structured output's name: what OpenAI takes (and Bedrock for a tool's).
SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]+")
MAX_SCHEMA_NAME_CHARS = 64
MAX_TEMPERATURE = 2


class InvalidRequestError(ValueError):
    """A request OpenAI would refuse with a 400: its message, the parameter at fault, and its code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_chat_body(body: object) -> dict[str, Any]:
    """`body` as a chat completion request; InvalidRequestError for what OpenAI refuses in it."""
    if not isinstance(body, dict):
        raise InvalidRequestError(f"Invalid type for the request body: expected an object, but got {_kind(body)}.")
    model = body.get("model")
    if model is None or model == "":
        raise InvalidRequestError("you must provide a model parameter")
    _as_string(model, "model")
    messages = _nonempty_list(body.get("messages"), "messages")
    texts = [text for index, message in enumerate(messages) for text in _message_texts(message, f"messages[{index}]")]
    _check_response_format(body.get("response_format"), texts)
    for name in ("max_tokens", "max_completion_tokens"):
        _check_count(body.get(name), name)
    _check_temperature(body.get("temperature"))
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise _unsupported(tier, SERVICE_TIERS, "service_tier")
    return body


def _message_texts(value: object, at: str) -> Iterator[str]:
    """Check one message; yields the texts it holds."""
    message = _as_object(value, at)
    role = message.get("role")
    if role is None:
        raise _missing(f"{at}.role")
    if not isinstance(role, str) or role not in PART_TYPES:
        raise _unsupported(role, tuple(PART_TYPES), f"{at}.role")
    if role in ANSWERS_TO:
        _string(message, ANSWERS_TO[role], at)
    calls = role == "assistant" and _makes_calls(message, at)
    content, where = message.get("content"), f"{at}.content"
    if content is None:
        if calls or (role == "function" and "content" in message):
            return
        if "content" not in message:
            raise _missing(where)
        raise InvalidRequestError("Invalid value for 'content': expected a string, got null.", where)
    if isinstance(content, str):
        yield content
        return
    if role == "function" or not isinstance(content, list):
        expected = "a string" if role == "function" else "one of a string or array of objects"
        raise InvalidRequestError(_type_message(where, expected, content), where, "invalid_type")
    for index, part in enumerate(_nonempty_list(content, where)):
        yield from _part_texts(part, PART_TYPES[role], f"{where}[{index}]")


def _makes_calls(message: dict[str, Any], at: str) -> bool:
    """Whether an assistant message makes tool calls (or the deprecated function call)."""
    if message.get("tool_calls") is not None:
        _nonempty_list(message["tool_calls"], f"{at}.tool_calls")
        return True
    return message.get("function_call") is not None


def _part_texts(value: object, allowed: Sequence[str], at: str) -> Iterator[str]:
    """Check one content part of a role that takes the part types `allowed`; yields its text."""
    part = _as_object(value, at)
    kind = part.get("type")
    if kind is None:
        raise _missing(f"{at}.type")
    if kind not in allowed:
        raise _unsupported(kind, allowed, f"{at}.type")
    match kind:
        case "text" | "refusal":
            yield _string(part, kind, at)
        case "image_url":
            _check_image(_object(part, "image_url", at), f"{at}.image_url")
        case "input_audio":
            audio = _object(part, "input_audio", at)
            _string(audio, "data", f"{at}.input_audio")
            if "format" not in audio:
                raise _missing(f"{at}.input_audio.format")
            if audio["format"] not in AUDIO_FORMATS:
                raise _unsupported(audio["format"], AUDIO_FORMATS, f"{at}.input_audio.format")
        case _:  # "file": its data, or an uploaded file's id
            file = _object(part, "file", at)
            if not any(isinstance(file.get(field), str) for field in ("file_data", "file_id")):
                message = f"Missing required parameter: '{at}.file.file_data' or '{at}.file.file_id'."
                raise InvalidRequestError(message, f"{at}.file", "missing_required_parameter")
            if not isinstance(file.get("file_id"), str) and not isinstance(file.get("filename"), str):
                # A file's data goes with its name: OpenAI, finding none, asks for an uploaded file's id.
                raise _missing(f"{at}.file.file_id")


def _check_image(image: dict[str, Any], at: str) -> None:
    url = _string(image, "url", at)
    if not url.startswith(("http://", "https://", "data:image/")):
        message = (
            f"Invalid '{at}.url': expected an http(s) URL or a base64-encoded data URL with an image MIME type "
            "(e.g. 'data:image/png;base64,...')."
        )
        raise InvalidRequestError(message, f"{at}.url", "invalid_value")
    if "detail" in image and image["detail"] not in IMAGE_DETAILS:
        raise _unsupported(image["detail"], IMAGE_DETAILS, f"{at}.detail")


def _check_response_format(value: object, texts: list[str]) -> None:
    if value is None:
        return
    response_format = _as_object(value, "response_format")
    kind = response_format.get("type")
    if kind is None:
        raise _missing("response_format.type")
    if kind not in RESPONSE_FORMATS:
        raise _unsupported(kind, RESPONSE_FORMATS, "response_format.type")
    if kind == "json_object" and not any("json" in text.lower() for text in texts):
        message = (
            "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."
        )
        raise InvalidRequestError(message, "messages")
    if kind == "json_schema":
        _check_json_schema(_object(response_format, "json_schema", "response_format"), "response_format.json_schema")


def _check_json_schema(json_schema: dict[str, Any], at: str) -> None:
    """A structured output's name and schema (a schema is optional, as the SDK's types say)."""
    name = _string(json_schema, "name", at)
    if len(name) > MAX_SCHEMA_NAME_CHARS:
        message = (
            f"Invalid '{at}.name': string too long. Expected a string with maximum length {MAX_SCHEMA_NAME_CHARS}, "
            f"but got a string with length {len(name)} instead."
        )
        raise InvalidRequestError(message, f"{at}.name", "string_above_max_length")
    if SCHEMA_NAME.fullmatch(name) is None:
        message = (
            f"Invalid '{at}.name': string does not match pattern. Expected a string that matches the pattern "
            f"'^{SCHEMA_NAME.pattern}$'."
        )
        raise InvalidRequestError(message, f"{at}.name", "invalid_value")
    if "schema" in json_schema:
        _as_object(json_schema["schema"], f"{at}.schema")
    strict = json_schema.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(_type_message(f"{at}.strict", "a boolean", strict), f"{at}.strict", "invalid_type")


def _check_count(value: object, at: str) -> None:
    """A token count: absent, null, or an integer of at least 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(_type_message(at, "an integer", value), at, "invalid_type")
    if value < 1:
        raise _out_of_range(at, value, "integer", "min", 1)


def _check_temperature(value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(_type_message("temperature", "a number", value), "temperature", "invalid_type")
    if value > MAX_TEMPERATURE:
        raise _out_of_range("temperature", value, "decimal", "max", MAX_TEMPERATURE)
    if not value >= 0:  # NaN too
        raise _out_of_range("temperature", value, "decimal", "min", 0)


# --- the pieces of a refusal ---


def _as_object(value: object, at: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(_type_message(at, "an object", value), at, "invalid_type")
    return value


def _as_string(value: object, at: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(_type_message(at, "a string", value), at, "invalid_type")
    return value


def _nonempty_list(value: object, at: str) -> list[Any]:
    """A required array of at least one item (the caller checks the items)."""
    if value is None:
        raise _missing(at)
    if not isinstance(value, list):
        raise InvalidRequestError(_type_message(at, "an array", value), at, "invalid_type")
    if not value:
        message = (
            f"Invalid '{at}': empty array. Expected an array with minimum length 1, but got an empty array instead."
        )
        raise InvalidRequestError(message, at, "empty_array")
    return value


def _object(holder: dict[str, Any], field: str, at: str) -> dict[str, Any]:
    """`holder[field]`, a required object."""
    if holder.get(field) is None:
        raise _missing(f"{at}.{field}")
    return _as_object(holder[field], f"{at}.{field}")


def _string(holder: dict[str, Any], field: str, at: str) -> str:
    """`holder[field]`, a required string."""
    if holder.get(field) is None:
        raise _missing(f"{at}.{field}")
    return _as_string(holder[field], f"{at}.{field}")


def _missing(at: str) -> InvalidRequestError:
    return InvalidRequestError(f"Missing required parameter: '{at}'.", at, "missing_required_parameter")


def _out_of_range(at: str, value: float, kind: str, bound: str, limit: float) -> InvalidRequestError:
    """A number past its minimum (`bound` "min") or its maximum ("max"), as OpenAI words and codes it."""
    side, word, sign = ("below", "minimum", ">=") if bound == "min" else ("above", "maximum", "<=")
    message = f"Invalid '{at}': {kind} {side} {word} value. Expected a value {sign} {limit}, but got {value} instead."
    return InvalidRequestError(message, at, f"{kind}_{side}_{bound}_value")


def _unsupported(value: object, supported: Sequence[str], at: str) -> InvalidRequestError:
    """OpenAI's refusal of a value not among those `supported`: "Supported values are: 'a', 'b', and 'c'."."""
    quoted = [f"'{item}'" for item in supported]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])}{',' * (len(quoted) > 2)} and {quoted[-1]}"
    shown = f"'{value}'" if isinstance(value, str) else _kind(value)
    return InvalidRequestError(f"Invalid value: {shown}. Supported values are: {listed}.", at, "invalid_value")


def _type_message(at: str, expected: str, value: object) -> str:
    return f"Invalid type for '{at}': expected {expected}, but got {_kind(value)} instead."


def _kind(value: object) -> str:
    """A JSON value's kind, as OpenAI's messages name it."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int():
            return "an integer"
        case float():
            return "a decimal"
        case str():
            return "a string"
        case list():
            return "an array"
        case _:
            return "an object"
