"""engine.wiring: what a function refuses to start with."""

from __future__ import annotations

import pytest

from engine.config import load_settings
from engine.core.errors import ConfigurationError
from engine.wiring import build_worker

STACK = {
    "JOBS_TABLE_NAME": "jobs",
    "JOBS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/jobs",
    "JOBS_PAYLOAD_BUCKET": "payloads",
    "AI_API_KEY": "sk-test",
}


@pytest.mark.parametrize("budget", ["5", "unlimited"])
def test_with_budgets_on_a_model_without_a_price_refuses_to_start_naming_it(budget: str) -> None:
    settings = load_settings(STACK | {"AI_MODEL_FALLBACK": "my-fine-tune", "AIJOBS_DEFAULT_DAILY_BUDGET_USD": budget})

    with pytest.raises(ConfigurationError) as refused:
        build_worker(settings)

    message = str(refused.value)
    assert message.startswith("AIJOBS_PRICES: model 'my-fine-tune' has no price")
    assert "\n" not in message


def test_with_budgets_on_a_model_priced_in_aijobs_prices_starts() -> None:
    settings = load_settings(
        STACK
        | {
            "AI_MODEL_FALLBACK": "my-fine-tune",
            "AIJOBS_DEFAULT_DAILY_BUDGET_USD": "5",
            "AIJOBS_PRICES": '{"my-fine-tune": {"input": 1, "output": 2}}',
        }
    )

    assert build_worker(settings) is not None


def test_without_budgets_a_model_without_a_price_starts() -> None:
    assert build_worker(load_settings(STACK | {"AI_MODEL_PRIMARY": "my-fine-tune"})) is not None
