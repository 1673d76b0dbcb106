"""A local OpenAI-compatible model provider: deterministic answers for any job type, faults on demand.

`LocalProvider` serves `POST /v1/chat/completions` and `GET /v1/models` on 127.0.0.1 from a daemon
thread, for the tests and for `aijobs dev` / `aijobs demo`. Answers are computed from the request's
structure alone (aijobs.local.answers): the output schema it carries (response_format's json_schema,
or in json_object mode the one after SCHEMA_PREAMBLE in the system message), which the engine
narrows to the job's input, so they pass the job types' own validation whatever their prompts say.
The job type comes in the X-Aijobs-Job-Type header and is logged. With `answers` (job type ->
`{input, output}` examples) a request of such a job type is answered with an example's output instead
(aijobs.local.answers.example_answer); the job type is the header's, else (a batch line) the
response_format's json_schema name, which is the job type's name (engine.gateway.openai.output_name
changes none of the characters a job type name has). Token counts are about a token
per four characters, like a real tokenizer on English text; images and PDFs (`image_url` and
`file` parts with data URLs) are billed as OpenAI bills them for the model asked for
(aijobs.local.attachments).
A request OpenAI would refuse (no content, a content part of an unknown type, ...:
aijobs.local.refusals; an image or a PDF whose bytes are not what its part claims) gets OpenAI's 400
`invalid_request_error`, with its `param` and `code`, so that no test passes on such a request.

A request gets a fault in one of two ways:
- its prompt (the first user message, so: the job's input; or the text of a PDF it carries) holds a
  marker, `fault:<kind>` (every time, re-asks included) or `fault:<kind>*<count>` (the first <count>
  times that prompt is asked, then a normal answer), e.g. a classify job whose text says
  `fault:unavailable*2`;
- else at random: with probability `fault_rate`, one of `random_faults`, from an RNG seeded by `seed`.
The kinds are `FaultKind`'s. `repairable` answers a first ask wrongly and a re-ask (a request with an
assistant turn or a second user turn: the engine's repair) rightly.

On the same port it serves Anthropic's Messages API (`POST /v1/messages`, aijobs.local.messages: the
key in `x-api-key`, the answer a tool call or text, usage with cache reads and writes of a prefix
marked `cache_control`, faults and refusals in Anthropic's shapes) and its Message Batches API
(aijobs.local.message_batches); `anthropic_url` is their base URL.
Like OpenAI, it serves `service_tier: "flex"` (flex processing, docs/cost.md): a flex request is
answered after `flex_latency_seconds` rather than `latency_seconds`, and may be refused with a 429
"Resource Unavailable" (error code `resource_unavailable`, no charge): always with the marker
`fault:flex_unavailable` (or `*<count>` times), and at random with probability `flex_refusal_rate`.
Every answer names the tier that served it (`service_tier`), and a tier that is none of OpenAI's is
refused as OpenAI refuses it.

It also serves OpenAI's Files and Batches APIs (aijobs.local.batches): a batch's lines are answered
as chat completion requests are, after `batch_delay_seconds`, with the faults a test picks per batch
(`batch_fault`, settable while it runs: stall, expire half, failed lines).

Every chat completion request, and every line a batch answered, is logged (`log`; a batch's lines
with its `batch_id`) with the tokens it billed (none unless it got a 200 answer), so that a test
can reconcile what the engine recorded with what the provider served.
With `rpm`/`tpm` it enforces a rate limit of its own, as a real provider does: a request beyond
it gets 429 with Retry-After, logged with `limited=True` (aijobs.local.ratelimit).
Like OpenAI, it reports cached tokens (the longest prefix of a system message that it answered
before, in blocks of PREFIX_BLOCK_CHARS characters or whole, is served from its prompt cache;
`prompt_cache=False` turns that off) and, with `reasoning_tokens=N`, N reasoning tokens per answer,
as parts of the prompt and completion tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from aijobs.local.answers import answer_for, example_answer, faulty_content
from aijobs.local.batches import DEFAULT_BATCH_DELAY_SECONDS, FILES_PATH, MAX_FILE_BYTES, BatchApi, BatchFault
from aijobs.local.faults import TRANSIENT_FAULTS, FaultKind, find_fault_marker, prompt_hash
from aijobs.local.message_batches import MessageBatchApi
from aijobs.local.messages import MESSAGES_PATH, fault_reply, message_body, parse_message_body, parse_message_request
from aijobs.local.messages import error_reply as anthropic_error
from aijobs.local.messages import refused as anthropic_refused
from aijobs.local.protocol import (
    ChatRequest,
    Reply,
    completion_body,
    error_reply,
    estimate_tokens,
    parse_chat_body,
    parse_chat_request,
    served_tier,
)
from aijobs.local.pushed_examples import PushedExamples
from aijobs.local.ratelimit import ProviderRateLimit
from aijobs.local.refusals import InvalidRequestError
from engine.gateway.openai import JOB_TYPE_HEADER

DEFAULT_MODEL = "local-model"
DEFAULT_LATENCY_SECONDS = 0.05
# A flex request waits for spare capacity: slower than one at the standard tier.
DEFAULT_FLEX_LATENCY_SECONDS = 0.5
DEFAULT_HANG_SECONDS = 30.0
# A hang never outlasts this, so every handler thread ends even when nobody stops the server.
MAX_HANG_SECONDS = 300.0
# An idle keep-alive connection is closed after this long.
IDLE_TIMEOUT_SECONDS = 60.0
# OpenAI takes a request of up to 50 MB (its images guide): the engine's attachments, in base64, fit.
MAX_BODY_BYTES = 50 * 1000 * 1000
COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
# The prompt cache keeps a system message's prefixes at every this many characters (about 128
# tokens: OpenAI caches in blocks of 128 tokens), and the whole message.
PREFIX_BLOCK_CHARS = 512


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One entry of the request log."""

    at: float
    model: str
    schema_name: str | None
    fault: FaultKind | None
    # None when no HTTP response was sent (drop, hang).
    status: int | None
    prompt_tokens: int
    completion_tokens: int
    prompt_hash: str = ""
    # True when the request carried a re-ask (an assistant turn, or more than one user turn).
    repair: bool = False
    # The request's X-Aijobs-Job-Type header: the job type the engine asked for.
    job_type: str | None = None
    # Parts of prompt_tokens and completion_tokens, as OpenAI reports them.
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    # True when the provider's own rate limit refused it (429), rather than an injected fault.
    limited: bool = False
    # The batch whose line it was; None for a chat completion request.
    batch_id: str | None = None
    # The part of prompt_tokens its images and PDFs cost (aijobs.local.attachments).
    attachment_tokens: int = 0
    # The part of prompt_tokens written to the prompt cache (an Anthropic request's cache_control).
    cache_write_tokens: int = 0
    # Which API it came through: "openai" (Chat Completions) or "anthropic" (Messages).
    api: str = "openai"
    # The service tier it asked for, and the one that served it (None unless it got a 200 answer).
    asked_tier: str | None = None
    service_tier: str | None = None


class LocalProvider:
    """An OpenAI-compatible Chat Completions server on 127.0.0.1, run from a daemon thread."""

    def __init__(
        self,
        *,
        port: int = 0,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        latency_seconds: float = DEFAULT_LATENCY_SECONDS,
        retry_after_seconds: int = 1,
        hang_seconds: float = DEFAULT_HANG_SECONDS,
        fault_rate: float = 0.0,
        random_faults: Sequence[FaultKind | str] = TRANSIENT_FAULTS,
        seed: int = 0,
        prompt_cache: bool = True,
        reasoning_tokens: int = 0,
        rpm: int | None = None,
        tpm: int | None = None,
        batch_delay_seconds: float = DEFAULT_BATCH_DELAY_SECONDS,
        batch_fault: BatchFault | str | None = None,
        answers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        pushed: PushedExamples | None = None,
        flex_latency_seconds: float = DEFAULT_FLEX_LATENCY_SECONDS,
        flex_refusal_rate: float = 0.0,
    ) -> None:
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate {fault_rate} is not within [0, 1]")
        if not 0.0 <= flex_refusal_rate <= 1.0:
            raise ValueError(f"flex_refusal_rate {flex_refusal_rate} is not within [0, 1]")
        if fault_rate and not random_faults:
            raise ValueError("fault_rate is set but random_faults is empty")
        self._port = port
        self._api_key = api_key
        # None: any model is served; otherwise others get 404 model_not_found, like a real provider.
        self._models = tuple(models) if models is not None else None
        self._latency_seconds = max(latency_seconds, 0.0)
        self._flex_latency_seconds = max(flex_latency_seconds, 0.0)
        self._flex_refusal_rate = flex_refusal_rate
        self._retry_after_seconds = retry_after_seconds
        self._hang_seconds = min(max(hang_seconds, 0.0), MAX_HANG_SECONDS)
        self._fault_rate = fault_rate
        self._random_faults = tuple(FaultKind(kind) for kind in random_faults)
        self._rng = random.Random(seed)
        # Prompt caching as providers do it for a prefix seen before: here, of the system message.
        self._prompt_cache = prompt_cache
        self._cached_prefixes: set[bytes] = set()
        self._reasoning_tokens = max(reasoning_tokens, 0)
        # A rate limit of its own, as real providers have: beyond it, 429 with Retry-After.
        self._limit = ProviderRateLimit(rpm, tpm) if rpm or tpm else None
        self._lock = threading.Lock()
        self._log: list[ServedRequest] = []
        self._faults_served: Counter[str] = Counter()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._batches = BatchApi(self._answer_line, batch_delay_seconds, batch_fault)
        self._message_batches = MessageBatchApi(
            self._answer_message, lambda: self.anthropic_url, batch_delay_seconds, lambda: self._batches.fault
        )
        # Per job type, the examples its answers are taken from (fault markers still come first): those
        # given, else, with `pushed`, those pushed with a data job type (aijobs.local.pushed_examples).
        self._answers = {job_type: tuple(examples) for job_type, examples in (answers or {}).items()}
        self._pushed = pushed

    @property
    def batch_fault(self) -> BatchFault | None:
        """The fault batches created from now on get (aijobs.local.batches); None: they are answered."""
        return self._batches.fault

    @batch_fault.setter
    def batch_fault(self, fault: BatchFault | str | None) -> None:
        self._batches.fault = BatchFault(fault) if fault else None

    # --- lifecycle ---

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("the local provider is already running")
        self._stopping.clear()
        server = _Server(("127.0.0.1", self._port), self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="aijobs-local-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()  # wakes handlers that hang or wait out their latency
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The base URL for AI_BASE_URL, e.g. http://127.0.0.1:8123/v1."""
        return f"{self.anthropic_url}/v1"

    @property
    def anthropic_url(self) -> str:
        """The base URL of its Anthropic Messages API (the SDK's base_url, without /v1)."""
        if self._server is None:
            raise RuntimeError("the local provider is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- the request log ---

    @property
    def log(self) -> list[ServedRequest]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    def billed_tokens(self) -> tuple[int, int]:
        """(prompt_tokens, completion_tokens) billed over the whole log."""
        entries = self.log
        return sum(entry.prompt_tokens for entry in entries), sum(entry.completion_tokens for entry in entries)

    def billed_token_parts(self) -> tuple[int, int]:
        """(cached_tokens, reasoning_tokens) billed over the whole log: parts of billed_tokens()."""
        entries = self.log
        return sum(entry.cached_tokens for entry in entries), sum(entry.reasoning_tokens for entry in entries)

    def reset(self) -> None:
        """Forget the log, the `*<count>` markers' counts and the prompt cache."""
        with self._lock:
            self._log.clear()
            self._faults_served.clear()
            self._cached_prefixes.clear()

    # --- answering ---

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        raw: bytes,
        job_type: str | None = None,
        content_type: str | None = None,
        api_key: str | None = None,
        anthropic_version: str | None = None,
    ) -> Reply:
        """The reply to one HTTP request (`job_type`: its X-Aijobs-Job-Type header; `api_key` and
        `anthropic_version`: the headers of Anthropic's API); every model request is logged."""
        path, _, query = path.partition("?")
        path = path.rstrip("/")
        if path == MESSAGES_PATH or self._message_batches.handles(path):
            return self._anthropic(method, path, query, api_key, anthropic_version, raw, job_type or None)
        if self._batches.handles(path):
            if not self._authorized(authorization):
                return self._unauthorized()
            return self._batches.respond(method, path, query, content_type, raw)
        if (method, path) == ("GET", MODELS_PATH):
            if not self._authorized(authorization):
                return self._unauthorized()
            models = self._models or (DEFAULT_MODEL,)
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "aijobs-local"} for model in models]
            return Reply(200, {"object": "list", "data": data})
        if path not in (COMPLETIONS_PATH, MODELS_PATH):
            return error_reply(404, f"no route {method} {path}", "invalid_request_error", "not_found")
        if method != "POST":
            return error_reply(405, f"{method} is not allowed on {path}", "invalid_request_error")
        return self._complete(authorization, raw, job_type or None)

    def _complete(self, authorization: str | None, raw: bytes, job_type: str | None) -> Reply:
        if not self._authorized(authorization):
            self._record(ServedRequest(time.time(), "", None, None, 401, 0, 0, job_type=job_type))
            return self._unauthorized()
        try:
            request = parse_chat_request(raw, job_type)
        except InvalidRequestError as exc:
            self._record(ServedRequest(time.time(), "", None, None, 400, 0, 0, job_type=job_type))
            return _refused(exc)
        key = prompt_hash(request.content)
        if self._models is not None and request.model not in self._models:
            entry = ServedRequest(
                time.time(), request.model, request.schema_name, None, 404, 0, 0, key, job_type=job_type
            )
            self._record(entry)
            message = f"The model {request.model!r} does not exist"
            return error_reply(404, message, "invalid_request_error", "model_not_found")
        return self._serve(request, key)

    def _anthropic(
        self,
        method: str,
        path: str,
        query: str,
        api_key: str | None,
        version: str | None,
        raw: bytes,
        job_type: str | None,
    ) -> Reply:
        """A request to the Messages or Message Batches API: its key in x-api-key, its version named."""
        if not self._authorized_key(api_key):
            if path == MESSAGES_PATH:
                self._record(ServedRequest(time.time(), "", None, None, 401, 0, 0, job_type=job_type, api="anthropic"))
            return anthropic_error(401, "authentication_error", "invalid x-api-key")
        if not version:
            return anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
        if path != MESSAGES_PATH:
            return self._message_batches.respond(method, path, query, raw)
        if method != "POST":
            return anthropic_error(405, "invalid_request_error", f"{method} is not allowed on {path}")
        try:
            request = parse_message_request(raw, job_type)
        except InvalidRequestError as exc:
            self._record(ServedRequest(time.time(), "", None, None, 400, 0, 0, job_type=job_type, api="anthropic"))
            return anthropic_refused(exc)
        key = prompt_hash(request.content)
        if self._models is not None and request.model not in self._models:
            entry = ServedRequest(time.time(), request.model, request.schema_name, None, 404, 0, 0, key)
            self._record(replace(entry, job_type=job_type, api="anthropic"))
            return anthropic_error(404, "not_found_error", f"model: {request.model[:200]}")
        return self._serve(request, key, anthropic=True)

    def _serve(self, request: ChatRequest, key: str, anthropic: bool = False) -> Reply:
        """A well-formed request to a served model: refused over a limit, else answered (or faulted)."""
        refused = self._over_limit(request, key, anthropic=anthropic)
        if refused is not None:
            return refused
        with self._lock:
            fault = self._choose_fault(request, key)
            reply, entry = self._reply(request, key, fault, number=len(self._log) + 1)
            self._log.append(entry)
        return reply

    def _answer_message(
        self, params: object, batch_id: str, fault: FaultKind | None
    ) -> tuple[int | None, dict[str, Any] | None]:
        """A message batch request's answer, as `POST /v1/messages` gives it for `params` (but never rate
        limited), or with `fault` when the batch's own fault picks one; logged with `batch_id`. Its job
        type is its forced tool's name (the engine's is the job type's)."""
        try:
            request = parse_message_body(params)
        except InvalidRequestError as exc:
            self._record(ServedRequest(time.time(), "", None, None, 400, 0, 0, batch_id=batch_id, api="anthropic"))
            return 400, anthropic_refused(exc).body
        key = prompt_hash(request.content)
        request = replace(request, job_type=request.tool)
        if self._models is not None and request.model not in self._models:
            entry = ServedRequest(time.time(), request.model, request.schema_name, None, 404, 0, 0, key)
            self._record(replace(entry, job_type=request.job_type, batch_id=batch_id, api="anthropic"))
            return 404, anthropic_error(404, "not_found_error", f"model: {request.model[:200]}").body
        with self._lock:
            reply, entry = self._reply(request, key, fault or self._choose_fault(request, key), len(self._log) + 1)
            self._log.append(replace(entry, batch_id=batch_id))
        return reply.status, reply.body

    def _answer_line(
        self, body: object, batch_id: str, fault: FaultKind | None
    ) -> tuple[int | None, dict[str, Any] | None]:
        """A batch line's answer, as a chat completion request with `body` gets it (but never rate limited),
        or with `fault` when the batch's own fault picks one; logged with `batch_id`. A line has no
        header to name its job type: its schema's name does, else its prompt_cache_key's first part."""
        try:
            request = parse_chat_body(body)
        except InvalidRequestError as exc:
            self._record(ServedRequest(time.time(), "", None, None, 400, 0, 0, batch_id=batch_id))
            return 400, _refused(exc).body
        key = prompt_hash(request.content)
        cache_key_job_type = request.cache_key.rpartition(":")[0] if request.cache_key else None
        request = replace(request, job_type=request.schema_name or cache_key_job_type or None)
        if self._models is not None and request.model not in self._models:
            entry = ServedRequest(time.time(), request.model, request.schema_name, None, 404, 0, 0, key)
            self._record(replace(entry, job_type=request.job_type, batch_id=batch_id))
            message = f"The model {request.model!r} does not exist"
            return 404, error_reply(404, message, "invalid_request_error", "model_not_found").body
        with self._lock:
            reply, entry = self._reply(request, key, fault or self._choose_fault(request, key), len(self._log) + 1)
            self._log.append(replace(entry, batch_id=batch_id))
        return reply.status, reply.body

    def _over_limit(self, request: ChatRequest, key: str, anthropic: bool = False) -> Reply | None:
        """429 with Retry-After for a request beyond the provider's own limit (counted against it
        with its prompt and max_tokens, as OpenAI counts); None when it is within."""
        if self._limit is None:
            return None
        wait = self._limit.admit(request.prompt_tokens + request.max_tokens)
        if wait is None:
            return None
        entry = ServedRequest(time.time(), request.model, request.schema_name, None, 429, 0, 0, key, limited=True)
        self._record(replace(entry, job_type=request.job_type, api="anthropic" if anthropic else "openai"))
        headers = {"Retry-After": str(wait)}
        if anthropic:
            return anthropic_error(429, "rate_limit_error", "Number of requests has exceeded your rate limit", headers)
        return error_reply(429, "Rate limit reached for requests", "requests", "rate_limit_exceeded", headers)

    def _choose_fault(self, request: ChatRequest, key: str) -> FaultKind | None:
        """The fault this request gets, if any (called under the lock: counts and the RNG are shared)."""
        marker = find_fault_marker(request.content)
        if marker is not None:
            # A re-ask is the cure a repairable answer waits for; it is never itself refused. Only a
            # request for the flex tier can find it unavailable.
            if marker.kind is FaultKind.REPAIRABLE and request.repair:
                return None
            if marker.kind is FaultKind.FLEX_UNAVAILABLE and not request.flex:
                return None
            if marker.count is None:
                return marker.kind
            if self._faults_served[key] < marker.count:
                self._faults_served[key] += 1
                return marker.kind
            return None
        if self._fault_rate and self._rng.random() < self._fault_rate:
            kind = self._rng.choice(self._random_faults)
            return None if kind is FaultKind.REPAIRABLE and request.repair else kind
        if request.flex and self._flex_refusal_rate and self._rng.random() < self._flex_refusal_rate:
            return FaultKind.FLEX_UNAVAILABLE
        return None

    def _reply(
        self, request: ChatRequest, key: str, fault: FaultKind | None, number: int
    ) -> tuple[Reply, ServedRequest]:
        """The reply to a chat completion request (or, when it came through the Messages API, a message
        request), and its log entry (tokens are billed only for a 200)."""
        anthropic = request.api == "anthropic"
        if anthropic:
            reply = fault_reply(fault, self._latency_seconds, self._retry_after_seconds, self._hang_seconds)
        else:
            reply = self._fault_reply(fault)
        written = 0
        if reply is None:
            examples = self._examples(request) if fault is None else ()
            if examples:
                content = json.dumps(example_answer(examples, request.prompt), ensure_ascii=False)
            elif fault is None:
                content = json.dumps(answer_for(request.schema, request.content))
            else:
                content = faulty_content(fault, request.schema, request.content)
            reasoning = self._reasoning_tokens
            completion_tokens = estimate_tokens(content) + reasoning
            if anthropic:
                cached, written = self._cache_breakpoint(request)
                body = message_body(content, request, number, request.prompt_tokens, completion_tokens, cached, written)
                tier = None
            else:
                cached = self._cached_tokens(request)
                tier = served_tier(request.service_tier)
                body = completion_body(
                    content, request.model, request.prompt_tokens, completion_tokens, number, cached, reasoning, tier
                )
            latency = self._flex_latency_seconds if request.flex else self._latency_seconds
            reply = Reply(200, body, delay_seconds=latency)
            billed = (request.prompt_tokens, completion_tokens, cached, reasoning, request.attachments.tokens)
        else:
            billed, tier = (0, 0, 0, 0, 0), None
        prompt_tokens, completion_tokens, cached, reasoning, attachment_tokens = billed
        entry = ServedRequest(
            time.time(),
            request.model,
            request.schema_name,
            fault,
            reply.status,
            prompt_tokens,
            completion_tokens,
            key,
            request.repair,
            request.job_type,
            cached,
            reasoning,
            attachment_tokens=attachment_tokens,
            cache_write_tokens=written,
            api=request.api,
            asked_tier=request.service_tier,
            service_tier=tier,
        )
        return reply, entry

    def _examples(self, request: ChatRequest) -> Sequence[Mapping[str, Any]]:
        """The examples a request's answer is taken from: its job type's given ones, else its pushed ones."""
        job_type = request.job_type or request.schema_name or ""
        given = self._answers.get(job_type)
        if given or self._pushed is None:
            return given or ()
        return self._pushed(job_type, request.schema)

    def _cache_breakpoint(self, request: ChatRequest) -> tuple[int, int]:
        """(read, written): the tokens of an Anthropic request's cacheable prefix, read from the prompt
        cache when it was seen before, else written to it (called under the lock)."""
        prefix = request.cache_prefix
        if not self._prompt_cache or not prefix:
            return 0, 0
        tokens = min(estimate_tokens(prefix), request.prompt_tokens)
        digest = hashlib.sha256(prefix.encode("utf-8", "surrogatepass")).digest()
        if digest in self._cached_prefixes:
            return tokens, 0
        self._cached_prefixes.add(digest)
        return 0, tokens

    def _cached_tokens(self, request: ChatRequest) -> int:
        """The tokens of the longest prefix of the system message answered before, in blocks of
        PREFIX_BLOCK_CHARS or whole; each of its prefixes is cached from now on (called under the lock)."""
        system = request.system
        if not self._prompt_cache or not system:
            return 0
        cached = 0
        digest = hashlib.sha256()
        start = 0
        for end in [*range(PREFIX_BLOCK_CHARS, len(system), PREFIX_BLOCK_CHARS), len(system)]:
            digest.update(system[start:end].encode("utf-8", "surrogatepass"))
            start = end
            prefix = digest.digest() + end.to_bytes(8, "big")
            if prefix in self._cached_prefixes:
                cached = end
            else:
                self._cached_prefixes.add(prefix)
        return min(estimate_tokens(system[:cached]), request.prompt_tokens) if cached else 0

    def _fault_reply(self, fault: FaultKind | None) -> Reply | None:
        """The reply of a fault that gives no answer; None for the faults that answer (with bad content)."""
        latency = self._latency_seconds
        match fault:
            case FaultKind.RATE_LIMITED:
                headers = {"Retry-After": str(self._retry_after_seconds)}
                return error_reply(
                    429, "Rate limit reached", "rate_limit_error", "rate_limit_exceeded", headers, latency
                )
            case FaultKind.SERVER_ERROR:
                return error_reply(
                    500, "The server had an error processing your request", "server_error", None, {}, latency
                )
            case FaultKind.UNAVAILABLE:
                return error_reply(503, "The engine is currently overloaded", "server_error", "overloaded", {}, latency)
            case FaultKind.FLEX_UNAVAILABLE:
                message = "Resource Unavailable: flex processing has no capacity for this request now"
                return error_reply(429, message, "resource_unavailable", "resource_unavailable", {}, latency)
            case FaultKind.HANG:
                return Reply(None, delay_seconds=self._hang_seconds)
            case FaultKind.DROP:
                return Reply(None, delay_seconds=latency)
            case _:
                return None

    def _authorized(self, authorization: str | None) -> bool:
        """Chat Completions' credentials: `Authorization: Bearer <key>`."""
        scheme, _, key = (authorization or "").partition(" ")
        return self._authorized_key(key if scheme == "Bearer" else None)

    def _authorized_key(self, key: str | None) -> bool:
        """Whether `key` is the provider's key (any is, when it has none)."""
        if self._api_key is None:
            return True
        return hmac.compare_digest((key or "").encode(), self._api_key.encode())

    @staticmethod
    def _unauthorized() -> Reply:
        return error_reply(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")

    def _record(self, entry: ServedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds` (a handler's latency or hang); returns at once when the server stops."""
        if seconds > 0:
            self._stopping.wait(seconds)


def _refused(exc: InvalidRequestError) -> Reply:
    """The 400 OpenAI answers a request it refuses."""
    return error_reply(400, str(exc), "invalid_request_error", exc.code, param=exc.param)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], provider: LocalProvider) -> None:
        self.provider = provider
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """End the open connections, so that handler threads waiting on keep-alive reads finish."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by the client
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_SECONDS
    # Headers and body go out in two writes; with Nagle on, the body waits for a delayed ACK (~40 ms).
    disable_nagle_algorithm = True

    @property
    def _server(self) -> _Server:
        assert isinstance(self.server, _Server)
        return self.server

    def setup(self) -> None:
        super().setup()
        self._server.track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._server.track(self.connection, open_=False)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        # A file may be as large as OpenAI takes one; any other body is a request of a few MB at most.
        limit = MAX_FILE_BYTES if self.path.split("?", 1)[0].rstrip("/") == FILES_PATH else MAX_BODY_BYTES
        if not 0 <= length <= limit:
            self.close_connection = True  # the body is left unread
            self._send(error_reply(413 if length > 0 else 400, "bad Content-Length", "invalid_request_error"))
            return
        raw = self.rfile.read(length) if length else b""
        provider = self._server.provider
        reply = provider.respond(
            method,
            self.path,
            self.headers.get("Authorization"),
            raw,
            self.headers.get(JOB_TYPE_HEADER),
            self.headers.get("Content-Type"),
            self.headers.get("x-api-key"),
            self.headers.get("anthropic-version"),
        )
        provider.wait(reply.delay_seconds)
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        if reply.status is None:
            # Drop (or the end of a hang): close the connection without a byte of response.
            self.close_connection = True
            return
        if reply.content is not None:
            data = reply.content
        else:
            data = json.dumps(reply.body).encode() if reply.body is not None else b""
        headers = {"Content-Type": "application/json", **reply.headers}
        try:
            self.send_response(reply.status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client gave up waiting, or the server is stopping

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log (`LocalProvider.log`) is the record, and prompts are not printed."""
