"""The stack's resources created from template.yaml's own properties, on any DynamoDB/SQS endpoint.

Used by the tests and the local stack so that what runs locally is what `sam deploy` creates:
the same key schema, indexes, TTL, visibility timeout and redrive policy.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import boto3
import yaml

# The stack's template, shipped with the package (a link to the repository's template.yaml in a
# checkout, a copy in a built wheel), so that `aijobs dev` runs from an installed package too.
DEFAULT_TEMPLATE = Path(str(resources.files("aijobs") / "template.yaml"))
REGION_ACCOUNT = ("us-east-1", "123456789012")
# The events the local tap copies besides the webhook's: a guarded canary ended by itself
# (engine.job_type_tally.ROLLED_BACK, docs/events.md), which the webhook, about jobs, does not carry.
OPERATOR_EVENTS = ("Job Type Rolled Back",)


class _CloudFormationLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short-form tags (!Ref, !GetAtt, !Sub, ...) as plain mappings."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    # !Ref and !Condition stand for Ref and Condition; every other tag for its Fn:: function.
    name = suffix if suffix in {"Ref", "Condition"} else f"Fn::{suffix}"
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


@functools.cache
def load_template(path: Path = DEFAULT_TEMPLATE) -> dict[str, Any]:
    """The template, parsed once per process: a shared document that callers read and never change."""
    loaded: dict[str, Any] = yaml.load(path.read_text(), Loader=_CloudFormationLoader)
    return loaded


def function_timeout(template: dict[str, Any], function: str) -> float:
    """A function's Timeout in seconds, from its properties or the template's Globals."""
    properties = template["Resources"][function].get("Properties", {})
    globals_ = template.get("Globals", {}).get("Function", {})
    return float(properties.get("Timeout", globals_.get("Timeout", 3)))


def batching_window(template: dict[str, Any], function: str, queue: str) -> float:
    """The MaximumBatchingWindowInSeconds of a function's SQS event source on the queue resource `queue`."""
    for event in template["Resources"][function]["Properties"].get("Events", {}).values():
        properties = event.get("Properties", {})
        if event.get("Type") == "SQS" and properties.get("Queue") == {"Fn::GetAtt": [queue, "Arn"]}:
            return float(properties.get("MaximumBatchingWindowInSeconds", 0))
    raise KeyError(f"template: {function} has no SQS event source on {queue}")


@dataclass(frozen=True, slots=True)
class StackResources:
    table_name: str
    queue_url: str
    background_queue_url: str
    dlq_url: str
    payload_bucket: str
    event_bus: str
    # Local only: a queue the bus's completion events are copied to, for `aijobs events`.
    events_queue_url: str

    def environment(self) -> dict[str, str]:
        return {
            "JOBS_TABLE_NAME": self.table_name,
            "JOBS_QUEUE_URL": self.queue_url,
            "JOBS_BACKGROUND_QUEUE_URL": self.background_queue_url,
            "JOBS_DLQ_URL": self.dlq_url,
            "JOBS_PAYLOAD_BUCKET": self.payload_bucket,
            "AIJOBS_EVENT_BUS": self.event_bus,
            "JOBS_EVENTS_QUEUE_URL": self.events_queue_url,
        }


# Resolves to "leave this property out" (AWS::NoValue), removed from the resolved properties.
_NO_VALUE = object()


class TemplateResolver:
    """Resolves the intrinsic functions the template uses (Ref, GetAtt of an Arn, Sub, If, conditions).

    Parameters take their defaults unless `parameters` overrides them; a resource resolves once its
    physical id and ARN are registered (`physical`, `arns`).
    """

    def __init__(
        self,
        template: dict[str, Any],
        stack_name: str,
        region: str,
        account: str,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.parameters = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
        self.parameters.update(parameters or {})
        self.conditions: dict[str, Any] = template.get("Conditions", {})
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
            return [item for item in (self.resolve(item) for item in value) if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if set(value) == {"Fn::If"}:
            condition, if_true, if_false = value["Fn::If"]
            return self.resolve(if_true if self.condition(condition) else if_false)
        if set(value) == {"Ref"}:
            ref = value["Ref"]
            if ref == "AWS::NoValue":
                return _NO_VALUE
            for table in (self.pseudo, self.parameters, self.physical):
                if ref in table:
                    return table[ref]
            raise KeyError(f"template: cannot resolve Ref {ref}")
        if set(value) == {"Fn::GetAtt"}:
            resource, attribute = value["Fn::GetAtt"]
            if attribute == "Arn":
                return self.arns[resource]
            if attribute == "QueueName":
                return self.physical[resource].rsplit("/", 1)[-1]
            if attribute == "StreamArn":
                return f"{self.arns[resource]}.StreamArn"
            raise KeyError(f"template: cannot resolve GetAtt {resource}.{attribute}")
        if set(value) == {"Fn::Sub"}:
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(self._substitute(m.group(1))), value["Fn::Sub"])
        resolved = {key: self.resolve(item) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not _NO_VALUE}

    def _substitute(self, name: str) -> Any:
        if "." in name:  # ${Resource.Attribute}
            return self.resolve({"Fn::GetAtt": name.split(".", 1)})
        return self.resolve({"Ref": name})

    def condition(self, name: str) -> bool:
        return self._truth(self.conditions[name])

    def _truth(self, expression: Any) -> bool:
        (function, arguments), *_ = expression.items()
        if function == "Fn::Equals":
            left, right = (self.resolve(argument) for argument in arguments)
            return bool(str(left) == str(right))
        if function == "Fn::Not":
            return not self._truth(arguments[0])
        if function == "Fn::And":
            return all(self._truth(argument) for argument in arguments)
        if function == "Condition":
            return self.condition(arguments)
        raise KeyError(f"template: cannot evaluate condition {function}")


def create_stack_resources(
    stack_name: str = "aijobs",
    template_path: Path = DEFAULT_TEMPLATE,
    session: boto3.Session | None = None,
    endpoint_url: str | None = None,
) -> StackResources:
    """Create the template's queues, table and bucket (on moto, or any endpoint `endpoint_url` names)."""
    template = load_template(template_path)
    session = session or _default_session()
    region = session.region_name or REGION_ACCOUNT[0]
    resolver = TemplateResolver(template, stack_name, region, REGION_ACCOUNT[1])
    resources = template["Resources"]
    sqs = session.client("sqs", endpoint_url=endpoint_url)
    dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
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
    buckets = {name: spec for name, spec in resources.items() if spec["Type"] == "AWS::S3::Bucket"}
    bucket_names = {}
    s3 = session.client("s3", endpoint_url=endpoint_url)
    for name, spec in buckets.items():
        properties = resolver.resolve(spec["Properties"])
        bucket_name = properties.get("BucketName", f"{stack_name}-payloads")
        _create_bucket(s3, bucket_name, properties)
        bucket_names[name] = bucket_name
    event_bus, events_queue_url = _create_event_bus(session, endpoint_url, resolver, resources, stack_name)
    return StackResources(
        table_name=table_names["JobsTable"],
        queue_url=resolver.physical["JobsQueue"],
        background_queue_url=resolver.physical["BackgroundJobsQueue"],
        dlq_url=resolver.physical["JobsDeadLetterQueue"],
        payload_bucket=bucket_names["PayloadBucket"],
        event_bus=event_bus,
        events_queue_url=events_queue_url,
    )


def _create_event_bus(
    session: boto3.Session, endpoint_url: str | None, resolver: TemplateResolver, resources: dict[str, Any], stack: str
) -> tuple[str, str]:
    """The completion events' bus (the template's, or "default"), and, as a local stand-in for a
    consumer, a queue with a rule that copies every completion event to it, and every event an
    operator acts on (`aijobs events` shows them all)."""
    spec = resources["JobEventBus"]
    bus = resolver.resolve(spec["Properties"])["Name"] if resolver.condition(spec["Condition"]) else "default"
    events = session.client("events", endpoint_url=endpoint_url)
    if bus != "default":
        events.create_event_bus(Name=bus)
    sqs = session.client("sqs", endpoint_url=endpoint_url)
    url = sqs.create_queue(QueueName=f"{stack}-events-tap")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = dict(resources["WebhookRule"]["Properties"]["EventPattern"])  # the webhook's own: every completion event
    rule["detail-type"] = [*rule["detail-type"], *OPERATOR_EVENTS]
    events.put_rule(Name=f"{stack}-events-tap", EventBusName=bus, EventPattern=json.dumps(rule))
    events.put_targets(Rule=f"{stack}-events-tap", EventBusName=bus, Targets=[{"Id": "tap", "Arn": arn}])
    return bus, url


def _default_session() -> boto3.Session:
    """boto3's default session: its loaders keep the service models parsed between stacks."""
    if boto3.DEFAULT_SESSION is None:
        boto3.setup_default_session()
    assert boto3.DEFAULT_SESSION is not None
    return boto3.DEFAULT_SESSION


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
    stream = properties.get("StreamSpecification")
    if stream:
        params["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    sse = properties.get("SSESpecification")
    if sse:
        params["SSESpecification"] = {"Enabled": sse["SSEEnabled"], "SSEType": sse.get("SSEType", "KMS")} | (
            {"KMSMasterKeyId": sse["KMSMasterKeyId"]} if "KMSMasterKeyId" in sse else {}
        )
    dynamodb.create_table(**params)
    ttl = properties.get("TimeToLiveSpecification")
    if ttl:
        dynamodb.update_time_to_live(TableName=table_name, TimeToLiveSpecification=ttl)
    recovery = properties.get("PointInTimeRecoverySpecification")
    if recovery:
        dynamodb.update_continuous_backups(TableName=table_name, PointInTimeRecoverySpecification=recovery)


def _create_bucket(s3: Any, bucket_name: str, properties: dict[str, Any]) -> None:
    """The bucket with the template's encryption, public access block and lifecycle.

    The bucket policy (TLS only) is left out: the local endpoint speaks plain http on loopback.
    """
    s3.create_bucket(Bucket=bucket_name)
    encryption = properties.get("BucketEncryption")
    if encryption:
        rules = [
            {
                "ApplyServerSideEncryptionByDefault": rule["ServerSideEncryptionByDefault"],
                "BucketKeyEnabled": bool(rule.get("BucketKeyEnabled", False)),
            }
            for rule in encryption["ServerSideEncryptionConfiguration"]
        ]
        s3.put_bucket_encryption(Bucket=bucket_name, ServerSideEncryptionConfiguration={"Rules": rules})
    if "PublicAccessBlockConfiguration" in properties:
        s3.put_public_access_block(
            Bucket=bucket_name, PublicAccessBlockConfiguration=properties["PublicAccessBlockConfiguration"]
        )
    lifecycle = properties.get("LifecycleConfiguration")
    if lifecycle:
        rules = [
            {
                "ID": rule["Id"],
                "Status": rule["Status"],
                "Filter": {"Prefix": rule.get("Prefix", "")},
                "Expiration": {"Days": int(rule["ExpirationInDays"])},
            }
            for rule in lifecycle["Rules"]
        ]
        s3.put_bucket_lifecycle_configuration(Bucket=bucket_name, LifecycleConfiguration={"Rules": rules})
