"""aijobs.deployed: what a deployed stack's outputs and parameters become, tied to template.yaml,
and the one line a stack that cannot be used gives."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from aijobs.deployed import OPTIONAL_STACK_OUTPUTS, STACK_OUTPUTS, STACK_PARAMETERS, stack_environment
from aijobs.stack import load_template
from engine.core.errors import ConfigurationError

TEMPLATE = load_template()


def function_environments() -> list[dict[str, Any]]:
    """The Environment.Variables of the template's Globals and of each function."""
    environments = [TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]]
    for spec in TEMPLATE["Resources"].values():
        if spec["Type"] == "AWS::Serverless::Function":
            environments.append(spec["Properties"].get("Environment", {}).get("Variables", {}))
    return environments


@pytest.mark.parametrize(("output", "variable"), [*STACK_OUTPUTS.items(), *OPTIONAL_STACK_OUTPUTS.items()])
def test_each_output_read_is_in_the_template_with_the_value_the_functions_get(output: str, variable: str) -> None:
    # A renamed output, or one that no longer names what the functions use, breaks here, not for a user.
    assert output in TEMPLATE["Outputs"]
    values = [environment[variable] for environment in function_environments() if variable in environment]
    assert values
    assert all(value == TEMPLATE["Outputs"][output]["Value"] for value in values)


@pytest.mark.parametrize(("parameter", "variable"), STACK_PARAMETERS.items())
def test_each_parameter_read_is_in_the_template_and_sets_that_variable(parameter: str, variable: str) -> None:
    assert parameter in TEMPLATE["Parameters"]
    values = [environment[variable] for environment in function_environments() if variable in environment]
    assert values
    assert all(value == {"Ref": parameter} for value in values)


class OneClient:
    """A session whose CloudFormation client is the stubbed one."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def client(self, service: str) -> Any:
        assert service == "cloudformation"
        return self._client


def stack_error(**answer: Any) -> str:
    """The error of a stack whose DescribeStacks answers `answer` (a stack, or a service error)."""
    client = boto3.client("cloudformation", region_name="eu-west-1")
    with Stubber(client) as stubber:
        if "service_error_code" in answer:
            stubber.add_client_error("describe_stacks", **answer)
        else:
            stubber.add_response("describe_stacks", {"Stacks": [answer]}, {"StackName": "prod"})
        with pytest.raises(ConfigurationError) as caught:
            stack_environment("prod", OneClient(client))  # type: ignore[arg-type]
        stubber.assert_no_pending_responses()
    return str(caught.value)


def test_a_stack_whose_creation_failed_is_named_with_its_status_and_reason_on_one_line() -> None:
    message = stack_error(
        StackName="prod",
        CreationTime="2026-12-01T10:00:00Z",
        StackStatus="ROLLBACK_COMPLETE",
        StackStatusReason="The following resource(s) failed to create: [WorkerFunction].\nRollback requested by user.",
    )

    assert message == (
        "stack prod is ROLLBACK_COMPLETE: The following resource(s) failed to create: [WorkerFunction].\\n"
        "Rollback requested by user."
    )


def test_a_stack_being_deleted_is_refused() -> None:
    message = stack_error(StackName="prod", CreationTime="2026-12-01T10:00:00Z", StackStatus="DELETE_IN_PROGRESS")

    assert message == "stack prod is DELETE_IN_PROGRESS"


def test_a_refused_describe_says_why() -> None:
    refusal = "User: arn:aws:iam::123456789012:user/dev is not authorized to perform: cloudformation:DescribeStacks"

    message = stack_error(service_error_code="AccessDenied", service_message=refusal, http_status_code=403)

    assert message == f"stack prod: cannot read it ({refusal})"


def test_an_unknown_stack_names_the_region_it_was_looked_for_in() -> None:
    message = stack_error(
        service_error_code="ValidationError", service_message="Stack with id prod does not exist", http_status_code=400
    )

    assert message == "stack prod does not exist in eu-west-1"


def test_without_a_region_the_line_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")

    with pytest.raises(ConfigurationError) as caught:
        stack_environment("prod")

    assert str(caught.value) == "stack prod: cannot read it (You must specify a region.)"
