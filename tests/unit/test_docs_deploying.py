"""docs/deploying.md and docs/configuration.md's tables against template.yaml and the settings.

Every parameter of the template is in the configuration page's table with its default and bounds;
every parameter the deploying page names exists there with the same default; each of its `sam
deploy --parameter-overrides` commands gives values the template accepts, that pass its Rules and
that the settings check takes; and the counts its cost and permission sections assume (alarms and
the metrics they read, schedules, event sources, log groups, roles, functions) are the template's.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aijobs.stack import load_template
from engine.config import Settings
from engine.settings_check import check_environment
from tests.support.template import transformed_template
from tests.unit.test_template_rules import SECRET, functions_environment, refusals

DOCS = Path(__file__).resolve().parents[2] / "docs"
DEPLOYING = (DOCS / "deploying.md").read_text()
TEMPLATE = load_template()
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
# What the page's shell variables hold, for the commands that use them.
SHELL = {"$SECRET_ARN": SECRET}
MONTH_MINUTES = 30 * 24 * 60
# The tables write a range of numbers (1 to 3650) with an en dash between them.
EN_DASH = "\N{EN DASH}"


def section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def rows(text: str) -> dict[str, list[str]]:
    """{first cell without backticks: the other cells} of every table row in `text`."""
    found = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            found[cells[0].strip("`")] = cells[1:]
    return found


def written(default: Any) -> str:
    """A default as the tables write it: empty, or the value in backticks."""
    return "empty" if default == "" else f"`{default}`"


# --- the parameters -----------------------------------------------------------------------------


def test_the_configuration_page_has_every_variable_the_settings_read() -> None:
    # Given the environment table's rows, then each setting the engine reads has one
    table = rows(section((DOCS / "configuration.md").read_text(), "## Environment variables"))

    assert {field.upper() for field in Settings.model_fields} <= set(table)


def test_the_configuration_page_has_every_parameter_with_its_default_and_bounds() -> None:
    table = rows(section((DOCS / "configuration.md").read_text(), "## Template parameters"))

    assert sorted(table) == sorted(PARAMETERS)
    for name, (bounds, default, _) in table.items():
        spec = PARAMETERS[name]
        assert default.startswith(written(spec.get("Default", ""))), name
        if "MinValue" in spec:
            assert f"{spec['MinValue']}{EN_DASH}{spec['MaxValue']}" in bounds.replace(",", ""), name
        allowed = spec.get("AllowedValues", [])
        # A long list is written as its ends: `DEBUG` … `CRITICAL`
        for value in allowed[:: max(1, len(allowed) - 1)] if "…" in bounds else allowed:
            assert f"`{value}`" in bounds, name


def test_every_parameter_the_deploying_page_tabulates_exists_with_its_default() -> None:
    table = rows(section(DEPLOYING, "## 3. Deploy"))

    assert table, "no parameter table"
    for name, (default, _) in table.items():
        assert name in PARAMETERS
        assert default == written(PARAMETERS[name].get("Default", "")), name


def overrides() -> list[dict[str, str]]:
    """Each `--parameter-overrides` of the page as SAM reads it: Key=Value, a value in single quotes
    kept whole, shell variables replaced by what the page put in them."""
    commands = re.findall(r"^\.venv-sam/bin/sam deploy --parameter-overrides (.*?)\n(?!  )", DEPLOYING, re.M | re.S)
    found = []
    for command in commands:
        given = {}
        for word in shlex.split(command.replace("\\\n", " ")):
            key, value = word.split("=", 1)
            value = SHELL.get(value, value)
            given[key] = value[1:-1] if value.startswith("'") and value.endswith("'") else value
        found.append(given)
    return found


def test_the_page_shows_the_overrides_of_each_provider() -> None:
    providers = [given.get("AiProvider", PARAMETERS["AiProvider"]["Default"]) for given in overrides()]
    assert Counter(providers) == Counter({"openai": 3, "bedrock": 1, "anthropic": 1})
    assert set(providers) == set(PARAMETERS["AiProvider"]["AllowedValues"])


@pytest.mark.parametrize("given", overrides(), ids=lambda given: " ".join(sorted(given)))
def test_each_override_is_a_value_the_template_takes_and_the_settings_check_accepts(given: dict[str, str]) -> None:
    for key, value in given.items():
        spec = PARAMETERS[key]
        assert value in spec.get("AllowedValues", [value]), key
        assert re.fullmatch(spec.get("AllowedPattern", ".*"), value), key
        if "MinValue" in spec:
            assert spec["MinValue"] <= float(value) <= spec["MaxValue"], key

    assert refusals(**given) == []
    check_environment(functions_environment(**given))


# --- what it costs ------------------------------------------------------------------------------


def alarm_metrics(properties: dict[str, Any]) -> int:
    """The metrics an alarm reads, as CloudWatch bills it: each of a metric-math alarm's, or its one."""
    if "Metrics" in properties:
        return sum(1 for metric in properties["Metrics"] if "MetricStat" in metric)
    return 1


def of_type(kind: str, *, transformed: bool = False) -> dict[str, Any]:
    resources = transformed_template()["Resources"] if transformed else RESOURCES
    return {name: spec for name, spec in resources.items() if spec["Type"] == kind}


def cost_rows() -> dict[str, list[str]]:
    table = section(DEPLOYING, "## 5. What it costs").split("### Per job", 1)[0]
    return {
        cells[0]: cells[1:]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| what")
        for cells in [[cell.strip() for cell in line.strip().strip("|").split("|")]]
    }


def test_the_idle_cost_counts_the_template_s_alarms_and_the_metrics_they_read() -> None:
    alarms = of_type("AWS::CloudWatch::Alarm")
    always = {name: spec for name, spec in alarms.items() if "Condition" not in spec}
    assert {spec["Condition"] for name, spec in alarms.items() if name not in always} == {"BatchApiOn"}
    metrics = sum(alarm_metrics(spec["Properties"]) for spec in always.values())
    with_batches = sum(alarm_metrics(spec["Properties"]) for spec in alarms.values())

    in_template, _, month = cost_rows()["alarms"]
    assert in_template == (
        f"{len(always)} alarms reading {metrics} metrics "
        f"(with `BatchApi=on`: {len(alarms)} alarms, {with_batches} metrics)"
    )
    assert month == f"${metrics * 0.10:.2f} (${with_batches * 0.10:.2f})"


def test_the_idle_cost_counts_the_dashboard_event_sources_and_log_groups() -> None:
    costs = cost_rows()
    assert costs["dashboard"][0] == f"{len(of_type('AWS::CloudWatch::Dashboard'))} dashboard"
    sources = [
        event["Properties"]
        for spec in of_type("AWS::Serverless::Function").values()
        for event in spec["Properties"].get("Events", {}).values()
        if event["Type"] == "SQS"
    ]
    limited = sum(1 for source in sources if "ScalingConfig" in source)
    assert costs["queue polling"][0] == f"{len(sources)} SQS event sources ({limited} with `MaximumConcurrency`)"
    groups = of_type("AWS::Logs::LogGroup")
    (retention,) = {spec["Properties"]["RetentionInDays"] for spec in groups.values()}
    assert costs["logs"][0] == f"{len(groups)} log groups, kept {retention} days"


@pytest.mark.parametrize(("row", "function"), [("reconciler", "ReconcilerFunction"), ("batcher", "BatchFunction")])
def test_the_idle_cost_of_each_schedule_is_its_rate_and_memory(row: str, function: str) -> None:
    properties = RESOURCES[function]["Properties"]
    (schedule,) = [event["Properties"] for event in properties["Events"].values() if event["Type"] == "ScheduleV2"]
    expression = schedule["ScheduleExpression"]
    every = re.fullmatch(r"rate\((\d+) minutes?\)", expression)
    assert every is not None
    invocations = MONTH_MINUTES // int(every[1])

    label = next(label for label in cost_rows() if label.startswith(row))
    assert cost_rows()[label][0] == f"`{expression}`: {invocations:,} invocations of {properties['MemorySize']} MB"
    assert ("(`BatchApi=on`)" in label) == (RESOURCES[function].get("Condition") == "BatchApiOn")


def test_every_schedule_of_the_template_has_its_idle_cost() -> None:
    scheduled = {
        name
        for name, spec in of_type("AWS::Serverless::Function").items()
        for event in spec["Properties"].get("Events", {}).values()
        if event["Type"] == "ScheduleV2"
    }
    assert scheduled == {"ReconcilerFunction", "BatchFunction"}
    assert len(of_type("AWS::Scheduler::Schedule", transformed=True)) == len(scheduled)


# --- the deployer's permissions -----------------------------------------------------------------

# The IAM prefix of each service whose resources the transformed template creates.
SERVICES = {
    "CloudFormation": "cloudformation",
    "CloudWatch": "cloudwatch",
    "DynamoDB": "dynamodb",
    "Events": "events",
    "IAM": "iam",
    "Lambda": "lambda",
    "Logs": "logs",
    "S3": "s3",
    "SQS": "sqs",
    "Scheduler": "scheduler",
}
# How the permissions table counts each resource type it names (the most a deployment makes).
COUNTED = {
    "AWS::IAM::Role": "roles",
    "AWS::IAM::ManagedPolicy": "managed policies",
    "AWS::Lambda::Function": "functions",
    "AWS::Lambda::EventSourceMapping": "event source mappings",
    "AWS::SQS::Queue": "queues",
    "AWS::Scheduler::Schedule": "schedules",
    "AWS::CloudWatch::Alarm": "alarms",
    "AWS::CloudWatch::Dashboard": "dashboard",
    "AWS::Logs::LogGroup": "log groups",
}


def permissions() -> str:
    return section(DEPLOYING, "## 4. The permissions the deployer needs")


def test_the_deployer_s_permissions_name_every_service_the_template_creates_resources_of() -> None:
    types = {spec["Type"] for spec in transformed_template()["Resources"].values()}
    services = {kind.split("::")[1] for kind in types if kind.startswith("AWS::")}
    assert services <= set(SERVICES), services - set(SERVICES)

    text = permissions()
    for service in services | {"CloudFormation"}:
        assert f"`{SERVICES[service]}:" in text, service
    # A custom resource is a Lambda function CloudFormation invokes with the deployer's credentials
    assert any(kind.startswith("Custom::") for kind in types)
    assert "`InvokeFunction`" in text


def test_the_deployer_s_permissions_count_what_the_template_makes() -> None:
    text = " ".join(permissions().split())
    resources = transformed_template()["Resources"]
    for kind, noun in COUNTED.items():
        made = [spec for spec in resources.values() if spec["Type"] == kind]
        count = f"{len(made)} {noun}"
        if any("Condition" in spec for spec in made):
            count = f"up to {count}"
        assert count in text, kind
