"""The custom resource SettingsCheck: CloudFormation's request in, one answer PUT to its URL.

CloudFormation invokes the function with a request naming a pre-signed S3 URL and waits for a
PUT there. Here the URL is a local HTTP server (127.0.0.1, port 0) that keeps what it is sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import botocore.endpoint
import pytest

import handlers.settings_check
from engine import settings_check
from engine.settings_check import check_environment

GOOD = {
    "POWERTOOLS_SERVICE_NAME": "aijobs",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "JOBS_TABLE_NAME": "aijobs-JobsTable-1A2B3C",
    "JOBS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/123456789012/aijobs-jobs",
    "JOBS_PAYLOAD_BUCKET": "aijobs-payloadbucket-1a2b3c",
    "AIJOBS_RETENTION_DAYS": "90",
    "AI_PROVIDER": "openai",
    "AI_BASE_URL": "https://api.openai.com/v1",
    "AI_MODEL_PRIMARY": "gpt-4o-mini",
    "AI_MODEL_FALLBACK": "",
    "AI_API_KEY_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:aijobs-key-AbCdEf",
    "AI_STRUCTURED_OUTPUT": "json_schema",
    "AIJOBS_REPAIR_ATTEMPTS": "1",
    "AIJOBS_PRICES": "",
    "AIJOBS_JOB_MODULES": "",
    "AIJOBS_PROVIDER_LIMITS": "",
    "AIJOBS_DEFAULT_DAILY_BUDGET_USD": "",
    "AIJOBS_EVENT_BUS": "aijobs-jobs",
    "AIJOBS_BATCH_API": "off",
    "AIJOBS_BATCH_WINDOW_SECONDS": "300",
    "AIJOBS_BATCH_POLL_SECONDS": "60",
    "AIJOBS_BATCH_RESCUE_SECONDS": "1800",
    "AIJOBS_BATCH_ROLE_ARN": "",
}
BEDROCK = {"AI_PROVIDER": "bedrock", "AI_MODEL_PRIMARY": "amazon.nova-lite-v1:0", "AI_API_KEY_SECRET_ARN": ""}
BATCH_ROLE = "arn:aws:iam::123456789012:role/aijobs-BedrockBatchRole-1A2B3C"


class CloudFormation:
    """The response URL: keeps each PUT's path, headers and JSON body."""

    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.headers.append(dict(self.headers))
                received.answers.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/stack-response?X-Amz-Signature=abc"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def request(self, request_type: str, environment: dict[str, str] | None = None, **more: Any) -> dict[str, Any]:
        properties: dict[str, Any] = {"ServiceToken": "arn:aws:lambda:eu-west-1:123456789012:function:check"}
        if environment is not None:
            properties["Environment"] = environment
        return {
            "RequestType": request_type,
            "ResponseURL": self.url,
            "StackId": "arn:aws:cloudformation:eu-west-1:123456789012:stack/aijobs/guid",
            "RequestId": "request-1",
            "ResourceType": "Custom::SettingsCheck",
            "LogicalResourceId": "SettingsCheck",
            "ResourceProperties": properties,
            **more,
        }


@pytest.fixture
def cloudformation() -> Iterator[CloudFormation]:
    fake = CloudFormation()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.fixture
def no_aws_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every AWS request botocore would send, refused and named: the check must send none."""
    sent: list[str] = []

    def refuse(self: Any, request: Any, *_: Any, **__: Any) -> Any:
        sent.append(request.url)
        raise AssertionError(f"the settings check sent an AWS request to {request.url}")

    monkeypatch.setattr(botocore.endpoint.Endpoint, "_send", refuse)
    return sent


def invoke(event: dict[str, Any]) -> dict[str, Any]:
    """The Lambda entry point, as CloudFormation invokes it (the answer goes over HTTP)."""
    return handlers.settings_check.lambda_handler(event, None)


def test_good_settings_succeed_with_a_fingerprint_and_no_aws_request(
    cloudformation: CloudFormation, no_aws_requests: list[str]
) -> None:
    invoke(cloudformation.request("Create", GOOD))

    (answer,) = cloudformation.answers
    assert answer["Status"] == "SUCCESS"
    assert (answer["StackId"], answer["RequestId"], answer["LogicalResourceId"]) == (
        "arn:aws:cloudformation:eu-west-1:123456789012:stack/aijobs/guid",
        "request-1",
        "SettingsCheck",
    )
    assert answer["PhysicalResourceId"] == "aijobs-settings-check"
    assert answer["Data"] == {"Fingerprint": check_environment(GOOD)}
    assert no_aws_requests == []
    # The URL is signed for no content type: none is sent
    assert cloudformation.headers[0].get("Content-Type", "") == ""


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        (
            {"AIJOBS_PROVIDER_LIMITS": '{"gpt-4o-mini": {"rpm": 500'},
            "AIJOBS_PROVIDER_LIMITS: Value error, not valid JSON (Expecting ',' delimiter: line 1 column 28 (char 27))",
        ),
        (
            {"AIJOBS_PRICES": "{gpt-4o-mini: 1}"},
            "AIJOBS_PRICES: Value error, not valid JSON "
            "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        (
            {"AIJOBS_PROVIDER_LIMITS": '{"gpt-4o-mini": {}}'},
            "AIJOBS_PROVIDER_LIMITS: gpt-4o-mini: Value error, a model's limit needs rpm, tpm or both",
        ),
        (
            {"AI_PROVIDER": "bedrock", "AI_MODEL_PRIMARY": "gpt-4o-mini"},
            "AI_MODEL_PRIMARY: 'gpt-4o-mini' is not a Bedrock model id (<provider>.<model>, such as "
            "anthropic.claude-3-5-haiku-20241022-v1:0, or an inference profile's, such as us.amazon.nova-lite-v1:0)",
        ),
        (
            {"AI_PROVIDER": "bedrock", "AI_MODEL_PRIMARY": "amazon.nova-lite-v1:0", "AI_MODEL_FALLBACK": "gpt-4.1"},
            "AI_MODEL_FALLBACK: 'gpt-4.1' is not a Bedrock model id (<provider>.<model>, such as "
            "anthropic.claude-3-5-haiku-20241022-v1:0, or an inference profile's, such as us.amazon.nova-lite-v1:0)",
        ),
        (
            {"AI_BASE_URL": "https://llm.example.com/v1", "AI_API_KEY_SECRET_ARN": ""},
            "AI_API_KEY_SECRET_ARN: the provider at llm.example.com needs an API key (a Secrets Manager secret, the "
            "template's AiApiKeySecretArn; AI_API_KEY locally); only an endpoint on this machine goes without one",
        ),
        (
            {"AI_BASE_URL": "http://llm.example.com/v1"},
            "AI_BASE_URL: Value error, plain http sends the API key in clear; use https for llm.example.com",
        ),
        (
            {"AIJOBS_JOB_MODULES": "myapp.no_such_jobs"},
            "AIJOBS_JOB_MODULES: cannot import 'myapp.no_such_jobs': No module named 'myapp'",
        ),
        ({"AIJOBS_REPAIR_ATTEMPTS": "4"}, "AIJOBS_REPAIR_ATTEMPTS: Input should be less than or equal to 3"),
        ({"AIJOBS_BATCH_API": "maybe"}, "AIJOBS_BATCH_API: Value error, must be on or off, not 'maybe'"),
        ({"AIJOBS_FLEX": "cheap"}, "AIJOBS_FLEX: Value error, must be on or off, not 'cheap'"),
        (
            {"AIJOBS_BATCH_RESCUE_SECONDS": "0"},
            "AIJOBS_BATCH_RESCUE_SECONDS: Input should be greater than or equal to 1",
        ),
        (
            # The batcher's own refusal: Bedrock's batch jobs need the template's service role
            BEDROCK | {"AIJOBS_BATCH_API": "on"},
            "AIJOBS_BATCH_ROLE_ARN: not set; Bedrock's batch inference jobs need the service role the template "
            "makes (BatchApi=on)",
        ),
    ],
)
def test_settings_a_function_would_refuse_fail_the_deployment_with_the_engine_s_line(
    cloudformation: CloudFormation, no_aws_requests: list[str], changed: dict[str, str], reason: str
) -> None:
    invoke(cloudformation.request("Update", GOOD | changed, PhysicalResourceId="aijobs-settings-check"))

    (answer,) = cloudformation.answers
    assert (answer["Status"], answer["Reason"]) == ("FAILED", reason)
    assert answer["PhysicalResourceId"] == "aijobs-settings-check"
    assert "Data" not in answer
    assert no_aws_requests == []


def test_a_keyless_endpoint_on_the_function_s_own_machine_is_taken(cloudformation: CloudFormation) -> None:
    invoke(
        cloudformation.request(
            "Create", GOOD | {"AI_BASE_URL": "http://127.0.0.1:4000/v1", "AI_API_KEY_SECRET_ARN": ""}
        )
    )

    assert cloudformation.answers[0]["Status"] == "SUCCESS"


@pytest.mark.parametrize(
    "changed",
    [
        {"AIJOBS_BATCH_API": "on"},
        BEDROCK | {"AIJOBS_BATCH_API": "on", "AIJOBS_BATCH_ROLE_ARN": BATCH_ROLE},
        # Batches off: no batcher, so no service role needed
        BEDROCK,
    ],
)
def test_batch_settings_a_batcher_takes_succeed_with_no_aws_request(
    cloudformation: CloudFormation, no_aws_requests: list[str], changed: dict[str, str]
) -> None:
    invoke(cloudformation.request("Create", GOOD | changed))

    assert cloudformation.answers[0]["Status"] == "SUCCESS"
    assert no_aws_requests == []


def test_the_fingerprint_follows_the_settings_and_nothing_else() -> None:
    first = check_environment(GOOD)

    assert check_environment(dict(reversed(list(GOOD.items())))) == first
    assert check_environment(GOOD | {"AIJOBS_PRICES": '{"my-model": {"input": 1, "output": 2}}'}) != first
    assert check_environment(GOOD | {"AIJOBS_REPAIR_ATTEMPTS": "2"}) != first


def test_a_delete_succeeds_whatever_the_settings(cloudformation: CloudFormation) -> None:
    # A stack whose settings are now refused can still be deleted, or rolled back from a failed create
    invoke(cloudformation.request("Delete", GOOD | {"AIJOBS_PRICES": "{"}, PhysicalResourceId="aijobs-settings-check"))

    (answer,) = cloudformation.answers
    assert (answer["Status"], answer["PhysicalResourceId"]) == ("SUCCESS", "aijobs-settings-check")


def test_a_request_without_the_environment_fails_with_a_line(cloudformation: CloudFormation) -> None:
    invoke(cloudformation.request("Create"))

    (answer,) = cloudformation.answers
    assert (answer["Status"], answer["Reason"]) == ("FAILED", "SettingsCheck: its Environment property is missing")


def test_an_unexpected_error_still_answers_naming_only_its_type(
    cloudformation: CloudFormation, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> object:
        raise RuntimeError("a message that could quote a setting")

    monkeypatch.setattr(settings_check, "build_every_function", broken)

    invoke(cloudformation.request("Create", GOOD))

    (answer,) = cloudformation.answers
    assert (answer["Status"], answer["Reason"]) == ("FAILED", "the settings check failed unexpectedly (RuntimeError)")
