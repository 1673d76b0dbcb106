"""A loopback OpenAI-compatible provider: a small HTTP server on 127.0.0.1 that answers Chat Completions.

It answers `POST /v1/chat/completions` with the valid output of the job type the request's
`response_format` names (tests/support/providers.VALID_OUTPUTS, or an override), and counts requests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.providers import VALID_OUTPUTS, openai_completion

COMPLETIONS_PATH = "/v1/chat/completions"


class LoopbackProvider:
    """The server's state: the answers it gives and the requests it received."""

    def __init__(self, answers: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.answers: dict[str, dict[str, Any]] = {**VALID_OUTPUTS, **(answers or {})}
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def base_url(self) -> str:
        """The value for AI_BASE_URL."""
        assert self._server is not None, "the server is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def answer(self, request: dict[str, Any], authorization: str | None) -> dict[str, Any]:
        with self._lock:
            self.requests.append(request)
            self.authorizations.append(authorization)
        name = request["response_format"]["json_schema"]["name"]
        return openai_completion(json.dumps(self.answers[name]), model=request["model"])

    @contextmanager
    def running(self) -> Iterator[LoopbackProvider]:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._server = server
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None


def _handler_for(provider: LoopbackProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path != COMPLETIONS_PATH:
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                request = json.loads(raw)
                body = provider.answer(request, self.headers.get("Authorization"))
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": {"message": f"bad request: {type(exc).__name__}"}})
                return
            self._send(200, body)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: tests read the provider's counters, not its access log."""

    return Handler
