"""template.yaml as CloudFormation runs it: after the SAM transform, done offline with samtranslator.

`sam deploy` sends the template with its Transform, and CloudFormation expands every
AWS::Serverless::Function into a function, its version, alias, event source mappings and whatever
role SAM would make. What the deployed functions may do is read from that expansion, not from the
template as written.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

from samtranslator.internal.managed_policies import get_bundled_managed_policy_map
from samtranslator.translator.transform import transform

from aijobs.stack import load_template

# What `sam package` writes in place of CodeUri: src/.
PACKAGED_CODE = "s3://aijobs-artifacts/src.zip"


class BundledManagedPolicies:
    """The ARNs of AWS managed policies by name, from the list samtranslator ships (no IAM request)."""

    def load(self) -> dict[str, str]:
        return dict(get_bundled_managed_policy_map("aws") or {})


@functools.cache
def transformed_template() -> dict[str, Any]:
    """The transformed template, made once per process: callers read it and never change it."""
    template = copy.deepcopy(load_template())
    for spec in template["Resources"].values():
        if spec["Type"] == "AWS::Serverless::Function":
            spec["Properties"]["CodeUri"] = PACKAGED_CODE
    # The transform reads the region from the environment; any region gives the same resources.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    transformed: dict[str, Any] = transform(template, {}, BundledManagedPolicies())
    return transformed


def function_role(function: str) -> str:
    """The logical id of the role a function runs as (its Role, in the transformed template)."""
    role = transformed_template()["Resources"][function]["Properties"]["Role"]
    assert set(role) == {"Fn::GetAtt"}, f"{function} runs as {role}"
    assert role["Fn::GetAtt"][1] == "Arn", f"{function} runs as {role}"
    return str(role["Fn::GetAtt"][0])


def role_policies(role: str) -> list[Any]:
    """The policy documents a role holds: its inline ones, then the template's managed policies it attaches
    (each may still be an Fn::If for the caller's resolver)."""
    resources = transformed_template()["Resources"]
    properties = resources[role]["Properties"]
    documents: list[Any] = []
    for policy in properties.get("Policies", []):
        if set(policy) == {"Fn::If"}:
            condition, if_true, if_false = policy["Fn::If"]
            documents.append({"Fn::If": [condition, if_true["PolicyDocument"], if_false]})
        else:
            documents.append(policy["PolicyDocument"])
    for arn in properties.get("ManagedPolicyArns", []):
        if set(arn) == {"Fn::If"}:
            condition, if_true, if_false = arn["Fn::If"]
            documents.append({"Fn::If": [condition, managed_policy(role, if_true), if_false]})
        else:
            documents.append(managed_policy(role, arn))
    return documents


def managed_policy(role: str, arn: Any) -> Any:
    """The document of a managed policy the role attaches, which must be one of the template's own."""
    resources = transformed_template()["Resources"]
    assert set(arn) == {"Ref"}, f"{role} attaches a managed policy that is not the template's: {arn}"
    assert resources[arn["Ref"]]["Type"] == "AWS::IAM::ManagedPolicy", f"{role} attaches {arn}"
    return resources[arn["Ref"]]["Properties"]["PolicyDocument"]


def attached_policies(role: str) -> list[str]:
    """The template's managed policies a role attaches, on either side of an Fn::If."""
    names = []
    for arn in transformed_template()["Resources"][role]["Properties"].get("ManagedPolicyArns", []):
        for branch in arn["Fn::If"][1:] if set(arn) == {"Fn::If"} else [arn]:
            if branch != {"Ref": "AWS::NoValue"}:
                managed_policy(role, branch)
                names.append(str(branch["Ref"]))
    return names
