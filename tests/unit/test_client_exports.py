"""`from aijobs import ...`: the client, and every error its calls raise on purpose, from the package itself."""

from __future__ import annotations

import ast
import builtins
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import aijobs
from engine.core.errors import AiJobsError

ROOT = Path(__file__).resolve().parents[2]
# The modules a client call runs through: the client, what it attaches, the stack it reads by name,
# and the stores it reads and writes with.
CLIENT_PATHS = [
    "aijobs/client.py",
    "aijobs/attachments.py",
    "aijobs/deployed.py",
    "src/engine/definitions/registry.py",
    "src/engine/intake.py",
    *(f"src/engine/store/{name}.py" for name in ("admin_writes", "listing", "payloads", "reads", "retries", "usage")),
    *(f"src/engine/store/{name}.py" for name in ("budgets", "batches", "table")),
]
# Raised there but never out of a client call: caught by the client (a bad message), or raised by
# what no client call runs (the sweep that deletes payloads).
NOT_OUT_OF_A_CLIENT_CALL = {"BadMessageError", "PayloadDeleteError"}
WHAT_USERS_CATCH = [
    "AiJobsError",
    "ConfigurationError",
    "MissingSettingsError",
    "JobError",
    "InputValidationError",
    "InvalidArgumentError",
    "UnknownJobTypeError",
    "SchemaVersionMismatchError",
    "JobConflictError",
    "JobNotFoundError",
    "JobStateError",
    "JobNotFailedError",
]


def raised_names(path: Path) -> set[str]:
    """The names of the exceptions a module raises by name: `raise X(...)` and `raise X`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


def test_every_name_of_all_is_importable_from_aijobs() -> None:
    for name in aijobs.__all__:
        exported = getattr(aijobs, name)
        assert exported.__name__ == name
    namespace: dict[str, object] = {}
    exec(f"from aijobs import {', '.join(aijobs.__all__)}", namespace)
    assert set(aijobs.__all__) <= set(namespace)


@pytest.mark.parametrize("name", WHAT_USERS_CATCH)
def test_the_errors_users_catch_are_exported_as_the_engine_raises_them(name: str) -> None:
    exported = getattr(aijobs, name)

    assert name in aijobs.__all__
    assert issubclass(exported, AiJobsError)
    assert exported is getattr(importlib.import_module(exported.__module__), name)


def test_every_error_a_client_call_raises_on_purpose_is_exported() -> None:
    exported = tuple(getattr(aijobs, name) for name in aijobs.__all__ if isinstance(getattr(aijobs, name), type))
    for path in CLIENT_PATHS:
        module = importlib.import_module(path.removeprefix("src/").removesuffix(".py").replace("/", "."))
        for name in raised_names(ROOT / path):
            raised = getattr(module, name, None) or getattr(builtins, name, None)
            assert isinstance(raised, type), (path, name)
            if issubclass(raised, AiJobsError) and name not in NOT_OUT_OF_A_CLIENT_CALL:
                assert raised in exported, f"{path} raises {name}, which `aijobs` does not export"


def test_a_bad_argument_is_both_an_input_validation_error_and_a_value_error() -> None:
    refused = aijobs.InvalidArgumentError("user_id", "'a b' is not a user id")

    assert isinstance(refused, aijobs.InputValidationError)
    assert isinstance(refused, ValueError)
    assert (refused.argument, refused.detail, str(refused)) == (
        "user_id",
        "'a b' is not a user id",
        "user_id: 'a b' is not a user id",
    )


def test_importing_the_package_loads_neither_the_client_nor_the_engine() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, aijobs; print(sorted(m for m in sys.modules if m.startswith(('engine', 'boto3', 'aijobs.'))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )

    assert loaded.stdout.strip() == "[]"
