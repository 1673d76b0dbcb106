"""A stack deployed with `sam deploy`, by name: its settings read from CloudFormation (DescribeStacks).

The stack's outputs name its table, queue and bucket, and two of its parameters set what the client
must agree on with the workers (retention, the default daily budget). They become the values of the
JOBS_* and AIJOBS_* variables they stand for, over the environment's for those names only, and
engine.config parses the result as it parses any environment.
"""

from __future__ import annotations

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from engine.config import Settings, load_settings
from engine.core.errors import ConfigurationError
from engine.text import one_line

# template.yaml's output -> the variable it gives (tests/unit/test_deployed.py checks both sides).
STACK_OUTPUTS = {
    "JobsTableName": "JOBS_TABLE_NAME",
    "JobsQueueUrl": "JOBS_QUEUE_URL",
    "PayloadBucketName": "JOBS_PAYLOAD_BUCKET",
}
# Outputs a stack deployed from an older template may lack: the variable stays unset then.
OPTIONAL_STACK_OUTPUTS = {
    "BackgroundJobsQueueUrl": "JOBS_BACKGROUND_QUEUE_URL",
}
# template.yaml's parameter -> the variable the functions get from it, which the client reads too.
STACK_PARAMETERS = {
    "RetentionDays": "AIJOBS_RETENTION_DAYS",
    "DefaultDailyBudgetUsd": "AIJOBS_DEFAULT_DAILY_BUDGET_USD",
}
# Statuses in which the stack's resources exist and its outputs name them: created, updated, an
# update rolled back to the previous resources, or an update under way (the resources keep serving).
USABLE_STATUSES = frozenset(
    {
        "CREATE_COMPLETE",
        "UPDATE_COMPLETE",
        "UPDATE_ROLLBACK_COMPLETE",
        "IMPORT_COMPLETE",
        "IMPORT_ROLLBACK_COMPLETE",
        "UPDATE_IN_PROGRESS",
        "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
        "UPDATE_ROLLBACK_IN_PROGRESS",
        "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
        "IMPORT_IN_PROGRESS",
        "IMPORT_ROLLBACK_IN_PROGRESS",
    }
)


def stack_environment(name: str, session: boto3.Session | None = None) -> dict[str, str]:
    """The variables the stack gives, from one DescribeStacks; ConfigurationError naming the stack and
    what is wrong when it cannot be read, does not exist, is not usable, or lacks an output."""
    try:
        cloudformation = (session or boto3.Session()).client("cloudformation")
        (stack,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationError":  # DescribeStacks' answer for a name it does not know
            raise ConfigurationError(f"stack {name} does not exist in {cloudformation.meta.region_name}") from exc
        raise ConfigurationError(one_line(f"stack {name}: cannot read it ({error.get('Message', exc)})")) from exc
    except BotoCoreError as exc:  # no region, no credentials, no connection
        raise ConfigurationError(one_line(f"stack {name}: cannot read it ({exc})")) from exc
    status = stack["StackStatus"]
    if status not in USABLE_STATUSES:
        reason = stack.get("StackStatusReason")
        raise ConfigurationError(one_line(f"stack {name} is {status}" + (f": {reason}" if reason else "")))
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [key for key in STACK_OUTPUTS if key not in outputs]
    if missing:
        raise ConfigurationError(
            f"stack {name} has no output {', '.join(missing)}: not an aijobs stack, or deployed from an older template"
        )
    parameters = {parameter["ParameterKey"]: parameter["ParameterValue"] for parameter in stack.get("Parameters", [])}
    environment = {variable: outputs[key] for key, variable in STACK_OUTPUTS.items()}
    environment.update({variable: outputs[key] for key, variable in OPTIONAL_STACK_OUTPUTS.items() if key in outputs})
    environment.update({variable: parameters[key] for key, variable in STACK_PARAMETERS.items() if key in parameters})
    return environment


def load_stack_settings(name: str, session: boto3.Session | None = None) -> Settings:
    """The environment's settings with the stack's values over them, for the names the stack gives."""
    return load_settings(overrides=stack_environment(name, session))
