"""ModelGateway.execute with a scripted provider; ModelTiers; PriceTable."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from engine.definitions import JobDefinition, JobRegistry
from engine.errors import (
    ErrorCode,
    JobError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.gateway import Completion, CompletionRequest, Execution, ModelGateway, ModelTiers, PriceTable
from engine.gateway.pricing import DEFAULT_PRICES, ModelPrice
from tests.support.providers import VALID_OUTPUTS, FakeProvider

# gpt-4o-mini at 0.15 / 0.60 USD per million tokens: 100 in + 20 out.
GPT_4O_MINI_100_20 = Decimal("0.000027")

INPUTS: dict[str, dict[str, Any]] = {
    "classify": {"text": "Win a free cruise now!", "labels": ["spam", "ham"]},
    "summarize": {"text": "SQS delivers messages at least once.", "max_words": 10},
    "answer_with_citations": {"question": "How long?", "documents": [{"id": "d1", "text": "Up to 14 days."}]},
}


def run(
    provider: FakeProvider,
    job_type: str = "classify",
    tiers: ModelTiers | None = None,
    prices: PriceTable | None = None,
    definition: JobDefinition | None = None,
) -> Execution:
    definition = definition or JobRegistry().get(job_type)
    gateway = ModelGateway(provider, tiers or ModelTiers("gpt-4o-mini"), prices)
    job_input = definition.parse_input(INPUTS[definition.name])
    return gateway.execute(definition, job_input, timeout_seconds=12.5)


@pytest.mark.parametrize("job_type", sorted(VALID_OUTPUTS))
def test_a_valid_answer_carries_output_tokens_and_cost(job_type: str) -> None:
    provider = FakeProvider()

    execution = run(provider, job_type)

    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS[job_type]
    assert execution.answered is True
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == GPT_4O_MINI_100_20
    assert execution.latency_ms == 5
    assert (execution.provider, execution.tier, execution.model) == ("fake", "primary", "gpt-4o-mini")
    assert (execution.prompt.key, execution.prompt.version) == (job_type, "1")


def test_the_provider_is_asked_with_the_definitions_prompt_schema_and_limits() -> None:
    provider = FakeProvider()
    definition = JobRegistry().get("classify")

    execution = run(provider, "classify")

    assert provider.calls == 1
    request = provider.requests[0]
    assert request == CompletionRequest(
        model="gpt-4o-mini",
        system=execution.prompt.system,
        user=execution.prompt.user,
        schema_name="classify",
        output_schema=definition.output_json_schema,
        max_tokens=256,
        timeout_seconds=12.5,
    )
    assert "Win a free cruise now!" in request.user


@pytest.mark.parametrize(
    ("job_type", "answer", "code"),
    [
        ("classify", "this is not json", ErrorCode.SCHEMA_VALIDATION_FAILED),
        ("classify", {"label": "spam"}, ErrorCode.SCHEMA_VALIDATION_FAILED),
        ("classify", {"label": "spam", "confidence": 0.5, "extra": 1}, ErrorCode.SCHEMA_VALIDATION_FAILED),
        ("classify", {"label": "eggs", "confidence": 0.5}, ErrorCode.BUSINESS_VALIDATION_FAILED),
        ("summarize", {"summary": " ".join(["w"] * 13)}, ErrorCode.BUSINESS_VALIDATION_FAILED),
        ("answer_with_citations", {"answer": "a", "citations": ["d7"]}, ErrorCode.REFERENCE_VALIDATION_FAILED),
    ],
)
def test_an_invalid_answer_is_an_error_that_still_cost_tokens(job_type: str, answer: Any, code: ErrorCode) -> None:
    provider = FakeProvider(lambda _: answer, input_tokens=300, output_tokens=50)

    execution = run(provider, job_type)

    assert execution.output is None
    assert execution.error is not None
    assert execution.error.code is code
    assert execution.error.retryable is False
    assert execution.answered is True
    assert (execution.input_tokens, execution.output_tokens) == (300, 50)
    assert execution.cost_usd == Decimal("0.000075")  # (300 * 0.15 + 50 * 0.60) / 1e6


@pytest.mark.parametrize("finish_reason", ["length", "content_filter", ""])
def test_an_empty_answer_is_a_schema_failure_naming_the_finish_reason(finish_reason: str) -> None:
    def empty(request: CompletionRequest) -> Completion:
        return Completion("", request.model, 40, 0, latency_ms=3, finish_reason=finish_reason)

    execution = run(FakeProvider(empty))

    assert execution.error is not None
    assert execution.error.code is ErrorCode.SCHEMA_VALIDATION_FAILED
    assert execution.error.message == f"the model returned no content (finish_reason {finish_reason or 'unknown'})"
    assert execution.answered is True
    assert execution.input_tokens == 40
    assert execution.cost_usd == Decimal("0.000006")


@pytest.mark.parametrize(
    "error",
    [
        ProviderRateLimitedError("429", retry_after_seconds=3),
        ProviderTimeoutError("timeout"),
        ProviderUnavailableError("503"),
        ProviderRejectedError("401", status_code=401),
    ],
)
def test_a_provider_error_is_returned_unanswered_and_free(error: JobError) -> None:
    execution = run(FakeProvider(lambda _: error))

    assert execution.error is error
    assert execution.output is None
    assert execution.answered is False
    assert (execution.input_tokens, execution.output_tokens, execution.cost_usd) == (0, 0, Decimal(0))
    assert execution.model == "gpt-4o-mini"


def test_an_unpriced_model_costs_zero_but_keeps_its_tokens() -> None:
    execution = run(FakeProvider(), tiers=ModelTiers("my-local-llama"))

    assert execution.model == "my-local-llama"
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == Decimal(0)


def test_custom_prices_are_used_for_the_cost() -> None:
    prices = PriceTable({"gpt-4o-mini": ModelPrice(Decimal(1), Decimal(2))})

    execution = run(FakeProvider(), prices=prices)

    assert execution.cost_usd == Decimal("0.00014")  # (100 * 1 + 20 * 2) / 1e6


def test_a_fallback_tier_definition_calls_the_fallback_model() -> None:
    # Given a job type that runs on the fallback tier
    summarize = JobRegistry().get("summarize")
    definition = JobDefinition(
        name="summarize",
        input_model=summarize.input_model,
        output_model=summarize.output_model,
        prompt=summarize.prompt,
        model_tier="fallback",
    )
    provider = FakeProvider()

    execution = run(provider, definition=definition, tiers=ModelTiers("gpt-4o-mini", fallback="gpt-4o"))

    assert provider.requests[0].model == "gpt-4o"
    assert (execution.tier, execution.model) == ("fallback", "gpt-4o")
    assert execution.cost_usd == Decimal("0.00045")  # (100 * 2.50 + 20 * 10.00) / 1e6


# --- ModelTiers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tiers", "tier", "model"),
    [
        (ModelTiers("p"), "primary", "p"),
        (ModelTiers("p"), "fallback", "p"),
        (ModelTiers("p", None), "fallback", "p"),
        (ModelTiers("p", ""), "fallback", "p"),
        (ModelTiers("p", "f"), "primary", "p"),
        (ModelTiers("p", "f"), "fallback", "f"),
    ],
)
def test_model_tiers_map_a_tier_to_a_model(tiers: ModelTiers, tier: str, model: str) -> None:
    assert tiers.model_for(tier) == model


# --- PriceTable -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "input_tokens", "output_tokens", "cost"),
    [
        ("gpt-4o-mini", 0, 0, Decimal("0")),
        ("gpt-4o-mini", 1_000_000, 0, Decimal("0.15")),
        ("gpt-4o-mini", 0, 1_000_000, Decimal("0.60")),
        ("gpt-4o-mini", 812, 40, Decimal("0.0001458")),
        ("gpt-4o", 1_000_000, 1_000_000, Decimal("12.50")),
        ("amazon.nova-micro-v1:0", 1, 1, Decimal("0.000000175")),
        ("deepseek-chat", 1234, 567, Decimal("0.00095688")),
    ],
)
def test_cost_is_tokens_times_the_price_per_million(
    model: str, input_tokens: int, output_tokens: int, cost: Decimal
) -> None:
    assert PriceTable().cost(model, input_tokens, output_tokens) == cost


def test_cost_is_exact_to_the_nano_dollar() -> None:
    cost = PriceTable().cost("gpt-4o-mini", 1, 0)

    assert cost == Decimal("0.000000150")
    assert cost.as_tuple().exponent == -9


def test_an_unknown_model_costs_zero() -> None:
    table = PriceTable()

    assert table.cost("no-such-model", 1_000, 1_000) == Decimal(0)
    assert table.cost("no-such-model", 5, 5) == Decimal(0)


def test_overrides_replace_and_extend_the_default_prices() -> None:
    table = PriceTable.with_overrides(
        {"gpt-4o-mini": (Decimal("1"), Decimal("1")), "my-model": (Decimal("0.5"), Decimal("2"))}
    )

    assert table.cost("gpt-4o-mini", 1_000_000, 1_000_000) == Decimal("2")
    assert table.cost("my-model", 2_000_000, 1_000_000) == Decimal("3")
    assert table.cost("gpt-4o", 1_000_000, 0) == Decimal("2.50")


def test_overrides_leave_the_defaults_untouched() -> None:
    PriceTable.with_overrides({"gpt-4o-mini": (Decimal("9"), Decimal("9"))})

    assert DEFAULT_PRICES["gpt-4o-mini"] == ModelPrice(Decimal("0.15"), Decimal("0.60"))
    assert PriceTable().cost("gpt-4o-mini", 1_000_000, 0) == Decimal("0.15")


def test_the_fake_provider_answers_json() -> None:
    # Guards the shared fixture the gateway tests lean on.
    completion = FakeProvider().complete(
        CompletionRequest("m", "s", "u", "classify", {}, max_tokens=1, timeout_seconds=1)
    )

    assert json.loads(completion.content) == VALID_OUTPUTS["classify"]
