"""A local AWS endpoint: moto's server on 127.0.0.1, with DynamoDB requests made linearizable.

moto checks a condition and applies the write without a lock, so two concurrent conditional
writes can both pass where DynamoDB lets one. The engine's claims depend on that guarantee, so
DynamoDB requests are served one at a time here (SQS requests stay concurrent: long polls).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class OneDynamoDbRequestAtATime:
    """WSGI middleware: serve DynamoDB requests (X-Amz-Target DynamoDB_*) one at a time."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith("DynamoDB"):
            with self._lock:
                return list(self._app(environ, start_response))
        return self._app(environ, start_response)


class LocalAws:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the local AWS endpoint is not started")
        return f"http://{self._host}:{self._server.server_port}"

    def start(self) -> LocalAws:
        # One access-log line per request would drown everything else out.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = OneDynamoDbRequestAtATime(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._host, self._port, app, threaded=True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="aijobs-local-aws", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
