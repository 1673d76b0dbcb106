"""After `sam build`: each function holds the engine, its handlers, your own job types and their
pinned dependencies, nothing else.

Every top-level entry of a function's build folder must be `engine`, `handlers`, `jobtypes` (the
package of your own job types, which the registry loads whenever it is there), requirements.txt,
or belong to a distribution that src/requirements.txt pins (directly or as a dependency), as the
build's own *.dist-info records say. Every module of src/engine, src/handlers and src/jobtypes
must be there but those of `engine/testing` (the stores in memory: test support, which src/Makefile
leaves out), and those must not. Prints one line per function; exits 1 on anything else.
"""

from __future__ import annotations

import sys
from pathlib import Path

BUILD = Path(".aws-sam/build")
SOURCE = Path("src")
PROJECT_PACKAGES = ("engine", "handlers", "jobtypes")
PROJECT_ENTRIES = {*PROJECT_PACKAGES, "requirements.txt"}
FORBIDDEN = {"aijobs", "tests", "bench", "moto", "yaml", "rich", "typer"}
# Parts of the project's packages that only tests use.
TEST_SUPPORT = Path("engine/testing")


def distribution_entries(folder: Path) -> dict[str, str]:
    """Top-level entry -> the distribution that installed it, from the dist-info RECORD files."""
    owners: dict[str, str] = {}
    for record in folder.glob("*.dist-info/RECORD"):
        distribution = record.parent.name.split("-")[0]
        owners[record.parent.name] = distribution
        for line in record.read_text().splitlines():
            top = line.split(",", 1)[0].split("/", 1)[0]
            if top:
                owners.setdefault(top, distribution)
    return owners


def modules(root: Path) -> set[Path]:
    """The project's modules under `root` (src/ or a function's build folder), relative to it."""
    return {path.relative_to(root) for package in PROJECT_PACKAGES for path in (root / package).rglob("*.py")}


def check(folder: Path, source: Path = SOURCE) -> list[str]:
    owners = distribution_entries(folder)
    problems = []
    for entry in sorted(path.name for path in folder.iterdir()):
        if entry in FORBIDDEN:
            problems.append(f"{entry} is shipped, and the function never imports it")
        elif entry not in PROJECT_ENTRIES and entry not in owners and not entry.startswith("__pycache__"):
            problems.append(f"{entry} belongs to no pinned distribution")
    if (folder / TEST_SUPPORT).exists():
        problems.append(f"{TEST_SUPPORT} is shipped, and only tests use it")
    wanted = {module for module in modules(source) if not module.is_relative_to(TEST_SUPPORT)}
    if missing := sorted(wanted - modules(folder)):
        problems.append(f"{len(missing)} modules of src/ are missing: {', '.join(map(str, missing[:3]))}")
    return problems


def main() -> int:
    functions = sorted(path for path in BUILD.glob("*Function") if path.is_dir())
    if not functions:
        print(f"no functions under {BUILD}: run sam build first", file=sys.stderr)
        return 1
    failed = False
    for folder in functions:
        problems = check(folder)
        distributions = sorted(set(distribution_entries(folder).values()))
        status = "ok" if not problems else "; ".join(problems)
        print(f"{folder.name}: engine, handlers, jobtypes and {len(distributions)} distributions ({status})")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
