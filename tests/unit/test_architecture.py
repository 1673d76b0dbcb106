"""docs/architecture.md's Layers against the import contracts that hold them (pyproject.toml's
[tool.importlinter], checked by `lint-imports` in `make lint`): the table's rows are the engine's
layers in the contract's order, and the section names every contract and no other."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS: dict[str, dict[str, Any]] = {
    contract["id"]: contract
    for contract in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}
SECTION = (ROOT / "docs" / "architecture.md").read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]


def table_layers() -> list[set[str]]:
    """The modules of each row of the Layers table, top to bottom (`runner.py` -> runner, `core/` -> core)."""
    rows = [line for line in SECTION.splitlines() if line.startswith("| `")]
    first_cells = [re.split(r"(?<!\\)\|", row)[1] for row in rows]
    return [
        {name.removesuffix(".py").removesuffix("/") for name in re.findall(r"`([^`]+)`", cell)} for cell in first_cells
    ]


def test_the_table_is_the_engines_layers_in_order() -> None:
    contract = CONTRACTS["engine-layers"]
    assert contract["containers"] == ["engine"]
    assert contract["exhaustive"] is True
    assert table_layers() == [{module.strip() for module in layer.split("|")} for layer in contract["layers"]]


def test_the_section_names_every_contract_and_no_other() -> None:
    named = set(re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", SECTION)) - {"lint-imports"}
    assert named == set(CONTRACTS)
