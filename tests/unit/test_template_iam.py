"""Least privilege as deployed: every IAM statement of the SAM-transformed template, walked.

SAM expands the template before CloudFormation creates anything, and may add roles and policies of
its own (an event source's AWS managed policy, a schedule's role). This walks what it produces:
every policy document, inline or managed, of every resource. A statement that allows an action on
`*` (or on an ARN with a `*` in it) must be one docs/stack.md's "Permissions on `*`" table holds, with the
same roles and actions; no role may attach an AWS managed policy; a parameter that reaches an IAM
resource must not be able to put a `*` there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aijobs.stack import load_template
from tests.support.template import attached_policies, function_role, transformed_template

STACK_PAGE = Path(__file__).resolve().parents[2] / "docs" / "stack.md"
TEMPLATE = load_template()
# How a log group's ARN reads (GetAtt ... Arn ends in ":*": its streams) in the role of its own function.
OWN_LOG_GROUP = "<its own log group>:*"

Row = tuple[str, frozenset[str], frozenset[str], str]


def documented() -> set[Row]:
    """docs/stack.md's table: (statement, roles, actions, resource) per row."""
    section = STACK_PAGE.read_text().split("\n## Permissions on `*`\n", 1)[1].split("\n#", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        sid, roles, actions, resource = (re.findall(r"`([^`]+)`", cell) for cell in cells[:4])
        rows.add((sid[0], frozenset(roles), frozenset(actions), resource[0]))
    return rows


def render(value: Any, own_log_groups: set[str]) -> Iterator[str]:
    """Each resource an IAM `Resource` can be, as text: `${X}` for a reference, both sides of an Fn::If."""
    if isinstance(value, list):
        for item in value:
            yield from render(item, own_log_groups)
    elif isinstance(value, str):
        yield value
    elif set(value) == {"Fn::If"}:
        for branch in value["Fn::If"][1:]:
            yield from render(branch, own_log_groups)
    elif set(value) == {"Ref"}:
        if value["Ref"] != "AWS::NoValue":
            yield f"${{{value['Ref']}}}"
    elif set(value) == {"Fn::GetAtt"}:
        resource, attribute = value["Fn::GetAtt"]
        if RESOURCES[resource]["Type"] == "AWS::Logs::LogGroup" and attribute == "Arn":
            yield OWN_LOG_GROUP if resource in own_log_groups else f"${{{resource}.Arn}}:*"
        else:
            yield f"${{{resource}.{attribute}}}"
    elif set(value) == {"Fn::Split"}:
        # ARNs made of a list parameter (AttachmentBuckets): each reads as the one of its first item.
        delimiter, joined = value["Fn::Split"]
        yield from (text.split(delimiter)[0] for text in render(joined, own_log_groups))
    elif set(value) == {"Fn::Join"}:
        delimiter, items = value["Fn::Join"]
        yield delimiter.join(next(render(item, own_log_groups)) for item in as_list(items))
    elif set(value) == {"Fn::Sub"}:
        text, names = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]
        for name, bound in names.items():
            text = text.replace(f"${{{name}}}", next(render(bound, own_log_groups)))
        yield text
    else:
        raise AssertionError(f"an IAM resource this test cannot read: {value}")


RESOURCES: dict[str, Any] = transformed_template()["Resources"]


def owners(name: str) -> set[str]:
    """The roles a policy resource applies to: the role itself, or the roles that attach it."""
    spec = RESOURCES[name]
    if spec["Type"] == "AWS::IAM::Role":
        return {name}
    attached = {
        role
        for role, other in RESOURCES.items()
        if other["Type"] == "AWS::IAM::Role" and name in attached_policies(role)
    }
    return attached | {role["Ref"] for role in spec["Properties"].get("Roles", [])}


def log_groups_of(role: str) -> set[str]:
    """The log groups of the functions that run as `role`."""
    return {
        spec["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        for name, spec in RESOURCES.items()
        if spec["Type"] == "AWS::Lambda::Function" and function_role(name) == role
    }


def documents(value: Any) -> Iterator[dict[str, Any]]:
    """Every policy document in `value`, through Fn::If (each side), leaving trust policies out."""
    if isinstance(value, list):
        for item in value:
            yield from documents(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key == "PolicyDocument":
                yield from documents_of(item)
            elif key != "AssumeRolePolicyDocument":
                yield from documents(item)


def documents_of(value: Any) -> Iterator[dict[str, Any]]:
    if set(value) == {"Fn::If"}:
        for branch in value["Fn::If"][1:]:
            if branch != {"Ref": "AWS::NoValue"}:
                yield from documents_of(branch)
    else:
        yield value


def allowed_statements() -> Iterator[tuple[str, dict[str, Any]]]:
    """(resource holding it, statement) for every statement that allows something."""
    for name, spec in RESOURCES.items():
        for document in documents(spec.get("Properties", {})):
            for statement in document["Statement"]:
                if statement["Effect"] == "Allow":
                    yield name, statement


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def wildcards() -> set[Row]:
    """Every statement that allows an action on a resource with a `*`, as docs/stack.md's table names it."""
    found: dict[tuple[str, frozenset[str], str], set[str]] = {}
    for name, statement in allowed_statements():
        roles = owners(name)
        own = set().union(*(log_groups_of(role) for role in roles)) if roles else set()
        for resource in render(statement.get("Resource", []), own):
            if "*" in resource:
                key = (statement.get("Sid", f"(no Sid, in {name})"), frozenset(as_list(statement["Action"])), resource)
                found.setdefault(key, set()).update(roles)
    return {(sid, frozenset(roles), actions, resource) for (sid, actions, resource), roles in found.items()}


def test_every_permission_on_a_wildcard_is_the_documented_one_and_every_documented_one_exists() -> None:
    assert wildcards() == documented()


def test_no_role_attaches_an_aws_managed_policy() -> None:
    for name, spec in RESOURCES.items():
        if spec["Type"] == "AWS::IAM::Role":
            for arn in spec["Properties"].get("ManagedPolicyArns", []):
                assert not (isinstance(arn, str) and ":iam::aws:policy/" in arn), f"{name} attaches {arn}"
            # Each one the template's own (a Ref to its ManagedPolicy, maybe on a side of an Fn::If)
            attached_policies(name)


def test_each_function_runs_as_a_role_of_its_own_that_only_lambda_assumes() -> None:
    functions = [name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::Lambda::Function"]
    roles = [function_role(name) for name in functions]
    assert len(set(roles)) == len(functions) == 6
    for role in roles:
        (trust,) = RESOURCES[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert trust == {
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }


@pytest.mark.parametrize(
    ("role", "function"),
    [("ReconcilerFunctionEvery5MinutesRole", "ReconcilerFunction"), ("BatchFunctionEveryMinuteRole", "BatchFunction")],
)
def test_every_role_sam_makes_is_a_schedule_s_that_invokes_its_function_s_alias_only(role: str, function: str) -> None:
    made_by_sam = {
        name
        for name, spec in RESOURCES.items()
        if spec["Type"] == "AWS::IAM::Role" and name not in TEMPLATE["Resources"]
    }
    assert made_by_sam == {"ReconcilerFunctionEvery5MinutesRole", "BatchFunctionEveryMinuteRole"}
    ((_, statement),) = [found for found in allowed_statements() if found[0] == role]
    assert (statement["Action"], statement["Resource"]) == ("lambda:InvokeFunction", {"Ref": f"{function}Aliaslive"})
    # Made only when its function is
    assert RESOURCES[role].get("Condition") == TEMPLATE["Resources"][function].get("Condition")


def test_the_only_role_no_function_runs_as_is_bedrock_s_batch_service_role() -> None:
    # Besides the roles of the functions, of the schedules and of the webhook (EventBridge's)
    functions = {name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::Lambda::Function"}
    roles = {name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::IAM::Role"}
    schedules = {"ReconcilerFunctionEvery5MinutesRole", "BatchFunctionEveryMinuteRole"}
    assert roles - {function_role(name) for name in functions} - schedules == {"BedrockBatchRole", "WebhookRole"}
    (trust,) = RESOURCES["BedrockBatchRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust == {
        "Effect": "Allow",
        "Principal": {"Service": "bedrock.amazonaws.com"},
        "Action": "sts:AssumeRole",
        "Condition": {
            "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
            "ArnEquals": {
                "aws:SourceArn": {
                    "Fn::Sub": "arn:${AWS::Partition}:bedrock:${AWS::Region}:${AWS::AccountId}:model-invocation-job/*"
                }
            },
        },
    }


def parameters_in_iam_resources() -> set[str]:
    names = set()
    for _, statement in allowed_statements():
        for resource in render(statement.get("Resource", []), set()):
            names |= {name for name in re.findall(r"\$\{([^}.]+)\}", resource) if name in TEMPLATE["Parameters"]}
    return names


# A value each parameter that reaches an IAM resource accepts.
ACCEPTED = {
    "AiApiKeySecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:aijobs/key-AbCdEf",
    "AttachmentBuckets": "acme-invoices,acme-scans",
    "AiModelFallback": "us.anthropic.claude-3-5-haiku-20241022-v1:0",
    "AiModelPrimary": "anthropic.claude-3-5-haiku-20241022-v1:0",
    "EventBusName": "orders-bus",
    "KmsKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
}


def test_the_parameters_that_reach_iam_resources_are_known() -> None:
    # A new one needs a pattern that keeps "*" out, and its accepted value here
    assert parameters_in_iam_resources() == set(ACCEPTED)


@pytest.mark.parametrize("parameter", sorted(ACCEPTED))
def test_no_parameter_that_reaches_an_iam_resource_can_put_a_wildcard_there(parameter: str) -> None:
    pattern = TEMPLATE["Parameters"][parameter]["AllowedPattern"]
    value = ACCEPTED[parameter]
    assert re.fullmatch(pattern, value)
    for at in range(len(value) + 1):
        for widened in (value[:at] + "*" + value[at:], value[:at] + "*"):
            assert not re.fullmatch(pattern, widened), f"{parameter} accepts {widened!r}"
