"""The local provider's flex tier, over HTTP: it answers `service_tier: "flex"` naming the tier that served
it, refuses flex with OpenAI's 429 on a marker or at random, and the engine's gateway meets both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion

from aijobs.local.provider import LocalProvider
from engine.core import Via
from engine.core.errors import FlexUnavailableError
from engine.definitions import JobRegistry
from engine.gateway import CallTier, ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, chat_completion_body, static_api_key
from tests.support.providers import completion_request

FLEX_MODEL = "gpt-5-mini"


@pytest.fixture
def flexible() -> Iterator[LocalProvider]:
    """A local provider that answers at once at either tier."""
    with LocalProvider(latency_seconds=0, flex_latency_seconds=0) as provider:
        yield provider


def ask(http: httpx.Client, provider: LocalProvider, prompt: str, tier: str | None) -> httpx.Response:
    body: dict[str, Any] = chat_completion_body(completion_request(user=prompt), "json_schema")
    if tier is not None:
        body["service_tier"] = tier
    return http.post(f"{provider.url}/chat/completions", json=body)


@pytest.mark.parametrize(
    ("asked", "serving"),
    [("flex", "flex"), (None, "default"), ("auto", "default"), ("default", "default"), ("fast", "priority")],
)
def test_an_answer_names_the_tier_that_served_it_as_openais_do(
    asked: str | None, serving: str, flexible: LocalProvider, http: httpx.Client
) -> None:
    response = ask(http, flexible, "Win a cruise", asked)

    assert response.status_code == 200
    assert ChatCompletion.model_validate(response.json()).service_tier == serving
    (entry,) = flexible.log
    assert (entry.asked_tier, entry.service_tier) == (asked, serving)


def test_the_marker_refuses_a_flex_request_with_openais_429_and_bills_nothing(
    flexible: LocalProvider, http: httpx.Client
) -> None:
    refused = ask(http, flexible, "Win a cruise fault:flex_unavailable", "flex")
    standard = ask(http, flexible, "Win a cruise fault:flex_unavailable", None)

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "resource_unavailable"
    assert standard.status_code == 200  # only a flex request can find flex unavailable
    assert [(entry.status, entry.prompt_tokens, entry.service_tier) for entry in flexible.log] == [
        (429, 0, None),
        (200, flexible.log[1].prompt_tokens, "default"),
    ]


def test_a_counted_marker_refuses_flex_that_many_times(flexible: LocalProvider, http: httpx.Client) -> None:
    statuses = [ask(http, flexible, "Win fault:flex_unavailable*2", "flex").status_code for _ in range(3)]

    assert statuses == [429, 429, 200]


@pytest.mark.parametrize(("rate", "refused"), [(1.0, 5), (0.0, 0)])
def test_the_refusal_rate_refuses_flex_requests_only(rate: float, refused: int, http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, flex_latency_seconds=0, flex_refusal_rate=rate) as provider:
        flex = [ask(http, provider, f"ticket {n}", "flex").status_code for n in range(5)]
        standard = [ask(http, provider, f"ticket {n}", None).status_code for n in range(5)]

    assert flex.count(429) == refused
    assert standard == [200] * 5


def test_a_refusal_rate_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="flex_refusal_rate"):
        LocalProvider(flex_refusal_rate=1.5)


def attempt(provider: LocalProvider, text: str, tier: CallTier) -> Any:
    definition = JobRegistry().get("classify")
    adapter = OpenAICompatibleProvider(provider.url, static_api_key(None))
    job_input = definition.parse_input({"text": text, "labels": ["spam", "ham"]})
    return ModelGateway(adapter, ModelTiers(FLEX_MODEL)).execute(definition, job_input, tier=tier)


def test_the_engine_meets_a_refusal_as_flex_unavailable_and_near_its_deadline_takes_the_standard_tier(
    flexible: LocalProvider,
) -> None:
    waiting = attempt(flexible, "Win a cruise fault:flex_unavailable", CallTier.FLEX)
    served = attempt(flexible, "Win a cruise fault:flex_unavailable", CallTier.FLEX_OR_STANDARD)

    assert isinstance(waiting.error, FlexUnavailableError)
    assert served.error is None
    assert (served.via, served.service_tier, served.calls) == (Via.FLEX, "default", 2)
    assert [(entry.status, entry.asked_tier) for entry in flexible.log] == [
        (429, "flex"),
        (429, "flex"),
        (200, None),
    ]


def test_the_engine_records_the_tier_the_local_provider_served(flexible: LocalProvider) -> None:
    execution = attempt(flexible, "Win a cruise", CallTier.FLEX)

    assert (execution.via, execution.service_tier) == (Via.FLEX, "flex")
    assert execution.cost_usd * 2 == execution.standard_cost_usd
    (entry,) = flexible.log
    assert (entry.asked_tier, entry.service_tier) == ("flex", "flex")
