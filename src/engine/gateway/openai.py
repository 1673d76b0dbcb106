"""OpenAI-compatible Chat Completions over httpx (OpenAI, DeepSeek, vLLM, Ollama, LiteLLM, ...)."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol

import httpx

from engine.core.errors import OutputTooLargeError, ProviderTimeoutError, ProviderUnavailableError
from engine.gateway.provider import Completion, CompletionRequest, error_for_status, part_count, token_count
from engine.gateway.schema import strict_json_schema

StructuredOutput = Literal["json_schema", "json_object"]

_CONNECT_TIMEOUT_SECONDS = 5.0
# The most of a response body that is read. A completion of even 100k tokens is far smaller; a
# larger body is refused unread rather than held in the worker's memory.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# Every request names its job type in this header: harmless to a real provider, useful in a proxy's
# logs, and how the local provider (aijobs.local) tells job types apart.
JOB_TYPE_HEADER = "X-Aijobs-Job-Type"
# json_object mode names no schema in response_format, so the system message carries it: this line,
# then the schema as compact JSON on the next line.
SCHEMA_PREAMBLE = "Answer with one JSON object that is valid against this JSON schema:"


class ApiKeySource(Protocol):
    """The API key; `refresh=True` reads it again from its source (a rotated secret)."""

    def __call__(self, *, refresh: bool = False) -> str | None: ...


def static_api_key(key: str | None) -> ApiKeySource:
    """A key that never changes (a plain variable, a local provider): refreshing gives it again."""

    def source(*, refresh: bool = False) -> str | None:
        return key

    return source


class _BodyTooLargeError(Exception):
    pass


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


def _default_client() -> httpx.Client:
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
        self._client = client or _default_client()

    def complete(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        key = self._api_key()
        status, headers, content = self._post(request, key)
        if status == 401:
            # A rotated key: read the secret again, and ask once more if it changed.
            fresh = self._api_key(refresh=True)
            if fresh != key:
                status, headers, content = self._post(request, fresh)
        latency_ms = int((time.perf_counter() - started) * 1000)
        if status >= 400:
            retry_after = parse_retry_after(headers.get("retry-after"))
            raise error_for_status(status, "provider", f"HTTP {status}", retry_after)
        return self._completion(request, content, latency_ms)

    def _post(self, request: CompletionRequest, key: str | None) -> tuple[int, httpx.Headers, bytes]:
        """One request: the status, headers and at most MAX_RESPONSE_BYTES of body."""
        timeout = httpx.Timeout(request.timeout_seconds, connect=min(_CONNECT_TIMEOUT_SECONDS, request.timeout_seconds))
        headers = request_headers(request)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            body = chat_completion_body(request, self._structured_output)
            with self._client.stream("POST", self._url, json=body, headers=headers, timeout=timeout) as response:
                return response.status_code, response.headers, _read_bounded(response)
        except httpx.TimeoutException as exc:
            raise ProviderTimeoutError(f"no answer from the provider within {request.timeout_seconds:g}s") from exc
        except httpx.TransportError as exc:
            raise ProviderUnavailableError(f"provider connection failed: {type(exc).__name__}") from exc
        except _BodyTooLargeError as exc:
            # Not a completion of max_tokens tokens; paying for it again would not make it one.
            raise OutputTooLargeError(f"the provider's response is larger than {MAX_RESPONSE_BYTES} bytes") from exc

    @staticmethod
    def _completion(request: CompletionRequest, content_bytes: bytes, latency_ms: int) -> Completion:
        try:
            envelope = json.loads(content_bytes)
            choice = envelope["choices"][0]
            message = choice["message"]
            usage = envelope.get("usage") or {}
            input_tokens = token_count(usage.get("prompt_tokens"))
            output_tokens = token_count(usage.get("completion_tokens"))
            # prompt_tokens counts the cached ones, completion_tokens the reasoning ones.
            cached = part_count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"), input_tokens)
            reasoning = part_count(
                (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"), output_tokens
            )
            content = message.get("content")
            finish_reason = str(choice.get("finish_reason") or ("refusal" if message.get("refusal") else ""))
            model = str(envelope.get("model") or request.model)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # A 2xx that is not a chat completion is a provider fault, not the model's answer.
            raise ProviderUnavailableError("provider answered with a malformed completion envelope") from exc
        return Completion(
            content=content if isinstance(content, str) else "",
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_ms=latency_ms,
            finish_reason=finish_reason,
            cached_input_tokens=cached,
            reasoning_tokens=reasoning,
        )


def request_headers(request: CompletionRequest) -> dict[str, str]:
    """The headers of a request but its credentials: the job type, when a header can carry its name."""
    name = request.schema_name
    return {JOB_TYPE_HEADER: name} if name and name.isascii() and name.isprintable() else {}


def system_with_schema(system: str, schema: dict[str, Any]) -> str:
    """The system message of json_object mode: the prompt's, then SCHEMA_PREAMBLE and the schema."""
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return f"{system}\n\n{SCHEMA_PREAMBLE}\n{compact}" if system else f"{SCHEMA_PREAMBLE}\n{compact}"


def chat_completion_body(request: CompletionRequest, structured_output: StructuredOutput) -> dict[str, Any]:
    """The Chat Completions request body for `request`, asking for structured output as `structured_output` says."""
    system = request.system
    if structured_output == "json_schema":
        response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {
                "name": request.schema_name,
                "schema": strict_json_schema(request.output_schema),
                "strict": True,
            },
        }
    else:
        response_format = {"type": "json_object"}
        system = system_with_schema(system, request.output_schema)
    return {
        "model": request.model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": request.user},
            *({"role": turn.role, "content": turn.content} for turn in request.conversation),
        ],
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "response_format": response_format,
    }


def _read_bounded(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _BodyTooLargeError
        chunks.append(chunk)
    return b"".join(chunks)
