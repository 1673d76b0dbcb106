"""A deployed stack by name, on moto's CloudFormation: its outputs and parameters as settings, and
`AiJobsClient.from_stack`."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from aijobs.client import AiJobsClient
from aijobs.deployed import load_stack_settings
from aijobs.stack import StackResources
from engine.core import JobStatus
from engine.core.errors import ConfigurationError
from tests.support.deployed import deploy_stand_in, stand_in_template

CLASSIFY_INPUT = {"text": "Win a cruise!", "labels": ["spam", "ham"]}


@pytest.fixture
def cloudformation(stack: StackResources) -> Any:
    return boto3.client("cloudformation")


def stack_error(name: str) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_stack_settings(name)
    return str(caught.value)


def test_from_stack_submits_to_the_table_and_queue_its_outputs_name(
    stack: StackResources, cloudformation: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a deployed stack and no JOBS_* variable
    deploy_stand_in(cloudformation, "prod", stack)
    for name in ("JOBS_TABLE_NAME", "JOBS_QUEUE_URL", "JOBS_PAYLOAD_BUCKET"):
        monkeypatch.delenv(name, raising=False)

    # When a client made from the stack's name submits a job
    jobs = AiJobsClient.from_stack("prod", session=boto3.Session(region_name="us-east-1"))
    result = jobs.submit("classify", "u-1", CLASSIFY_INPUT, job_id="stack-1")

    # Then the job is in the stack's table, and its message on the stack's queue
    assert result.created
    assert jobs.get("stack-1").status is JobStatus.QUEUED
    messages = sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=10)["Messages"]
    assert [json.loads(message["Body"]) for message in messages] == [{"job_id": "stack-1"}]


def test_the_stack_overrides_the_environment_only_for_the_names_it_gives(
    stack: StackResources, cloudformation: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy_stand_in(cloudformation, "prod", stack, {"RetentionDays": "30", "DefaultDailyBudgetUsd": "2.5"})
    monkeypatch.setenv("JOBS_TABLE_NAME", "some-other-table")
    monkeypatch.setenv("AIJOBS_RETENTION_DAYS", "7")
    monkeypatch.setenv("AIJOBS_REPAIR_ATTEMPTS", "3")

    settings = load_stack_settings("prod")

    assert settings.jobs_table_name == stack.table_name
    assert settings.jobs_queue_url == stack.queue_url
    assert settings.jobs_payload_bucket == stack.payload_bucket
    assert settings.aijobs_retention_days == 30
    assert str(settings.default_daily_budget_usd) == "2.5"
    assert settings.aijobs_repair_attempts == 3  # not the stack's: the environment's


def test_a_stack_deployed_with_the_defaults_has_no_budgets(stack: StackResources, cloudformation: Any) -> None:
    deploy_stand_in(cloudformation, "prod", stack)

    settings = load_stack_settings("prod")

    assert settings.budgets_enabled is False
    assert settings.aijobs_retention_days == 90


def test_an_unknown_stack_is_one_line_naming_it(stack: StackResources) -> None:
    assert stack_error("nope") == "stack nope does not exist in us-east-1"


def test_a_stack_whose_change_set_was_never_executed_is_refused(stack: StackResources, cloudformation: Any) -> None:
    # `sam deploy` answered "n" at its confirmation: the stack waits for review, with no resources.
    cloudformation.create_change_set(
        StackName="prod",
        ChangeSetName="first",
        ChangeSetType="CREATE",
        TemplateBody=json.dumps(stand_in_template(stack)),
    )

    assert stack_error("prod") == "stack prod is REVIEW_IN_PROGRESS"


def test_a_deleted_stack_is_refused(stack: StackResources, cloudformation: Any) -> None:
    deploy_stand_in(cloudformation, "prod", stack)
    stack_id = cloudformation.describe_stacks(StackName="prod")["Stacks"][0]["StackId"]
    cloudformation.delete_stack(StackName="prod")

    assert stack_error(stack_id) == f"stack {stack_id} is DELETE_COMPLETE"


def test_a_stack_without_the_outputs_names_the_missing_ones(stack: StackResources, cloudformation: Any) -> None:
    deploy_stand_in(cloudformation, "other", None)

    assert stack_error("other") == (
        "stack other has no output JobsTableName, JobsQueueUrl, PayloadBucketName: "
        "not an aijobs stack, or deployed from an older template"
    )
