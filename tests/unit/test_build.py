"""What `sam build` ships: src/Makefile's recipe for each function and scripts/check_build.py's check.

The functions ship src/engine, src/handlers and src/jobtypes with their pinned dependencies, and not
engine/testing (the stores in memory, test support). The recipe is run here as SAM runs it, but with
a `python` that installs nothing, so that only what it copies of src/ is looked at (no network).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

from aijobs.stack import load_template

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
MAKEFILE = (SOURCE / "Makefile").read_text()
TEMPLATE = load_template()
FUNCTIONS = {name: spec for name, spec in TEMPLATE["Resources"].items() if spec["Type"] == "AWS::Serverless::Function"}


def load_check_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_build", ROOT / "scripts" / "check_build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_build = load_check_build()


def make_variable(name: str) -> str:
    match = re.search(rf"^{name} := (.+)$", MAKEFILE, flags=re.MULTILINE)
    assert match, f"src/Makefile sets no {name}"
    return match[1].strip()


def build(function: str, artifacts: Path) -> None:
    """src/Makefile's recipe for `function`, its pip step a no-op."""
    subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(SOURCE),
            f"build-{function}",
            f"ARTIFACTS_DIR={artifacts}",
            "PYTHON=true",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_every_function_is_built_by_src_makefile_from_src() -> None:
    for name, spec in FUNCTIONS.items():
        assert spec["Properties"]["CodeUri"] == "src/", name
        assert spec.get("Metadata", {}).get("BuildMethod") == "makefile", name
    assert set(make_variable("FUNCTIONS").split()) == set(FUNCTIONS)


def test_the_makefile_installs_wheels_for_the_runtime_and_architecture_of_the_template() -> None:
    globals_: dict[str, Any] = TEMPLATE["Globals"]["Function"]
    architecture = {"arm64": "aarch64", "x86_64": "x86_64"}[globals_["Architectures"][0]]
    assert make_variable("PLATFORM") == f"manylinux2014_{architecture}"
    assert f"python{make_variable('PYTHON_VERSION')}" == globals_["Runtime"]
    for name, spec in FUNCTIONS.items():
        assert not {"Runtime", "Architectures"} & set(spec["Properties"]), name


def test_a_function_ships_every_module_of_src_but_engine_testing(tmp_path: Path) -> None:
    build("WorkerFunction", tmp_path)

    shipped = check_build.modules(tmp_path)
    assert not (tmp_path / "engine" / "testing").exists()
    assert {Path("engine/views.py"), Path("handlers/worker.py"), Path("jobtypes/__init__.py")} <= shipped
    assert not any(path.name == "__pycache__" for path in tmp_path.rglob("*"))
    assert check_build.check(tmp_path, SOURCE) == []


def shipped_copy(folder: Path) -> Path:
    """A function's folder as a build that shipped all of src/ would hold it."""
    for package in check_build.PROJECT_PACKAGES:
        shutil.copytree(SOURCE / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SOURCE / "requirements.txt", folder)
    return folder


def test_the_check_refuses_a_function_that_ships_engine_testing(tmp_path: Path) -> None:
    folder = shipped_copy(tmp_path)

    assert check_build.check(folder, SOURCE) == ["engine/testing is shipped, and only tests use it"]


def test_the_check_refuses_a_function_missing_a_module(tmp_path: Path) -> None:
    folder = shipped_copy(tmp_path)
    shutil.rmtree(folder / "engine" / "testing")
    (folder / "engine" / "views.py").unlink()

    assert check_build.check(folder, SOURCE) == ["1 modules of src/ are missing: engine/views.py"]
