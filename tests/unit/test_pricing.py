"""PriceTable: what a call costs by kind of token, what caching saved, and the most a call can cost."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from engine.config import load_settings
from engine.core import Via
from engine.gateway import Completion, price_table
from engine.gateway.pricing import DEFAULT_PRICES, PRICES_AS_OF, ModelPrice, PriceTable


def tokens(input_tokens: int, output_tokens: int, cached: int = 0, written: int = 0, reasoning: int = 0) -> Completion:
    return Completion(
        content="{}",
        model="m",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=1,
        cached_input_tokens=cached,
        cache_write_input_tokens=written,
        reasoning_tokens=reasoning,
    )


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
def test_without_caching_cost_is_tokens_times_the_price_per_million(
    model: str, input_tokens: int, output_tokens: int, cost: Decimal
) -> None:
    priced = PriceTable().cost(model, tokens(input_tokens, output_tokens))

    assert (priced.usd, priced.cache_savings_usd) == (cost, Decimal(0))


def test_cost_is_exact_to_the_nano_dollar() -> None:
    cost = PriceTable().cost("gpt-4o-mini", tokens(1, 0)).usd

    assert cost == Decimal("0.000000150")
    assert cost.as_tuple().exponent == -9


def test_cached_input_is_billed_at_the_cached_price_and_the_difference_is_the_saving() -> None:
    # Given 1M input tokens of which 600k were read from the cache, on gpt-4o-mini (0.15 / 0.075)
    priced = PriceTable().cost("gpt-4o-mini", tokens(1_000_000, 0, cached=600_000))

    # Then 400k cost full price, 600k half of it
    assert priced.usd == Decimal("0.105")  # 0.4 * 0.15 + 0.6 * 0.075
    assert priced.cache_savings_usd == Decimal("0.045")  # 0.6 * (0.15 - 0.075)


def test_cache_writes_dearer_than_input_save_a_negative_amount() -> None:
    # Given an Anthropic model on Bedrock: cache writes at 1.00, reads at 0.08, input 0.80 per million
    model = "anthropic.claude-3-5-haiku-20241022-v1:0"

    priced = PriceTable().cost(model, tokens(1_000_000, 0, cached=250_000, written=500_000))

    assert priced.usd == Decimal("0.72")  # 0.25 * 0.80 + 0.25 * 0.08 + 0.5 * 1.00
    assert priced.cache_savings_usd == Decimal("0.08")  # 0.25 * 0.72 - 0.5 * 0.20


def test_reasoning_tokens_are_billed_as_the_output_tokens_they_are_part_of() -> None:
    plain = PriceTable().cost("gpt-4.1-mini", tokens(0, 1_000))
    reasoning = PriceTable().cost("gpt-4.1-mini", tokens(0, 1_000, reasoning=900))

    assert plain == reasoning
    assert reasoning.usd == Decimal("0.0016")


def test_an_unknown_model_costs_zero() -> None:
    table = PriceTable()

    assert table.cost("no-such-model", tokens(1_000, 1_000, cached=500)).usd == Decimal(0)
    assert table.most("no-such-model", 1_000, 1_000) == Decimal(0)


def test_the_most_a_call_costs_prices_input_at_its_dearest_kind_and_rounds_up() -> None:
    table = PriceTable({"m": ModelPrice.of("1", "2", cached_input="0.5", cache_write="1.25")})

    assert table.most("m", 1_000_000, 1_000_000) == Decimal("3.25")
    assert table.most("m", 1, 0) == Decimal("0.000001250")
    assert PriceTable({"m": ModelPrice.of("0.1", "0")}).most("m", 1, 0) == Decimal("0.000000100")
    assert PriceTable({"m": ModelPrice.of("0.0001", "0")}).most("m", 1, 0) == Decimal("0.000000001")


def test_overrides_replace_and_extend_the_default_prices() -> None:
    table = PriceTable.with_overrides({"gpt-4o-mini": ModelPrice.of(1, 1), "my-model": ModelPrice.of("0.5", 2)})

    assert table.cost("gpt-4o-mini", tokens(1_000_000, 1_000_000)).usd == Decimal("2")
    assert table.cost("gpt-4o-mini", tokens(1_000_000, 0, cached=1_000_000)).usd == Decimal("1")
    assert table.cost("my-model", tokens(2_000_000, 1_000_000)).usd == Decimal("3")
    assert table.cost("gpt-4o", tokens(1_000_000, 0)).usd == Decimal("2.50")


def test_overrides_leave_the_defaults_untouched() -> None:
    PriceTable.with_overrides({"gpt-4o-mini": ModelPrice.of(9, 9)})

    assert DEFAULT_PRICES["gpt-4o-mini"] == ModelPrice.of("0.15", "0.60", cached_input="0.075")
    assert PriceTable().cost("gpt-4o-mini", tokens(1_000_000, 0)).usd == Decimal("0.15")


def test_the_built_in_table_carries_its_date_and_prices_every_kind() -> None:
    assert date.fromisoformat(PRICES_AS_OF) <= date.today()
    for price in DEFAULT_PRICES.values():
        assert price.cached_input <= price.input <= price.output
        assert price.cache_write >= price.input


@pytest.mark.parametrize(
    "model",
    [
        "anthropic.claude-3-5-haiku-20241022-v1:0",
        "us.anthropic.claude-3-5-haiku-20241022-v1:0",
        "eu.anthropic.claude-3-5-haiku-20241022-v1:0",
        "apac.anthropic.claude-3-5-haiku-20241022-v1:0",
        "global.anthropic.claude-3-5-haiku-20241022-v1:0",
        "us-gov.anthropic.claude-3-5-haiku-20241022-v1:0",
        "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-haiku-20241022-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0",
    ],
)
def test_bedrock_inference_profiles_and_arns_are_priced_by_their_base_model(model: str) -> None:
    priced = PriceTable().cost(model, tokens(1_000_000, 1_000_000))

    assert priced.priced
    assert priced.usd == Decimal("4.80")  # 0.80 input + 4.00 output


def test_a_price_of_its_own_wins_over_the_base_models() -> None:
    profile = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
    table = PriceTable.with_overrides({profile: ModelPrice.of("1", "1")})

    assert table.cost(profile, tokens(1_000_000, 0)).usd == Decimal("1")


@pytest.mark.parametrize(
    "model",
    [
        "my-fine-tune",
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5",
        "us.anthropic.claude-9-unknown-v1:0",
        "usa.anthropic.claude-3-5-haiku-20241022-v1:0",
    ],
)
def test_a_model_with_no_price_costs_zero_marked_unpriced(model: str) -> None:
    table = PriceTable()

    priced = table.cost(model, tokens(1_000, 1_000))

    assert (priced.usd, priced.priced) == (Decimal(0), False)
    assert table.unpriced([model, "gpt-4o-mini"]) == [model]


# --- a route's share -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("via", "usd"),
    [(Via.REALTIME, Decimal("0.000065")), (Via.BATCH, Decimal("0.0000325")), (Via.FLEX, Decimal("0.0000325"))],
)
def test_a_batch_or_flex_call_costs_half_of_the_same_call_in_real_time(via: Via, usd: Decimal) -> None:
    # gpt-5-mini at 0.25 / 2.00 USD per million tokens: 100 in, 20 out
    assert PriceTable().cost("gpt-5-mini", Completion("{}", "gpt-5-mini", 100, 20, latency_ms=0), via).usd == usd


def test_a_flex_share_of_a_price_of_its_own_prices_flex_and_gives_the_model_a_flex_tier() -> None:
    prices = PriceTable.with_overrides({"my-model": ModelPrice.of("1", "2", flex="0.25")})
    tokens = Completion("{}", "my-model", 1_000_000, 0, latency_ms=0)

    assert prices.cost("my-model", tokens, Via.FLEX).usd == Decimal("0.25")
    assert prices.cost("my-model", tokens, Via.BATCH).usd == Decimal("0.5")  # the batch share is its own
    assert prices.offers_flex("my-model")
    assert not PriceTable.with_overrides({"my-model": ModelPrice.of("1", "2")}).offers_flex("my-model")


def test_the_settings_flex_share_reaches_the_price_table() -> None:
    settings = load_settings(
        {
            "JOBS_TABLE_NAME": "jobs",
            "JOBS_QUEUE_URL": "https://sqs/q",
            "JOBS_PAYLOAD_BUCKET": "aijobs-payloads",
            "AIJOBS_PRICES": '{"gpt-4o-mini": {"input": 0.15, "output": 0.6, "flex": 0.4}}',
        }
    )

    prices = price_table(settings)

    assert prices.offers_flex("gpt-4o-mini")
    assert prices.cost("gpt-4o-mini", Completion("{}", "gpt-4o-mini", 1_000_000, 0, latency_ms=0), Via.FLEX).usd == (
        Decimal("0.06")
    )


@pytest.mark.parametrize(
    ("model", "usd"),
    [
        # 250k uncached, 250k read, 500k written, 100k out
        ("claude-haiku-4-5", Decimal("1.40")),  # 0.25 * 1 + 0.25 * 0.10 + 0.5 * 1.25 + 0.1 * 5
        ("claude-3-5-haiku-20241022", Decimal("1.12")),  # 0.25 * 0.80 + 0.25 * 0.08 + 0.5 * 1.00 + 0.1 * 4
        ("claude-3-haiku-20240307", Decimal("0.345")),  # 0.25 * 0.25 + 0.25 * 0.03 + 0.5 * 0.30 + 0.1 * 1.25
    ],
)
def test_claude_cache_reads_and_writes_are_priced_as_anthropic_lists_them(model: str, usd: Decimal) -> None:
    # Given a call on Anthropic's API that read and wrote the prompt cache
    completion = tokens(1_000_000, 100_000, cached=250_000, written=500_000)

    # When it is priced
    priced = PriceTable().cost(model, completion)

    # Then each kind of token costs what Anthropic's pricing page lists for the model
    assert priced.usd == usd
