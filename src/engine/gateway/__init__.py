"""The only modules that talk to model providers.

The adapters (openai.py over httpx, bedrock.py over boto3) are imported by `build_gateway` for the
configured provider only: a worker never loads the other one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from engine.config import Settings
from engine.gateway.gateway import CallPlan, Execution, ModelGateway, ModelTiers
from engine.gateway.pricing import ModelPrice, PriceTable
from engine.gateway.provider import ChatTurn, Completion, CompletionRequest, ModelProvider

if TYPE_CHECKING:
    from engine.gateway.openai import ApiKeySource

__all__ = [
    "CallPlan",
    "ChatTurn",
    "Completion",
    "CompletionRequest",
    "Execution",
    "ModelGateway",
    "ModelPrice",
    "ModelProvider",
    "ModelTiers",
    "PriceTable",
    "api_key_source",
    "build_gateway",
    "price_table",
]

# Secrets Manager is read at most this often per warm worker.
SECRET_MAX_AGE_SECONDS = 300


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
        model: ModelPrice.of(price.input, price.output, price.cached_input, price.cache_write)
        for model, price in settings.aijobs_prices.items()
    }
    return PriceTable.with_overrides(overrides)


def build_gateway(settings: Settings) -> ModelGateway:
    provider: ModelProvider
    if settings.ai_provider == "bedrock":
        from engine.gateway.bedrock import BedrockConverseProvider

        # IAM-authenticated in the function's own region; no key, no base URL.
        provider = BedrockConverseProvider()
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
    )
