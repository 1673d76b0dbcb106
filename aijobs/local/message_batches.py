"""The local provider's Message Batches API, as Anthropic's: requests with `custom_id` and `params`,
answered after a delay, their results as JSONL.

Routes: `POST /v1/messages/batches` (`{"requests": [{"custom_id", "params"}]}`: 1 to 100,000 of
them, each `custom_id` 1 to 64 characters of `[a-zA-Z0-9_-]`, unique), `GET
/v1/messages/batches/{id}`, `POST /v1/messages/batches/{id}/cancel`, `GET
/v1/messages/batches/{id}/results` (once ended; its `results_url`) and `GET /v1/messages/batches`
(newest first; `limit`, `after_id`, `before_id`).

A batch is `in_progress` until `delay_seconds` after its creation; the first request that looks at
it after then answers each request as `POST /v1/messages` answers its params (the same answers,
`fault:<kind>` markers, token counts and prompt cache; not counted against the rate limit): a 200 is
a `succeeded` result, any other reply an `errored` one carrying its error; then it has `ended`. A
batch cancelled while in progress is `canceling` until it is looked at again, then `ended` with
its unanswered requests `canceled`. The faults of aijobs.local.batches (`BatchFault`), chosen the
same way (the provider's `batch_fault`, or a `batch-fault:<kind>` marker in a request's prompt):
`stall` never ends until cancelled; `expire_half` ends with the second half of its requests
`expired`; `failed_lines` answers every second request with a 500 `api_error` (`errored`).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

from aijobs.local.batches import DEFAULT_BATCH_DELAY_SECONDS, FAULT_MARKER, BatchFault, LineAnswerer
from aijobs.local.faults import FaultKind
from aijobs.local.messages import error_reply, parse_message_body
from aijobs.local.protocol import Reply
from aijobs.local.refusals import InvalidRequestError

BATCHES_PATH = "/v1/messages/batches"
MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 1000
WINDOW = timedelta(hours=24)


@dataclass
class MessageBatch:
    id: str
    requests: list[dict[str, Any]]
    created_at: datetime
    due: float
    fault: BatchFault | None
    base_url: str
    status: str = "in_progress"
    results: list[bytes] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None

    def view(self) -> dict[str, Any]:
        counts = {name: self.counts.get(name, 0) for name in ("succeeded", "errored", "canceled", "expired")}
        ended = self.status == "ended"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": {"processing": 0 if ended else len(self.requests), **counts},
            "ended_at": _time(self.ended_at),
            "created_at": _time(self.created_at),
            "expires_at": _time(self.created_at + WINDOW),
            "archived_at": None,
            "cancel_initiated_at": _time(self.cancel_initiated_at),
            "results_url": f"{self.base_url}{BATCHES_PATH}/{self.id}/results" if ended else None,
        }


class MessageBatchApi:
    """The message batches of one local provider; `answer` answers one request's params."""

    def __init__(
        self,
        answer: LineAnswerer,
        base_url: Callable[[], str],
        delay_seconds: float = DEFAULT_BATCH_DELAY_SECONDS,
        fault: Callable[[], BatchFault | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._answer = answer
        self._base_url = base_url
        self._delay_seconds = max(delay_seconds, 0.0)
        self._fault = fault
        self._clock = clock
        self._lock = threading.Lock()
        self._batches: dict[str, MessageBatch] = {}

    def handles(self, path: str) -> bool:
        return path == BATCHES_PATH or path.startswith(BATCHES_PATH + "/")

    def respond(self, method: str, path: str, query: str, raw: bytes) -> Reply:
        parts = path.removeprefix(BATCHES_PATH).strip("/").split("/") if path != BATCHES_PATH else []
        with self._lock:
            match method, parts:
                case "POST", []:
                    return self._create(raw)
                case "GET", []:
                    return self._list(parse_qs(query))
                case "GET", [batch_id]:
                    return self._batch(batch_id, lambda batch: Reply(200, batch.view()))
                case "POST", [batch_id, "cancel"]:
                    return self._batch(batch_id, self._cancel)
                case "GET", [batch_id, "results"]:
                    return self._batch(batch_id, _results)
                case _:
                    return error_reply(404, "not_found_error", f"no route {method} {path}")

    def _create(self, raw: bytes) -> Reply:
        try:
            body = json.loads(raw)
        except ValueError:
            return error_reply(400, "invalid_request_error", "The request body is not valid JSON.")
        requests = body.get("requests") if isinstance(body, dict) else None
        problem = _requests_problem(requests)
        if problem is not None:
            return error_reply(400, "invalid_request_error", problem)
        assert isinstance(requests, list)
        batch = MessageBatch(
            id=f"msgbatch_local_{uuid.uuid4().hex[:24]}",
            requests=requests,
            created_at=datetime.now(UTC),
            due=self._clock() + self._delay_seconds,
            fault=self._fault() or _marked_fault(requests),
            base_url=self._base_url(),
        )
        self._batches[batch.id] = batch
        return Reply(200, batch.view())

    def _batch(self, batch_id: str, reply: Callable[[MessageBatch], Reply]) -> Reply:
        batch = self._batches.get(batch_id)
        if batch is None:
            return error_reply(404, "not_found_error", f"No message batch with id '{batch_id[:100]}'")
        self._advance(batch)
        return reply(batch)

    def _list(self, query: Mapping[str, list[str]]) -> Reply:
        try:
            limit = int((query.get("limit") or [str(DEFAULT_LIST_LIMIT)])[0])
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIST_LIMIT:
            return error_reply(400, "invalid_request_error", f"limit: Input should be from 1 to {MAX_LIST_LIMIT}")
        newest_first = list(reversed(self._batches.values()))
        for cursor, after in (("after_id", True), ("before_id", False)):
            marks = query.get(cursor)
            if not marks:
                continue
            at = next((index for index, batch in enumerate(newest_first) if batch.id == marks[0]), None)
            if at is None:
                return error_reply(404, "not_found_error", f"No message batch with id '{marks[0][:100]}'")
            newest_first = newest_first[at + 1 :] if after else newest_first[:at][-limit:]
        page = newest_first[:limit]
        for batch in page:
            self._advance(batch)
        return Reply(
            200,
            {
                "data": [batch.view() for batch in page],
                "has_more": len(newest_first) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            },
        )

    def _cancel(self, batch: MessageBatch) -> Reply:
        if batch.status == "in_progress":
            batch.status, batch.cancel_initiated_at = "canceling", datetime.now(UTC)
        return Reply(200, batch.view())

    def _advance(self, batch: MessageBatch) -> None:
        """Move a batch on to where it is by now (called under the lock)."""
        if batch.status == "canceling":
            self._end(batch, answered=0, unanswered="canceled")
        elif batch.status == "in_progress" and batch.fault is not BatchFault.STALL and self._clock() >= batch.due:
            if batch.fault is BatchFault.EXPIRE_HALF:
                self._end(batch, answered=len(batch.requests) // 2, unanswered="expired")
            else:
                self._end(batch, answered=len(batch.requests), unanswered="expired")

    def _end(self, batch: MessageBatch, answered: int, unanswered: str) -> None:
        """End a batch, its first `answered` requests answered, the others `unanswered`."""
        for index, request in enumerate(batch.requests):
            if index >= answered:
                result: dict[str, Any] = {"type": unanswered}
            else:
                forced = FaultKind.SERVER_ERROR if batch.fault is BatchFault.FAILED_LINES and index % 2 == 1 else None
                status, body = self._answer(request["params"], batch.id, forced)
                if status == 200:
                    result = {"type": "succeeded", "message": body}
                else:
                    error = body if isinstance(body, dict) and body.get("type") == "error" else _server_error()
                    result = {"type": "errored", "error": error}
            batch.counts[result["type"]] = batch.counts.get(result["type"], 0) + 1
            line = {"custom_id": request["custom_id"], "result": result}
            batch.results.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        batch.status, batch.ended_at = "ended", datetime.now(UTC)


def _results(batch: MessageBatch) -> Reply:
    if batch.status != "ended":
        return error_reply(400, "invalid_request_error", f"Message batch {batch.id} has not ended: no results yet")
    return Reply(200, content=b"".join(batch.results), headers={"Content-Type": "application/x-jsonl"})


def _server_error() -> dict[str, Any]:
    """What a request that got no response (a dropped connection) errs with."""
    return {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}


def _time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def _requests_problem(requests: object) -> str | None:
    """Why a create request's `requests` are refused; None when they are not."""
    if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_REQUESTS:
        return f"requests: a list of 1 to {MAX_REQUESTS} requests is required"
    seen: set[str] = set()
    for index, request in enumerate(requests):
        if not isinstance(request, dict) or set(request) != {"custom_id", "params"}:
            return f"requests.{index}: a request is exactly {{'custom_id', 'params'}}"
        custom_id = request["custom_id"]
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            return f"requests.{index}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"requests.{index}.custom_id: custom_id must be unique within the batch"
        if not isinstance(request["params"], dict):
            return f"requests.{index}.params: Input should be a valid dictionary"
        seen.add(custom_id)
    return None


def _marked_fault(requests: list[dict[str, Any]]) -> BatchFault | None:
    """The fault a `batch-fault:<kind>` marker asks for in what a request gives to read (a request
    Anthropic would refuse has none)."""
    for request in requests:
        try:
            content = parse_message_body(request["params"]).content
        except InvalidRequestError:
            continue
        match = FAULT_MARKER.search(content)
        if match is not None:
            return BatchFault(match.group(1))
    return None
