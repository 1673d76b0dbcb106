"""docs/stack.md's "Resources and roles", claim by claim, against template.yaml.

Every bullet of that section has a check here, and every check a bullet: a claim added to the page
without a check, or a check whose claim was removed, fails as surely as a template that drifted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aijobs.attachments import UPLOAD_PREFIX
from aijobs.stack import TemplateResolver, load_template
from aijobs.target import StackTarget
from engine.batching.batcher import STOP_MARGIN_MS
from engine.config import load_settings
from engine.definitions import MAX_INPUT_BYTES
from engine.gateway.batch_files import SPOOL_MEMORY_BYTES
from engine.gateway.bedrock_batch import JOB_NAME_PREFIX, KEY_PREFIX
from engine.gateway.bedrock_batch import MAX_INPUT_BYTES as BEDROCK_MAX_INPUT_BYTES
from handlers.worker import FUNCTION_TIMEOUT_SECONDS, QUEUE_VISIBILITY_SECONDS
from tests.support.template import function_role, role_policies, transformed_template

DOCS = Path(__file__).resolve().parents[2] / "docs"
TEMPLATE = load_template()
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
REGION, ACCOUNT = "eu-west-1", "123456789012"
KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
SECRET_ARN = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:aijobs-key-AbCdEf"


def claims() -> dict[str, str]:
    """The bullets of docs/stack.md's "Resources and roles": {label: text}."""
    section = (DOCS / "stack.md").read_text().split("\n## Resources and roles\n", 1)[1].split("\n## ", 1)[0]
    return {match[1]: match[2] for match in re.finditer(r"^- \*\*(.+?)\.\*\* (.+)$", section, flags=re.MULTILINE)}


class Resolver(TemplateResolver):
    """The template resolved for a set of parameters, every resource named after its logical id; a log
    group's ARN ends in `:*`, as CloudFormation's GetAtt gives it, and other attributes read `X.Attr`."""

    def resolve(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
            resource, attribute = value["Fn::GetAtt"]
            if attribute not in {"Arn", "QueueName", "StreamArn"}:
                return f"{resource}.{attribute}"
        return super().resolve(value)


def resolver(**parameters: Any) -> TemplateResolver:
    """The template resolved for `parameters`, every resource named after its logical id."""
    resolved = Resolver(TEMPLATE, "aijobs", REGION, ACCOUNT, parameters)
    for name, spec in transformed_template()["Resources"].items():
        service = spec["Type"].split("::")[1].lower()
        resolved.physical[name] = name
        resolved.arns[name] = f"arn:aws:{service}:{REGION}:{ACCOUNT}:{name}"
        if spec["Type"] == "AWS::Logs::LogGroup":
            resolved.arns[name] += ":*"
    return resolved


def properties(name: str, **parameters: Any) -> dict[str, Any]:
    resolved: dict[str, Any] = resolver(**parameters).resolve(RESOURCES[name].get("Properties", {}))
    return resolved


def statements(function: str, **parameters: Any) -> list[dict[str, Any]]:
    """Every statement of the role the function runs as once deployed (the SAM-transformed template)."""
    return role_statements(function_role(function), **parameters)


def role_statements(role: str, **parameters: Any) -> list[dict[str, Any]]:
    """Every statement of a role, its inline policies and the managed ones it attaches, resolved."""
    documents = resolver(**parameters).resolve(role_policies(role))
    return [statement for document in documents for statement in document["Statement"]]


def grants(function: str, **parameters: Any) -> dict[str, set[str]]:
    """{resource: actions} the function's role allows, resolved for `parameters`."""
    return role_grants(function_role(function), **parameters)


def role_grants(role: str, **parameters: Any) -> dict[str, set[str]]:
    """{resource: actions} a role allows, resolved for `parameters`."""
    allowed: dict[str, set[str]] = {}
    for found in role_statements(role, **parameters):
        assert found["Effect"] == "Allow"
        actions = found["Action"] if isinstance(found["Action"], list) else [found["Action"]]
        resources = found["Resource"] if isinstance(found["Resource"], list) else [found["Resource"]]
        for resource in resources:
            allowed.setdefault(resource, set()).update(actions)
    return allowed


def statement(function: str, sid: str, **parameters: Any) -> dict[str, Any]:
    return role_statement(function_role(function), sid, **parameters)


def role_statement(role: str, sid: str, **parameters: Any) -> dict[str, Any]:
    for found in role_statements(role, **parameters):
        if found.get("Sid") == sid:
            return dict(found)
    raise AssertionError(f"{role} has no statement {sid}")


TABLE = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:JobsTable"
BUCKET = f"arn:aws:s3:{REGION}:{ACCOUNT}:PayloadBucket"
QUEUE = f"arn:aws:sqs:{REGION}:{ACCOUNT}:JobsQueue"
BACKGROUND_QUEUE = f"arn:aws:sqs:{REGION}:{ACCOUNT}:BackgroundJobsQueue"
DLQ = f"arn:aws:sqs:{REGION}:{ACCOUNT}:JobsDeadLetterQueue"
OBJECTS = f"arn:aws:s3:{REGION}:{ACCOUNT}:PayloadBucket/*"
TRACES = {"*": {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}}
CONSUME = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
WRITE_LOGS = {"logs:CreateLogStream", "logs:PutLogEvents"}


def own_logs(group: str) -> dict[str, set[str]]:
    """A function's right to write its own log group (the group's ARN ends in `:*`: its streams)."""
    return {f"arn:aws:logs:{REGION}:{ACCOUNT}:{group}:*": WRITE_LOGS}


# --- the claims ---------------------------------------------------------------------------------


def jobs_table(text: str) -> None:
    table = RESOURCES["JobsTable"]
    assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert (table["DeletionPolicy"], table["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert "on demand" in text
    assert "Retain" in text


def backups(text: str) -> None:
    assert properties("JobsTable")["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert "Point-in-time recovery is on" in text


def table_encryption(text: str) -> None:
    assert properties("JobsTable")["SSESpecification"] == {"SSEEnabled": True, "SSEType": "KMS"}
    assert properties("JobsTable", KmsKeyArn=KEY_ARN)["SSESpecification"] == {
        "SSEEnabled": True,
        "SSEType": "KMS",
        "KMSMasterKeyId": KEY_ARN,
    }
    assert "aws/dynamodb" in text
    assert "KmsKeyArn" in text


def retention(text: str) -> None:
    assert properties("JobsTable")["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert TEMPLATE["Parameters"]["RetentionDays"]["Default"] == 90
    environment = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert environment["AIJOBS_RETENTION_DAYS"] == {"Ref": "RetentionDays"}
    assert "`expires_at`" in text
    assert "default 90" in text
    assert "AIJOBS_RETENTION_DAYS" in text


def payload_bucket(text: str) -> None:
    bucket = RESOURCES["PayloadBucket"]
    assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain")
    plain = properties("PayloadBucket")
    assert plain["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert plain["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    (rule,) = plain["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    (kms_rule,) = properties("PayloadBucket", KmsKeyArn=KEY_ARN)["BucketEncryption"][
        "ServerSideEncryptionConfiguration"
    ]
    assert kms_rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": KEY_ARN}
    (expiry,) = properties("PayloadBucket", RetentionDays=30)["LifecycleConfiguration"]["Rules"]
    assert (expiry["Status"], expiry["ExpirationInDays"]) == ("Enabled", 30)
    # No prefix or filter: it expires every key, the uploads of aijobs.attachments included.
    assert not {"Prefix", "Filter", "TagFilters"} & set(expiry)
    assert UPLOAD_PREFIX == "attachments/"
    (deny,) = properties("PayloadBucketPolicy")["PolicyDocument"]["Statement"]
    assert (deny["Effect"], deny["Condition"]) == ("Deny", {"Bool": {"aws:SecureTransport": False}})
    for claim in (
        "256 KiB",
        "`attachments/`",
        "private",
        "TLS only",
        "RetentionDays",
        "kept when the stack is deleted",
    ):
        assert claim in text


def jobs_queue(text: str) -> None:
    queue = properties("JobsQueue")
    worker_timeout = RESOURCES["WorkerFunction"]["Properties"]["Timeout"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["MaximumMessageSize"] == MAX_INPUT_BYTES == 1_048_576
    assert worker_timeout == FUNCTION_TIMEOUT_SECONDS == 300
    assert queue["VisibilityTimeout"] == 6 * worker_timeout == QUEUE_VISIBILITY_SECONDS == 1800
    assert queue["MessageRetentionPeriod"] == 14 * 86_400
    assert queue["RedrivePolicy"]["maxReceiveCount"] == 100
    assert TEMPLATE["Parameters"]["MaxReceiveCount"]["Default"] == 100
    for claim in ("up to 1 MiB", "1800 s", "6 x the worker's 300 s", "14 days", "default 100"):
        assert claim in text
    source = worker_event_source("JobsQueue")
    assert (source["MaximumBatchingWindowInSeconds"], source["ScalingConfig"]) == (0, {"MaximumConcurrency": 10})
    assert "`MaximumConcurrency` (default 10) and no batching window" in text


def worker_event_source(queue: str) -> dict[str, Any]:
    """The properties of the worker's SQS event source on `queue`."""
    (source,) = (
        event["Properties"]
        for event in properties("WorkerFunction")["Events"].values()
        if event["Properties"]["Queue"] == f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}"
    )
    return source


def background_jobs_queue(text: str) -> None:
    queue, background = properties("JobsQueue"), properties("BackgroundJobsQueue")
    assert {name: value for name, value in background.items() if name != "QueueName"} == {
        name: value for name, value in queue.items() if name != "QueueName"
    }
    assert background["QueueName"] == "aijobs-background-jobs"
    source = worker_event_source("BackgroundJobsQueue")
    assert source["BatchSize"] == worker_event_source("JobsQueue")["BatchSize"] == 10
    assert (source["MaximumBatchingWindowInSeconds"], source["ScalingConfig"]) == (5, {"MaximumConcurrency": 5})
    assert TEMPLATE["Parameters"]["BackgroundMaximumConcurrency"]["Default"] == 5
    for claim in ("the same dead-letter queue", "`BackgroundMaximumConcurrency` (default 5)", "batching window of 5 s"):
        assert claim in text


def dead_letter_queue(text: str) -> None:
    dlq, queue = properties("JobsDeadLetterQueue"), properties("JobsQueue")
    assert dlq["SqsManagedSseEnabled"] is True
    assert dlq["MaximumMessageSize"] == queue["MaximumMessageSize"]
    assert dlq["MessageRetentionPeriod"] >= queue["MessageRetentionPeriod"]
    assert dlq["RedriveAllowPolicy"] == {
        "redrivePermission": "byQueue",
        "sourceQueueArns": [
            f"arn:aws:sqs:{REGION}:{ACCOUNT}:aijobs-jobs",
            f"arn:aws:sqs:{REGION}:{ACCOUNT}:aijobs-background-jobs",
        ],
    }
    assert queue["QueueName"] == "aijobs-jobs"
    assert "14 days" in text
    assert "up to 1 MiB" in text
    assert "only the jobs queue" in text


def worker_permissions(text: str) -> None:
    # With no secret, no Bedrock and no key, the worker touches its table, queue, bucket, log and traces only.
    assert grants("WorkerFunction") == {
        TABLE: {"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
        # (SendMessage: a pipeline's children, docs/pipelines.md)
        QUEUE: CONSUME | {"sqs:ChangeMessageVisibility", "sqs:SendMessage"},
        BACKGROUND_QUEUE: CONSUME | {"sqs:ChangeMessageVisibility", "sqs:SendMessage"},
        OBJECTS: {"s3:GetObject", "s3:PutObject"},
        **own_logs("WorkerLogGroup"),
        **TRACES,
    }
    # The provider key: its one secret, and Decrypt through Secrets Manager for that secret only.
    with_secret = grants("WorkerFunction", AiApiKeySecretArn=SECRET_ARN)
    assert with_secret[SECRET_ARN] == {"secretsmanager:GetSecretValue"}
    assert with_secret["*"] == {"kms:Decrypt"} | TRACES["*"]
    assert statement("WorkerFunction", "DecryptProviderApiKey", AiApiKeySecretArn=SECRET_ARN)["Condition"] == {
        "StringEquals": {
            "kms:ViaService": f"secretsmanager.{REGION}.amazonaws.com",
            "kms:EncryptionContext:SecretARN": SECRET_ARN,
        }
    }
    # Bedrock: the configured models only, never a wildcard model outside an inference profile.
    bedrock = {"AiProvider": "bedrock", "AiModelPrimary": "us.anthropic.claude-3-5-haiku-20241022-v1:0"}
    profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    invoked = {
        resource
        for resource, actions in grants("WorkerFunction", **bedrock).items()
        if actions == {"bedrock:InvokeModel"}
    }
    assert invoked == {
        f"arn:aws:bedrock:{REGION}::foundation-model/us.anthropic.claude-3-5-haiku-20241022-v1:0",
        profile,
        "arn:aws:bedrock:*::foundation-model/*",
    }
    routed = statement("WorkerFunction", "InvokeModelsThroughConfiguredProfiles", **bedrock)
    assert routed["Condition"] == {"StringEquals": {"bedrock:InferenceProfileArn": [profile]}}
    with_fallback = grants("WorkerFunction", **bedrock, AiModelFallback="amazon.nova-lite-v1:0")
    assert f"arn:aws:bedrock:{REGION}::foundation-model/amazon.nova-lite-v1:0" in with_fallback
    assert not any("bedrock" in resource for resource in grants("WorkerFunction"))
    # A customer managed key: Decrypt and GenerateDataKey, through DynamoDB and S3 only.
    assert grants("WorkerFunction", KmsKeyArn=KEY_ARN)[KEY_ARN] == {"kms:Decrypt", "kms:GenerateDataKey"}
    assert via_services("WorkerFunction", "UseTableAndPayloadKey") == {
        f"dynamodb.{REGION}.amazonaws.com",
        f"s3.{REGION}.amazonaws.com",
    }
    for claim in (
        "Its own role",
        "`ReceiveMessage`, `DeleteMessage`, `GetQueueAttributes`",
        "`ChangeMessageVisibility`, on the two jobs queues only",
        "`SendMessage` there (a pipeline's children)",
        "configured model ids only",
        "`GetSecretValue`",
        "`KmsKeyArn`",
        "its own log group",
        "X-Ray",
    ):
        assert claim in text


def via_services(function: str, sid: str) -> set[str]:
    services = statement(function, sid, KmsKeyArn=KEY_ARN)["Condition"]["StringEquals"]["kms:ViaService"]
    return set(services) if isinstance(services, list) else {services}


def dead_letter_function_permissions(text: str) -> None:
    assert grants("DeadLetterFunction") == {
        DLQ: CONSUME,
        TABLE: {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
        OBJECTS: {"s3:PutObject"},
        **own_logs("DeadLetterLogGroup"),
        **TRACES,
    }
    assert grants("DeadLetterFunction", KmsKeyArn=KEY_ARN)[KEY_ARN] == {"kms:Decrypt", "kms:GenerateDataKey"}
    assert via_services("DeadLetterFunction", "UseTableAndPayloadKey") == via_services(
        "WorkerFunction", "UseTableAndPayloadKey"
    )
    for claim in ("Its own role", "the dead-letter queue only", "`PutObject`", "its own log group"):
        assert claim in text


def reconciler_permissions(text: str) -> None:
    assert grants("ReconcilerFunction") == {
        f"{TABLE}/index/OpenJobs": {"dynamodb:Query"},
        TABLE: {"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"},
        QUEUE: {"sqs:SendMessage"},
        BACKGROUND_QUEUE: {"sqs:SendMessage"},
        **own_logs("ReconcilerLogGroup"),
        **TRACES,
    }
    # A Query of the data job types' items only (a recounted data pipeline's steps)
    leading = statement("ReconcilerFunction", "ReadJobTypes")["Condition"]["ForAllValues:StringLike"]
    assert leading == {"dynamodb:LeadingKeys": ["JOBTYPES", "JOBTYPE#*"]}
    assert grants("ReconcilerFunction", KmsKeyArn=KEY_ARN)[KEY_ARN] == {"kms:Decrypt"}
    assert via_services("ReconcilerFunction", "UseTableKey") == {f"dynamodb.{REGION}.amazonaws.com"}
    (schedule,) = RESOURCES["ReconcilerFunction"]["Properties"]["Events"].values()
    assert schedule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    for claim in ("Its own role", "every 5 minutes", "its own log group"):
        assert claim in text


BATCHES_ON = {"BatchApi": "on"}
BEDROCK_BATCHES = {"BatchApi": "on", "AiProvider": "bedrock", "AiModelPrimary": "us.amazon.nova-lite-v1:0"}
BATCH_JOBS = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/*"
BATCH_SERVICE_ROLE = f"arn:aws:iam:{REGION}:{ACCOUNT}:BedrockBatchRole"
BATCH_RESOURCES = ("BatchLogGroup", "BatchFunction", "BatchRole", "BatchErrorsAlarm")


def batches(text: str) -> None:
    # Only with BatchApi=on; the service role only with Bedrock too.
    for name in BATCH_RESOURCES:
        assert RESOURCES[name]["Condition"] == "BatchApiOn", name
    assert TEMPLATE["Outputs"]["BatchFunctionName"]["Condition"] == "BatchApiOn"
    assert RESOURCES["BedrockBatchRole"]["Condition"] == "UsesBedrockBatches"
    assert TEMPLATE["Parameters"]["BatchApi"]["Default"] == "off"
    assert not resolver().condition("BatchApiOn")
    assert resolver(**BATCHES_ON).condition("BatchApiOn")
    assert not resolver(**BATCHES_ON).condition("UsesBedrockBatches")
    assert not resolver(AiProvider="bedrock").condition("UsesBedrockBatches")
    assert resolver(**BEDROCK_BATCHES).condition("UsesBedrockBatches")
    function = properties("BatchFunction", **BATCHES_ON)
    assert function["Handler"] == "handlers.batches.lambda_handler"
    assert function["CodeUri"] == RESOURCES["WorkerFunction"]["Properties"]["CodeUri"]
    (schedule,) = function["Events"].values()
    assert (schedule["Type"], schedule["Properties"]) == ("ScheduleV2", {"ScheduleExpression": "rate(1 minute)"})
    assert function["ReservedConcurrentExecutions"] == 1
    assert function["EventInvokeConfig"] == {"MaximumEventAgeInSeconds": 60, "MaximumRetryAttempts": 0}
    # A pass stops with STOP_MARGIN_MS left: the timeout leaves it most of the invocation.
    assert function["Timeout"] == 900 > 10 * STOP_MARGIN_MS / 1000
    assert function["MemorySize"] == 1024
    # Past SPOOL_MEMORY_BYTES a result file is on /tmp, and a Bedrock one repeats its job's input;
    # SnapStart takes no ephemeral storage past 512 MB.
    storage_bytes = function["EphemeralStorage"]["Size"] * 1024 * 1024
    assert storage_bytes > BEDROCK_MAX_INPUT_BYTES > SPOOL_MEMORY_BYTES
    assert function["SnapStart"] == {"ApplyOn": "None"}
    # Every function gets the batch settings, from their parameters.
    environment = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    for variable, parameter in BATCH_SETTINGS.items():
        assert environment[variable] == {"Ref": parameter}
    role_arn = environment["AIJOBS_BATCH_ROLE_ARN"]
    assert resolver(**BATCHES_ON).resolve(role_arn) == ""
    assert resolver(**BEDROCK_BATCHES).resolve(role_arn) == BATCH_SERVICE_ROLE
    for claim in (
        "`BatchApi=on` (default `off`",
        "`rate(1 minute)`",
        "one pass at a time (reserved concurrency 1",
        "dropped",
        "900 s",
        "1024 MB and 10,240 MB of `/tmp`",
        "`AIJOBS_BATCH_ROLE_ARN` names `BedrockBatchRole`",
        "none of it exists",
    ):
        assert claim in text


# The batch settings and the parameters that set them (tests/unit/test_template_settings.py: bounds).
BATCH_SETTINGS = {
    "AIJOBS_BATCH_API": "BatchApi",
    "AIJOBS_BATCH_WINDOW_SECONDS": "BatchWindowSeconds",
    "AIJOBS_BATCH_POLL_SECONDS": "BatchPollSeconds",
    "AIJOBS_BATCH_RESCUE_SECONDS": "BatchRescueSeconds",
}


def flex_tier(text: str) -> None:
    parameter = TEMPLATE["Parameters"]["FlexTier"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("off", ["on", "off"])
    # Every function gets it, and the settings check reads it, from the one parameter.
    assert TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]["AIJOBS_FLEX"] == {"Ref": "FlexTier"}
    assert RESOURCES["SettingsCheck"]["Properties"]["Environment"]["AIJOBS_FLEX"] == {"Ref": "FlexTier"}
    # Nothing of the stack depends on it: no condition, resource or permission names it.
    mentions = json.dumps({name: value for name, value in TEMPLATE.items() if name != "Parameters"})
    assert mentions.count('"FlexTier"') == 2
    assert grants("WorkerFunction", FlexTier="on") == grants("WorkerFunction")
    for claim in ("`FlexTier=on` (default `off`", "`AIJOBS_FLEX=on`", "no resource and no permission"):
        assert claim in text


def batcher_permissions(text: str) -> None:
    # OpenAI-compatible: the table, its files, the queues, its log and traces only.
    assert grants("BatchFunction", **BATCHES_ON) == {
        TABLE: {
            "dynamodb:BatchGetItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        },
        OBJECTS: {"s3:GetObject", "s3:PutObject"},
        f"{BUCKET}/batches/*": {"s3:DeleteObject"},
        BUCKET: {"s3:ListBucket"},
        QUEUE: {"sqs:SendMessage"},
        BACKGROUND_QUEUE: {"sqs:SendMessage"},
        **own_logs("BatchLogGroup"),
        **TRACES,
    }
    listed = statement("BatchFunction", "ListBatchFiles", **BATCHES_ON)
    assert listed["Condition"] == {"StringLike": {"s3:prefix": "batches/*"}}
    # The provider key, the models and the table's and bucket's key: the worker's own statements.
    shared = {
        "ReadProviderApiKey": {"AiApiKeySecretArn": SECRET_ARN},
        "DecryptProviderApiKey": {"AiApiKeySecretArn": SECRET_ARN},
        "UseTableAndPayloadKey": {"KmsKeyArn": KEY_ARN},
        "InvokeConfiguredModels": {"AiProvider": "bedrock", "AiModelFallback": "amazon.nova-pro-v1:0"},
        "InvokeModelsThroughConfiguredProfiles": {"AiProvider": "bedrock", "AiModelFallback": "amazon.nova-pro-v1:0"},
    }
    for sid, parameters in shared.items():
        worker = statement("WorkerFunction", sid, **parameters)
        assert statement("BatchFunction", sid, **BATCHES_ON, **parameters) == worker
    # Bedrock: its batch inference jobs, the configured models' and no other, and the service role to Bedrock only.
    bedrock = grants("BatchFunction", **BEDROCK_BATCHES)
    model = "us.amazon.nova-lite-v1:0"
    created = {resource for resource, actions in bedrock.items() if "bedrock:CreateModelInvocationJob" in actions}
    assert created == {
        BATCH_JOBS,
        f"arn:aws:bedrock:{REGION}::foundation-model/{model}",
        f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model}",
    }
    assert bedrock[BATCH_JOBS] == {
        "bedrock:CreateModelInvocationJob",
        "bedrock:GetModelInvocationJob",
        "bedrock:StopModelInvocationJob",
    }
    assert bedrock["*"] == {"bedrock:ListModelInvocationJobs"} | TRACES["*"]
    assert bedrock[BATCH_SERVICE_ROLE] == {"iam:PassRole"}
    assert statement("BatchFunction", "PassBatchServiceRole", **BEDROCK_BATCHES)["Condition"] == {
        "StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}
    }
    assert not any("bedrock" in resource or "iam" in resource for resource in grants("BatchFunction", **BATCHES_ON))
    for claim in (
        "Its own role (`BatchRole`)",
        "`Query`",
        "`DeleteObject` and `ListBucket` under `batches/` only",
        "`SendMessage`",
        "as for the worker",
        "`CreateModelInvocationJob` of the configured models",
        "`ListModelInvocationJobs`",
        "`iam:PassRole` of `BedrockBatchRole` to Bedrock only",
    ):
        assert claim in text


def bedrock_batch_service_role(text: str) -> None:
    (trust,) = properties("BedrockBatchRole", **BEDROCK_BATCHES)["AssumeRolePolicyDocument"]["Statement"]
    assert trust == {
        "Effect": "Allow",
        "Principal": {"Service": "bedrock.amazonaws.com"},
        "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"aws:SourceAccount": ACCOUNT}, "ArnEquals": {"aws:SourceArn": BATCH_JOBS}},
    }
    # The files engine.gateway.bedrock_batch names: batches/<aijobs-...>/input.jsonl, and output/ beside it.
    jobs = f"{BUCKET}/{KEY_PREFIX}{JOB_NAME_PREFIX}*"
    model = "us.amazon.nova-lite-v1:0"
    assert role_grants("BedrockBatchRole", **BEDROCK_BATCHES) == {
        f"{jobs}/input.jsonl": {"s3:GetObject"},
        f"{jobs}/output/*": {"s3:PutObject"},
        BUCKET: {"s3:ListBucket"},
        f"arn:aws:bedrock:{REGION}::foundation-model/{model}": {"bedrock:InvokeModel"},
        f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model}": {"bedrock:InvokeModel"},
        "arn:aws:bedrock:*::foundation-model/*": {"bedrock:InvokeModel"},
    }
    listed = role_statement("BedrockBatchRole", "ListBatchFolders", **BEDROCK_BATCHES)
    assert listed["Condition"] == {"StringLike": {"s3:prefix": f"{KEY_PREFIX}{JOB_NAME_PREFIX}*"}}
    assert role_grants("BedrockBatchRole", **BEDROCK_BATCHES, KmsKeyArn=KEY_ARN)[KEY_ARN] == {
        "kms:Decrypt",
        "kms:GenerateDataKey",
    }
    key = role_statement("BedrockBatchRole", "UsePayloadKey", **BEDROCK_BATCHES, KmsKeyArn=KEY_ARN)
    assert key["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}}
    for claim in (
        "`BedrockBatchRole`",
        "only Bedrock may assume",
        "`aws:SourceAccount`, `aws:SourceArn`",
        "`batches/aijobs-*/input.jsonl`",
        "`batches/aijobs-*/output/`",
        "`ListBucket` of `batches/aijobs-*` only",
        "through S3",
    ):
        assert claim in text


def table_stream(text: str) -> None:
    assert properties("JobsTable")["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert "`NEW_AND_OLD_IMAGES`" in text


def completion_events(text: str) -> None:
    function = properties("EventsFunction")
    (source,) = function["Events"].values()
    assert source["Type"] == "DynamoDB"
    stream = source["Properties"]
    assert stream["Stream"] == "arn:aws:dynamodb:eu-west-1:123456789012:JobsTable.StreamArn"
    assert stream["StartingPosition"] == "TRIM_HORIZON"
    assert stream["MaximumRetryAttempts"] == 20
    assert (
        stream["DestinationConfig"]["OnFailure"]["Destination"]
        == "arn:aws:sqs:eu-west-1:123456789012:EventFailuresQueue"
    )
    assert len(stream["FilterCriteria"]["Filters"]) == 2  # tests/unit/test_events.py checks what they select
    bus = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]["AIJOBS_EVENT_BUS"]
    assert resolver().resolve(bus) == "JobEventBus"
    assert properties("JobEventBus")["Name"] == "aijobs-jobs"
    assert resolver(EventBusName="default").resolve(bus) == "default"
    assert resolver().condition("CreatesEventBus")
    assert not resolver(EventBusName="default").condition("CreatesEventBus")
    assert properties("EventFailuresQueue")["MessageRetentionPeriod"] == 1_209_600
    assert "`<stack>-jobs`" in text
    assert "after 20 retries" in text
    assert "14 days" in text


def events_function_permissions(text: str) -> None:
    bus = "arn:aws:events:eu-west-1:123456789012:JobEventBus"
    failures = "arn:aws:sqs:eu-west-1:123456789012:EventFailuresQueue"
    stream = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:JobsTable.StreamArn"
    assert grants("EventsFunction") == {
        bus: {"events:PutEvents"},
        failures: {"sqs:SendMessage"},
        stream: {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"},
        TABLE: {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"},
        QUEUE: {"sqs:SendMessage"},
        BACKGROUND_QUEUE: {"sqs:SendMessage"},
        "*": {"dynamodb:ListStreams"} | TRACES["*"],
        **own_logs("EventsLogGroup"),
    }
    # The data job types' items only (engine.job_type_tally)
    leading = statement("EventsFunction", "TallyJobTypes")["Condition"]["ForAllValues:StringLike"]
    assert leading == {"dynamodb:LeadingKeys": ["JOBTYPES", "JOBTYPE#*"]}
    # The pipelines moved on (engine.pipelines): UpdateItem of job items only, and their messages
    moving = statement("EventsFunction", "MovePipelines")
    assert (moving["Action"], moving["Condition"]) == (
        "dynamodb:UpdateItem",
        {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["JOB#*"]}},
    )
    default_bus = f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/default"
    assert grants("EventsFunction", EventBusName="default")[default_bus] == {"events:PutEvents"}
    assert grants("EventsFunction", KmsKeyArn=KEY_ARN)[KEY_ARN] == {"kms:Decrypt"}
    assert via_services("EventsFunction", "DecryptTableStream") == {f"dynamodb.{REGION}.amazonaws.com"}
    for claim in (
        "Its own role",
        "`events:PutEvents` on that bus only",
        "`DescribeStream`, `GetRecords`, `GetShardIterator` on the table's stream only",
        "`ListStreams`",
        "on the table's data job type items only",
        "`UpdateItem` on the table's job items only",
        "`SendMessage` on the two jobs queues",
        "its own log group",
    ):
        assert claim in text


def webhook(text: str) -> None:
    parameters = {"WebhookUrl": "https://hooks.example.com/aijobs", "WebhookSecretArn": SECRET_ARN}
    webhook_resources = {
        "WebhookConnection",
        "WebhookDestination",
        "WebhookRole",
        "WebhookRule",
        "EventFailuresQueuePolicy",
    }
    for name in webhook_resources:
        assert RESOURCES[name]["Condition"] == "HasWebhook"
    assert not resolver().condition("HasWebhook")
    assert not resolver(WebhookUrl=parameters["WebhookUrl"]).condition("HasWebhook")
    assert resolver(**parameters).condition("HasWebhook")
    destination = properties("WebhookDestination", **parameters)
    assert (destination["InvocationEndpoint"], destination["HttpMethod"]) == (parameters["WebhookUrl"], "POST")
    auth = properties("WebhookConnection", **parameters)["AuthParameters"]["ApiKeyAuthParameters"]
    assert auth == {
        "ApiKeyName": "Authorization",
        "ApiKeyValue": f"{{{{resolve:secretsmanager:{SECRET_ARN}:SecretString}}}}",
    }
    rule = properties("WebhookRule", **parameters)
    assert rule["EventPattern"] == {
        "source": ["aijobs"],
        "detail-type": ["Job Succeeded", "Job Failed", "Job Cancelled", "Job Reviewed"],
    }
    (target,) = rule["Targets"]
    assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == 86_400
    assert target["DeadLetterConfig"]["Arn"] == "arn:aws:sqs:eu-west-1:123456789012:EventFailuresQueue"
    assert "`WebhookHeader` (default `Authorization`)" in text
    assert "24 hours" in text


def alarms(text: str) -> None:
    names = {name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::CloudWatch::Alarm"}
    assert names == {
        "DeadLetterAlarm",
        "DeadLetterBacklogAlarm",
        "DeadLetterUnrecordedAlarm",
        "WorkerErrorsAlarm",
        "OldestMessageAlarm",
        "BackgroundOldestMessageAlarm",
        "FailedJobRateAlarm",
        "RateLimitedShareAlarm",
        "EventFailuresAlarm",
        "EventsLagAlarm",
        "BatchErrorsAlarm",
        "JobTypeRollbackAlarm",
    }
    assert properties("EventFailuresAlarm")["Dimensions"] == [{"Name": "QueueName", "Value": "EventFailuresQueue"}]
    lag = properties("EventsLagAlarm")
    assert (lag["MetricName"], lag["Threshold"]) == ("IteratorAge", 600_000)  # 10 minutes, in ms
    # The age of the oldest message counts only while messages are visible and none is received or
    # deleted: messages the engine hides on purpose are not visible (tests/unit/test_alarm_math.py).
    oldest = properties("OldestMessageAlarm")
    assert metric_names(oldest) == {
        "age": "ApproximateAgeOfOldestMessage",
        "visible": "ApproximateNumberOfMessagesVisible",
        "received": "NumberOfMessagesReceived",
        "deleted": "NumberOfMessagesDeleted",
        "stuck": None,
    }
    assert (oldest["Threshold"], oldest["EvaluationPeriods"], oldest["DatapointsToAlarm"]) == (900, 5, 5)
    assert {metric["MetricStat"]["Period"] for metric in oldest["Metrics"] if "MetricStat" in metric} == {60}
    # The background queue's: the same measure, an hour's age, 15 minutes on end (a backlog waits its turn).
    background = properties("BackgroundOldestMessageAlarm")
    assert metric_names(background) == metric_names(oldest)
    assert background["Metrics"][-1]["Expression"] == oldest["Metrics"][-1]["Expression"]
    assert {
        dimension["Value"]
        for metric in background["Metrics"]
        if "MetricStat" in metric
        for dimension in metric["MetricStat"]["Metric"]["Dimensions"]
    } == {"BackgroundJobsQueue"}
    assert (background["Threshold"], background["EvaluationPeriods"], background["DatapointsToAlarm"]) == (3600, 15, 15)
    # Dead letters held on their queue, visible or in flight, 15 minutes on end; and those not recorded.
    backlog = properties("DeadLetterBacklogAlarm")
    assert metric_names(backlog) == {
        "visible": "ApproximateNumberOfMessagesVisible",
        "inflight": "ApproximateNumberOfMessagesNotVisible",
        "held": None,
    }
    assert (backlog["EvaluationPeriods"], backlog["DatapointsToAlarm"]) == (3, 3)
    assert properties("DeadLetterUnrecordedAlarm")["MetricName"] == "DeadLetters_unrecorded"
    failed = properties("FailedJobRateAlarm")
    assert metric_names(failed) == {"succeeded": "Jobs_succeeded", "failed": "Jobs_failed", "rate": None}
    assert ">= 10" in failed["Metrics"][2]["Expression"]
    assert failed["Threshold"] == 0.2
    limited = properties("RateLimitedShareAlarm")
    assert [metric.get("MetricStat", {}).get("Metric", {}).get("MetricName") for metric in limited["Metrics"]] == [
        "Attempts",
        "Retries_provider_rate_limited",
        None,
    ]
    # Sustained: three 5-minute periods on end
    assert (limited["Threshold"], limited["EvaluationPeriods"], limited["DatapointsToAlarm"]) == (0.2, 3, 3)
    # The batcher's passes that failed and the batches it could not move on (Batches_errors, which
    # engine.batching.batcher counts), in each of three 5-minute periods (tests/unit/test_alarm_math.py).
    batcher = properties("BatchErrorsAlarm")
    assert RESOURCES["BatchErrorsAlarm"]["Condition"] == "BatchApiOn"
    assert metric_names(batcher) == {"failed": "Errors", "caught": "Batches_errors", "errors": None}
    (function,) = batcher["Metrics"][0]["MetricStat"]["Metric"]["Dimensions"]
    assert function == {"Name": "FunctionName", "Value": "BatchFunction"}
    assert (batcher["EvaluationPeriods"], batcher["DatapointsToAlarm"]) == (3, 3)
    for name in ("OldestMessageAlarmSeconds", "FailedJobRateThreshold", "RateLimitedShareThreshold"):
        assert f"`{name}`" in text
    assert "with `BatchApi=on`, `BatchErrorsAlarm`" in text
    for claim in ("none is received or none deleted", "parked on purpose", "visible or in flight"):
        assert claim in text
    for name in names:
        assert properties(name, AlarmTopicArn=f"arn:aws:sns:{REGION}:{ACCOUNT}:ops")["AlarmActions"] == [
            f"arn:aws:sns:{REGION}:{ACCOUNT}:ops"
        ]
        assert "AlarmActions" not in properties(name)
        assert f"`{name}`" in text


def metric_names(alarm: dict[str, Any]) -> dict[str, str | None]:
    """{id: metric name} of a metric-math alarm's metrics (None for an expression)."""
    return {
        metric["Id"]: metric.get("MetricStat", {}).get("Metric", {}).get("MetricName") for metric in alarm["Metrics"]
    }


def dashboard(text: str) -> None:
    body_template, names = RESOURCES["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    values = {"AWS::Region": REGION, "JobsQueueName": "q", "BackgroundQueueName": "b", "DeadLetterQueueName": "d"}
    values |= {"WorkerFunction": "worker", "EventsFunction": "events"}
    assert set(names) == {"JobsQueueName", "BackgroundQueueName", "DeadLetterQueueName"}
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda match: values[match.group(1)], body_template))
    titles = [widget["properties"]["title"] for widget in body["widgets"]]
    assert titles == [
        "Jobs queues by lane: depth and age of the oldest message",
        "Jobs by outcome (5 min)",
        "Jobs by type and outcome (5 min)",
        "Provider latency by model: p50, p95, p99 (s)",
        "Provider 429s and attempts (5 min)",
        "Tokens and cost per hour",
        "Dead letters: on the queue, recorded, not recorded",
        "Worker errors and throttles",
        "Time to answer by lane: p50, p95 (s)",
    ]
    searched = json.dumps(body)
    for metric in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage.input", "CostUsd", "Jobs_failed"):
        assert metric in searched
    assert "p50, p95, p99" in titles[3]
    assert "p50/p95/p99" in text
    # The time to answer by lane is the JobLatency the runner counts (engine.telemetry.count_latency).
    assert '"JobLatency", "lane", "interactive"' in body_template
    assert "time to answer by lane" in text
    assert "`<stack>-jobs` in CloudWatch" in text


def logs(text: str) -> None:
    functions = {name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::Serverless::Function"}
    for function in functions:
        group = RESOURCES[function]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert RESOURCES[group]["Properties"]["RetentionInDays"] == 30
    assert "30 days" in text


def versions(text: str) -> None:
    functions = TEMPLATE["Globals"]["Function"]
    assert functions["AutoPublishAlias"] == "live"
    assert resolver().resolve(functions["SnapStart"]) == {"ApplyOn": "None"}
    assert resolver(SnapStart="PublishedVersions").resolve(functions["SnapStart"]) == {"ApplyOn": "PublishedVersions"}
    assert TEMPLATE["Parameters"]["SnapStart"]["AllowedValues"] == ["None", "PublishedVersions"]
    assert "alias `live`" in text
    assert "`SnapStart` (default `None`)" in text


def settings_check(text: str) -> None:
    check = RESOURCES["SettingsCheck"]
    assert check["Type"] == "Custom::SettingsCheck"
    assert check["Properties"]["ServiceToken"] == {"Fn::GetAtt": ["SettingsCheckFunction", "Arn"]}
    assert check["Properties"]["ServiceTimeout"] == 120
    function = RESOURCES["SettingsCheckFunction"]["Properties"]
    assert function["Handler"] == "handlers.settings_check.lambda_handler"
    assert function["CodeUri"] == RESOURCES["WorkerFunction"]["Properties"]["CodeUri"]  # the same engine
    # Every published version waits for the check, and carries the fingerprint of the settings it checked.
    for name in ("WorkerFunction", "DeadLetterFunction", "EventsFunction", "ReconcilerFunction", "BatchFunction"):
        assert RESOURCES[name]["Properties"]["VersionDescription"] == {
            "Fn::Sub": "settings ${SettingsCheck.Fingerprint}"
        }
    # tests/unit/test_template_settings.py: its Environment is every variable the functions get.
    for claim in ("`SettingsCheck`", "engine's own", "one line", "Before any function's new version", "alias `live`"):
        assert claim in text


def parameter_rules(text: str) -> None:
    # tests/unit/test_template_rules.py evaluates each rule on good and bad parameters.
    assert set(TEMPLATE["Rules"]) == {
        "WebhookNeedsSecret",
        "OpenAiNeedsKey",
        "BedrockNeedsBedrockModels",
        "AnthropicNeedsKey",
        "AnthropicNeedsAnthropicModels",
    }
    for name in ("AiModelPrimary", "AiModelFallback"):
        pattern = TEMPLATE["Parameters"][name]["AllowedPattern"]
        assert re.fullmatch(pattern, "anthropic.claude-3-5-haiku-20241022-v1:0")
        assert not re.fullmatch(pattern, f"arn:aws:bedrock:{REGION}::foundation-model/amazon.nova-lite-v1:0")
        assert not re.fullmatch(pattern, "*")
    claimed = ("`WebhookSecretArn`", "`AiApiKeySecretArn`", "`AiProvider=bedrock`", "`AiProvider=anthropic`", "an ARN")
    for claim in (*claimed, "`SettingsCheck`"):
        assert claim in text


CHECKS: dict[str, Callable[[str], None]] = {
    "Jobs table": jobs_table,
    "Backups": backups,
    "Table encryption": table_encryption,
    "Retention": retention,
    "Payload bucket": payload_bucket,
    "Jobs queue": jobs_queue,
    "Background jobs queue": background_jobs_queue,
    "Dead-letter queue": dead_letter_queue,
    "Worker permissions": worker_permissions,
    "Dead-letter function permissions": dead_letter_function_permissions,
    "Reconciler permissions": reconciler_permissions,
    "Batches": batches,
    "Batcher permissions": batcher_permissions,
    "Flex tier": flex_tier,
    "Bedrock batch service role": bedrock_batch_service_role,
    "Table stream": table_stream,
    "Completion events": completion_events,
    "Events function permissions": events_function_permissions,
    "Webhook": webhook,
    "Alarms": alarms,
    "Dashboard": dashboard,
    "Logs": logs,
    "Versions": versions,
    "Settings check": settings_check,
    "Parameter rules": parameter_rules,
}


def test_every_claim_of_the_stack_page_has_a_check_and_every_check_a_claim() -> None:
    assert set(claims()) == set(CHECKS)


@pytest.mark.parametrize("label", sorted(CHECKS))
def test_the_claim_holds_in_the_template(label: str) -> None:
    CHECKS[label](claims()[label])


def test_the_web_dashboard_finds_the_stack_and_its_cloudwatch_dashboard_from_the_queue_url() -> None:
    # docs/ui.md: a deployed jobs queue is `<stack>-jobs`, and so is the stack's CloudWatch dashboard
    resolved = resolver()
    queue_name = properties("JobsQueue")["QueueName"]
    resolved.physical["Dashboard"] = resolved.resolve(RESOURCES["Dashboard"]["Properties"]["DashboardName"])
    output = resolved.resolve(TEMPLATE["Outputs"]["DashboardUrl"]["Value"])
    settings = load_settings(
        {
            "JOBS_TABLE_NAME": "aijobs-JobsTable-1X2Y3Z",
            "JOBS_QUEUE_URL": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{queue_name}",
            "JOBS_PAYLOAD_BUCKET": "aijobs-payloads",
        }
    )

    target = StackTarget.from_settings(settings)

    assert queue_name == "aijobs-jobs"
    assert (target.name, target.embedded, target.dashboard_url) == ("aijobs", False, output)


def test_the_architecture_doc_gives_each_function_its_handler_timeout_memory_and_schedule() -> None:
    text = (DOCS / "architecture.md").read_text()
    rows = re.findall(
        r"^\| `(handlers\.\w+\.lambda_handler)` \| `(\w+)` \((\d+) s, (\d+) MB[;)][^|]*\| ([^|]+) \|", text, re.M
    )
    functions = {name for name, spec in RESOURCES.items() if spec["Type"] == "AWS::Serverless::Function"}
    assert sorted(function for _, function, *_ in rows) == sorted(functions)
    for handler, function, timeout, memory, trigger in rows:
        spec = RESOURCES[function]["Properties"]
        assert (spec["Handler"], spec["Timeout"], spec["MemorySize"]) == (handler, int(timeout), int(memory))
        schedules = [
            event["Properties"]["ScheduleExpression"]
            for event in spec.get("Events", {}).values()
            if event["Type"] == "ScheduleV2"
        ]
        assert all(f"`{expression}`" in trigger for expression in schedules), function
