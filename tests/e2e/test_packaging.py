"""The package as `pip install aijobs` gets it: a wheel that carries the template, and runs the demo
from anywhere (no source checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from aijobs.demo import sample_jobs
from aijobs.local.samples import SAMPLES

ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = ROOT / "aijobs" / "local" / "samples"
PACKAGE_FILES = ("pyproject.toml", "README.md", "template.yaml")
PACKAGE_FOLDERS = ("src", "aijobs")
DEMO_JOBS = len(sample_jobs("count"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of what the package is made of: pip builds in place, and its build/ folder
    # must not land in the checkout.
    source = tmp_path_factory.mktemp("source")
    for name in PACKAGE_FILES:
        shutil.copy2(ROOT / name, source / name)
    for name in PACKAGE_FOLDERS:
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("aijobs-*.whl")
    return built


def source_modules() -> set[str]:
    """Every module of the four packages, as a path inside the wheel."""
    modules = {path.relative_to(ROOT / "src").as_posix() for path in (ROOT / "src").rglob("*.py")}
    modules |= {path.relative_to(ROOT).as_posix() for path in (ROOT / "aijobs").rglob("*.py")}
    return modules


def test_the_wheel_ships_every_module_the_command_and_the_template_but_no_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()

    tops = {name.split("/")[0] for name in names if not name.startswith("aijobs-")}
    assert tops == {"aijobs", "engine", "handlers", "jobtypes"}
    assert {name for name in names if name.endswith(".py")} == source_modules()
    template = zipfile.ZipFile(wheel).read("aijobs/template.yaml")
    assert template == (ROOT / "template.yaml").read_bytes()
    # and the dashboard's templates and static files
    dashboard = {path.relative_to(ROOT).as_posix() for path in (ROOT / "aijobs" / "ui").glob("*/*.*")}
    assert {"aijobs/ui/templates/base.html", "aijobs/ui/static/refresh.js"} <= dashboard <= set(names)
    # and the sample documents and images the demo sends
    for sample in SAMPLES:
        assert zipfile.ZipFile(wheel).read(f"aijobs/local/samples/{sample}") == (SAMPLES_DIR / sample).read_bytes()


def test_the_demo_runs_from_the_installed_wheel_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    # Given the wheel installed into a folder of its own, ahead of the checkout on the path
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "JOBS_", "AI_"))}
    environment["PYTHONPATH"] = str(site)

    # When the installed package locates its template and runs the demo from an unrelated folder
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import aijobs.stack, engine.testing, aijobs.local.devstack as d;"
            "print(aijobs.stack.DEFAULT_TEMPLATE); print(engine.testing.__file__); print(d.__file__)",
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    demo = subprocess.run(
        [sys.executable, "-m", "aijobs", "demo"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )

    # Then both come from the wheel, and every demo job ends as meant
    assert all(Path(line).is_relative_to(site) for line in where.stdout.split())
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert f"{DEMO_JOBS} of {DEMO_JOBS}" in demo.stdout


# `pip install aijobs` without the `local` extra: moto and PyYAML cannot be imported.
WITHOUT_LOCAL_EXTRA = """
import sys
from importlib.abc import MetaPathFinder


class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"moto", "yaml"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
sys.argv[0] = "aijobs"
from aijobs.cli import main

main()
"""


def run_without_local_extra(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "aijobs_without_local.py"
    script.write_text(WITHOUT_LOCAL_EXTRA)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("JOBS_", "AIJOBS_"))}
    return subprocess.run(
        [sys.executable, str(script), *args], env=environment, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("command", ["dev", "demo"])
def test_without_the_local_extra_the_embedded_stack_says_what_to_install(tmp_path: Path, command: str) -> None:
    completed = run_without_local_extra(tmp_path, command)

    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines() == [
        f"error: aijobs {command} runs the embedded stack, which needs moto (not installed): "
        "pip install 'aijobs[local]'"
    ]


def test_without_the_local_extra_the_client_commands_still_run(tmp_path: Path) -> None:
    # Nothing configured: the command gets as far as asking for a stack, importing neither moto nor PyYAML.
    completed = run_without_local_extra(tmp_path, "status", "any-job")

    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines() == [
        "error: no stack configured: pass --stack NAME (or set AIJOBS_STACK), "
        "or set JOBS_TABLE_NAME, JOBS_QUEUE_URL and JOBS_PAYLOAD_BUCKET"
    ]
