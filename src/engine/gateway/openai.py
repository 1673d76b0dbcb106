"""OpenAI-compatible Chat Completions over httpx (OpenAI, DeepSeek, vLLM, Ollama, LiteLLM, ...).

A request for the flex tier carries `service_tier: "flex"` (OpenAI's flex processing, docs/cost.md);
what the flex tier answers when it does not serve one is told apart from the account's own rate limit
by the error's `code` and `type` (FlexUnavailableError), and each answer says which tier served it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol, TypeVar

import httpx

from engine.core.attachments import Attachment
from engine.core.errors import (
    FlexUnavailableError,
    OutputTooLargeError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.gateway.parts import attachment_filename, attachment_text, base64_text
from engine.gateway.provider import (
    FLEX_TIER,
    Completion,
    CompletionRequest,
    error_for_status,
    part_count,
    token_count,
)
from engine.gateway.schema import strict_json_schema, system_with_schema

StructuredOutput = Literal["json_schema", "json_object"]

_CONNECT_TIMEOUT_SECONDS = 5.0
# The most of a response body that is read. A completion of even 100k tokens is far smaller; a
# larger body is refused unread rather than held in the worker's memory.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# Every request names its job type in this header: harmless to a real provider, useful in a proxy's
# logs, and how the local provider (aijobs.local) tells job types apart.
JOB_TYPE_HEADER = "X-Aijobs-Job-Type"
# What OpenAI takes as a structured output's name; a job type's name may hold any character.
_OUTPUT_NAME_REFUSED = re.compile(r"[^a-zA-Z0-9_-]")
MAX_OUTPUT_NAME_CHARS = 64
# What a job's error quotes of a provider's error body: identifiers (a code, a type, a parameter's path).
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\[\]-]{1,64}")
# OpenAI's reasoning models (o1, o3, o4-mini, GPT-5 and its kin, also behind a proxy's `openai/`
# prefix) take `max_completion_tokens` rather than `max_tokens`, and only their default temperature.
_REASONING_MODEL = re.compile(r"^(?:.*/)?(?:o\d|gpt-5)(?:[.-].*)?$")
# The `code` and `type` of a 429 that is the account's own rate limit or quota. Any other 429 to a flex
# request is the flex tier's "Resource Unavailable": the same call may pass at the standard tier.
RATE_LIMIT_ERRORS = frozenset({"rate_limit_exceeded", "rate_limit_error", "insufficient_quota", "requests", "tokens"})
# A service tier as a provider names it in an answer: a short word, else it is not one.
_SERVICE_TIER = re.compile(r"[a-z_]{1,32}")


class ApiKeySource(Protocol):
    """The API key; `refresh=True` reads it again from its source (a rotated secret)."""

    def __call__(self, *, refresh: bool = False) -> str | None: ...


def static_api_key(key: str | None) -> ApiKeySource:
    """A key that never changes (a plain variable, a local provider): refreshing gives it again."""

    def source(*, refresh: bool = False) -> str | None:
        return key

    return source


class BodyTooLargeError(Exception):
    """A response body past MAX_RESPONSE_BYTES (left unread)."""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: either delta-seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = now if now is not None else time.time()
    return max(when.timestamp() - reference, 0.0)


def default_client() -> httpx.Client:
    # One pooled client per process, reused by every record of every invocation.
    return httpx.Client(limits=httpx.Limits(max_connections=32, max_keepalive_connections=16))


class OpenAICompatibleProvider:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: ApiKeySource,
        *,
        structured_output: StructuredOutput = "json_schema",
        client: httpx.Client | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._structured_output = structured_output
        self._client = client or default_client()

    def complete(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        status, headers, content = send_authorized(self._api_key, lambda auth: self._post(request, auth))
        latency_ms = int((time.perf_counter() - started) * 1000)
        if request.service_tier == FLEX_TIER:
            refused = flex_refusal(status, content, headers.get("retry-after"))
            if refused is not None:
                raise refused
        return parse_completion(status, content, request.model, latency_ms, headers.get("retry-after"))

    def _post(self, request: CompletionRequest, auth: dict[str, str]) -> Sent:
        """One request: the status, headers and at most MAX_RESPONSE_BYTES of body."""
        timeout = httpx.Timeout(request.timeout_seconds, connect=min(_CONNECT_TIMEOUT_SECONDS, request.timeout_seconds))
        body = chat_completion_body(request, self._structured_output)
        headers = {**request_headers(request), **auth}
        with (
            provider_errors(request.timeout_seconds),
            self._client.stream("POST", self._url, json=body, headers=headers, timeout=timeout) as response,
        ):
            return response.status_code, response.headers, read_bounded(response)


# What one HTTP request to the provider gave: its status, headers and (bounded) body.
Sent = tuple[int, httpx.Headers, bytes]
# What a request gives, its HTTP status first.
Response = TypeVar("Response", bound=tuple[object, ...])


def send_authorized(
    api_key: ApiKeySource,
    send: Callable[[dict[str, str]], Response],
    credentials: Callable[[str | None], dict[str, str]] | None = None,
) -> Response:
    """`send(headers)` with the key's headers (`credentials`; by default an Authorization bearer header);
    when its status is 401, the key is read again from its source (a rotated secret) and, if it
    changed, the request is sent once more."""
    headers = credentials or _authorization
    key = api_key()
    sent = send(headers(key))
    if sent[0] == 401:
        fresh = api_key(refresh=True)
        if fresh != key:
            sent = send(headers(fresh))
    return sent


def _authorization(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@contextmanager
def provider_errors(timeout_seconds: float) -> Iterator[None]:
    """The engine's errors for a request that got no (whole) response: a timeout, a broken connection,
    a body larger than MAX_RESPONSE_BYTES."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise ProviderTimeoutError(f"no answer from the provider within {timeout_seconds:g}s") from exc
    except httpx.TransportError as exc:
        raise ProviderUnavailableError(f"provider connection failed: {type(exc).__name__}") from exc
    except BodyTooLargeError as exc:
        # Not a completion of max_tokens tokens; paying for it again would not make it one.
        raise OutputTooLargeError(f"the provider's response is larger than {MAX_RESPONSE_BYTES} bytes") from exc


def request_headers(request: CompletionRequest) -> dict[str, str]:
    """The headers of a request but its credentials: the job type, when a header can carry its name."""
    name = request.schema_name
    return {JOB_TYPE_HEADER: name} if name and name.isascii() and name.isprintable() else {}


def chat_completion_body(request: CompletionRequest, structured_output: StructuredOutput) -> dict[str, Any]:
    """The Chat Completions request body for `request`, asking for structured output as `structured_output` says:
    what a real-time call posts, and what a batch line (engine.gateway.openai_batch) carries."""
    system = request.system
    if structured_output == "json_schema":
        response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {
                "name": output_name(request.schema_name),
                "schema": strict_json_schema(request.output_schema),
                "strict": True,
            },
        }
    else:
        response_format = {"type": "json_object"}
        system = system_with_schema(system, request.output_schema)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user_content(request.user, request.attachments)},
            *({"role": turn.role, "content": turn.content} for turn in request.conversation),
        ],
    }
    if _REASONING_MODEL.match(request.model):
        body["max_completion_tokens"] = request.max_tokens
    else:
        body |= {"max_tokens": request.max_tokens, "temperature": 0}
    body["response_format"] = response_format
    if request.cache_key:
        # Routes requests that share a prompt prefix (a job type's instructions) to the same prompt cache.
        body["prompt_cache_key"] = request.cache_key
    if request.service_tier:
        body["service_tier"] = request.service_tier
    return body


def user_content(text: str, attachments: Sequence[Attachment]) -> str | list[dict[str, Any]]:
    """The user turn: its text alone, or its text first and then each attachment as Chat Completions
    takes it: an image as an `image_url` part with a `data:` URL (at detail high, which the token
    estimate prices), a PDF as a `file` part, a text file as a text part that names it."""
    if not attachments:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for attachment in attachments:
        if attachment.media_type.is_image:
            url = f"data:{attachment.media_type.value};base64,{base64_text(attachment.data)}"
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": "high"}})
        elif attachment.media_type.is_document:
            data = f"data:{attachment.media_type.value};base64,{base64_text(attachment.data)}"
            parts.append({"type": "file", "file": {"filename": attachment_filename(attachment), "file_data": data}})
        else:
            parts.append({"type": "text", "text": attachment_text(attachment)})
    return parts


def output_name(job_type: str) -> str:
    """A job type's name as a structured output's name OpenAI takes: its other characters as `_`, at
    most MAX_OUTPUT_NAME_CHARS of them (a name only names the schema; the schema is the contract)."""
    return _OUTPUT_NAME_REFUSED.sub("_", job_type)[:MAX_OUTPUT_NAME_CHARS] or "output"


def flex_refusal(status: int, content: bytes, retry_after: str | None = None) -> FlexUnavailableError | None:
    """The flex tier's refusal of a flex request, by the answer's status and its error's `code`, `type`
    and `param` (never its message): a 429 that is not the account's rate limit (RATE_LIMIT_ERRORS) is
    OpenAI's "Resource Unavailable"; a 400 whose `param` is `service_tier`, a model or an account
    without a flex tier. None for any other answer."""
    if status not in (400, 429):
        return None
    error = _error_fields(content)
    if status == 429 and not {error.get("code"), error.get("type")} & RATE_LIMIT_ERRORS:
        return FlexUnavailableError(
            "the provider's flex tier is unavailable (HTTP 429)", retry_after_seconds=parse_retry_after(retry_after)
        )
    if status == 400 and error.get("param") == "service_tier":
        return FlexUnavailableError("the provider serves no flex tier for this request (HTTP 400)", later=False)
    return None


def _error_fields(content: bytes | object) -> dict[str, str]:
    """The string fields of an error body's `error` object (raw bytes, or already parsed JSON; {} for a
    body that is not one)."""
    try:
        envelope = json.loads(content) if isinstance(content, bytes) else content
    except ValueError:
        return {}
    error = envelope.get("error") if isinstance(envelope, dict) else None
    if not isinstance(error, dict):
        return {}
    return {name: value for name, value in error.items() if isinstance(value, str)}


def error_detail(status: int, body: bytes | object) -> str:
    """`HTTP <status>`, with the identifiers the provider's error body gives (its code or type, and the
    request parameter at fault): what a person needs to find what to mend. Its message is left out (it may
    quote the prompt), and classification never reads any of it."""
    fields = _error_fields(body)
    kind = next(
        (value for value in (fields.get("code"), fields.get("type")) if _IDENTIFIER.fullmatch(value or "")), None
    )
    param = fields.get("param") if _IDENTIFIER.fullmatch(fields.get("param") or "") else None
    return " ".join(part for part in (f"HTTP {status}", kind, f"(param {param})" if param else None) if part)


def parse_completion(
    status: int, body: bytes | object, model: str, latency_ms: int, retry_after: str | None = None
) -> Completion:
    """The answer in a Chat Completions response of HTTP `status` (a real-time call's, or a batch line's),
    whose body is `body` (raw bytes, or already parsed JSON); the engine error for a status that is
    not a success (`retry_after`: the Retry-After header, if any)."""
    if status >= 400:
        raise error_for_status(status, "provider", error_detail(status, body), parse_retry_after(retry_after))
    try:
        envelope: Any = json.loads(body) if isinstance(body, bytes) else body
        choice = envelope["choices"][0]
        message = choice["message"]
        usage = envelope.get("usage") or {}
        input_tokens = token_count(usage.get("prompt_tokens"))
        output_tokens = token_count(usage.get("completion_tokens"))
        # prompt_tokens counts the cached ones, completion_tokens the reasoning ones.
        cached = part_count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"), input_tokens)
        reasoning = part_count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"), output_tokens)
        content = message.get("content")
        finish_reason = str(choice.get("finish_reason") or ("refusal" if message.get("refusal") else ""))
        answered_by = str(envelope.get("model") or model)
        served = envelope.get("service_tier")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        # A 2xx that is not a chat completion is a provider fault, not the model's answer.
        raise ProviderUnavailableError("provider answered with a malformed completion envelope") from exc
    return Completion(
        content=content if isinstance(content, str) else "",
        model=answered_by,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=latency_ms,
        finish_reason=finish_reason,
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
        service_tier=served if isinstance(served, str) and _SERVICE_TIER.fullmatch(served) else None,
    )


def read_bounded(response: httpx.Response) -> bytes:
    """A response's body, or BodyTooLargeError past MAX_RESPONSE_BYTES."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise BodyTooLargeError
        chunks.append(chunk)
    return b"".join(chunks)
