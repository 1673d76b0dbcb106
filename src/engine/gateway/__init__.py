"""The only modules that talk to model providers.

The adapters (openai.py and anthropic.py over httpx, bedrock.py over boto3) are imported by
`build_gateway` for the configured provider only: a worker never loads the others.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from engine.config import Settings, is_local_host
from engine.core.errors import ConfigurationError
from engine.gateway.gateway import Answered, CallPlan, CallTier, Execution, FlexModels, ModelGateway, ModelTiers
from engine.gateway.pricing import ANTHROPIC_PRICES, DEFAULT_PRICES, ModelPrice, PriceTable
from engine.gateway.provider import ChatTurn, Completion, CompletionRequest, ModelProvider

if TYPE_CHECKING:
    from engine.gateway.openai import ApiKeySource

__all__ = [
    "Answered",
    "CallPlan",
    "CallTier",
    "ChatTurn",
    "Completion",
    "CompletionRequest",
    "Execution",
    "FlexModels",
    "ModelGateway",
    "ModelPrice",
    "ModelProvider",
    "ModelTiers",
    "PriceTable",
    "api_key_source",
    "build_gateway",
    "check_provider",
    "price_table",
]

# Secrets Manager is read at most this often per warm worker.
SECRET_MAX_AGE_SECONDS = 300
# A Bedrock model id: <provider>.<model> (anthropic.claude-3-5-haiku-20241022-v1:0), behind a
# cross-region inference profile's prefix (us., eu., apac., global., us-gov.) or not, or an ARN.
# The provider part has no hyphen, so the ids of other APIs (gpt-4o-mini, gpt-4.1, claude-3-5-haiku,
# deepseek-chat) do not pass for one.
BEDROCK_MODEL_ID = re.compile(
    r"^(arn:aws[a-z-]*:bedrock:\S+|([a-z]{2,6}(-gov)?\.)?[a-z][a-z0-9]*\.[A-Za-z0-9][\w.:-]*)$"
)


def api_key_source(settings: Settings) -> ApiKeySource:
    """Where the API key comes from: Secrets Manager in Lambda, a plain variable locally."""
    from engine.gateway.openai import static_api_key

    arn = settings.ai_api_key_secret_arn
    if arn:

        def from_secret(*, refresh: bool = False) -> str | None:
            from aws_lambda_powertools.utilities import parameters

            secret = str(parameters.get_secret(arn, max_age=SECRET_MAX_AGE_SECONDS, force_fetch=refresh))
            # A secret is either the key itself or a JSON object holding it as "api_key".
            if secret.lstrip().startswith("{"):
                return str(json.loads(secret)["api_key"])
            return secret

        return from_secret
    return static_api_key(settings.ai_api_key.get_secret_value() if settings.ai_api_key else None)


def price_table(settings: Settings) -> PriceTable:
    """The built-in prices with AIJOBS_PRICES over them."""
    overrides = {
        model: ModelPrice.of(price.input, price.output, price.cached_input, price.cache_write, price.batch, price.flex)
        for model, price in settings.aijobs_prices.items()
    }
    return PriceTable.with_overrides(overrides)


def check_provider(settings: Settings) -> None:
    """Refuse, with one line naming the variable, a provider configuration that would fail every job."""
    if settings.ai_provider == "bedrock":
        for variable, model in (
            ("AI_MODEL_PRIMARY", settings.ai_model_primary),
            ("AI_MODEL_FALLBACK", settings.ai_model_fallback),
        ):
            if model is not None and not BEDROCK_MODEL_ID.match(model):
                raise ConfigurationError(
                    f"{variable}: {model!r} is not a Bedrock model id (<provider>.<model>, such as "
                    "anthropic.claude-3-5-haiku-20241022-v1:0, or an inference profile's, such as "
                    "us.amazon.nova-lite-v1:0)"
                )
        return
    if settings.ai_provider == "anthropic":
        for variable, model in (
            ("AI_MODEL_PRIMARY", settings.ai_model_primary),
            ("AI_MODEL_FALLBACK", settings.ai_model_fallback),
        ):
            # A Bedrock id, or a model the engine prices as another provider's: no Anthropic model.
            if model is not None and (
                BEDROCK_MODEL_ID.match(model) or (model in DEFAULT_PRICES and model not in ANTHROPIC_PRICES)
            ):
                raise ConfigurationError(
                    f"{variable}: {model!r} is not an Anthropic model id (such as claude-haiku-4-5 or "
                    "claude-sonnet-4-5-20250929)"
                )
    host = urlsplit(settings.ai_base_url).hostname or ""
    if settings.ai_api_key is None and settings.ai_api_key_secret_arn is None and not is_local_host(host):
        raise ConfigurationError(
            f"AI_API_KEY_SECRET_ARN: the provider at {host} needs an API key (a Secrets Manager secret, the "
            "template's AiApiKeySecretArn; AI_API_KEY locally); only an endpoint on this machine goes without one"
        )


# Which models a provider is asked the flex tier of (docs/cost.md): an OpenAI-compatible one, any (one
# without it says so); Bedrock, those listed; Anthropic sells none, so its jobs are called as with flex off.
FLEX_MODELS_OF = {"openai": FlexModels.ANY, "bedrock": FlexModels.LISTED, "anthropic": FlexModels.NONE}


def build_gateway(settings: Settings) -> ModelGateway:
    check_provider(settings)
    provider: ModelProvider
    if settings.ai_provider == "bedrock":
        from engine.gateway.bedrock import BedrockConverseProvider

        # IAM-authenticated in the function's own region; no key, no base URL.
        provider = BedrockConverseProvider()
    elif settings.ai_provider == "anthropic":
        from engine.gateway.anthropic import AnthropicProvider

        provider = AnthropicProvider(
            settings.ai_base_url, api_key_source(settings), json_output_models=settings.ai_json_output_models
        )
    else:
        from engine.gateway.openai import OpenAICompatibleProvider

        provider = OpenAICompatibleProvider(
            settings.ai_base_url, api_key_source(settings), structured_output=settings.ai_structured_output
        )
    return ModelGateway(
        provider,
        ModelTiers(primary=settings.ai_model_primary, fallback=settings.ai_model_fallback),
        price_table(settings),
        repair_attempts=settings.aijobs_repair_attempts,
        flex_models=FLEX_MODELS_OF[settings.ai_provider],
    )
