"""The local provider's Files and Batches APIs, as OpenAI's: a JSONL file of chat completion lines,
uploaded with `purpose=batch`, and a batch over it, answered after a delay.

Routes: `POST /v1/files` (multipart: `file`, `purpose`), `GET /v1/files/{id}` and
`GET /v1/files/{id}/content`; `POST /v1/batches`, `GET /v1/batches/{id}`,
`POST /v1/batches/{id}/cancel` and `GET /v1/batches` (newest first; `limit`, `after`).

A batch is `in_progress` until `delay_seconds` after its creation; the first request that looks at
it after then (a status, a listing, a cancel) answers its lines, each as the chat completions
endpoint answers that body (the same answers, `fault:<kind>` markers, token counts and prompt
cache; not counted against the rate limit), writes its output and error files, and ends it.
A cancelled batch is `cancelling` until it is looked at again, then `cancelled`. An input file with
a malformed line, or a line for another endpoint, makes a `failed` batch, as OpenAI's validation does;
a line whose body the chat completions endpoint would refuse (aijobs.local.refusals) is answered as
that endpoint answers it, with a 400, and so is a line of the error file.

Faults, chosen per batch (`BatchFault`): by the provider's `batch_fault` when the batch is created
(tests set it at runtime), or by a `batch-fault:<kind>` marker in any of its lines' prompts (or
in the text of a PDF a line carries):
- `stall`: never ends until it is cancelled (then `cancelled`, with no line answered);
- `expire_half`: ends `expired` with the first half of its lines answered; the others are in the
  error file as `batch_expired` (never run);
- `failed_lines`: ends `completed` with every second line (the 2nd, 4th, ...) failed with a 500
  server error, in the error file.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qs

from aijobs.local.faults import FaultKind
from aijobs.local.protocol import Reply, error_reply, parse_chat_body
from aijobs.local.refusals import InvalidRequestError

FILES_PATH = "/v1/files"
BATCHES_PATH = "/v1/batches"
ENDPOINT = "/v1/chat/completions"
COMPLETION_WINDOW_SECONDS = 24 * 3600
DEFAULT_BATCH_DELAY_SECONDS = 3.0
# OpenAI's limits on an input file: 50,000 lines, 200 MB.
MAX_LINES = 50_000
MAX_FILE_BYTES = 200_000_000
# OpenAI's limits on a batch's metadata: 16 pairs, keys of 64 and values of 512 characters.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100


class BatchFault(StrEnum):
    STALL = "stall"
    EXPIRE_HALF = "expire_half"
    FAILED_LINES = "failed_lines"


FAULT_MARKER = re.compile(r"batch-fault:(" + "|".join(fault.value for fault in BatchFault) + r")(?![a-z_])")

# Answers one line: (its body, its batch's id, a fault it must get, or None) -> (HTTP status, or None
# when no response would have been sent; the response's body).
LineAnswerer = Callable[[Any, str, FaultKind | None], tuple[int | None, dict[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            # Deprecated by OpenAI, yet still sent and required by its SDK's FileObject.
            "status": "processed",
        }


@dataclass
class LocalBatch:
    id: str
    input_file_id: str
    metadata: dict[str, str]
    created_at: int
    # When it is due (the clock's time, not the wall's).
    due: float
    fault: BatchFault | None
    lines: list[dict[str, Any]]
    status: str = "in_progress"
    errors: list[dict[str, Any]] = field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    times: dict[str, int] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": "24h",
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.created_at + COMPLETION_WINDOW_SECONDS,
            **{f"{event}_at": self.times.get(event) for event in _EVENTS},
            "request_counts": {"total": len(self.lines), "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


_EVENTS = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


class BatchApi:
    """The files and batches of one local provider."""

    def __init__(
        self,
        answer_line: LineAnswerer,
        delay_seconds: float = DEFAULT_BATCH_DELAY_SECONDS,
        fault: BatchFault | str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._answer_line = answer_line
        self._delay_seconds = max(delay_seconds, 0.0)
        self.fault = BatchFault(fault) if fault else None
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[str, StoredFile] = {}
        self._batches: dict[str, LocalBatch] = {}

    def handles(self, path: str) -> bool:
        return any(path == root or path.startswith(root + "/") for root in (FILES_PATH, BATCHES_PATH))

    def respond(self, method: str, path: str, query: str, content_type: str | None, raw: bytes) -> Reply:
        parts = path.removeprefix("/v1/").split("/")
        with self._lock:
            match method, parts:
                case "POST", ["files"]:
                    return self._upload(content_type, raw)
                case "GET", ["files", file_id]:
                    return self._file(file_id, lambda file: Reply(200, file.view()))
                case "GET", ["files", file_id, "content"]:
                    return self._file(file_id, _content_reply)
                case "POST", ["batches"]:
                    return self._create(raw)
                case "GET", ["batches"]:
                    return self._list(parse_qs(query))
                case "GET", ["batches", batch_id]:
                    return self._batch(batch_id, lambda batch: Reply(200, batch.view()))
                case "POST", ["batches", batch_id, "cancel"]:
                    return self._batch(batch_id, self._cancel)
                case _:
                    return error_reply(404, f"no route {method} {path}", "invalid_request_error", "not_found")

    # --- files ---

    def _upload(self, content_type: str | None, raw: bytes) -> Reply:
        try:
            fields = multipart_fields(content_type, raw)
        except ValueError as exc:
            return error_reply(400, str(exc), "invalid_request_error")
        purpose, upload = fields.get("purpose"), fields.get("file")
        if upload is None or upload[0] is None:
            return error_reply(400, "'file' is required, as a file", "invalid_request_error")
        if purpose is None or purpose[1] != b"batch":
            return error_reply(400, "'purpose' must be 'batch'", "invalid_request_error")
        stored = StoredFile(_new_id("file-"), upload[0], "batch", upload[1], int(time.time()))
        self._files[stored.id] = stored
        return Reply(200, stored.view())

    def _file(self, file_id: str, reply: Callable[[StoredFile], Reply]) -> Reply:
        stored = self._files.get(file_id)
        if stored is None:
            return error_reply(404, f"No such File object: {file_id}", "invalid_request_error", "not_found")
        return reply(stored)

    def _store(self, filename: str, lines: list[bytes]) -> str | None:
        if not lines:
            return None
        stored = StoredFile(_new_id("file-"), filename, "batch_output", b"".join(lines), int(time.time()))
        self._files[stored.id] = stored
        return stored.id

    # --- batches ---

    def _create(self, raw: bytes) -> Reply:
        try:
            request = json.loads(raw)
        except ValueError:
            return error_reply(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(request, dict):
            return error_reply(400, "the body is not a JSON object", "invalid_request_error")
        problem = _create_problem(request)
        if problem is not None:
            return error_reply(400, problem, "invalid_request_error")
        stored = self._files.get(request["input_file_id"])
        if stored is None:
            message = f"No such File object: {request['input_file_id']}"
            return error_reply(404, message, "invalid_request_error", "not_found")
        lines, errors = _input_lines(stored.content)
        now = int(time.time())
        batch = LocalBatch(
            id=_new_id("batch_"),
            input_file_id=stored.id,
            metadata=dict(request.get("metadata") or {}),
            created_at=now,
            due=self._clock() + self._delay_seconds,
            fault=self.fault or _marked_fault(lines),
            lines=lines,
            errors=errors,
        )
        if errors:
            batch.status, batch.times["failed"] = "failed", now
        else:
            batch.times["in_progress"] = now
        self._batches[batch.id] = batch
        return Reply(200, batch.view())

    def _batch(self, batch_id: str, reply: Callable[[LocalBatch], Reply]) -> Reply:
        batch = self._batches.get(batch_id)
        if batch is None:
            return error_reply(404, f"No batch found with id '{batch_id}'", "invalid_request_error", "not_found")
        self._advance(batch)
        return reply(batch)

    def _list(self, query: Mapping[str, list[str]]) -> Reply:
        try:
            limit = int((query.get("limit") or [str(DEFAULT_LIST_LIMIT)])[0])
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIST_LIMIT:
            return error_reply(400, f"'limit' must be an integer from 1 to {MAX_LIST_LIMIT}", "invalid_request_error")
        newest_first = list(reversed(self._batches.values()))
        after = query.get("after")
        if after:
            position = next((index for index, batch in enumerate(newest_first) if batch.id == after[0]), None)
            if position is None:
                return error_reply(404, f"No batch found with id '{after[0]}'", "invalid_request_error", "not_found")
            newest_first = newest_first[position + 1 :]
        page = newest_first[:limit]
        for batch in page:
            self._advance(batch)
        return Reply(
            200,
            {
                "object": "list",
                "data": [batch.view() for batch in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(newest_first) > limit,
            },
        )

    def _cancel(self, batch: LocalBatch) -> Reply:
        if batch.status != "in_progress":
            message = f"Cannot cancel a batch with status '{batch.status}'."
            return error_reply(400, message, "invalid_request_error")
        batch.status, batch.times["cancelling"] = "cancelling", int(time.time())
        return Reply(200, batch.view())

    def _advance(self, batch: LocalBatch) -> None:
        """Move a batch on to where it is by now (called under the lock)."""
        if batch.status == "cancelling":
            self._end(batch, "cancelled", answered=0)
        elif batch.status == "in_progress" and batch.fault is not BatchFault.STALL and self._clock() >= batch.due:
            if batch.fault is BatchFault.EXPIRE_HALF:
                self._end(batch, "expired", answered=len(batch.lines) // 2)
            else:
                self._end(batch, "completed", answered=len(batch.lines))

    def _end(self, batch: LocalBatch, status: str, answered: int) -> None:
        """End a batch as `status`, its first `answered` lines answered (the others never run)."""
        output: list[bytes] = []
        failed: list[bytes] = []
        for index, line in enumerate(batch.lines):
            custom_id = line["custom_id"]
            if index >= answered:
                failed.append(_result(custom_id, None, None, _NOT_RUN[status]))
                continue
            forced = FaultKind.SERVER_ERROR if batch.fault is BatchFault.FAILED_LINES and index % 2 == 1 else None
            code, body = self._answer_line(line["body"], batch.id, forced)
            if code is None:
                error = {"code": "server_error", "message": "The server had an error processing the request."}
                failed.append(_result(custom_id, None, None, error))
            else:
                (output if code == 200 else failed).append(_result(custom_id, code, body, None))
        now = int(time.time())
        batch.output_file_id = self._store(f"{batch.id}_output.jsonl", output)
        batch.error_file_id = self._store(f"{batch.id}_error.jsonl", failed)
        batch.completed, batch.failed = len(output), len(failed)
        batch.status = status
        batch.times.update({"finalizing": now, status: now})


# The error of a line a batch never ran, by how the batch ended.
_NOT_RUN = {
    "expired": {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired.",
    },
    "cancelled": {
        "code": "batch_cancelled",
        "message": "This request was not executed because the batch was cancelled.",
    },
}


def _result(custom_id: str, status: int | None, body: dict[str, Any] | None, error: dict[str, Any] | None) -> bytes:
    """One line of an output or error file."""
    response = None if status is None else {"status_code": status, "request_id": uuid.uuid4().hex, "body": body}
    line = {"id": _new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": error}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _content_reply(stored: StoredFile) -> Reply:
    return Reply(200, content=stored.content, headers={"Content-Type": "application/octet-stream"})


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _create_problem(request: Mapping[str, Any]) -> str | None:
    """Why a create-batch request is refused; None when it is not."""
    if not isinstance(request.get("input_file_id"), str):
        return "'input_file_id' is required"
    if request.get("endpoint") != ENDPOINT:
        return f"'endpoint' must be '{ENDPOINT}'"
    if request.get("completion_window") != "24h":
        return "'completion_window' must be '24h'"
    metadata = request.get("metadata")
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_PAIRS
        or not all(isinstance(key, str) and len(key) <= MAX_METADATA_KEY_CHARS for key in metadata)
        or not all(isinstance(value, str) and len(value) <= MAX_METADATA_VALUE_CHARS for value in metadata.values())
    ):
        return (
            f"'metadata' is at most {MAX_METADATA_PAIRS} pairs of strings, keys of at most "
            f"{MAX_METADATA_KEY_CHARS} and values of at most {MAX_METADATA_VALUE_CHARS} characters"
        )
    return None


def _input_lines(content: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The lines of an input file, and the validation errors that fail its batch (each naming its line)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        if not isinstance(line, dict):
            errors.append({"code": "invalid_json_line", "message": "the line is not a JSON object", "line": number})
            continue
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            message = "'custom_id' must be a string, unique within the batch"
            errors.append({"code": "invalid_custom_id", "message": message, "line": number})
        elif line.get("method") != "POST" or line.get("url") != ENDPOINT or not isinstance(line.get("body"), dict):
            message = f"a line is a POST to {ENDPOINT} with a 'body' object"
            errors.append({"code": "invalid_request", "message": message, "line": number})
        else:
            seen.add(custom_id)
            lines.append(line)
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "the input file holds no requests", "line": None})
    if len(lines) > MAX_LINES:
        errors.append({"code": "too_many_requests", "message": f"more than {MAX_LINES} requests", "line": None})
    return lines, errors


def _marked_fault(lines: list[dict[str, Any]]) -> BatchFault | None:
    """The fault a `batch-fault:<kind>` marker asks for in what a line gives to read: its prompt, or
    its PDFs' text (a line the chat completions endpoint refuses has none)."""
    for line in lines:
        try:
            content = parse_chat_body(line["body"]).content
        except InvalidRequestError:
            continue
        match = FAULT_MARKER.search(content)
        if match is not None:
            return BatchFault(match.group(1))
    return None


def multipart_fields(content_type: str | None, raw: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (file name, or None for a plain field; content)."""
    header = Message()
    header["Content-Type"] = content_type or ""
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise ValueError("the body must be multipart/form-data with a boundary")
    fields: dict[str, tuple[str | None, bytes]] = {}
    delimiter = b"--" + boundary.encode("latin-1")
    for part in raw.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, separator, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not separator:
            raise ValueError("a multipart part has no header")
        headers = Message()
        for line in head.decode("latin-1").split("\r\n"):
            header_name, _, value = line.partition(":")
            headers[header_name.strip()] = value.strip()
        name = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        if isinstance(name, str):
            fields[name] = (filename if isinstance(filename, str) else None, content.removesuffix(b"\r\n"))
    return fields
