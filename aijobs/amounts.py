"""Amounts as people read them, the same in the CLI and the dashboard."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

# Costs are shown to at least the cent's ten-thousandth, and to ten places at most: a token of the
# cheapest models costs about $0.0000001.
USD_PLACES = (6, 10)


def usd(amount: Decimal | float) -> str:
    """An amount in US dollars as people read it, never in E notation: $0.000017, $0.0000001, $12.500000."""
    exact = amount if isinstance(amount, Decimal) else Decimal(repr(float(amount)))
    most = Decimal(1).scaleb(-USD_PLACES[1])
    whole, _, fraction = format(exact.quantize(most, rounding=ROUND_HALF_EVEN), "f").partition(".")
    return f"${whole}.{fraction.rstrip('0').ljust(USD_PLACES[0], '0')}"
