"""The `aijobs` command run in this process, as the e2e tests run it against an embedded stack."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner, Result

from aijobs.cli import app


def run(*args: str) -> Result:
    """The command's result, whatever its exit code."""
    return CliRunner().invoke(app, list(args))


def succeeded(*args: str) -> Any:
    """The command's JSON (with --json), else its text; it must succeed."""
    result = run(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout
