"""Anthropic's Message Batches API over httpx: one `POST /v1/messages/batches` a batch.

A batch is `{"requests": [{"custom_id", "params"}]}`, each `params` exactly the body a real-time call
posts (engine.gateway.anthropic.message_body); Anthropic takes up to 100,000 requests or 256 MB a
batch, and a `custom_id` of 1 to 64 characters of `[a-zA-Z0-9_-]`. Its `processing_status` goes
`in_progress` → (`canceling` →) `ended`; once ended, its results (JSONL at `results_url`) hold a line
per request, `{"custom_id", "result": {"type": ...}}`: `succeeded` (a message, read as a real-time
one is), `errored` (an error body: the engine's typed error for its type, as a real-time call's),
`canceled` or `expired` (never run: no answer, for the caller to hand back). Results are checked
against the batch's own `request_counts`: fewer lines than it counts is an error to read again
later, never "no answers".

Anthropic's batches carry no metadata. So each `custom_id` is `<tag>-<the caller's id>`, the tag a
digest of the metadata the batch was submitted with (the batch's record), and `find` tells a batch
by its tag: an ended batch by the first line of its results (read once, remembered), a batch this
process submitted by what it remembers. A batch still running that this process did not submit
cannot be told apart until it ends: `find` then raises a retryable error, so that the caller does
not create the batch again while it may exist (docs/batches.md says what this promises).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import IO, Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from engine.core.batches import BatchState
from engine.core.errors import JobError, ProviderUnavailableError
from engine.gateway.anthropic import (
    AnthropicProvider,
    anthropic_credentials,
    api_root,
    message_completion,
    typed_error,
)
from engine.gateway.batch_files import (
    UnreadableLine,
    jsonl_line,
    jsonl_values,
    names_a_request,
    request_count,
    spooled,
    unreadable_answer,
    write_chunks,
)
from engine.gateway.batches import BatchAnswer, BatchLine, BatchStatus, stop_unless_ended
from engine.gateway.openai import (
    MAX_RESPONSE_BYTES,
    ApiKeySource,
    Sent,
    default_client,
    parse_retry_after,
    provider_errors,
    read_bounded,
    send_authorized,
)
from engine.gateway.provider import error_for_status

# Anthropic's "Batch processing" guide: "up to 100,000 Message requests or 256 MB in size,
# whichever is reached first" (MB taken as 10^6 bytes, the smaller reading).
MIN_LINES = 1
MAX_LINES = 100_000
MAX_BYTES = 256_000_000
BATCHES_PATH = "/v1/messages/batches"
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# The tag before each custom_id: hex characters of the metadata's digest.
TAG_CHARS = 16
# A results line: a message (bounded as a real-time body is) in its envelope.
MAX_LINE_BYTES = MAX_RESPONSE_BYTES + 64 * 1024
# What is kept of a results line too long to parse, to find its custom_id.
HEAD_BYTES = 4096
REQUEST_TIMEOUT_SECONDS = 60.0
UPLOAD_TIMEOUT_SECONDS = 300.0
# `find` reads the newest batches, PAGE_SIZE a page, at most MAX_FIND_PAGES pages, none older than
# FIND_DAYS (the batcher gives up on a batch eight days after recording it).
PAGE_SIZE = 100
MAX_FIND_PAGES = 20
FIND_DAYS = 9
# Batches whose tag this process knows (it submitted them, or read their results), most recent kept.
MAX_REMEMBERED = 4096


class AnthropicBatchProvider:
    name = "anthropic"
    min_lines = MIN_LINES
    max_lines = MAX_LINES
    max_bytes = MAX_BYTES

    def __init__(
        self,
        base_url: str,
        api_key: ApiKeySource,
        *,
        json_output_models: Sequence[str] = (),
        client: httpx.Client | None = None,
    ) -> None:
        self._root = api_root(base_url)
        self._api_key = api_key
        self._client = client or default_client()
        # The real-time adapter makes each request's params: a batch request is exactly its body.
        self._messages = AnthropicProvider(base_url, api_key, json_output_models=json_output_models, client=client)
        self._tags: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def line_bytes(self, line: BatchLine) -> int:
        # A request in the body's array, and the comma before the next one.
        return len(self._request(line, "0" * TAG_CHARS))

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        if not self.min_lines <= len(lines) <= self.max_lines:
            raise ValueError(f"a batch holds {self.min_lines} to {self.max_lines} requests, not {len(lines)}")
        tag = batch_tag(metadata)
        content = b'{"requests":[' + b",".join(self._request(line, tag)[:-1] for line in lines) + b"]}"
        if len(content) > self.max_bytes:
            raise ValueError(f"a batch's body is at most {self.max_bytes} bytes, not {len(content)}")
        headers = {"content-type": "application/json"}
        batch = self._call("POST", BATCHES_PATH, UPLOAD_TIMEOUT_SECONDS, content=content, headers=headers)
        batch_id = _id(batch)
        self._remember(batch_id, tag)
        return batch_id

    def status(self, batch_id: str) -> BatchStatus:
        return _status(self._call("GET", f"{BATCHES_PATH}/{quote(batch_id, safe='')}"))

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        """The results of an ended batch; an error (to read them again later) when it has not ended, or
        its results hold fewer lines than its own counts say."""
        batch = self._call("GET", f"{BATCHES_PATH}/{quote(batch_id, safe='')}")
        status = _status(batch)
        if not status.state.ended:
            raise ProviderUnavailableError(f"batch {batch_id} has not ended ({status.detail})")
        expected = _total(batch.get("request_counts"))
        read = 0
        with self._results(batch, batch_id, _spooled) as file:
            for value in jsonl_values(file, MAX_LINE_BYTES):
                answer = _answer(value)
                read += answer is not None or names_a_request(value)
                if answer is not None:
                    yield answer
        if read < expected:
            raise ProviderUnavailableError(f"batch {batch_id}'s results hold {read} lines; the batch counts {expected}")

    def cancel(self, batch_id: str) -> None:
        path = f"{BATCHES_PATH}/{quote(batch_id, safe='')}/cancel"
        stop_unless_ended(lambda: self._call("POST", path), lambda: self.status(batch_id))

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        """The batches submitted with this metadata, newest first; a retryable error while a batch that
        may be one of them is still running and cannot be told apart."""
        tag = batch_tag(metadata)
        found: list[str] = []
        unknown = 0
        oldest = datetime.now(UTC) - timedelta(days=FIND_DAYS)
        after: str | None = None
        for _ in range(MAX_FIND_PAGES):
            params = {"limit": str(PAGE_SIZE), **({"after_id": after} if after else {})}
            page = self._call("GET", BATCHES_PATH, params=params)
            batches = [batch for batch in page.get("data") or [] if isinstance(batch, dict)]
            recent = [batch for batch in batches if _created_at(batch) >= oldest]
            for batch in recent:
                batch_tag_of = self._tag_of(batch)
                if batch_tag_of == tag:
                    found.append(_id(batch))
                unknown += batch_tag_of is None
            if len(recent) < len(batches) or not batches or page.get("has_more") is not True:
                break
            after = _id(batches[-1])
        if not found and unknown:
            raise ProviderUnavailableError(
                f"{unknown} batches still running cannot be told apart until they end; looked for again later"
            )
        return found

    def _tag_of(self, batch: Mapping[str, Any]) -> str | None:
        """The tag of a batch's custom_ids: remembered, or read from its results' first line once it has ended;
        "" for a batch of no tag (not the engine's); None while it cannot be known."""
        batch_id = _id(batch)
        with self._lock:
            known = self._tags.get(batch_id)
        if known is not None:
            return known
        if batch.get("processing_status") != "ended":
            return None
        custom_id = _custom_id(self._results(batch, batch_id, _first_line))
        tag, separator, _ = custom_id.partition("-")
        found = tag if separator and len(tag) == TAG_CHARS else ""
        self._remember(batch_id, found)
        return found

    def _remember(self, batch_id: str, tag: str) -> None:
        with self._lock:
            self._tags[batch_id] = tag
            self._tags.move_to_end(batch_id)
            while len(self._tags) > MAX_REMEMBERED:
                self._tags.popitem(last=False)

    def _request(self, line: BatchLine, tag: str) -> bytes:
        """One request of a batch's body (and a trailing byte, as a line of a JSONL file has)."""
        custom_id = f"{tag}-{line.custom_id}"
        if not CUSTOM_ID.match(custom_id):
            raise ValueError(f"a custom_id is 1 to 64 characters of [a-zA-Z0-9_-], not {custom_id!r}")
        return jsonl_line({"custom_id": custom_id, "params": self._messages.body(line.request)})

    def _call(
        self, method: str, path: str, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS, **kwargs: Any
    ) -> dict[str, Any]:
        """One API call's JSON object; the engine's error for a failure (an error body, by its type)."""

        extra: dict[str, str] = kwargs.pop("headers", {})

        def send(auth: dict[str, str]) -> Sent:
            headers = {**extra, **auth}
            with (
                provider_errors(timeout_seconds),
                self._client.stream(
                    method, self._root + path, headers=headers, timeout=timeout_seconds, **kwargs
                ) as response,
            ):
                return response.status_code, response.headers, read_bounded(response)

        status, response_headers, content = send_authorized(self._api_key, send, anthropic_credentials)
        retry_after = parse_retry_after(response_headers.get("retry-after"))
        if status >= 400:
            raise error_for_status(status, "Anthropic", f"HTTP {status} on {method} {path}", retry_after)
        try:
            value = json.loads(content)
        except ValueError:
            value = None
        if isinstance(value, dict) and value.get("type") == "error":
            raise typed_error(value, retry_after)
        if not isinstance(value, dict):
            raise ProviderUnavailableError(f"Anthropic answered {method} {path} with something other than an object")
        return value

    def _results(self, batch: Mapping[str, Any], batch_id: str, read: Callable[[httpx.Response], Read]) -> Read:
        """What `read` makes of an ended batch's results: from its `results_url` when it is on the API's
        own host (the key goes nowhere else), else from the documented path."""
        url = batch.get("results_url")
        if not isinstance(url, str) or _origin(url) != _origin(self._root):
            url = f"{self._root}{BATCHES_PATH}/{quote(batch_id, safe='')}/results"

        def send(auth: dict[str, str]) -> tuple[int, Read | None]:
            with (
                provider_errors(REQUEST_TIMEOUT_SECONDS),
                self._client.stream("GET", url, headers=auth, timeout=REQUEST_TIMEOUT_SECONDS) as response,
            ):
                if response.status_code >= 400:
                    return response.status_code, None
                return response.status_code, read(response)

        status, results = send_authorized(self._api_key, send, anthropic_credentials)
        if results is None:
            raise error_for_status(status, "Anthropic", f"HTTP {status} reading batch {batch_id}'s results")
        return results


# What is read of a batch's results: all of them, spooled (engine.gateway.batch_files), or their first line.
Read = TypeVar("Read")


def _spooled(response: httpx.Response) -> IO[bytes]:
    return spooled(write_chunks(response.iter_bytes()))


def _first_line(response: httpx.Response) -> bytes:
    """The results' first line, at most MAX_LINE_BYTES of it (the rest is left unread)."""
    line = b""
    for chunk in response.iter_bytes():
        line += chunk
        if b"\n" in line or len(line) > MAX_LINE_BYTES:
            break
    return line.split(b"\n", 1)[0][:MAX_LINE_BYTES]


def batch_tag(metadata: Mapping[str, str]) -> str:
    """The tag of the custom_ids of a batch submitted with `metadata`: a digest of it."""
    canonical = json.dumps(dict(metadata), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:TAG_CHARS]


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def _id(value: Mapping[str, Any]) -> str:
    identifier = value.get("id")
    if not isinstance(identifier, str) or not identifier:
        raise ProviderUnavailableError("Anthropic answered without an id")
    return identifier


def _created_at(batch: Mapping[str, Any]) -> datetime:
    """When a batch was created; a batch that does not say is taken as new (it is looked at)."""
    value = batch.get("created_at")
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        return datetime.now(UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _total(counts: object) -> int:
    """The requests an ended batch has a result for: every one it holds."""
    return sum(request_count(counts, name) for name in ("succeeded", "errored", "canceled", "expired"))


def _status(batch: Mapping[str, Any]) -> BatchStatus:
    """The status a batch object gives; a 200 whose body is no batch is an error."""
    detail = batch.get("processing_status")
    if batch.get("type") != "message_batch" or not isinstance(detail, str):
        raise ProviderUnavailableError("Anthropic answered with something other than a message batch")
    counts = batch.get("request_counts")
    if detail != "ended":
        # in_progress, canceling, or a status this adapter does not know: polled again.
        state = BatchState.PENDING
    elif batch.get("cancel_initiated_at"):
        state = BatchState.CANCELLED
    elif request_count(counts, "expired"):
        state = BatchState.EXPIRED
    else:
        state = BatchState.COMPLETED
    return BatchStatus(_id(batch), state, detail, request_count(counts, "succeeded"), request_count(counts, "errored"))


def _custom_id(line: bytes) -> str:
    """The custom_id a results line names ("" for none), wherever it stands in the line."""
    try:
        value = json.loads(line)
    except ValueError:
        value = UnreadableLine(line[:HEAD_BYTES], oversized=True).field("custom_id")
    custom_id = value.get("custom_id") if isinstance(value, dict) else value
    return custom_id if isinstance(custom_id, str) else ""


def _line_id(custom_id: str) -> str:
    """The caller's id in a custom_id (after its tag)."""
    _, separator, line = custom_id.partition("-")
    return line if separator else custom_id


def _answer(value: object) -> BatchAnswer | None:
    """The answer a results line holds; None for a line that names no request, or one never run."""
    if isinstance(value, UnreadableLine):
        answer = unreadable_answer(value, "custom_id", MAX_LINE_BYTES)
        return BatchAnswer(_line_id(answer.custom_id), error=answer.error) if answer is not None else None
    if not isinstance(value, dict) or not isinstance(value.get("custom_id"), str):
        return None
    custom_id = _line_id(value["custom_id"])
    result = value.get("result")
    result = result if isinstance(result, dict) else {}
    kind = result.get("type")
    if kind in ("canceled", "expired"):
        return None
    if kind == "errored":
        return BatchAnswer(custom_id, error=typed_error(result.get("error")))
    if kind != "succeeded":
        return BatchAnswer(custom_id, error=ProviderUnavailableError("the batch's result is of no known type"))
    try:
        return BatchAnswer(custom_id, completion=message_completion(200, result.get("message"), "", latency_ms=0))
    except JobError as exc:
        return BatchAnswer(custom_id, error=exc)
