"""The stack's resources created from template.yaml's own properties, on any DynamoDB/SQS endpoint.

Used by the tests and the local stack so that what runs locally is what `sam deploy` creates:
the same key schema, indexes, TTL, visibility timeout and redrive policy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import yaml

DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
REGION_ACCOUNT = ("us-east-1", "123456789012")


class _CloudFormationLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short-form tags (!Ref, !GetAtt, !Sub, ...) as plain mappings."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_CloudFormationLoader.add_multi_constructor("!", _construct_tag)


def load_template(path: Path = DEFAULT_TEMPLATE) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(path.read_text(), Loader=_CloudFormationLoader)
    return loaded


def function_timeout(template: dict[str, Any], function: str) -> float:
    """A function's Timeout in seconds, from its properties or the template's Globals."""
    properties = template["Resources"][function].get("Properties", {})
    globals_ = template.get("Globals", {}).get("Function", {})
    return float(properties.get("Timeout", globals_.get("Timeout", 3)))


@dataclass(frozen=True, slots=True)
class StackResources:
    table_name: str
    queue_url: str
    dlq_url: str

    def environment(self) -> dict[str, str]:
        return {"JOBS_TABLE_NAME": self.table_name, "JOBS_QUEUE_URL": self.queue_url, "JOBS_DLQ_URL": self.dlq_url}


class _Resolver:
    """Resolves the intrinsic functions the template's table and queues use."""

    def __init__(self, template: dict[str, Any], stack_name: str, region: str, account: str) -> None:
        self.parameters = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
        self.pseudo = {
            "AWS::StackName": stack_name,
            "AWS::Region": region,
            "AWS::AccountId": account,
            "AWS::Partition": "aws",
        }
        self.physical: dict[str, str] = {}
        self.arns: dict[str, str] = {}

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if not isinstance(value, dict):
            return value
        if set(value) == {"Ref"}:
            ref = value["Ref"]
            for table in (self.pseudo, self.parameters, self.physical):
                if ref in table:
                    return table[ref]
            raise KeyError(f"template: cannot resolve Ref {ref}")
        if set(value) == {"Fn::GetAtt"}:
            resource, attribute = value["Fn::GetAtt"]
            if attribute != "Arn":
                raise KeyError(f"template: cannot resolve GetAtt {resource}.{attribute}")
            return self.arns[resource]
        if set(value) == {"Fn::Sub"}:
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(self.resolve({"Ref": m.group(1)})), value["Fn::Sub"])
        return {key: self.resolve(item) for key, item in value.items()}


def create_stack_resources(
    stack_name: str = "aijobs", template_path: Path = DEFAULT_TEMPLATE, session: boto3.Session | None = None
) -> StackResources:
    """Create the template's queues and table (moto or any endpoint boto3 is pointed at)."""
    template = load_template(template_path)
    session = session or boto3.Session()
    region = session.region_name or REGION_ACCOUNT[0]
    resolver = _Resolver(template, stack_name, region, REGION_ACCOUNT[1])
    resources = template["Resources"]
    sqs = session.client("sqs")
    dynamodb = session.client("dynamodb")
    queues = {name: spec for name, spec in resources.items() if spec["Type"] == "AWS::SQS::Queue"}
    # Queues that others name in a redrive policy first.
    for name in sorted(queues, key=lambda n: "RedrivePolicy" in queues[n]["Properties"]):
        properties = resolver.resolve(queues[name]["Properties"])
        queue_name = properties.pop("QueueName", f"{stack_name}-{name}")
        attributes = {key: _queue_attribute(value) for key, value in properties.items()}
        url = sqs.create_queue(QueueName=queue_name, Attributes=attributes)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        resolver.physical[name], resolver.arns[name] = url, arn
    tables = {name: spec for name, spec in resources.items() if spec["Type"] == "AWS::DynamoDB::Table"}
    table_names = {}
    for name, spec in tables.items():
        properties = resolver.resolve(spec["Properties"])
        table_name = properties.get("TableName", f"{stack_name}-jobs")
        _create_table(dynamodb, table_name, properties)
        table_names[name] = table_name
    return StackResources(
        table_name=table_names["JobsTable"],
        queue_url=resolver.physical["JobsQueue"],
        dlq_url=resolver.physical["JobsDeadLetterQueue"],
    )


def _queue_attribute(value: Any) -> str:
    return (
        json.dumps(value) if isinstance(value, dict) else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _create_table(dynamodb: Any, table_name: str, properties: dict[str, Any]) -> None:
    params: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": properties["AttributeDefinitions"],
        "KeySchema": properties["KeySchema"],
        "BillingMode": properties.get("BillingMode", "PAY_PER_REQUEST"),
    }
    if "GlobalSecondaryIndexes" in properties:
        params["GlobalSecondaryIndexes"] = properties["GlobalSecondaryIndexes"]
    if "SSESpecification" in properties:
        params["SSESpecification"] = {"Enabled": properties["SSESpecification"]["SSEEnabled"]}
    dynamodb.create_table(**params)
    ttl = properties.get("TimeToLiveSpecification")
    if ttl:
        dynamodb.update_time_to_live(TableName=table_name, TimeToLiveSpecification=ttl)
