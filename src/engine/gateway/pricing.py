"""What a model call costs: its tokens of each kind times the model's prices, in US dollars.

Prices are per million tokens, for uncached input, cached input (a prompt-cache read), cache-write
input, and output. Token kinds follow the OpenTelemetry GenAI conventions the adapters report in:
input tokens include the cached and cache-write ones, output tokens include the reasoning ones
(billed as output). The built-in table is list prices as of PRICES_AS_OF; AIJOBS_PRICES overrides
or extends it (docs/configuration.md). A call through a provider's batch API costs the model's
`batch` share of these (half, as OpenAI, Anthropic and Bedrock sell batches), and one served at the
provider's flex tier its `flex` share (half: OpenAI sells flex at the batch price). Which models
have a flex tier: FLEX_MODELS (the providers' lists), and any model whose price gives a `flex` share.

A model id is priced by its own entry, else by its base model's: Bedrock ids name the same model
under a cross-region inference profile (`us.`, `eu.`, `apac.`, `global.`, ... before the model id) or
as an ARN (`arn:aws:bedrock:...:foundation-model/<id>` or `.../inference-profile/<id>`). A model
with no price at all costs 0 and its usage is marked unpriced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Protocol

from engine.core import Via
from engine.observability import logger

_MILLION = Decimal(1_000_000)
_NANO_USD = Decimal("0.000000001")

# The date the built-in prices were taken from the providers' price lists.
PRICES_AS_OF = "2025-08-07"
# What a batch call costs as a share of the same call in real time, unless a price says otherwise.
BATCH_SHARE = Decimal("0.5")
# What a call served at the provider's flex tier costs as a share of the same call at its standard
# tier, unless a price says otherwise: OpenAI's flex tokens are priced at its Batch API rates.
FLEX_SHARE = Decimal("0.5")
# The models the providers sell at a flex tier (matched whole against a model id and its base model's):
# OpenAI's flex processing guide and pricing page (GPT-5 and its mini and nano, o3, o4-mini); Amazon
# Bedrock's service tiers guide (gpt-oss, DeepSeek V3.1, Qwen3, Nova Pro, Premier and 2 Lite). Any
# other model has one when its AIJOBS_PRICES entry gives a `flex` share.
FLEX_MODELS = re.compile(
    r"gpt-5(\.\d+)?(-mini|-nano)?(-\d{4}-\d{2}-\d{2})?"
    r"|o3(-\d{4}-\d{2}-\d{2})?|o4-mini(-\d{4}-\d{2}-\d{2})?"
    r"|openai\.gpt-oss-(20b|120b)-1:0|deepseek\.v3-v\d+:\d+|qwen\.qwen3-[a-z0-9-]+-v\d+:\d+"
    r"|amazon\.nova-(pro|premier|2-lite)-v\d+:\d+"
)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """US dollars per million tokens of each kind."""

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write: Decimal
    batch: Decimal = BATCH_SHARE
    # The share a flex call costs, when a price gives one (it then says the model has a flex tier);
    # None: FLEX_SHARE, for the models of FLEX_MODELS.
    flex: Decimal | None = None

    @classmethod
    def of(
        cls,
        input: str | int | Decimal,
        output: str | int | Decimal,
        cached_input: str | int | Decimal | None = None,
        cache_write: str | int | Decimal | None = None,
        batch: str | Decimal | None = None,
        flex: str | Decimal | None = None,
    ) -> ModelPrice:
        """A price; cached and cache-write input cost as much as input unless given, a batch call half."""
        full = Decimal(input)
        return cls(
            input=full,
            output=Decimal(output),
            cached_input=full if cached_input is None else Decimal(cached_input),
            cache_write=full if cache_write is None else Decimal(cache_write),
            batch=BATCH_SHARE if batch is None else Decimal(batch),
            flex=None if flex is None else Decimal(flex),
        )

    def share(self, via: Via) -> Decimal:
        """What a call made `via` a route costs, as a share of the same call in real time."""
        if via is Via.BATCH:
            return self.batch
        if via is Via.FLEX:
            return FLEX_SHARE if self.flex is None else self.flex
        return Decimal(1)


class TokenCounts(Protocol):
    """The tokens of a call (engine.gateway.Completion has them)."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cached_input_tokens(self) -> int: ...
    @property
    def cache_write_input_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Cost:
    usd: Decimal
    # What the cached and cache-write tokens cost less than uncached input would have (negative
    # when cache writes are dearer, as on Anthropic models).
    cache_savings_usd: Decimal
    # False when the model has no price: the cost is 0 because it is unknown, not because it is free.
    priced: bool = True


# The geography prefix of a Bedrock cross-region inference profile id: `us.anthropic.claude-...`.
_PROFILE_PREFIX = re.compile(r"^(?:us|us-gov|eu|apac|jp|au|ca|global)\.(?=[a-z0-9-]+\.)")


def base_model_ids(model: str) -> Iterator[str]:
    """The ids `model` may be priced under, most specific first: itself, the id an ARN names, and the
    base model of a cross-region inference profile."""
    yield model
    resource = model.rsplit("/", 1)[-1] if model.startswith("arn:") and "/" in model else model
    if resource != model:
        yield resource
    base = _PROFILE_PREFIX.sub("", resource, count=1)
    if base != resource:
        yield base


def claude_price(input: str, output: str) -> ModelPrice:
    """A Claude model's price on Anthropic's API: a cache read costs a tenth of input, a (5-minute) cache
    write 1.25 times it."""
    full = Decimal(input)
    return ModelPrice.of(full, output, cached_input=full / 10, cache_write=full * Decimal("1.25"))


# Anthropic's API, by each model's id and its alias (its "Models overview" and "Pricing" pages, as of
# 2026-03-01). Claude Haiku 3 is the one whose cache prices are not the rule's: 0.30 a cache write
# (1.2 times input) and 0.03 a cache read.
ANTHROPIC_PRICES: Mapping[str, ModelPrice] = {
    "claude-3-haiku-20240307": ModelPrice.of("0.25", "1.25", cached_input="0.03", cache_write="0.30"),
    **{
        model: claude_price(input, output)
        for models, input, output in (
            (("claude-opus-4-6",), "5", "25"),
            (("claude-sonnet-4-6",), "3", "15"),
            (("claude-opus-4-5", "claude-opus-4-5-20251101"), "5", "25"),
            (("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"), "3", "15"),
            (("claude-haiku-4-5", "claude-haiku-4-5-20251001"), "1", "5"),
            (("claude-opus-4-1", "claude-opus-4-1-20250805"), "15", "75"),
            (("claude-opus-4-0", "claude-opus-4-20250514"), "15", "75"),
            (("claude-sonnet-4-0", "claude-sonnet-4-20250514"), "3", "15"),
            (("claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219"), "3", "15"),
            (("claude-3-5-haiku-latest", "claude-3-5-haiku-20241022"), "0.80", "4"),
        )
        for model in models
    },
}

# OpenAI bills cache writes as input; Anthropic models on Bedrock bill them at 1.25 x input.
DEFAULT_PRICES: Mapping[str, ModelPrice] = {
    "gpt-4o-mini": ModelPrice.of("0.15", "0.60", cached_input="0.075"),
    "gpt-4o": ModelPrice.of("2.50", "10.00", cached_input="1.25"),
    "gpt-4.1": ModelPrice.of("2.00", "8.00", cached_input="0.50"),
    "gpt-4.1-mini": ModelPrice.of("0.40", "1.60", cached_input="0.10"),
    "gpt-4.1-nano": ModelPrice.of("0.10", "0.40", cached_input="0.025"),
    "deepseek-chat": ModelPrice.of("0.27", "1.10", cached_input="0.07"),
    **ANTHROPIC_PRICES,
    "anthropic.claude-3-5-haiku-20241022-v1:0": ModelPrice.of("0.80", "4.00", cached_input="0.08", cache_write="1.00"),
    "anthropic.claude-3-5-sonnet-20241022-v2:0": ModelPrice.of(
        "3.00", "15.00", cached_input="0.30", cache_write="3.75"
    ),
    "anthropic.claude-3-7-sonnet-20250219-v1:0": ModelPrice.of(
        "3.00", "15.00", cached_input="0.30", cache_write="3.75"
    ),
    "anthropic.claude-sonnet-4-20250514-v1:0": ModelPrice.of("3.00", "15.00", cached_input="0.30", cache_write="3.75"),
    "anthropic.claude-opus-4-20250514-v1:0": ModelPrice.of("15.00", "75.00", cached_input="1.50", cache_write="18.75"),
    "anthropic.claude-3-haiku-20240307-v1:0": ModelPrice.of("0.25", "1.25"),
    "amazon.nova-micro-v1:0": ModelPrice.of("0.035", "0.14", cached_input="0.00875"),
    "amazon.nova-lite-v1:0": ModelPrice.of("0.06", "0.24", cached_input="0.015"),
    "amazon.nova-pro-v1:0": ModelPrice.of("0.80", "3.20", cached_input="0.20"),
    # Models with a flex tier (FLEX_MODELS).
    "gpt-5": ModelPrice.of("1.25", "10.00", cached_input="0.125"),
    "gpt-5-mini": ModelPrice.of("0.25", "2.00", cached_input="0.025"),
    "gpt-5-nano": ModelPrice.of("0.05", "0.40", cached_input="0.005"),
    "o3": ModelPrice.of("2.00", "8.00", cached_input="0.50"),
    "o4-mini": ModelPrice.of("1.10", "4.40", cached_input="0.275"),
    "openai.gpt-oss-120b-1:0": ModelPrice.of("0.15", "0.60"),
    "openai.gpt-oss-20b-1:0": ModelPrice.of("0.07", "0.30"),
}


class PriceTable:
    def __init__(self, prices: Mapping[str, ModelPrice] = DEFAULT_PRICES) -> None:
        self._prices = dict(prices)
        self._unpriced_seen: set[str] = set()

    @classmethod
    def with_overrides(cls, overrides: Mapping[str, ModelPrice]) -> PriceTable:
        return cls({**DEFAULT_PRICES, **overrides})

    def price(self, model: str) -> ModelPrice | None:
        """The model's price: its own, else its base model's (base_model_ids); None when it has none."""
        price = next((self._prices[name] for name in base_model_ids(model) if name in self._prices), None)
        if price is None and model not in self._unpriced_seen:
            self._unpriced_seen.add(model)
            logger.warning("no price for model; its cost is recorded as 0, marked unpriced", extra={"model": model})
        return price

    def unpriced(self, models: Iterable[str]) -> list[str]:
        """Those of `models` that have no price."""
        return [model for model in models if self.price(model) is None]

    def offers_flex(self, model: str) -> bool:
        """Whether the provider sells `model` at a flex tier: FLEX_MODELS names it (or its base model), or
        its price gives a `flex` share."""
        if any(FLEX_MODELS.fullmatch(name) for name in base_model_ids(model)):
            return True
        price = self.price(model)
        return price is not None and price.flex is not None

    def cost(self, model: str, tokens: TokenCounts, via: Via = Via.REALTIME) -> Cost:
        """What the provider bills for a call of `model` with `tokens`, made `via` a route: in real time at
        its standard tier, through its batch API, or served at its flex tier."""
        price = self.price(model)
        if price is None:
            return Cost(Decimal(0), Decimal(0), priced=False)
        share = price.share(via)
        cached, written = tokens.cached_input_tokens, tokens.cache_write_input_tokens
        uncached = max(tokens.input_tokens - cached - written, 0)
        usd = (
            (
                uncached * price.input
                + cached * price.cached_input
                + written * price.cache_write
                + tokens.output_tokens * price.output
            )
            * share
            / _MILLION
        )
        saved = (
            (cached * (price.input - price.cached_input) + written * (price.input - price.cache_write))
            * share
            / _MILLION
        )
        return Cost(usd.quantize(_NANO_USD), saved.quantize(_NANO_USD))

    def most(self, model: str, input_tokens: int, output_tokens: int) -> Decimal:
        """The most a call with up to these tokens can cost, whatever part of its input the cache serves."""
        price = self.price(model)
        if price is None:
            return Decimal(0)
        input_price = max(price.input, price.cached_input, price.cache_write)
        usd = (input_tokens * input_price + output_tokens * price.output) / _MILLION
        return usd.quantize(_NANO_USD, rounding=ROUND_CEILING)
