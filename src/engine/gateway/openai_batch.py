"""OpenAI-compatible batches over httpx: the Files API and the Batches API.

A batch is one JSONL file, uploaded with `purpose=batch`, whose lines are
`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}` with exactly the body a
real-time call posts (engine.gateway.openai.chat_completion_body), then a batch over it with a 24 h
completion window and the caller's metadata. Once it has ended, its output file holds a line per
answered request (`{"custom_id", "response": {"status_code", "body"}, "error"}`) and its error file
a line per failed one; each is read as a real-time answer would be (parse_completion: the same
usage, the same typed error for a status). Lines a batch never ran (`batch_expired`,
`batch_cancelled`) are no answer: they are left out, for the caller to find missing. The files are
checked against the batch's own `request_counts`: a file that holds fewer lines than it counts (a
200 with an error body, a file cut short) is an error to read again later, never "no answers".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any
from urllib.parse import quote

import httpx

from engine.core.batches import BatchState
from engine.core.errors import JobError, ProviderUnavailableError
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
    StructuredOutput,
    chat_completion_body,
    default_client,
    parse_completion,
    parse_retry_after,
    provider_errors,
    read_bounded,
    send_authorized,
)
from engine.gateway.provider import error_for_status

# OpenAI API reference, Batch, "Create batch": the input file "can contain up to 50,000 requests, and
# can be up to 200 MB in size" (MB taken as 10^6 bytes, the smaller reading).
MIN_LINES = 1
MAX_LINES = 50_000
MAX_BYTES = 200_000_000
ENDPOINT = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"
# A line of a results file: a completion (bounded as a real-time body is) in its envelope.
MAX_LINE_BYTES = MAX_RESPONSE_BYTES + 64 * 1024
# Control calls (create, status, list, cancel) and the upload of up to MAX_BYTES.
REQUEST_TIMEOUT_SECONDS = 60.0
UPLOAD_TIMEOUT_SECONDS = 300.0
# `find` reads the newest batches, PAGE_SIZE a page, at most MAX_FIND_PAGES pages.
PAGE_SIZE = 100
MAX_FIND_PAGES = 20

_STATES = {
    "validating": BatchState.PENDING,
    "in_progress": BatchState.PENDING,
    "finalizing": BatchState.PENDING,
    "cancelling": BatchState.PENDING,
    "completed": BatchState.COMPLETED,
    "expired": BatchState.EXPIRED,
    "cancelled": BatchState.CANCELLED,
    "failed": BatchState.FAILED,
}
# The error codes of lines a batch never ran: it expired or was cancelled first.
_NOT_RUN = frozenset({"batch_expired", "batch_cancelled"})


class OpenAIBatchProvider:
    name = "openai"
    min_lines = MIN_LINES
    max_lines = MAX_LINES
    max_bytes = MAX_BYTES

    def __init__(
        self,
        base_url: str,
        api_key: ApiKeySource,
        *,
        structured_output: StructuredOutput = "json_schema",
        client: httpx.Client | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._api_key = api_key
        self._structured_output = structured_output
        self._client = client or default_client()

    def line_bytes(self, line: BatchLine) -> int:
        return len(self._line(line))

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        if not self.min_lines <= len(lines) <= self.max_lines:
            raise ValueError(f"a batch holds {self.min_lines} to {self.max_lines} lines, not {len(lines)}")
        content = b"".join(self._line(line) for line in lines)
        if len(content) > self.max_bytes:
            raise ValueError(f"a batch's input is at most {self.max_bytes} bytes, not {len(content)}")
        upload = {"file": ("aijobs-batch.jsonl", content, "application/jsonl")}
        file = self._call("POST", "/files", UPLOAD_TIMEOUT_SECONDS, files=upload, data={"purpose": "batch"})
        batch = self._call(
            "POST",
            "/batches",
            json={
                "input_file_id": _id(file),
                "endpoint": ENDPOINT,
                "completion_window": COMPLETION_WINDOW,
                "metadata": dict(metadata),
            },
        )
        return _id(batch)

    def status(self, batch_id: str) -> BatchStatus:
        return _status(self._call("GET", f"/batches/{quote(batch_id, safe='')}"))

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        """The lines of an ended batch's output and error files; an error (to read them again later) when
        the batch is not an ended batch, or its files hold fewer lines than its own counts say."""
        batch = self._call("GET", f"/batches/{quote(batch_id, safe='')}")
        status = _status(batch)
        if not status.state.ended:
            raise ProviderUnavailableError(f"batch {batch_id} has not ended ({status.detail or 'no status'})")
        for field, expected in (("output_file_id", status.answered), ("error_file_id", status.failed)):
            file_id = batch.get(field)
            if not isinstance(file_id, str) or not file_id:
                if expected:
                    raise ProviderUnavailableError(f"batch {batch_id} counts {expected} lines but has no {field}")
                continue
            read = 0
            with self._download(file_id) as file:
                for value in jsonl_values(file, MAX_LINE_BYTES):
                    answer = _answer(value)
                    read += answer is not None or names_a_request(value)
                    if answer is not None:
                        yield answer
            if read < expected:
                raise ProviderUnavailableError(
                    f"batch {batch_id}'s {field} holds {read} lines; the batch counts {expected}"
                )

    def cancel(self, batch_id: str) -> None:
        path = f"/batches/{quote(batch_id, safe='')}/cancel"
        stop_unless_ended(lambda: self._call("POST", path), lambda: self.status(batch_id))

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        found: list[str] = []
        after: str | None = None
        for _ in range(MAX_FIND_PAGES):
            params = {"limit": str(PAGE_SIZE), **({"after": after} if after else {})}
            page = self._call("GET", "/batches", params=params)
            batches = [batch for batch in page.get("data") or [] if isinstance(batch, dict)]
            found += [_id(batch) for batch in batches if _tagged(batch, metadata)]
            if not batches or page.get("has_more") is not True:
                break
            after = _id(batches[-1])
        return found

    def _line(self, line: BatchLine) -> bytes:
        body = chat_completion_body(line.request, self._structured_output)
        return jsonl_line({"custom_id": line.custom_id, "method": "POST", "url": ENDPOINT, "body": body})

    def _call(
        self, method: str, path: str, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS, **kwargs: Any
    ) -> dict[str, Any]:
        """One API call's JSON object; the engine's error for a failure."""

        def send(auth: dict[str, str]) -> Sent:
            with (
                provider_errors(timeout_seconds),
                self._client.stream(
                    method, self._base + path, headers=auth, timeout=timeout_seconds, **kwargs
                ) as response,
            ):
                return response.status_code, response.headers, read_bounded(response)

        status, headers, content = send_authorized(self._api_key, send)
        if status >= 400:
            retry_after = parse_retry_after(headers.get("retry-after"))
            raise error_for_status(status, "provider", f"HTTP {status} on {method} {path}", retry_after)
        try:
            value = json.loads(content)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ProviderUnavailableError(f"provider answered {method} {path} with something other than an object")
        return value

    def _download(self, file_id: str) -> IO[bytes]:
        """A file's content, spooled (engine.gateway.batch_files)."""

        def send(auth: dict[str, str]) -> tuple[int, IO[bytes] | None]:
            url = f"{self._base}/files/{quote(file_id, safe='')}/content"
            with (
                provider_errors(REQUEST_TIMEOUT_SECONDS),
                self._client.stream("GET", url, headers=auth, timeout=REQUEST_TIMEOUT_SECONDS) as response,
            ):
                if response.status_code >= 400:
                    return response.status_code, None
                return response.status_code, spooled(write_chunks(response.iter_bytes()))

        status, file = send_authorized(self._api_key, send)
        if file is None:
            raise error_for_status(status, "provider", f"HTTP {status} reading batch file {file_id}")
        return file


def _id(value: Mapping[str, Any]) -> str:
    identifier = value.get("id")
    if not isinstance(identifier, str) or not identifier:
        raise ProviderUnavailableError("provider answered without an id")
    return identifier


def _tagged(batch: Mapping[str, Any], metadata: Mapping[str, str]) -> bool:
    tags = batch.get("metadata")
    return isinstance(tags, dict) and all(tags.get(key) == value for key, value in metadata.items())


def _status(batch: Mapping[str, Any]) -> BatchStatus:
    """The status a batch object gives; a 200 whose body is no batch (no id or status) is an error."""
    if not isinstance(batch.get("status"), str) or batch.get("object", "batch") != "batch":
        raise ProviderUnavailableError("provider answered with something other than a batch")
    detail = str(batch.get("status") or "")
    # A status this adapter does not know is taken as not ended yet: it is polled again.
    state = _STATES.get(detail, BatchState.PENDING)
    if state is BatchState.FAILED:
        detail += f" ({_first_error(batch)})"
    counts = batch.get("request_counts")
    return BatchStatus(_id(batch), state, detail, request_count(counts, "completed"), request_count(counts, "failed"))


def _first_error(batch: Mapping[str, Any]) -> str:
    """Why a batch failed as a whole: the code of the first error it lists (a malformed input file...)."""
    errors = batch.get("errors")
    data = errors.get("data") if isinstance(errors, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    return str(first.get("code") or "error") if isinstance(first, dict) else "no reason given"


def _answer(value: object) -> BatchAnswer | None:
    """The answer a line of a results file holds; None for a line that names no request, or one the
    batch never ran."""
    if isinstance(value, UnreadableLine):
        return unreadable_answer(value, "custom_id", MAX_LINE_BYTES)
    if not isinstance(value, dict) or not isinstance(value.get("custom_id"), str):
        return None
    custom_id: str = value["custom_id"]
    response = value.get("response")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        body = response.get("body")
        try:
            completion = parse_completion(response["status_code"], body, _model(body), latency_ms=0)
        except JobError as exc:
            return BatchAnswer(custom_id, error=exc)
        return BatchAnswer(custom_id, completion=completion)
    error = value.get("error")
    code = str(error.get("code") or "") if isinstance(error, dict) else ""
    if code in _NOT_RUN:
        return None
    unanswered = ProviderUnavailableError(f"the batch did not answer the line ({code or 'no code'})")
    return BatchAnswer(custom_id, error=unanswered)


def _model(body: object) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""
