"""Amazon Bedrock Converse over boto3's bedrock-runtime client, authenticated by the function's IAM role.

Structured output is a forced tool call: the request offers one tool whose input schema is the
output schema for the job's input (JobDefinition.output_schema: classify's label is an enum of the
labels offered) and makes the model call it; the tool call's input is the answer.

A system prompt long enough for the model's prompt cache is followed by a cache point, so that the
requests of a job type read their shared instructions from the cache (`cache_point_min_tokens`).

A request for the flex tier names it as Converse's `serviceTier` (`{"type": "flex"}`); the response
says which tier served it. Bedrock's on-demand quota is shared by its tiers, so a throttled flex
request is a rate limit like any other; a flex request the service cannot serve now (503) is the flex
tier being unavailable (FlexUnavailableError).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from boto3.session import Session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from engine.core.attachments import Attachment
from engine.core.errors import (
    FlexUnavailableError,
    JobError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.gateway.parts import attachment_text, bedrock_document_name
from engine.gateway.provider import FLEX_TIER, ChatTurn, Completion, CompletionRequest, error_for_status, token_count

_CONNECT_TIMEOUT_SECONDS = 5
# Clients are cached per whole-second read timeout; timeouts cut short by the Lambda's remaining
# time vary, so the cache keeps only the most recently used few.
_MAX_CACHED_CLIENTS = 8

# Error codes of the Converse operation (botocore's bedrock-runtime service model), by what asking
# again can do. Codes not listed here are classified by their HTTP status, as the OpenAI adapter does.
_RATE_LIMITED_CODES = frozenset(
    {
        "ThrottlingException",  # 429: the account's per-model request or token quota
        # 400, but "you can resubmit your request later" (Bedrock API reference): a quota that time
        # restores, like throttling, so it waits without spending attempts, bounded by the deadline.
        "ServiceQuotaExceededException",
    }
)
_TIMEOUT_CODES = frozenset({"ModelTimeoutException"})  # 408: the model ran past Bedrock's own limit
_UNAVAILABLE_CODES = frozenset(
    {
        "InternalServerException",  # 500
        "ServiceUnavailableException",  # 503
        # 429, yet not a quota: the model is not ready to serve yet (SDKs retry it by default),
        # so it spends an attempt and may fall back to the other tier like any outage.
        "ModelNotReadyException",
        # 424: the model failed while processing; the request itself was accepted.
        "ModelErrorException",
    }
)
# Wrong request, model id, IAM policy or model access: nothing changes until an operator does.
_REJECTED_CODES = frozenset({"ValidationException", "AccessDeniedException", "ResourceNotFoundException"})

# Bedrock refuses blank text blocks; an empty answer being re-asked about still needs a turn.
_EMPTY_TURN_TEXT = "(no answer)"

# The fewest tokens a prompt cache checkpoint takes, by model id (the first entry the id contains
# wins): the supported-models table of the Amazon Bedrock User Guide, "Prompt caching for faster
# model inference" (Claude 3.7 Sonnet 1,024, Claude 3.5 Haiku 2,048, Nova Micro/Lite/Pro/Premier
# 1,000), and Anthropic's prompt caching guide for the Claude 4 models (Sonnet 4.x and Opus 4/4.1
# 1,024; Opus 4.5/4.6 and Haiku 4.5 4,096). A model not listed gets no cache point: Bedrock refuses
# a request with one for a model without prompt caching.
CACHE_POINT_MIN_TOKENS: tuple[tuple[str, int], ...] = (
    ("anthropic.claude-opus-4-5", 4096),
    ("anthropic.claude-opus-4-6", 4096),
    ("anthropic.claude-haiku-4-5", 4096),
    ("anthropic.claude-3-5-haiku", 2048),
    ("anthropic.claude-3-7-sonnet", 1024),
    ("anthropic.claude-sonnet-4", 1024),
    ("anthropic.claude-opus-4", 1024),
    ("amazon.nova-micro", 1000),
    ("amazon.nova-lite", 1000),
    ("amazon.nova-pro", 1000),
    ("amazon.nova-premier", 1000),
)
# Tokens are estimated as UTF-8 bytes / 4: fewer than tokenizers make of prose, code or non-Latin
# text, so a prompt estimated past a minimum is past it, and one near it gets no cache point (which
# costs nothing but the cache's discount).
BYTES_PER_TOKEN = 4


class ConverseClient(Protocol):
    """The part of boto3's bedrock-runtime client the provider uses."""

    def converse(self, **kwargs: Any) -> Mapping[str, Any]: ...


# Builds a client whose read timeout is the given number of seconds.
ClientFactory = Callable[[int], ConverseClient]


def client_config(read_timeout: int) -> Config:
    # The engine retries (with backoff, fallback and attempt accounting), so botocore must not.
    # `total_max_attempts` counts the first call; botocore's `max_attempts` counts retries only.
    return Config(
        read_timeout=read_timeout,
        connect_timeout=min(_CONNECT_TIMEOUT_SECONDS, read_timeout),
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=32,
    )


def default_client_factory(region_name: str | None = None) -> ClientFactory:
    """bedrock-runtime clients from one lazily created session (which caches the service model)."""
    session: Session | None = None

    def build(read_timeout: int) -> ConverseClient:
        nonlocal session
        if session is None:
            session = Session()
        client = session.client("bedrock-runtime", region_name=region_name, config=client_config(read_timeout))
        return cast(ConverseClient, client)

    return build


class BedrockConverseProvider:
    name = "bedrock"

    def __init__(self, client_factory: ClientFactory | None = None, *, region_name: str | None = None) -> None:
        self._client_factory = client_factory or default_client_factory(region_name)
        self._clients: OrderedDict[int, ConverseClient] = OrderedDict()
        # Records may be processed on several threads; boto3 sessions are not thread-safe.
        self._lock = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        client = self._client(request.timeout_seconds)
        started = time.perf_counter()
        try:
            response = client.converse(**self._body(request))
        except ClientError as exc:
            raise classified_error(exc, flex=request.service_tier == FLEX_TIER) from exc
        except (ReadTimeoutError, ConnectTimeoutError) as exc:
            raise ProviderTimeoutError(f"no answer from Bedrock within {request.timeout_seconds:g}s") from exc
        except (BotocoreConnectionError, HTTPClientError) as exc:
            raise ProviderUnavailableError(f"Bedrock connection failed: {type(exc).__name__}") from exc
        except ParamValidationError as exc:
            # botocore checked the request against the service model before sending it.
            raise ProviderRejectedError("the Bedrock client refused the request (ParamValidationError)") from exc
        latency_ms = int((time.perf_counter() - started) * 1000)
        return converse_completion(request.model, response, latency_ms)

    def _client(self, timeout_seconds: float) -> ConverseClient:
        # botocore has no per-call timeout: a client carries one, so keep a client per timeout.
        read_timeout = max(1, math.ceil(timeout_seconds))
        with self._lock:
            client = self._clients.get(read_timeout)
            if client is None:
                client = self._client_factory(read_timeout)
                self._clients[read_timeout] = client
                if len(self._clients) > _MAX_CACHED_CLIENTS:
                    self._clients.popitem(last=False)
            else:
                self._clients.move_to_end(read_timeout)
            return client

    @staticmethod
    def _body(request: CompletionRequest) -> dict[str, Any]:
        tier = {"serviceTier": {"type": request.service_tier}} if request.service_tier else {}
        return tier | {
            "modelId": request.model,
            **converse_input(request, system_blocks(request.system, request.model)),
            "toolConfig": {
                "tools": [
                    {
                        "toolSpec": {
                            "name": request.schema_name,
                            "description": "Give your answer by calling this tool; its input is the answer.",
                            "inputSchema": {"json": request.output_schema},
                        }
                    }
                ],
                "toolChoice": {"tool": {"name": request.schema_name}},
            },
        }


def converse_input(
    request: CompletionRequest, system: list[dict[str, Any]], encode: Callable[[bytes], Any] = bytes
) -> dict[str, Any]:
    """The messages, system prompt (as `system` blocks; none when empty) and inference settings of a
    Converse request: what a real-time call and a batch record (engine.gateway.bedrock_batch) share.
    `encode`: how an attachment's bytes go (boto3 takes them as they are; a batch record's JSON, as
    base64)."""
    user = {"role": "user", "content": [{"text": request.user}, *_attachment_blocks(request.attachments, encode)]}
    body: dict[str, Any] = {
        "messages": [user, *(_turn(turn) for turn in request.conversation)],
        "inferenceConfig": {"maxTokens": request.max_tokens, "temperature": 0},
    }
    if system:
        body["system"] = system
    return body


def system_blocks(system: str, model: str) -> list[dict[str, Any]]:
    """A system prompt as Converse blocks: none when it is empty (a blank block is refused), followed by a
    cache point when it is long enough for the model's prompt cache."""
    if not system:
        return []
    minimum = cache_point_min_tokens(model)
    if minimum is None or len(system.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN < minimum:
        return [{"text": system}]
    return [{"text": system}, {"cachePoint": {"type": "default"}}]


def cache_point_min_tokens(model: str) -> int | None:
    """The fewest tokens `model`'s prompt cache takes at a cache point; None: no cache point for it."""
    return next((tokens for family, tokens in CACHE_POINT_MIN_TOKENS if family in model), None)


def converse_completion(model: str, response: Mapping[str, Any], latency_ms: int) -> Completion:
    """The answer in a Converse response (a real-time call's, or a batch record's modelOutput)."""
    try:
        blocks = response["output"]["message"]["content"]
        usage = response.get("usage") or {}
        # Converse counts cache reads and writes apart from inputTokens; the engine's input
        # tokens include them. It reports no reasoning tokens apart from outputTokens.
        cached = token_count(usage.get("cacheReadInputTokens"))
        written = token_count(usage.get("cacheWriteInputTokens"))
        input_tokens = token_count(token_count(usage.get("inputTokens")) + cached + written)
        output_tokens = token_count(usage.get("outputTokens"))
        content = _answer(blocks)
        finish_reason = str(response.get("stopReason") or "")
        served = (response.get("serviceTier") or {}).get("type")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # A success that is not a Converse message is a service fault, not the model's answer.
        raise ProviderUnavailableError("Bedrock answered with a malformed Converse response") from exc
    return Completion(
        content=content,
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=latency_ms,
        finish_reason=finish_reason,
        cached_input_tokens=cached,
        cache_write_input_tokens=written,
        service_tier=served if isinstance(served, str) and served.isalpha() and len(served) <= 32 else None,
    )


def _attachment_blocks(attachments: Sequence[Attachment], encode: Callable[[bytes], Any]) -> list[dict[str, Any]]:
    """Each attachment as a Converse content block, after the text: an image block, a document block
    (its name cleaned to Bedrock's rules and unlike the others), a text file as a text block."""
    blocks: list[dict[str, Any]] = []
    names: set[str] = set()
    for attachment in attachments:
        source = {"bytes": encode(attachment.data)}
        if attachment.media_type.is_image:
            blocks.append({"image": {"format": attachment.media_type.extension, "source": source}})
        elif attachment.media_type.is_document:
            name = bedrock_document_name(attachment.name, names)
            blocks.append({"document": {"format": attachment.media_type.extension, "name": name, "source": source}})
        else:
            blocks.append({"text": attachment_text(attachment)})
    return blocks


def _message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"text": text}]}


def _turn(turn: ChatTurn) -> dict[str, Any]:
    return _message(turn.role, turn.content if turn.content.strip() else _EMPTY_TURN_TEXT)


def _answer(blocks: object) -> str:
    """The first tool call's input as JSON; else the text, so validation can say what came back."""
    if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
        raise TypeError("a message's content is a list of content blocks")
    for block in blocks:
        if "toolUse" in block:
            return json.dumps(block["toolUse"]["input"])
    return "".join(block["text"] for block in blocks if "text" in block)


def classified_error(exc: ClientError, flex: bool = False) -> JobError:
    """The engine error for a Bedrock error response, by its error code, else by its HTTP status; for a
    request to the flex tier (`flex`), a ServiceUnavailableException is that tier's unavailability."""
    code = str(exc.response.get("Error", {}).get("Code") or "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    status = status if isinstance(status, int) else None
    described = f"{code or 'unknown error'}, HTTP {status if status is not None else 'unknown'}"
    # Bedrock sends no Retry-After; the delay is left to backoff.
    if code in _RATE_LIMITED_CODES:
        return ProviderRateLimitedError(f"Bedrock rate limit ({described})")
    if code in _TIMEOUT_CODES:
        return ProviderTimeoutError(f"Bedrock model timed out ({described})")
    if flex and code == "ServiceUnavailableException":
        return FlexUnavailableError(f"Bedrock's flex tier is unavailable ({described})")
    if code in _UNAVAILABLE_CODES:
        return ProviderUnavailableError(f"Bedrock unavailable ({described})")
    if code in _REJECTED_CODES:
        return ProviderRejectedError(f"Bedrock rejected the request ({described})", status_code=status)
    return error_for_status(status, "Bedrock", described)
