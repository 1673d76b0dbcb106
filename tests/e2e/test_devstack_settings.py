"""The embedded stack gives its functions the settings it was given, as the template would."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aijobs.cli import app
from aijobs.local.devstack import (
    LOCAL_ANTHROPIC_MODEL,
    LOCAL_API_KEY,
    DevStack,
    DevStackOptions,
    function_variables,
)
from aijobs.local.provider import LocalProvider
from engine.definitions import JobRegistry

EXTRA_JOBS = """
from dataclasses import replace
from engine.definitions.classify import CLASSIFY

JOB_DEFINITIONS = [replace(CLASSIFY, name="classify_again")]
"""


def test_only_the_functions_variables_are_taken_from_an_environment() -> None:
    environ = {
        "AI_MODEL_PRIMARY": "m",
        "AIJOBS_PRICES": "{}",
        "AIJOBS_STACK": "deployed",
        "HOME": "/root",
        "JOBS_TABLE_NAME": "t",
        "PATH": "/bin",
    }

    assert function_variables(environ) == {"AI_MODEL_PRIMARY": "m", "AIJOBS_PRICES": "{}"}


def test_the_local_provider_keeps_its_own_address_and_key_and_the_rest_is_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "devstack_extra_jobs.py").write_text(EXTRA_JOBS)
    monkeypatch.syspath_prepend(str(tmp_path))
    prices = {"my-model": {"input": 1, "output": 2}}
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        quiet=True,
        # moto keeps one account per process: a stack of its own.
        stack_name=f"settings-{uuid.uuid4().hex[:6]}",
        function_environment={
            "AI_API_KEY": "sk-a-real-key-that-must-not-reach-the-local-provider",
            "AI_MODEL_PRIMARY": "my-model",
            "AI_MODEL_FALLBACK": "my-other-model",
            "AI_STRUCTURED_OUTPUT": "json_object",
            "AIJOBS_PRICES": json.dumps(prices),
            "AIJOBS_REPAIR_ATTEMPTS": "2",
            "AIJOBS_JOB_MODULES": "devstack_extra_jobs",
        },
    )
    with DevStack(options) as stack:
        settings = stack.settings
        assert stack.provider is not None
        assert settings.ai_base_url == stack.provider.url
        assert settings.ai_api_key is not None
        assert settings.ai_api_key.get_secret_value() == LOCAL_API_KEY
        assert (settings.ai_model_primary, settings.ai_model_fallback) == ("my-model", "my-other-model")
        assert settings.ai_structured_output == "json_object"
        assert settings.aijobs_repair_attempts == 2
        assert JobRegistry.from_settings(settings).get("classify_again").name == "classify_again"
        assert set(settings.aijobs_prices) == {"my-model"}
        # What another shell is told to export is what the functions run with.
        assert stack.environment["AI_MODEL_PRIMARY"] == "my-model"
        assert stack.environment["AI_API_KEY"] == LOCAL_API_KEY


def test_an_anthropic_provider_of_your_own_is_asked_a_claude_model_when_none_is_named() -> None:
    # Given an Anthropic-compatible provider of one's own, and no AI_MODEL_PRIMARY
    provider = LocalProvider(api_key="their-key", latency_seconds=0.0).start()
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        quiet=True,
        stack_name=f"settings-{uuid.uuid4().hex[:6]}",
        function_environment={
            "AI_PROVIDER": "anthropic",
            "AI_BASE_URL": provider.anthropic_url,
            "AI_API_KEY": "their-key",
        },
    )

    # When the embedded stack starts against it
    try:
        with DevStack(options) as stack:
            # Then it starts (the OpenAI default model would be refused), its functions asking that provider
            # for claude-haiku-4-5, as they ask the local one, and the exports say so
            assert stack.provider is None
            assert (stack.settings.ai_base_url, stack.settings.ai_model_primary) == (
                provider.anthropic_url,
                LOCAL_ANTHROPIC_MODEL,
            )
            assert stack.environment["AI_MODEL_PRIMARY"] == LOCAL_ANTHROPIC_MODEL
    finally:
        provider.stop()


def test_the_dev_command_says_its_state_is_in_memory_only_and_job_types_load_at_start() -> None:
    shown = CliRunner().invoke(app, ["dev", "--help"])

    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.stdout.replace("│", " ").split())
    assert "Its state (jobs, queues, usage, budgets, dead letters) is in memory only" in words
    assert "Job types are loaded once, at start: restart it after adding one" in words
