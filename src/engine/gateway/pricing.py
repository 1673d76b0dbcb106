"""Cost of a model call: tokens times a per-model price, in US dollars per million tokens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from engine.observability import logger

_MILLION = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    input_per_million: Decimal
    output_per_million: Decimal


def _price(input_per_million: str, output_per_million: str) -> ModelPrice:
    return ModelPrice(Decimal(input_per_million), Decimal(output_per_million))


# List prices per million tokens (input, output); override or extend with AIJOBS_MODEL_PRICES.
DEFAULT_PRICES: Mapping[str, ModelPrice] = {
    "gpt-4o-mini": _price("0.15", "0.60"),
    "gpt-4o": _price("2.50", "10.00"),
    "gpt-4.1": _price("2.00", "8.00"),
    "gpt-4.1-mini": _price("0.40", "1.60"),
    "gpt-4.1-nano": _price("0.10", "0.40"),
    "deepseek-chat": _price("0.27", "1.10"),
    "anthropic.claude-3-5-haiku-20241022-v1:0": _price("0.80", "4.00"),
    "anthropic.claude-3-5-sonnet-20241022-v2:0": _price("3.00", "15.00"),
    "amazon.nova-micro-v1:0": _price("0.035", "0.14"),
    "amazon.nova-lite-v1:0": _price("0.06", "0.24"),
    "amazon.nova-pro-v1:0": _price("0.80", "3.20"),
}


class PriceTable:
    def __init__(self, prices: Mapping[str, ModelPrice] = DEFAULT_PRICES) -> None:
        self._prices = dict(prices)
        self._unpriced_seen: set[str] = set()

    @classmethod
    def with_overrides(cls, overrides: Mapping[str, tuple[Decimal, Decimal]]) -> PriceTable:
        prices = dict(DEFAULT_PRICES)
        prices.update({model: ModelPrice(*pair) for model, pair in overrides.items()})
        return cls(prices)

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> Decimal:
        price = self._prices.get(model)
        if price is None:
            if model not in self._unpriced_seen:
                self._unpriced_seen.add(model)
                logger.warning("no price for model; its cost is recorded as 0", extra={"model": model})
            return Decimal(0)
        cost = (input_tokens * price.input_per_million + output_tokens * price.output_per_million) / _MILLION
        return cost.quantize(Decimal("0.000000001"))
