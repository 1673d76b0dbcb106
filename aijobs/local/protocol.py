"""The Chat Completions wire format: parsing a request, the replies, and the bodies they carry.

A request OpenAI would refuse is refused first (aijobs.local.refusals).

A request is understood by its structure only, never by its prompts' wording: its output schema
(response_format's json_schema, or in json_object mode the schema the engine's adapter appends to
the system message after SCHEMA_PREAMBLE) and its job type (the X-Aijobs-Job-Type header).
Token counts are about a token per four characters, like a real tokenizer on English text, plus
what its images and PDFs cost (aijobs.local.attachments).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aijobs.local.attachments import NONE_READ, ReadAttachments, read_attachments
from aijobs.local.refusals import InvalidRequestError, check_chat_body
from engine.gateway.schema import SCHEMA_PREAMBLE
from engine.text import json_value_problem

NOT_JSON = "We could not parse the JSON body of your request: the API expects a JSON payload."


def estimate_tokens(text: str) -> int:
    """About one token per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    system: str
    # The first user message: the prompt the engine rendered from the job's input.
    prompt: str
    # The JSON schema the answer must meet; None when the request carries none.
    schema: dict[str, Any] | None
    # response_format's json_schema name, else (json_object mode names none) the job type header.
    schema_name: str | None
    # The X-Aijobs-Job-Type header.
    job_type: str | None
    repair: bool
    prompt_tokens: int
    # The request's max_tokens (or max_completion_tokens); 0 when it sets none.
    max_tokens: int = 0
    # Its prompt_cache_key: the engine's is the job type and its prompt's version, "<job type>:<version>".
    cache_key: str | None = None
    # Its images and PDFs: their part of prompt_tokens, and their text.
    attachments: ReadAttachments = NONE_READ
    # An Anthropic request's (aijobs.local.messages): the tool its tool_choice forces, whose input is
    # the answer; and what comes before its last cache_control breakpoint, read from or written to
    # the prompt cache.
    tool: str | None = None
    cache_prefix: str | None = None
    # The API it came through: "openai" (Chat Completions) or "anthropic" (Messages).
    api: str = "openai"
    # The service tier it asks for (`service_tier`); None when it names none.
    service_tier: str | None = None

    @property
    def flex(self) -> bool:
        """Whether it asks for the flex tier."""
        return self.service_tier == "flex"

    @property
    def content(self) -> str:
        """What the request gives to read: its prompt, then its PDFs' text. Answers, fault markers and
        their counts come from it."""
        return f"{self.prompt}\n{self.attachments.text}" if self.attachments.text else self.prompt


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _json_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """response_format's json_schema object, when the request asks for json_schema output."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, dict):
            return json_schema
    return None


def schema_in_system(system: str) -> dict[str, Any] | None:
    """The JSON schema after the last SCHEMA_PREAMBLE in a system message (json_object mode)."""
    at = system.rfind(SCHEMA_PREAMBLE)
    if at < 0:
        return None
    try:
        schema, _ = json.JSONDecoder().raw_decode(system[at + len(SCHEMA_PREAMBLE) :].lstrip())
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def parse_chat_request(raw: bytes, job_type: str | None = None) -> ChatRequest:
    """The request in `raw`; `job_type` is its X-Aijobs-Job-Type header, if it had one."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(NOT_JSON) from exc
    return parse_chat_body(body, job_type)


def parse_chat_body(body: object, job_type: str | None = None) -> ChatRequest:
    """The request whose JSON body is `body` (a batch line carries it parsed); `job_type` as above.
    InvalidRequestError for a request OpenAI would refuse."""
    body = check_chat_body(body)
    if json_value_problem(body, "body") is not None:
        raise InvalidRequestError(NOT_JSON)  # a lone surrogate is no Unicode: OpenAI's parser refuses it
    model, messages = body["model"], body["messages"]
    turns = [(str(message.get("role")), _content_text(message.get("content"))) for message in messages]
    system = next((text for role, text in turns if role == "system"), "")
    users = [text for role, text in turns if role == "user"]
    attachments = read_attachments(messages, model)
    json_schema = _json_schema(body)
    if json_schema is not None:
        schema = json_schema.get("schema")
        name = json_schema.get("name")
        schema_name = name if isinstance(name, str) else job_type
    else:
        schema, schema_name = schema_in_system(system), job_type
    return ChatRequest(
        model=model,
        system=system,
        prompt=users[0] if users else "",
        schema=schema if isinstance(schema, dict) else None,
        schema_name=schema_name,
        job_type=job_type or None,
        repair=len(users) > 1 or any(role == "assistant" for role, _ in turns),
        prompt_tokens=estimate_tokens("".join(text for _, text in turns)) + attachments.tokens,
        max_tokens=_max_tokens(body),
        cache_key=cache_key if isinstance(cache_key := body.get("prompt_cache_key"), str) else None,
        attachments=attachments,
        service_tier=body.get("service_tier"),
    )


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True, slots=True)
class Reply:
    """What the handler sends: a response, or (status None) nothing, after `delay_seconds`. Its body is
    `body` as JSON, or `content` as it is (a file's)."""

    status: int | None
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    content: bytes | None = None


def served_tier(asked: str | None) -> str:
    """The service tier that serves a request asking for `asked`, as OpenAI names it in its answer: flex
    for flex, priority for priority (or fast), scale for scale, else its standard tier, `default`."""
    return {"flex": "flex", "priority": "priority", "fast": "priority", "scale": "scale"}.get(asked or "", "default")


def error_reply(
    status: int,
    message: str,
    error_type: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    delay_seconds: float = 0.0,
    param: str | None = None,
) -> Reply:
    """An error response in OpenAI's shape (`param`: the request's parameter at fault)."""
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return Reply(status, body, headers or {}, delay_seconds)


def completion_body(
    content: str,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    number: int,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    service_tier: str = "default",
) -> dict[str, Any]:
    """A chat completion; as OpenAI's, the cached tokens are part of prompt_tokens and the
    reasoning tokens part of completion_tokens, and it names the service tier that served it."""
    return {
        "id": f"chatcmpl-local-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "service_tier": service_tier,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
    }
