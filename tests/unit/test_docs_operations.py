"""docs/operations.md against template.yaml: the alarms table and the runbook name every alarm the
template creates and no other, and each alarm's threshold parameter with its default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aijobs.stack import load_template

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
TEMPLATE = load_template()
ALARMS: dict[str, Any] = {
    name: spec["Properties"] for name, spec in TEMPLATE["Resources"].items() if spec["Type"] == "AWS::CloudWatch::Alarm"
}


def table(heading: str) -> dict[str, list[str]]:
    """{alarm: its row's other cells} of the first table under `heading`."""
    section = PAGE.read_text().split(f"\n{heading}\n", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.split("\n\n|", 1)[1].split("\n\n", 1)[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+Alarm)`", cells[0])
        if name:
            assert name[1] not in rows, f"{name[1]} twice under {heading}"
            rows[name[1]] = cells[1:]
    return rows


def test_the_alarms_table_names_every_alarm_of_the_template_and_no_other() -> None:
    assert sorted(table("## Alarms")) == sorted(ALARMS)


def test_each_alarm_names_the_parameter_of_its_threshold_with_its_default() -> None:
    for name, (_, parameter_cell) in table("## Alarms").items():
        threshold = ALARMS[name]["Threshold"]
        if isinstance(threshold, dict):
            parameter = threshold["Ref"]
            default = TEMPLATE["Parameters"][parameter]["Default"]
            assert parameter_cell == f"`{parameter}` ({default})", name
        else:
            assert parameter_cell == "—", name


def test_the_runbook_answers_every_alarm_of_the_template_and_no_other() -> None:
    assert sorted(table("## Runbook")) == sorted(ALARMS)
