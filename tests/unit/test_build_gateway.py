"""build_gateway: the provider, tiers, prices and repairs a worker gets from its settings, and the
provider configurations it refuses, as a worker starting (and the settings check at deployment) does."""

from __future__ import annotations

from typing import get_args

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws

from engine.config import Settings
from engine.core.errors import ConfigurationError
from engine.gateway import FLEX_MODELS_OF, FlexModels, ModelTiers, api_key_source, build_gateway
from engine.gateway.anthropic import AnthropicProvider
from engine.gateway.bedrock import BedrockConverseProvider
from engine.gateway.openai import OpenAICompatibleProvider

BASE = {"jobs_table_name": "jobs", "jobs_queue_url": "http://127.0.0.1:1/q", "jobs_payload_bucket": "payloads"}


def settings(**values: object) -> Settings:
    return Settings.model_validate(BASE | values)


def test_openai_is_the_default_provider_with_strict_structured_output() -> None:
    gateway = build_gateway(settings(ai_model_primary="gpt-4o-mini", ai_model_fallback="gpt-4o", ai_api_key="sk"))

    assert isinstance(gateway._provider, OpenAICompatibleProvider)
    assert gateway._provider._structured_output == "json_schema"
    assert gateway._models == ModelTiers("gpt-4o-mini", "gpt-4o")
    assert gateway._repair_attempts == 1


def test_bedrock_needs_no_key_or_base_url() -> None:
    gateway = build_gateway(settings(ai_provider="bedrock", ai_model_primary="amazon.nova-lite-v1:0"))

    assert isinstance(gateway._provider, BedrockConverseProvider)
    assert gateway._models == ModelTiers("amazon.nova-lite-v1:0", None)


def test_anthropic_calls_its_own_api_by_default_with_the_models_named_for_its_json_output() -> None:
    gateway = build_gateway(
        settings(
            ai_provider="anthropic",
            ai_api_key="sk-ant",
            ai_model_primary="claude-haiku-4-5",
            ai_json_output_models="claude-haiku-4-5",
        )
    )

    assert isinstance(gateway._provider, AnthropicProvider)
    assert gateway._provider._url == "https://api.anthropic.com/v1/messages"
    assert gateway._provider._json_output_models == ("claude-haiku-4-5",)


def test_each_provider_is_asked_the_flex_tier_of_the_models_it_may_sell_it_for() -> None:
    # An OpenAI-compatible provider says which models have none; Bedrock refuses an unknown tier; Anthropic
    # sells none, whatever the prices say (tests/unit/test_flex_gateway.py has what each means for a call)
    assert FLEX_MODELS_OF == {"openai": FlexModels.ANY, "bedrock": FlexModels.LISTED, "anthropic": FlexModels.NONE}
    assert set(FLEX_MODELS_OF) == set(get_args(Settings.model_fields["ai_provider"].annotation))


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({"ai_model_primary": "claude-haiku-4-5"}, "AI_API_KEY_SECRET_ARN"),  # Anthropic's API, no key
        ({"ai_api_key": "sk-ant"}, "AI_MODEL_PRIMARY"),  # the default model, gpt-4o-mini
        ({"ai_api_key": "sk-ant", "ai_model_primary": "anthropic.claude-3-5-haiku-20241022-v1:0"}, "AI_MODEL_PRIMARY"),
        (
            {"ai_api_key": "sk-ant", "ai_model_primary": "claude-haiku-4-5", "ai_model_fallback": "gpt-4o"},
            "AI_MODEL_FALLBACK",
        ),
    ],
)
def test_anthropic_refuses_a_configuration_that_would_fail_every_job(values: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{variable}: "):
        build_gateway(settings(ai_provider="anthropic", **values))


def test_an_anthropic_compatible_endpoint_on_this_machine_needs_no_key_and_an_unpriced_model_passes() -> None:
    gateway = build_gateway(
        settings(ai_provider="anthropic", ai_base_url="http://127.0.0.1:8700/v1", ai_model_primary="my-claude")
    )
    assert isinstance(gateway._provider, AnthropicProvider)
    assert gateway._provider._url == "http://127.0.0.1:8700/v1/messages"


def test_structured_output_and_repairs_come_from_the_settings() -> None:
    gateway = build_gateway(settings(ai_structured_output="json_object", aijobs_repair_attempts=0, ai_api_key="sk"))

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


@pytest.mark.parametrize(
    "values",
    [
        {"ai_api_key": "sk"},
        {"ai_api_key_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:k"},
        {"ai_base_url": "http://127.0.0.1:8700/v1"},
        {"ai_base_url": "http://localhost:4000/v1"},
        {"ai_base_url": "https://host.docker.internal:8443/v1"},
        {"ai_provider": "bedrock", "ai_model_primary": "us.anthropic.claude-3-5-haiku-20241022-v1:0"},
        {
            "ai_provider": "bedrock",
            "ai_model_primary": "amazon.nova-lite-v1:0",
            "ai_model_fallback": "amazon.nova-pro-v1:0",
        },
        {
            "ai_provider": "bedrock",
            "ai_model_primary": "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1",
        },
    ],
)
def test_a_provider_the_worker_can_call_is_taken(values: dict[str, str]) -> None:
    build_gateway(settings(**values))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "AI_API_KEY_SECRET_ARN: the provider at api.openai.com needs an API key"),
        (
            {"ai_base_url": "https://llm.internal.example/v1"},
            "AI_API_KEY_SECRET_ARN: the provider at llm.internal.example",
        ),
        ({"ai_provider": "bedrock"}, "AI_MODEL_PRIMARY: 'gpt-4o-mini' is not a Bedrock model id"),
        ({"ai_provider": "bedrock", "ai_model_primary": "claude-3-5-haiku-latest"}, "AI_MODEL_PRIMARY: 'claude-3-5"),
        (
            {
                "ai_provider": "bedrock",
                "ai_model_primary": "amazon.nova-lite-v1:0",
                "ai_model_fallback": "deepseek-chat",
            },
            "AI_MODEL_FALLBACK: 'deepseek-chat' is not a Bedrock model id",
        ),
    ],
)
def test_a_provider_that_would_fail_every_job_is_refused_with_one_line(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        build_gateway(settings(**values))

    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)
