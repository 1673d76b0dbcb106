"""The README's examples, run as a new user runs them, on the embedded stack: the first job from the
command line and from Python, and the job type of your own with the command that submits it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aijobs.cli import app
from aijobs.local.devstack import DevStack, DevStackOptions

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
# The module the README's job type is written to here, in place of src/jobtypes/triage_ticket.py.
MODULE = "readme_triage_ticket"


def section(heading: str) -> str:
    return README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def submits(text: str) -> list[list[str]]:
    """Each `aijobs submit ...` of the text's shell blocks, as the shell splits it (without `aijobs`)."""
    commands = []
    for block in blocks(text, "sh"):
        for command in re.findall(r"^\.venv/bin/aijobs (submit .*?)(?<!\\)$", block, flags=re.MULTILINE | re.DOTALL):
            commands.append(shlex.split(command.replace("\\\n", " ")))
    return commands


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The README's job type as a module of its own, named in AIJOBS_JOB_MODULES as JobModules would
    # name it: the same registry path as src/jobtypes, without changing the package of this checkout.
    (code,) = blocks(section("Write a job type"), "python")
    folder = tmp_path_factory.mktemp("jobtypes")
    (folder / f"{MODULE}.py").write_text(code + "\n\nJOB_DEFINITIONS = [TRIAGE_TICKET]\n")
    return folder


@pytest.fixture(scope="module")
def dev_stack(module_dir: Path) -> Iterator[DevStack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(module_dir))
        options = DevStackOptions(
            aws_port=0,
            provider_port=0,
            provider_latency_seconds=0,
            quiet=True,
            function_environment={"AIJOBS_JOB_MODULES": MODULE},
        )
        stack = DevStack(options).start()
        try:
            yield stack
        finally:
            stack.stop()


@pytest.fixture
def exported(dev_stack: DevStack, monkeypatch: pytest.MonkeyPatch) -> DevStack:
    """A shell with the lines `aijobs dev` exports pasted into it."""
    for name, value in dev_stack.environment.items():
        monkeypatch.setenv(name, value)
    return dev_stack


def test_the_first_job_from_the_command_line_succeeds(exported: DevStack) -> None:
    (command,) = submits(section("Your first job"))

    result = CliRunner().invoke(app, command)

    assert result.exit_code == 0, result.output
    assert re.search(r"^status\s+succeeded\s*$", result.stdout, flags=re.MULTILINE)


def test_the_first_job_from_python_succeeds(exported: DevStack, capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = blocks(section("Your first job"), "python")

    exec(compile(code, "README.md", "exec"), {})

    status, rest = capsys.readouterr().out.strip().split(" ", 1)
    assert status == "succeeded"
    assert "'label':" in rest
    assert re.search(r"\$\d+\.\d{6}$", rest)


def test_the_job_type_of_your_own_runs_with_the_readme_s_command(exported: DevStack) -> None:
    (command,) = submits(section("Write a job type"))
    assert command[:3] == ["submit", "--type", "triage_ticket"]

    result = CliRunner().invoke(app, [*command, "--json"])

    assert result.exit_code == 0, result.output
    assert '"status": "succeeded"' in result.stdout
    assert '"urgency":' in result.stdout
