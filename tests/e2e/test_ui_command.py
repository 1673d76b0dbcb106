"""`aijobs ui` as a user runs it: a process of its own against a stack over HTTP (a moto server on
127.0.0.1), which prints its address, serves, and stops on SIGTERM; and its one-line refusals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from aijobs.stack import StackResources

AIJOBS = [sys.executable, "-m", "aijobs"]
BOUND = 30.0


@pytest.fixture
def environment(endpoint_env: StackResources) -> dict[str, str]:
    """This process's environment, which endpoint_env pointed at a fresh stack on the moto server."""
    return dict(os.environ)


@pytest.fixture
def dashboard(environment: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [*AIJOBS, "ui", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment, text=True
    )
    try:
        assert process.stdout is not None
        yield process, process.stdout.readline().strip()  # the first line, printed before it serves
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(BOUND)


def test_ui_prints_its_address_serves_the_stack_and_stops_on_sigterm(
    dashboard: tuple[subprocess.Popen[str], str], endpoint_env: StackResources
) -> None:
    process, url = dashboard

    page = httpx.get(f"{url}jobs", timeout=BOUND)
    health = httpx.get(f"{url}health", timeout=BOUND)
    process.send_signal(signal.SIGTERM)

    assert url.startswith("http://127.0.0.1:")
    assert url.endswith("/")
    assert page.status_code == 200
    assert "embedded stack" in page.text  # AWS_ENDPOINT_URL is a local address
    assert "read-only" in page.text
    assert "queue interactive" in health.text
    assert "queue background" in health.text
    assert process.wait(BOUND) == 0
    assert process.stderr is not None
    assert "the dashboard of embedded stack (read-only); Ctrl-C stops" in process.stderr.read()


def test_ui_on_a_port_in_use_is_one_line_and_exit_1(environment: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        run = subprocess.run(
            [*AIJOBS, "ui", "--port", str(port)], capture_output=True, text=True, env=environment, timeout=BOUND
        )

    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.startswith("error: ")
    assert "in use" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_ui_without_its_extra_says_how_to_install_it(environment: dict[str, str]) -> None:
    # starlette missing, as in `pip install aijobs` without [ui]
    without = "import sys; sys.modules['starlette'] = None; from aijobs.cli import main; sys.argv[0] = 'aijobs'; main()"

    run = subprocess.run(
        [sys.executable, "-c", without, "ui"], capture_output=True, text=True, env=environment, timeout=BOUND
    )

    assert run.returncode == 1
    assert run.stderr.strip() == "error: the dashboard needs starlette: pip install 'aijobs[ui]'"
