"""docs/commands.md against the `aijobs` command itself: a section per command, and each section's
usage line naming exactly the flags the command takes (none it lacks, none left out)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from aijobs.cli import app
from engine.config import Settings
from engine.gateway import build_gateway

PAGE = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
FLAG = re.compile(r"--[a-z][a-z-]*")


def commands(command: Any = None, path: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """{"dead-letters redrive": {"--all", ...}, ...}: every command of the CLI with its long options."""
    command = command or typer.main.get_command(app)
    if hasattr(command, "commands"):
        found: dict[str, set[str]] = {}
        for name, sub in command.commands.items():
            found |= commands(sub, (*path, name))
        return found
    flags = {option for parameter in command.params for option in parameter.opts if option.startswith("--")}
    return {" ".join(path): flags - {"--help"}}


def usage_lines() -> dict[str, str]:
    """{command: the first code block of its `### `aijobs ...`` section}."""
    sections = re.split(r"^### `aijobs ([a-z -]+)`$", PAGE.read_text(), flags=re.MULTILINE)[1:]
    usages = {}
    for name, body in zip(sections[::2], sections[1::2], strict=True):
        block = re.search(r"^```\n(.*?)^```$", body, flags=re.MULTILINE | re.DOTALL)
        assert block is not None, f"the section of aijobs {name} has no usage line"
        usages[name] = block[1]
    return usages


def test_every_command_has_a_section_and_every_section_a_command() -> None:
    assert sorted(usage_lines()) == sorted(commands())


@pytest.mark.parametrize("name", sorted(commands()))
def test_the_usage_line_names_exactly_the_flags_the_command_takes(name: str) -> None:
    usage = usage_lines()[name]

    assert usage.startswith(f"aijobs {name}")
    assert set(FLAG.findall(usage)) == commands()[name]


def test_the_flex_flag_says_the_default_model_is_asked_the_flex_tier_as_the_worker_asks_it() -> None:
    # Given the worker's gateway as `aijobs dev --flex on` builds it: the local OpenAI-compatible provider,
    # the default model
    local = {"jobs_table_name": "jobs", "jobs_queue_url": "http://127.0.0.1:1/q", "jobs_payload_bucket": "payloads"}
    settings = Settings.model_validate(local | {"ai_base_url": "http://127.0.0.1:8700/v1", "aijobs_flex": "on"})
    gateway = build_gateway(settings)
    row = next(line for line in PAGE.read_text().splitlines() if line.startswith("| `--flex` |"))

    # Then the gateway asks the default model's flex tier, and the flag's row says so
    assert gateway._asks_flex(settings.ai_model_primary)
    assert f"the default `{settings.ai_model_primary}` too" in row
