"""The template's parameters of shared limits and budgets reach the worker, and accept what the engine does."""

from __future__ import annotations

import re

import pytest

from aijobs.stack import load_template
from engine.config import load_settings
from engine.core.errors import ConfigurationError

TEMPLATE = load_template()
BASE = {"JOBS_TABLE_NAME": "aijobs-jobs", "JOBS_QUEUE_URL": "https://sqs/q", "JOBS_PAYLOAD_BUCKET": "aijobs-payloads"}


def test_the_worker_gets_the_limits_and_the_default_budget_from_their_parameters() -> None:
    variables = TEMPLATE["Resources"]["WorkerFunction"]["Properties"]["Environment"]["Variables"]

    assert variables["AIJOBS_PROVIDER_LIMITS"] == {"Ref": "ProviderLimits"}
    assert variables["AIJOBS_DEFAULT_DAILY_BUDGET_USD"] == {"Ref": "DefaultDailyBudgetUsd"}
    for name in ("ProviderLimits", "DefaultDailyBudgetUsd"):
        assert TEMPLATE["Parameters"][name]["Default"] == ""  # off unless asked for


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
