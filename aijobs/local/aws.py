"""A local AWS endpoint: moto's server on 127.0.0.1, fitted by aijobs.local.moto_patches.

moto alone would let two concurrent conditional writes both pass where DynamoDB lets one; the
fitted backend serves DynamoDB operations one at a time (SQS requests stay concurrent: long polls).

`LocalAws(separate_process=True)` serves it from a process of its own (`python -m aijobs.local.aws`):
moto's work (parsing, conditions, serializing) then never competes with the functions for the
interpreter's lock, as AWS's never competes with Lambda's. That process's garbage collector is
tuned for a server holding a growing state: moto's requests make cyclic garbage by the thousand
(syntax trees linked to their parents, deep copies), and with Python's default thresholds the
objects of requests in flight (long polls, writes waiting for the DynamoDB lock) are promoted at
each of the frequent young collections, die old, and bring on a full collection every few seconds,
which walks all of moto's state (every item, message and stream record: growing with every job)
and stops the server for 150-300 ms within minutes of a burst. There, the startup heap (modules,
service models) is frozen out of the collections, and the young generation is collected every
10,000 allocations (`COLLECTOR_THRESHOLDS`), when most of what it holds is garbage already.
"""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
from typing import IO

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

from aijobs.local.moto_patches import fit_moto

# How long a separate process may take to start serving.
START_SECONDS = 60.0
# The separate process's garbage collector: allocations between young collections (Python's
# default: 700), young collections between middle ones (10), middle ones between old ones (10).
COLLECTOR_THRESHOLDS = (10_000, 20, 10)


class LocalAws:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, separate_process: bool = False) -> None:
        self._host = host
        self._port = port
        self._separate = separate_process
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[str] | None = None
        self._endpoint: str | None = None

    @property
    def endpoint_url(self) -> str:
        if self._endpoint is None:
            raise RuntimeError("the local AWS endpoint is not started")
        return self._endpoint

    def start(self) -> LocalAws:
        if self._separate:
            return self._start_process()
        # One access-log line per request would drown everything else out.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        fit_moto()
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._host, self._port, app, threaded=True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="aijobs-local-aws", daemon=True)
        self._thread.start()
        self._endpoint = f"http://{self._host}:{self._server.server_port}"
        return self

    def _start_process(self) -> LocalAws:
        command = [sys.executable, "-m", "aijobs.local.aws", self._host, str(self._port)]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        line = _read_line(self._process.stdout, START_SECONDS)
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the local AWS endpoint did not start: {line or 'no answer'}")
        self._endpoint = line
        return self

    def stop(self) -> None:
        if self._process is not None:
            # The server process serves until its stdin closes (or its parent dies with it open).
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _read_line(stream: IO[str], timeout: float) -> str:
    """The stream's first line, or "" when none comes within `timeout` seconds."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline().strip()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


def main(argv: list[str]) -> int:
    """Serve on HOST PORT (0: any free port), print the endpoint, and serve until stdin closes."""
    host, port = argv[0], int(argv[1])
    with LocalAws(host, port) as aws:
        _tune_collector()
        print(aws.endpoint_url, flush=True)
        sys.stdin.read()
    return 0


def _tune_collector() -> None:
    """For a process that serves moto and nothing else, once it is up (the module docstring says why)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
