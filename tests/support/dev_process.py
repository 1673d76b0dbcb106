"""`aijobs dev` as a user runs it: a process of its own, its exports read until `ready`, every wait bounded."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

AIJOBS = [sys.executable, "-m", "aijobs"]
READY_SECONDS = 60.0
# `aijobs dev` stops its pollers one after the other, each after its SQS long poll.
STOP_SECONDS = 60.0


def clean_environment() -> dict[str, str]:
    """This environment without anything that points at a stack or a provider."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("JOBS_", "AI_", "AIJOBS_")) and name not in {"AWS_ENDPOINT_URL", "AWS_PROFILE"}
    }
    env["POWERTOOLS_METRICS_DISABLED"] = "true"
    return env


def _read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


class DevProcess:
    """`aijobs dev ARGS` with `environment`; `exported` holds the `export NAME=VALUE` lines it printed,
    `ui_url` the dashboard's address (`ui URL`, with `--ui`), `log_path` its functions' log (`logs PATH`,
    with `--quiet`); `later_lines()`, what it printed on stdout after `ready`."""

    def __init__(self, args: list[str], environment: dict[str, str], log_dir: Path) -> None:
        self._args = args
        self._environment = environment
        self._log = log_dir / "dev.err"
        self.exported: dict[str, str] = {}
        self.ui_url = ""
        self.log_path: Path | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> DevProcess:
        with self._log.open("w") as errors:
            self._process = subprocess.Popen(
                [*AIJOBS, "dev", *self._args], stdout=subprocess.PIPE, stderr=errors, env=self._environment, text=True
            )
        try:
            self._read_exports()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.kill()

    @property
    def log(self) -> str:
        return self._log.read_text()

    def _read_exports(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        lines = self._lines
        # Drained to the end, so the stack's logs never fill the pipe.
        threading.Thread(target=_read_lines, args=(self._process.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty as exc:
                exports = sorted(self.exported)
                raise AssertionError(f"no `ready` within {READY_SECONDS:g}s; exports so far: {exports}") from exc
            if line is None:
                raise AssertionError(f"`aijobs dev` ended before `ready`: {self.log}")
            if line == "ready":
                return
            if line.startswith("ui "):
                self.ui_url = line.removeprefix("ui ")
                continue
            if line.startswith("logs "):
                self.log_path = Path(line.removeprefix("logs "))
                continue
            words = shlex.split(line)
            assert len(words) == 2, line
            assert words[0] == "export", line
            name, _, value = words[1].partition("=")
            self.exported[name] = value

    def later_lines(self) -> list[str]:
        """The lines it printed on stdout since `ready` (or since this was last called), so far."""
        lines = []
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return lines
            if line is not None:
                lines.append(line)

    def aijobs(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Another shell with the exports: an `aijobs` command against this stack."""
        return subprocess.run(
            [*AIJOBS, *args],
            capture_output=True,
            text=True,
            env=clean_environment() | self.exported,
            timeout=timeout,
            check=False,
        )

    def terminate(self) -> int:
        """SIGTERM, as Ctrl-C would: the exit status once it stopped."""
        assert self._process is not None
        self._process.send_signal(signal.SIGTERM)
        return self._process.wait(timeout=STOP_SECONDS)

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
