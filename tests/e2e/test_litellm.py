"""`aijobs dev` against software no one here wrote: the LiteLLM proxy as its OpenAI-compatible provider.

The proxy runs offline from its own venv (`make test` builds `.venv-litellm`, see the Makefile) with
`mock_response` models: `good` answers a classification, `broken` answers 500
(`litellm.InternalServerError`), `limited` answers 429 (`litellm.RateLimitError`). It asks for a key
of its own. So a job succeeds only when `aijobs dev` passed the key, both models and the prices of
its environment on to the worker, as the template would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dev_process import DevProcess, clean_environment

ROOT = Path(__file__).resolve().parents[2]
LITELLM = Path(os.environ.get("AIJOBS_LITELLM", ROOT / ".venv-litellm" / "bin" / "litellm"))
STARTUP_SECONDS = 120.0
WAIT_SECONDS = 60.0
MASTER_KEY = "sk-aijobs-e2e"
ANSWER = {"label": "billing", "confidence": 0.9}
# LiteLLM's mock answers bill 10 prompt and 20 completion tokens.
PRICES = {"good": {"input": 1.0, "output": 2.0}}
GOOD_CALL_USD = (10 * 1.0 + 20 * 2.0) / 1_000_000
CLASSIFY = {"text": "My invoice is wrong", "labels": ["billing", "bug", "other"]}


def proxy_config() -> dict[str, Any]:
    def mock(name: str, response: str) -> dict[str, Any]:
        return {
            "model_name": name,
            "litellm_params": {"model": f"openai/{name}", "api_key": "unused", "mock_response": response},
        }

    return {
        "model_list": [
            mock("good", json.dumps(ANSWER)),
            mock("broken", "litellm.InternalServerError"),
            mock("limited", "litellm.RateLimitError"),
        ],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "num_retries": 0},
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_live(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the LiteLLM proxy exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health/liveliness", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"the LiteLLM proxy was not up within {STARTUP_SECONDS:g}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def litellm_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not LITELLM.exists():
        if os.environ.get("AIJOBS_REQUIRE_LITELLM"):
            pytest.fail(f"the LiteLLM proxy is not installed at {LITELLM} (make test installs it)")
        pytest.skip(f"the LiteLLM proxy is not installed at {LITELLM}: `make test` installs it")
    folder = tmp_path_factory.mktemp("litellm")
    config = folder / "config.json"  # YAML is a superset of JSON
    config.write_text(json.dumps(proxy_config()))
    log = folder / "proxy.log"
    port = free_port()
    # Offline: the built-in model cost map, no telemetry.
    env = clean_environment() | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    command = [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_live(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def dev_environment(proxy_url: str, primary: str, fallback: str | None = None) -> dict[str, str]:
    settings = {
        "AI_BASE_URL": f"{proxy_url}/v1",
        "AI_API_KEY": MASTER_KEY,
        "AI_MODEL_PRIMARY": primary,
        "AIJOBS_PRICES": json.dumps(PRICES),
        # The proxy's mock answers ignore the schema the request names: json_object asks for less.
        "AI_STRUCTURED_OUTPUT": "json_object",
    }
    if fallback:
        settings["AI_MODEL_FALLBACK"] = fallback
    return clean_environment() | settings


def submit(dev: DevProcess, job_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return dev.aijobs(
        *("submit", "--type", "classify", "--user", "u-litellm", "--input", json.dumps(CLASSIFY)),
        *("--job-id", job_id, "--json", *extra),
    )


def inspect(dev: DevProcess, job_id: str) -> dict[str, Any]:
    run = dev.aijobs("inspect", job_id, "--json")
    assert run.returncode == 0, run.stderr
    inspection: dict[str, Any] = json.loads(run.stdout)
    return inspection


def test_a_500_from_the_primary_is_answered_by_the_fallback_with_the_key_and_prices_passed_on(
    litellm_proxy: str, tmp_path: Path
) -> None:
    environment = dev_environment(litellm_proxy, primary="broken", fallback="good")
    with DevProcess(["--port", "0", "--provider-port", "0"], environment, tmp_path) as dev:
        # What the functions get is what another shell is told to export: the provider's, not a local one.
        assert dev.exported["AI_BASE_URL"] == f"{litellm_proxy}/v1"
        assert dev.exported["AI_MODEL_FALLBACK"] == "good"

        run = submit(dev, "litellm-fallback", "--wait", "--timeout", str(WAIT_SECONDS))

        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{dev.log[-3000:]}"
        view = json.loads(run.stdout)
        assert view["status"] == "succeeded"
        assert view["output"] == ANSWER
        assert view["attempt_count"] == 1
        [attempt] = inspect(dev, "litellm-fallback")["attempts"]
        # One attempt: the primary's 500, then the fallback's answer, priced by AIJOBS_PRICES.
        assert (attempt["model"], attempt["tier"], attempt["outcome"]) == ("good", "fallback", "succeeded")
        assert (attempt["input_tokens"], attempt["output_tokens"]) == (10, 20)
        assert attempt["cost_usd"] == pytest.approx(GOOD_CALL_USD)
        assert view["usage"]["cost_usd"] == pytest.approx(GOOD_CALL_USD)


def test_a_429_from_the_provider_puts_the_job_back_without_spending_an_attempt(
    litellm_proxy: str, tmp_path: Path
) -> None:
    environment = dev_environment(litellm_proxy, primary="limited")
    with DevProcess(["--port", "0", "--provider-port", "0"], environment, tmp_path) as dev:
        run = submit(dev, "litellm-limited")
        assert run.returncode == 0, run.stderr

        # Between its tries the job waits queued (it is tried again after a backoff: read until seen so).
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            inspection = inspect(dev, "litellm-limited")
            if inspection["attempts"] and inspection["job"]["status"] == "queued":
                break
            assert time.monotonic() < deadline, f"not seen waiting within {WAIT_SECONDS:g}s:\n{dev.log[-3000:]}"
            time.sleep(0.2)

        job = inspection["job"]
        assert job["status"] == "queued"
        assert job["error"]["code"] == "provider_rate_limited"
        assert job["error"]["retryable"] is True
        assert job["attempt_count"] == 0  # refunded: a 429 does not spend the attempt budget
        assert inspection["attempts"][0]["model"] == "limited"
        assert inspection["attempts"][0]["error_code"] == "provider_rate_limited"

        # Cancelled at once while it waits; tried again meanwhile, it ends cancelled when that try ends.
        cancelled = dev.aijobs("cancel", "litellm-limited", "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        view = json.loads(cancelled.stdout)
        assert view["status"] == "cancelled" or (view["status"] == "running" and view["cancel_requested"])
        deadline = time.monotonic() + WAIT_SECONDS
        while inspect(dev, "litellm-limited")["job"]["status"] != "cancelled":
            assert time.monotonic() < deadline, f"not cancelled:\n{dev.log[-3000:]}"
            time.sleep(0.2)
