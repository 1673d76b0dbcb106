"""The template's Rules, evaluated on good and bad parameters as CloudFormation evaluates them.

CloudFormation checks Rules when it is given the parameters, before it creates or changes anything:
a rule whose RuleCondition holds fails the deployment with the AssertDescription of each assertion
that does not. The evaluator below knows the functions Rules may use (Fn::And, Fn::Or, Fn::Not,
Fn::Equals, Fn::Contains, Fn::EachMemberEquals, Fn::EachMemberIn, Ref) and fails on any other.
What the rules refuse, the settings check (engine.settings_check) refuses as well: a rule is the
early, cheap form of a refusal the engine makes anyway.
"""

from __future__ import annotations

from typing import Any

import pytest

from aijobs.stack import load_template
from engine.config import load_settings
from engine.core.errors import ConfigurationError
from engine.gateway import BEDROCK_MODEL_ID
from engine.gateway.pricing import ANTHROPIC_PRICES, DEFAULT_PRICES
from engine.settings_check import check_environment
from tests.unit.test_template import resolver

TEMPLATE = load_template()
SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:aijobs-key-AbCdEf"
HAIKU = "anthropic.claude-3-5-haiku-20241022-v1:0"


def value(expression: Any, parameters: dict[str, Any]) -> Any:
    if isinstance(expression, str | int | float):
        return str(expression)
    if isinstance(expression, list):
        return [value(item, parameters) for item in expression]
    ((function, arguments),) = expression.items()
    if function == "Ref":
        return str(parameters[arguments])
    if function == "Fn::Equals":
        left, right = (value(argument, parameters) for argument in arguments)
        return left == right
    if function == "Fn::Not":
        return not value(arguments[0], parameters)
    if function == "Fn::And":
        return all(value(argument, parameters) for argument in arguments)
    if function == "Fn::Or":
        return any(value(argument, parameters) for argument in arguments)
    if function == "Fn::Contains":
        values, item = (value(argument, parameters) for argument in arguments)
        return item in values
    if function == "Fn::EachMemberEquals":
        values, item = (value(argument, parameters) for argument in arguments)
        return all(member == item for member in values)
    if function == "Fn::EachMemberIn":
        values, allowed = (value(argument, parameters) for argument in arguments)
        return all(member in allowed for member in values)
    raise AssertionError(f"Rules cannot use {function}")


def refusals(**given: str) -> list[str]:
    """The AssertDescription of every assertion that fails for these parameters (defaults for the rest)."""
    parameters = {name: spec.get("Default", "") for name, spec in TEMPLATE["Parameters"].items()} | given
    failed = []
    for rule in TEMPLATE["Rules"].values():
        if "RuleCondition" in rule and not value(rule["RuleCondition"], parameters):
            continue
        for assertion in rule["Assertions"]:
            if not value(assertion["Assert"], parameters):
                failed.append(" ".join(assertion["AssertDescription"].split()))
    return failed


OPENAI_NEEDS_KEY = "The OpenAI API needs AiApiKeySecretArn (the Secrets Manager secret holding the API key)."
BEDROCK_PRIMARY = (
    "AiProvider bedrock needs a Bedrock model id in AiModelPrimary, such as "
    "anthropic.claude-3-5-haiku-20241022-v1:0 or us.amazon.nova-lite-v1:0."
)
BEDROCK_FALLBACK = "AiProvider bedrock needs a Bedrock model id in AiModelFallback, or none."
ANTHROPIC_NEEDS_KEY = "The Anthropic API needs AiApiKeySecretArn (the Secrets Manager secret holding the API key)."
ANTHROPIC_PRIMARY = "AiProvider anthropic needs an Anthropic model id in AiModelPrimary, such as claude-haiku-4-5."
ANTHROPIC_FALLBACK = "AiProvider anthropic needs an Anthropic model id in AiModelFallback, or none."
WEBHOOK = "WebhookUrl needs WebhookSecretArn (the secret the webhook's header carries)."

GOOD: list[dict[str, str]] = [
    {"AiApiKeySecretArn": SECRET},
    {"AiApiKeySecretArn": SECRET, "AiModelPrimary": "gpt-4.1-mini", "AiModelFallback": "gpt-4o"},
    {"AiProvider": "bedrock", "AiModelPrimary": HAIKU},
    {"AiProvider": "bedrock", "AiModelPrimary": f"us.{HAIKU}", "AiModelFallback": "amazon.nova-lite-v1:0"},
    # Not the OpenAI API: a rule cannot tell whether an endpoint takes no key; the settings check can
    {"AiBaseUrl": "http://localhost:4000/v1"},
    {"AiApiKeySecretArn": SECRET, "WebhookUrl": "https://hooks.example.com/a", "WebhookSecretArn": SECRET},
    {"AiProvider": "anthropic", "AiApiKeySecretArn": SECRET, "AiModelPrimary": "claude-haiku-4-5"},
    {
        "AiProvider": "anthropic",
        "AiApiKeySecretArn": SECRET,
        "AiBaseUrl": "https://api.anthropic.com",
        "AiModelPrimary": "claude-sonnet-4-5-20250929",
        "AiModelFallback": "claude-haiku-4-5",
        "JsonOutputModels": "claude-sonnet-4-5, claude-haiku-4-5",
    },
    # An Anthropic-compatible endpoint on this machine goes without a key
    {"AiProvider": "anthropic", "AiBaseUrl": "http://127.0.0.1:8700", "AiModelPrimary": "claude-haiku-4-5"},
]
BAD: list[tuple[dict[str, str], list[str]]] = [
    ({}, [OPENAI_NEEDS_KEY]),  # the defaults: the OpenAI API, and no key to call it with
    ({"AiProvider": "bedrock"}, [BEDROCK_PRIMARY]),  # with the default model, gpt-4o-mini
    ({"AiProvider": "bedrock", "AiModelPrimary": "deepseek-chat"}, [BEDROCK_PRIMARY]),
    ({"AiProvider": "bedrock", "AiModelPrimary": HAIKU, "AiModelFallback": "gpt-4o"}, [BEDROCK_FALLBACK]),
    ({"AiApiKeySecretArn": SECRET, "WebhookUrl": "https://hooks.example.com/a"}, [WEBHOOK]),
    ({"WebhookUrl": "https://hooks.example.com/a"}, [WEBHOOK, OPENAI_NEEDS_KEY]),
    # Anthropic's API (the default AiBaseUrl stands for it) without a key, with the default model, gpt-4o-mini
    ({"AiProvider": "anthropic"}, [ANTHROPIC_NEEDS_KEY, ANTHROPIC_PRIMARY]),
    (
        {
            "AiProvider": "anthropic",
            "AiApiKeySecretArn": SECRET,
            "AiModelPrimary": "claude-haiku-4-5",
            "AiModelFallback": "gpt-4o",
        },
        [ANTHROPIC_FALLBACK],
    ),
    (
        {"AiProvider": "anthropic", "AiBaseUrl": "https://api.anthropic.com", "AiModelPrimary": "claude-haiku-4-5"},
        [ANTHROPIC_NEEDS_KEY],
    ),
]


@pytest.mark.parametrize("parameters", GOOD)
def test_good_parameters_pass_every_rule(parameters: dict[str, str]) -> None:
    assert refusals(**parameters) == []


@pytest.mark.parametrize(("parameters", "messages"), BAD)
def test_bad_parameters_are_refused_with_the_rule_s_message(parameters: dict[str, str], messages: list[str]) -> None:
    assert sorted(refusals(**parameters)) == sorted(messages)


def test_the_models_bedrock_refuses_are_those_the_engine_prices_that_are_not_bedrock_s() -> None:
    not_bedrock = [model for model in DEFAULT_PRICES if not BEDROCK_MODEL_ID.match(model)]
    for assertion in TEMPLATE["Rules"]["BedrockNeedsBedrockModels"]["Assertions"]:
        listed, _ = assertion["Assert"]["Fn::Not"][0]["Fn::Contains"]
        assert sorted(listed) == sorted(not_bedrock)
    assert TEMPLATE["Parameters"]["AiModelPrimary"]["Default"] in not_bedrock


def test_the_models_anthropic_refuses_are_those_the_engine_prices_that_are_neither_bedrock_s_nor_anthropic_s() -> None:
    others = [model for model in DEFAULT_PRICES if not BEDROCK_MODEL_ID.match(model) and model not in ANTHROPIC_PRICES]
    for assertion in TEMPLATE["Rules"]["AnthropicNeedsAnthropicModels"]["Assertions"]:
        listed, _ = assertion["Assert"]["Fn::Not"][0]["Fn::Contains"]
        assert listed == others
    assert TEMPLATE["Parameters"]["AiModelPrimary"]["Default"] in others


def test_with_anthropic_the_default_base_url_stands_for_anthropic_s_api() -> None:
    environment = functions_environment(
        AiProvider="anthropic", AiApiKeySecretArn=SECRET, AiModelPrimary="claude-haiku-4-5"
    )
    assert environment["AI_BASE_URL"] == ""
    assert load_settings(environment).ai_base_url == "https://api.anthropic.com"
    assert functions_environment(AiApiKeySecretArn=SECRET)["AI_BASE_URL"] == "https://api.openai.com/v1"


def functions_environment(**parameters: str) -> dict[str, str]:
    """What the settings check is sent for these parameters: every variable the functions get."""
    environment = resolver(**parameters).resolve(TEMPLATE["Resources"]["SettingsCheck"]["Properties"]["Environment"])
    named = {
        "JOBS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/123456789012/aijobs-jobs",
        "JOBS_BACKGROUND_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/123456789012/aijobs-background-jobs",
    }
    return {name: str(item) for name, item in environment.items()} | named | {"JOBS_PAYLOAD_BUCKET": "aijobs-payloads"}


@pytest.mark.parametrize(("parameters", "messages"), [case for case in BAD if "WebhookUrl" not in case[0]])
def test_what_a_rule_refuses_the_settings_check_refuses_too(parameters: dict[str, str], messages: list[str]) -> None:
    with pytest.raises(ConfigurationError):
        check_environment(functions_environment(**parameters))


@pytest.mark.parametrize("parameters", GOOD)
def test_what_the_rules_let_through_the_settings_check_takes_when_nothing_else_is_wrong(
    parameters: dict[str, str],
) -> None:
    assert len(check_environment(functions_environment(**parameters))) == 16
