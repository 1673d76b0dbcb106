"""The gateway the runner calls: render the prompt, call the model, validate, price the call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from pydantic import BaseModel

from engine.definitions import JobDefinition, RenderedPrompt
from engine.errors import JobError, SchemaValidationError
from engine.gateway.pricing import PriceTable
from engine.gateway.provider import CompletionRequest, ModelProvider


@dataclass(frozen=True, slots=True)
class ModelTiers:
    primary: str
    fallback: str | None = None

    def model_for(self, tier: str) -> str:
        return self.fallback if tier == "fallback" and self.fallback else self.primary


@dataclass(frozen=True, slots=True)
class Execution:
    """One attempt's result: the validated output or the error, and what the calls cost."""

    prompt: RenderedPrompt
    provider: str
    tier: str
    model: str
    output: BaseModel | None = None
    error: JobError | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    latency_ms: int = 0
    # True once a provider answered; such an attempt cost tokens even when it failed.
    answered: bool = False


class ModelGateway:
    def __init__(self, provider: ModelProvider, models: ModelTiers, prices: PriceTable | None = None) -> None:
        self._provider = provider
        self._models = models
        self._prices = prices or PriceTable()

    def execute(self, definition: JobDefinition, job_input: BaseModel, timeout_seconds: float) -> Execution:
        prompt = definition.render_prompt(job_input)
        tier = definition.model_tier
        model = self._models.model_for(tier)
        request = CompletionRequest(
            model=model,
            system=prompt.system,
            user=prompt.user,
            schema_name=definition.name,
            output_schema=definition.output_json_schema,
            max_tokens=definition.max_tokens,
            timeout_seconds=timeout_seconds,
        )
        attempt = Execution(prompt=prompt, provider=self._provider.name, tier=tier, model=model)
        try:
            completion = self._provider.complete(request)
        except JobError as exc:
            return replace(attempt, error=exc)
        answered = replace(
            attempt,
            answered=True,
            input_tokens=completion.input_tokens,
            output_tokens=completion.output_tokens,
            cost_usd=self._prices.cost(model, completion.input_tokens, completion.output_tokens),
            latency_ms=completion.latency_ms,
        )
        if not completion.content:
            reason = completion.finish_reason or "unknown"
            return replace(
                answered, error=SchemaValidationError(f"the model returned no content (finish_reason {reason})")
            )
        try:
            output = definition.validate_output(job_input, completion.content)
        except JobError as exc:
            return replace(answered, error=exc)
        return replace(answered, output=output)
