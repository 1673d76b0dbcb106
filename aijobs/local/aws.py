"""A local AWS endpoint: moto's server on 127.0.0.1, fitted by aijobs.local.moto_patches.

moto alone would let two concurrent conditional writes both pass where DynamoDB lets one; the
fitted backend serves DynamoDB operations one at a time (SQS requests stay concurrent: long polls).
"""

from __future__ import annotations

import logging
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

from aijobs.local.moto_patches import fit_moto


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
        fit_moto()
        app = DomainDispatcherApplication(create_backend_app)
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
