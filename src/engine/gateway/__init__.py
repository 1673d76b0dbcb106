"""The only modules that talk to model providers."""

from __future__ import annotations

import json

from engine.config import Settings
from engine.gateway.bedrock import BedrockConverseProvider
from engine.gateway.gateway import Execution, ModelGateway, ModelTiers
from engine.gateway.openai import ApiKeySource, OpenAICompatibleProvider, static_api_key
from engine.gateway.pricing import PriceTable
from engine.gateway.provider import ChatTurn, Completion, CompletionRequest, ModelProvider

__all__ = [
    "ApiKeySource",
    "BedrockConverseProvider",
    "ChatTurn",
    "Completion",
    "CompletionRequest",
    "Execution",
    "ModelGateway",
    "ModelProvider",
    "ModelTiers",
    "OpenAICompatibleProvider",
    "PriceTable",
    "api_key_source",
    "build_gateway",
    "static_api_key",
]

# Secrets Manager is read at most this often per warm worker.
SECRET_MAX_AGE_SECONDS = 300


def api_key_source(settings: Settings) -> ApiKeySource:
    """Where the API key comes from: Secrets Manager in Lambda, a plain variable locally."""
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


def build_gateway(settings: Settings) -> ModelGateway:
    provider: ModelProvider
    if settings.ai_provider == "bedrock":
        # IAM-authenticated in the function's own region; no key, no base URL.
        provider = BedrockConverseProvider()
    else:
        provider = OpenAICompatibleProvider(
            settings.ai_base_url, api_key_source(settings), structured_output=settings.ai_structured_output
        )
    return ModelGateway(
        provider,
        ModelTiers(primary=settings.ai_model_primary, fallback=settings.ai_model_fallback),
        PriceTable.with_overrides(settings.aijobs_model_prices),
        repair_attempts=settings.aijobs_repair_attempts,
    )
