"""The settings the deployed functions read: each has a template parameter or a fixed value, the
parameters accept what the engine reads, and the settings check sees exactly what the functions get."""

from __future__ import annotations

import re
import typing
from typing import Any

import pytest
from annotated_types import Ge, Le

from aijobs.stack import load_template
from engine.config import Settings, load_settings
from engine.core.errors import ConfigurationError

TEMPLATE = load_template()
RESOURCES = TEMPLATE["Resources"]
BASE = {"JOBS_TABLE_NAME": "aijobs-jobs", "JOBS_QUEUE_URL": "https://sqs/q", "JOBS_PAYLOAD_BUCKET": "aijobs-payloads"}
FUNCTIONS = ("WorkerFunction", "DeadLetterFunction", "EventsFunction", "ReconcilerFunction", "BatchFunction")
# Settings no deployed function is given, and why (docs/configuration.md says the same).
NOT_DEPLOYED = {
    "AWS_ENDPOINT_URL": "a local endpoint; in Lambda every client talks to AWS",
    "AI_API_KEY": "the key as a plain variable, locally; Lambda reads AI_API_KEY_SECRET_ARN",
    "AIJOBS_DEFAULT_LEASE_SECONDS": "the lease without a Lambda context; in Lambda the invocation's deadline",
    "AIJOBS_JOB_TYPES_REFRESH_SECONDS": "the data job types' refresh; in Lambda its default, docs/jobtypes.md's 60 s",
    "JOBS_DLQ_URL": "the client's (the dashboard's health strip); the functions get their queue from their event",
    "LAMBDA_TASK_ROOT": "set by Lambda itself",
    "POWERTOOLS_TRACE_DISABLED": "tracing is on: the template's Tracing: Active",
}


def environment(function: str) -> dict[str, Any]:
    """The variables a function gets: the template's Globals, then its own."""
    common = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    own = RESOURCES[function]["Properties"].get("Environment", {}).get("Variables", {})
    return dict(common) | dict(own)


def merged() -> dict[str, Any]:
    variables: dict[str, Any] = {}
    for function in FUNCTIONS:
        for name, value in environment(function).items():
            assert variables.setdefault(name, value) == value, f"{name} differs between functions"
    return variables


def parameter_of(variable: str) -> dict[str, Any]:
    reference = merged()[variable]
    assert set(reference) == {"Ref"}, f"{variable} is not a parameter's value"
    return dict(TEMPLATE["Parameters"][reference["Ref"]])


def test_the_settings_check_sees_exactly_the_environment_the_functions_get() -> None:
    assert RESOURCES["SettingsCheck"]["Properties"]["Environment"] == merged()


def test_every_setting_is_given_to_the_deployed_functions_or_said_not_to_be() -> None:
    given = set(merged())
    for field in Settings.model_fields:
        variable = field.upper()
        assert (variable in given) != (variable in NOT_DEPLOYED), variable
    assert set(NOT_DEPLOYED) <= {field.upper() for field in Settings.model_fields}


def test_the_functions_that_parse_messages_get_the_job_modules() -> None:
    for function in ("WorkerFunction", "DeadLetterFunction"):
        assert environment(function)["AIJOBS_JOB_MODULES"] == {"Ref": "JobModules"}


@pytest.mark.parametrize(
    ("variable", "parameter"),
    [
        ("AI_STRUCTURED_OUTPUT", "StructuredOutput"),
        ("AIJOBS_REPAIR_ATTEMPTS", "RepairAttempts"),
        ("AIJOBS_PRICES", "Prices"),
        ("AIJOBS_JOB_MODULES", "JobModules"),
        ("AIJOBS_PROVIDER_LIMITS", "ProviderLimits"),
        ("AIJOBS_DEFAULT_DAILY_BUDGET_USD", "DefaultDailyBudgetUsd"),
    ],
)
def test_the_worker_gets_each_setting_from_its_parameter(variable: str, parameter: str) -> None:
    assert environment("WorkerFunction")[variable] == {"Ref": parameter}


def test_the_parameters_default_to_the_engine_s_defaults() -> None:
    defaults = load_settings(BASE)
    for variable in ("AI_STRUCTURED_OUTPUT", "AIJOBS_REPAIR_ATTEMPTS", "AI_PROVIDER", "AIJOBS_RETENTION_DAYS"):
        assert str(parameter_of(variable)["Default"]) == str(getattr(defaults, variable.lower()))
    for variable in ("AIJOBS_PRICES", "AIJOBS_JOB_MODULES", "AIJOBS_PROVIDER_LIMITS", "AI_MODEL_FALLBACK"):
        assert parameter_of(variable)["Default"] == ""  # none unless asked for
        load_settings(BASE | {variable: ""})


def test_the_structured_output_parameter_allows_exactly_the_engine_s_modes() -> None:
    modes = typing.get_args(Settings.model_fields["ai_structured_output"].annotation)
    assert parameter_of("AI_STRUCTURED_OUTPUT")["AllowedValues"] == list(modes)


@pytest.mark.parametrize(
    "variable",
    [
        "AIJOBS_REPAIR_ATTEMPTS",
        "AIJOBS_BATCH_WINDOW_SECONDS",
        "AIJOBS_BATCH_POLL_SECONDS",
        "AIJOBS_BATCH_RESCUE_SECONDS",
    ],
)
def test_the_number_parameters_have_the_engine_s_bounds_and_default(variable: str) -> None:
    field = Settings.model_fields[variable.lower()]
    low = next(item.ge for item in field.metadata if isinstance(item, Ge))
    high = next(item.le for item in field.metadata if isinstance(item, Le))
    spec = parameter_of(variable)
    assert (spec["MinValue"], spec["MaxValue"], spec["Default"]) == (low, high, field.default)


@pytest.mark.parametrize(
    ("variable", "field"), [("AIJOBS_BATCH_API", "aijobs_batch_api"), ("AIJOBS_FLEX", "aijobs_flex")]
)
def test_an_on_off_parameter_takes_on_and_off_as_the_engine_reads_them(variable: str, field: str) -> None:
    spec = parameter_of(variable)
    assert spec["AllowedValues"] == ["on", "off"]
    read = {value: getattr(load_settings(BASE | {variable: value}), field) for value in spec["AllowedValues"]}
    assert read == {"on": True, "off": False}
    assert spec["Default"] == "off"
    assert getattr(load_settings(BASE), field) is False


def test_the_batch_role_is_the_service_role_with_bedrock_batches_and_unset_otherwise() -> None:
    assert merged()["AIJOBS_BATCH_ROLE_ARN"] == {
        "Fn::If": ["UsesBedrockBatches", {"Fn::GetAtt": ["BedrockBatchRole", "Arn"]}, ""]
    }
    assert load_settings(BASE | {"AIJOBS_BATCH_ROLE_ARN": ""}).aijobs_batch_role_arn is None
    role = "arn:aws:iam::123456789012:role/aijobs-BedrockBatchRole-1A2B3C"
    assert load_settings(BASE | {"AIJOBS_BATCH_ROLE_ARN": role}).aijobs_batch_role_arn == role


@pytest.mark.parametrize(
    ("value", "modules"),
    [
        ("", ()),
        ("myapp.jobs", ("myapp.jobs",)),
        ("myapp.jobs, other_jobs", ("myapp.jobs", "other_jobs")),
        ("a,b,c", ("a", "b", "c")),
        ("myapp/jobs", None),
        ("1abc", None),
        ("a,,b", None),
    ],
)
def test_the_job_modules_parameter_accepts_module_lists_the_engine_splits_alike(
    value: str, modules: tuple[str, ...] | None
) -> None:
    pattern = parameter_of("AIJOBS_JOB_MODULES")["AllowedPattern"]
    assert bool(re.fullmatch(pattern, value)) == (modules is not None)
    if modules is not None:
        assert load_settings(BASE | {"AIJOBS_JOB_MODULES": value}).aijobs_job_modules == modules


@pytest.mark.parametrize("value", ["", "unlimited", "5", "2.50", "0", "123456789.123456", "-1", "abc", "1e3", "5."])
def test_the_budget_parameter_accepts_exactly_what_the_worker_can_read(value: str) -> None:
    pattern = TEMPLATE["Parameters"]["DefaultDailyBudgetUsd"]["AllowedPattern"]
    try:
        load_settings(BASE | {"AIJOBS_DEFAULT_DAILY_BUDGET_USD": value})
    except ConfigurationError:
        readable = False
    else:
        readable = True
    # What CloudFormation lets through, the worker reads (it also reads a few the pattern keeps out)
    if re.fullmatch(pattern, value):
        assert readable
    else:
        assert value in {"1e3", "5."} or not readable
