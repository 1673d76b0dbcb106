"""What each package ships and needs: one source of truth for the functions' dependency versions.

src/requirements.txt pins what `sam build` packages for the Lambda functions; pyproject.toml's
ranges (what `pip install aijobs` takes) must admit every pin, and the code may import nothing
that neither lists: the functions, nothing but their pins; the client and the CLI, nothing of the
`local` extra (moto, PyYAML) outside the embedded stack.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PINS = {
    Requirement(line).name.lower(): Requirement(line)
    for line in (ROOT / "src" / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}
RANGES = {Requirement(spec).name.lower(): Requirement(spec) for spec in PYPROJECT["project"]["dependencies"]}
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
LOCAL_EXTRA = {Requirement(spec).name.lower() for spec in EXTRAS["local"]}
# The dashboard's (aijobs/ui), which nothing else of the package imports.
UI_EXTRA = {Requirement(spec).name.lower() for spec in EXTRAS["ui"]}
# Only the command needs these; the functions never import them.
COMMAND_ONLY = {"pyyaml", "rich", "typer"}
# The managed Python runtime's own SnapStart hook library, imported only when present.
RUNTIME_PROVIDED = {"snapshot_restore_py"}


def test_every_pin_is_exact_and_admitted_by_the_packages_range() -> None:
    for name, pin in PINS.items():
        (specifier,) = pin.specifier
        assert specifier.operator == "==", f"{name} is not pinned"
        assert name in RANGES, f"{name} is pinned for the functions but not a dependency of the package"
        assert RANGES[name].specifier.contains(specifier.version), f"{RANGES[name]} does not admit {pin}"


def test_the_package_depends_on_the_functions_pins_and_the_commands_needs_only() -> None:
    assert set(RANGES) == set(PINS) | COMMAND_ONLY


def installed_closure(names: set[str]) -> set[str]:
    """The distributions `names` bring with them, as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in metadata.requires(name) or []:
            parsed = Requirement(requirement)
            if parsed.marker is None or parsed.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(parsed.name))
    return {canonicalize_name(name) for name in seen}


def third_party_imports(folder: Path) -> Iterator[tuple[Path, str]]:
    """(file, top-level module) of every import under `folder` that is neither stdlib nor the project's,
    leaving out imports for type checking only."""
    own = {"engine", "handlers", "jobtypes", "aijobs"}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        type_checking = {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in type_checking:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own:
                    yield path, top


def distribution_of(module: str) -> set[str]:
    return {canonicalize_name(name) for name in metadata.packages_distributions().get(module, [module])}


@pytest.mark.parametrize("folder", ["src/engine", "src/handlers", "src/jobtypes"])
def test_the_functions_import_nothing_but_their_pins(folder: str) -> None:
    allowed = installed_closure(set(PINS))
    for path, module in third_party_imports(ROOT / folder):
        if module in RUNTIME_PROVIDED:
            continue
        assert distribution_of(module) & allowed, f"{path.relative_to(ROOT)} imports {module}, which is not pinned"


def test_the_client_and_the_command_need_an_extra_only_for_the_embedded_stack_and_the_dashboard() -> None:
    core = installed_closure(set(RANGES))
    local = installed_closure(LOCAL_EXTRA) - core
    ui = installed_closure(UI_EXTRA) - core
    embedded_stack = {ROOT / "aijobs" / "stack.py", ROOT / "aijobs" / "demo.py"}
    for path, module in third_party_imports(ROOT / "aijobs"):
        found, where = distribution_of(module), path.relative_to(ROOT)
        if path.parent.name == "ui":
            assert found & (core | ui), f"{where} imports {module}, which neither the package nor `ui` lists"
            continue
        assert not found & (ui - local), f"{where} imports {module} from the ui extra"
        if found & local:
            assert path in embedded_stack or path.parent.name == "local", (
                f"{where} imports {module} from the local extra"
            )
