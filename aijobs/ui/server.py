"""The dashboard served by uvicorn on a thread of its own, on a socket bound first, so that port 0 (any
free port) has an address to print before the first request. Signals are left to the caller."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import uvicorn

from aijobs.client import AiJobsClient
from aijobs.ui.app import REFRESH_SECONDS, create_app
from aijobs.ui.guard import LOOPBACK_NAMES

DEFAULT_PORT = 8765
START_SECONDS = 10.0


class DashboardServer:
    def __init__(
        self,
        client: AiJobsClient,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        allow_actions: bool = False,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self.host = host
        # The Host names it answers to: loopback's, and the address it is bound to unless that is a wildcard.
        self.hosts = LOOPBACK_NAMES | ({host.lower()} if not _wildcard(host) else set())
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        app = create_app(client, allow_actions=allow_actions, hosts=self.hosts, refresh_seconds=refresh_seconds)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        port: int = self._socket.getsockname()[1]
        return port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if _wildcard(self.host) else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def start(self) -> DashboardServer:
        """Serve on a thread of its own; returns once it accepts connections."""
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="aijobs-ui", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the dashboard did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=START_SECONDS)
        self._socket.close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
