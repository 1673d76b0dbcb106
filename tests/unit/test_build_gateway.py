"""build_gateway: the provider, tiers, prices and repairs a worker gets from its settings."""

from __future__ import annotations

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws

from engine.config import Settings
from engine.gateway import ModelTiers, api_key_source, build_gateway
from engine.gateway.bedrock import BedrockConverseProvider
from engine.gateway.openai import OpenAICompatibleProvider

BASE = {"jobs_table_name": "jobs", "jobs_queue_url": "http://127.0.0.1:1/q", "jobs_payload_bucket": "payloads"}


def settings(**values: object) -> Settings:
    return Settings.model_validate(BASE | values)


def test_openai_is_the_default_provider_with_strict_structured_output() -> None:
    gateway = build_gateway(settings(ai_model_primary="gpt-4o-mini", ai_model_fallback="gpt-4o"))

    assert isinstance(gateway._provider, OpenAICompatibleProvider)
    assert gateway._provider._structured_output == "json_schema"
    assert gateway._models == ModelTiers("gpt-4o-mini", "gpt-4o")
    assert gateway._repair_attempts == 1


def test_bedrock_needs_no_key_or_base_url() -> None:
    gateway = build_gateway(settings(ai_provider="bedrock", ai_model_primary="amazon.nova-lite-v1:0"))

    assert isinstance(gateway._provider, BedrockConverseProvider)
    assert gateway._models == ModelTiers("amazon.nova-lite-v1:0", None)


def test_structured_output_and_repairs_come_from_the_settings() -> None:
    gateway = build_gateway(settings(ai_structured_output="json_object", aijobs_repair_attempts=0))

    assert isinstance(gateway._provider, OpenAICompatibleProvider)
    assert gateway._provider._structured_output == "json_object"
    assert gateway._repair_attempts == 0


def test_the_key_is_a_plain_variable_locally() -> None:
    assert api_key_source(settings(ai_api_key="sk-local"))() == "sk-local"
    assert api_key_source(settings())() is None


@pytest.mark.parametrize("secret", ["sk-from-secret", '{"api_key": "sk-from-secret"}'])
def test_the_key_comes_from_secrets_manager_when_an_arn_is_set(secret: str) -> None:
    # Given the key in Secrets Manager (moto), as the key itself or as a JSON object
    with mock_aws():
        arn = boto3.client("secretsmanager").create_secret(Name="aijobs-key", SecretString=secret)["ARN"]
        parameters.clear_caches()

        # Then the worker's key is read from it, and a plain variable is ignored
        assert api_key_source(settings(ai_api_key_secret_arn=arn, ai_api_key="ignored"))() == "sk-from-secret"
    parameters.clear_caches()


def test_a_refresh_reads_a_rotated_secret_that_the_cache_still_hides() -> None:
    # Given a key read once (cached for 5 minutes), then rotated in Secrets Manager
    with mock_aws():
        secrets = boto3.client("secretsmanager")
        arn = secrets.create_secret(Name="aijobs-key", SecretString="sk-old")["ARN"]
        parameters.clear_caches()
        source = api_key_source(settings(ai_api_key_secret_arn=arn))
        assert source() == "sk-old"
        secrets.put_secret_value(SecretId=arn, SecretString="sk-new")

        # Then the cache still answers the old key, and a refresh reads the new one
        assert source() == "sk-old"
        assert source(refresh=True) == "sk-new"
        assert source() == "sk-new"
    parameters.clear_caches()
