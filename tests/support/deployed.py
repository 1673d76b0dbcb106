"""A stand-in for a stack `sam deploy` made, on moto's CloudFormation.

moto cannot deploy the SAM template itself, so the stand-in has template.yaml's parameters and
exactly its output keys, with the outputs' values naming resources created from the template's own
properties (aijobs.stack.create_stack_resources) and one resource of its own.
"""

from __future__ import annotations

import json
from typing import Any

from aijobs.stack import StackResources, load_template


def stand_in_template(resources: StackResources | None) -> dict[str, Any]:
    """template.yaml's parameters and outputs; without `resources`, no output at all."""
    template = load_template()
    values = (
        {
            "JobsTableName": resources.table_name,
            "JobsQueueUrl": resources.queue_url,
            "BackgroundJobsQueueUrl": resources.background_queue_url,
            "JobsDeadLetterQueueUrl": resources.dlq_url,
            "PayloadBucketName": resources.payload_bucket,
            "CompletionEventBusName": resources.event_bus,
        }
        if resources is not None
        else {}
    )
    outputs = {
        key: {"Value": {"Ref": "EventFailuresQueue"} if key == "EventFailuresQueueUrl" else values.get(key, key)}
        for key in template["Outputs"]
    }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": template["Parameters"],
        "Resources": {"EventFailuresQueue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": outputs if resources is not None else {},
    }


def deploy_stand_in(
    cloudformation: Any, name: str, resources: StackResources | None, parameters: dict[str, str] | None = None
) -> None:
    """Create the stand-in stack `name` (CREATE_COMPLETE once create_stack returns, on moto)."""
    cloudformation.create_stack(
        StackName=name,
        TemplateBody=json.dumps(stand_in_template(resources)),
        Parameters=[{"ParameterKey": key, "ParameterValue": value} for key, value in (parameters or {}).items()],
    )
