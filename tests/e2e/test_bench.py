"""`make bench` on a fresh machine: the settings its cold-start figure builds the worker with, and a
short run of every figure (`python -m bench.figures --quick`) so that a change that breaks the bench
fails `make test`."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import boto3

import bench.figures
from aijobs.stack import load_template
from bench.figures import INIT_ENVIRONMENT, RUNTIME_PYTHON
from engine.config import load_settings
from engine.wiring import build_worker

ROOT = Path(__file__).resolve().parents[2]
# The callables whose first argument is a row's title.
TITLED = {"Figure", "ratio_figure"}


def test_the_cold_start_settings_pass_the_deploy_time_checks() -> None:
    # The provider check refuses the default provider (api.openai.com) without a key; the figure's
    # settings give it the template's kind of key, an ARN its AiApiKeySecretArn parameter accepts.
    build_worker(load_settings(INIT_ENVIRONMENT), boto3.Session(region_name="us-east-1"))

    pattern = load_template()["Parameters"]["AiApiKeySecretArn"]["AllowedPattern"]
    assert re.fullmatch(pattern, INIT_ENVIRONMENT["AI_API_KEY_SECRET_ARN"])


def bench_modules() -> list[Path]:
    """bench/figures.py and every bench module it imports (the blocks whose figures it gathers)."""
    source = Path(bench.figures.__file__)
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            names.update(f"bench.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            names.add(str(node.module))
    paths = [Path(str(importlib.import_module(name).__file__)) for name in sorted(names)]
    return [source, *paths]


def title_pattern(node: ast.expr) -> str | None:
    """A row title as a regular expression: a string as it is, an f-string's fields as `.+`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            re.escape(part.value) if isinstance(part, ast.Constant) else ".+"
            for part in node.values
            if isinstance(part, ast.Constant | ast.FormattedValue)
        )
    return None


def titles_in(tree: ast.AST) -> list[str]:
    """The titles of the rows a module always prints: those of its Figure calls outside an `if`
    (a row printed only when something went wrong, like a run's unfinished jobs, is not one)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute) and node.args:
            callee = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            pattern = title_pattern(node.args[0]) if callee in TITLED else None
            if pattern is not None:
                found.append(pattern)
        found += titles_in(node)
    return found


def full_run_titles() -> list[str]:
    return [pattern for path in bench_modules() for pattern in titles_in(ast.parse(path.read_text()))]


def test_the_title_patterns_are_read_from_the_code() -> None:
    titles = full_run_titles()

    assert re.escape("cold start: import handlers.worker / import boto3") in titles
    assert re.escape("DynamoDB requests, ") + ".+" in titles  # an f-string's field
    assert not any("jobs not succeeded" in title for title in titles)  # printed only on a failed run
    assert len(titles) >= 25


def test_the_quick_bench_prints_every_figure(tmp_path: Path) -> None:
    assert (ROOT / RUNTIME_PYTHON).exists(), "make runtime-venv builds it (make test does)"
    written = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.figures", "--quick", "--json", str(written)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\d+ of \d+ targets met", done.stdout)
    names = [figure["name"] for figure in json.loads(written.read_text())]
    titles = full_run_titles()
    unprinted = [title for title in titles if not any(re.fullmatch(title, name) for name in names)]
    unknown = [name for name in names if not any(re.fullmatch(title, name) for title in titles)]
    assert (unprinted, unknown) == ([], [])
    assert len(names) >= len(titles)


def test_the_worker_imports_nothing_only_other_functions_use() -> None:
    # What only the batcher, the events function and the reconciler use, and the attachments'
    # document libraries, stay out of a worker's cold start (the import the bench measures).
    script = "import sys, handlers.worker; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={"PYTHONPATH": "src"}, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    unneeded = {"engine.batching.batcher", "engine.events", "engine.reconciler", "engine.store.batches", "pypdf", "PIL"}
    assert loaded & unneeded == set()


def test_the_worker_s_setup_leaves_the_data_job_types_libraries_to_a_first_data_job() -> None:
    # jsonschema and cel are a cold start's cost only where a data job type is served: building the
    # worker's parts (what the cold-start figure's setup does) imports neither.
    script = (
        "import sys, handlers.worker; handlers.worker.lambda_handler.prepare(); print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": "src", **INIT_ENVIRONMENT},
        capture_output=True,
        text=True,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.split())
    assert loaded & {"engine.definitions.data", "jsonschema", "cel"} == set()
    assert "engine.definitions.catalog" in loaded
