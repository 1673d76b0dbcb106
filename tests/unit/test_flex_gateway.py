"""The gateway at the provider's flex tier (docs/cost.md): which calls ask it, with which timeout, what
they cost beside the same calls at the standard tier, and what an attempt does when flex is unavailable."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core import Via
from engine.core.errors import (
    FlexUnavailableError,
    ProviderRateLimitedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.definitions import JobRegistry
from engine.gateway import (
    CallTier,
    Completion,
    CompletionRequest,
    Execution,
    FlexModels,
    ModelGateway,
    ModelTiers,
    PriceTable,
)
from engine.gateway.gateway import FLEX_TIMEOUT_SECONDS, Answered, TimeLeft
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.gateway.pricing import DEFAULT_PRICES, ModelPrice
from engine.gateway.provider import FLEX_TIER
from tests.support.openai_sdk import sdk_request
from tests.support.providers import VALID_OUTPUTS, FakeProvider, Script, openai_completion

FLEX_MODEL = "gpt-5-mini"  # OpenAI sells it at a flex tier
NO_FLEX_MODEL = "gpt-4o-mini"  # OpenAI does not
# gpt-5-mini at 0.25 / 2.00 USD per million tokens: 100 in + 20 out, and at the flex tier (half).
GPT_5_MINI_100_20 = Decimal("0.000065")
GPT_5_MINI_100_20_FLEX = Decimal("0.0000325")
CLASSIFY = {"text": "Win a free cruise now!", "labels": ["spam", "ham"]}
TIMEOUT = 60.0  # classify's own timeout


def served(tier: str | None, content: Any = None) -> Script:
    """Every call answered validly, the answer saying it was served at `tier`."""

    def script(request: CompletionRequest) -> Completion:
        answer = json.dumps(content or VALID_OUTPUTS["classify"])
        return Completion(answer, request.model, 100, 20, latency_ms=5, service_tier=tier)

    return script


def calls(*answers: Any) -> Script:
    """The n-th call answered with answers[n]: a tier it was served at (str or None), or an error."""
    remaining = list(answers)

    def script(request: CompletionRequest) -> Any:
        answer = remaining.pop(0)
        if isinstance(answer, Exception):
            return answer
        return served(answer)(request)

    return script


def attempt(
    provider: FakeProvider,
    tier: CallTier,
    model: str = FLEX_MODEL,
    time_left: TimeLeft | None = None,
    prices: PriceTable | None = None,
) -> Execution:
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers(model), prices)
    return gateway.execute(definition, definition.parse_input(CLASSIFY), time_left, tier=tier)


# --- which calls ask the flex tier -----------------------------------------------------------------


@pytest.mark.parametrize("tier", [CallTier.FLEX, CallTier.FLEX_OR_STANDARD])
def test_a_flex_attempt_asks_the_flex_tier_with_a_longer_timeout_and_pays_the_flex_price(tier: CallTier) -> None:
    provider = FakeProvider(served(FLEX_TIER))

    execution = attempt(provider, tier)

    assert execution.error is None
    (request,) = provider.requests
    assert request.service_tier == FLEX_TIER
    assert request.timeout_seconds == FLEX_TIMEOUT_SECONDS  # no invocation clock: OpenAI's advice alone
    assert (execution.via, execution.service_tier) == (Via.FLEX, FLEX_TIER)
    assert execution.cost_usd == GPT_5_MINI_100_20_FLEX
    assert execution.standard_cost_usd == GPT_5_MINI_100_20


def test_a_standard_attempt_asks_no_tier_and_its_cost_is_its_standard_cost() -> None:
    provider = FakeProvider(served("default"))

    execution = attempt(provider, CallTier.STANDARD)

    assert provider.requests[0].service_tier is None
    assert provider.requests[0].timeout_seconds == TIMEOUT
    assert (execution.via, execution.service_tier) == (Via.REALTIME, "default")
    assert execution.cost_usd == execution.standard_cost_usd == GPT_5_MINI_100_20


def test_a_model_without_a_flex_tier_is_called_at_the_standard_tier() -> None:
    provider = FakeProvider(served(None))

    execution = attempt(provider, CallTier.FLEX, model=NO_FLEX_MODEL)

    assert provider.requests[0].service_tier is None
    assert provider.requests[0].timeout_seconds == TIMEOUT
    assert execution.via is Via.REALTIME
    assert execution.cost_usd == execution.standard_cost_usd


def test_an_openai_compatible_gateway_asks_the_flex_tier_of_a_model_no_list_names() -> None:
    # Given a gateway that asks any model's flex tier (build_gateway's, for an OpenAI-compatible provider)
    provider = FakeProvider(served(FLEX_TIER))
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers(NO_FLEX_MODEL), flex_models=FlexModels.ANY)

    # When a flex attempt of a model the price table lists without one is served at flex
    execution = gateway.execute(definition, definition.parse_input(CLASSIFY), tier=CallTier.FLEX)

    # Then it asked the flex tier, and pays its price
    assert provider.requests[0].service_tier == FLEX_TIER
    assert (execution.via, execution.service_tier) == (Via.FLEX, FLEX_TIER)
    assert execution.cost_usd == execution.standard_cost_usd / 2


def test_a_model_that_refused_the_flex_tier_is_not_asked_it_again() -> None:
    # Given a provider that refuses gpt-4o-mini's flex tier outright (a 400 naming service_tier)
    provider = FakeProvider(calls(FlexUnavailableError("400 service_tier", later=False), "default", "default"))
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers(NO_FLEX_MODEL), flex_models=FlexModels.ANY)
    job_input = definition.parse_input(CLASSIFY)

    # When two flex attempts run, one after the other
    first = gateway.execute(definition, job_input, tier=CallTier.FLEX)
    second = gateway.execute(definition, job_input, tier=CallTier.FLEX)

    # Then the first asked flex, was refused and called the standard tier at once; the second asked
    # the standard tier alone: three requests in all, at the standard price
    assert (first.error, second.error) == (None, None)
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, None, None]
    assert (second.via, second.calls, second.cost_usd) == (Via.REALTIME, 1, second.standard_cost_usd)


def test_a_flex_share_in_the_prices_gives_a_model_a_flex_tier_at_that_share() -> None:
    provider = FakeProvider(served(FLEX_TIER))
    prices = PriceTable.with_overrides({NO_FLEX_MODEL: ModelPrice.of("0.15", "0.60", flex="0.4")})

    execution = attempt(provider, CallTier.FLEX, model=NO_FLEX_MODEL, prices=prices)

    assert provider.requests[0].service_tier == FLEX_TIER
    assert execution.via is Via.FLEX
    assert execution.standard_cost_usd == Decimal("0.000027")
    assert execution.cost_usd == Decimal("0.0000108")  # 0.4 of it


def test_a_provider_that_sells_no_flex_tier_is_called_as_with_flex_off_whatever_the_prices_say() -> None:
    # Given a gateway for a provider with no flex tier (Anthropic's), and prices that give the model a flex share
    provider = FakeProvider(served(None))
    prices = PriceTable.with_overrides({NO_FLEX_MODEL: ModelPrice.of("0.15", "0.60", flex="0.5")})
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers(NO_FLEX_MODEL), prices, flex_models=FlexModels.NONE)

    # When a flex attempt runs
    execution = gateway.execute(definition, definition.parse_input(CLASSIFY), tier=CallTier.FLEX)

    # Then its call asks no tier, with the job type's own timeout, and is priced at the standard price
    (request,) = provider.requests
    assert (request.service_tier, request.timeout_seconds) == (None, TIMEOUT)
    assert execution.via is Via.REALTIME
    assert execution.cost_usd == execution.standard_cost_usd == Decimal("0.000027")


def test_a_flex_call_the_provider_says_it_served_at_its_standard_tier_costs_the_standard_price() -> None:
    provider = FakeProvider(served("default"))

    execution = attempt(provider, CallTier.FLEX)

    assert provider.requests[0].service_tier == FLEX_TIER
    assert (execution.via, execution.service_tier) == (Via.FLEX, "default")
    assert execution.cost_usd == execution.standard_cost_usd == GPT_5_MINI_100_20


def test_a_flex_call_whose_answer_names_no_tier_costs_the_flex_price_it_asked_for() -> None:
    execution = attempt(FakeProvider(served(None)), CallTier.FLEX)

    assert (execution.via, execution.service_tier) == (Via.FLEX, None)
    assert execution.cost_usd == GPT_5_MINI_100_20_FLEX


def test_a_re_ask_of_a_flex_attempt_is_made_at_the_flex_tier_too() -> None:
    wrong = {"label": "eggs", "confidence": 0.5}
    answers = [served(FLEX_TIER, wrong), served(FLEX_TIER)]
    provider = FakeProvider(lambda request: answers.pop(0)(request))

    execution = attempt(provider, CallTier.FLEX)

    assert execution.error is None
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, FLEX_TIER]
    assert (execution.calls, execution.reasks) == (2, 1)
    assert execution.cost_usd == 2 * GPT_5_MINI_100_20_FLEX


# --- flex unavailable ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "refusal",
    [FlexUnavailableError("429 resource unavailable"), ProviderTimeoutError("no answer within 900s")],
    ids=["429", "timeout"],
)
def test_far_from_the_deadline_flex_unavailable_ends_the_attempt_for_the_job_to_wait(refusal: Exception) -> None:
    provider = FakeProvider(calls(refusal))

    execution = attempt(provider, CallTier.FLEX)

    assert provider.calls == 1
    assert isinstance(execution.error, FlexUnavailableError)
    assert execution.error.later
    assert execution.error.code.value == "provider_rate_limited"  # a later try spends no attempt
    assert execution.via is Via.FLEX
    assert execution.cost_usd == execution.standard_cost_usd == 0


@pytest.mark.parametrize(
    "refusal",
    [FlexUnavailableError("429 resource unavailable"), ProviderTimeoutError("no answer within 900s")],
    ids=["429", "timeout"],
)
def test_near_the_deadline_flex_unavailable_is_followed_by_the_standard_tier_at_once(refusal: Exception) -> None:
    provider = FakeProvider(calls(refusal, "default"))

    execution = attempt(provider, CallTier.FLEX_OR_STANDARD, time_left=lambda: 250.0)

    assert execution.error is None
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, None]
    # The flex call left the standard call its timeout; the standard call has the job type's.
    assert [request.timeout_seconds for request in provider.requests] == [250.0 - TIMEOUT, TIMEOUT]
    assert (execution.via, execution.service_tier, execution.calls) == (Via.FLEX, "default", 2)
    assert execution.cost_usd == execution.standard_cost_usd == GPT_5_MINI_100_20


def test_a_flex_tier_that_will_never_serve_the_call_is_left_for_the_standard_tier_at_once() -> None:
    provider = FakeProvider(calls(FlexUnavailableError("400 service_tier", later=False), "default"))

    execution = attempt(provider, CallTier.FLEX)

    assert execution.error is None
    assert [request.service_tier for request in provider.requests] == [FLEX_TIER, None]


def test_near_the_deadline_without_time_for_both_tiers_the_standard_tier_is_called_alone() -> None:
    provider = FakeProvider(served("default"))

    # 100 s left: a flex call would leave the standard one less than its 60 s, or get less itself.
    execution = attempt(provider, CallTier.FLEX_OR_STANDARD, time_left=lambda: 100.0)

    assert [request.service_tier for request in provider.requests] == [None]
    assert execution.via is Via.REALTIME


def test_a_flex_call_gets_what_is_left_of_the_invocation_at_most() -> None:
    provider = FakeProvider(served(FLEX_TIER))

    attempt(provider, CallTier.FLEX, time_left=lambda: 280.0)

    assert provider.requests[0].timeout_seconds == 280.0


def test_a_rate_limit_met_at_the_flex_tier_is_a_rate_limit_not_a_reason_for_the_standard_tier() -> None:
    provider = FakeProvider(calls(ProviderRateLimitedError("429 rate limit", retry_after_seconds=7)))

    execution = attempt(provider, CallTier.FLEX_OR_STANDARD)

    assert provider.calls == 1
    assert type(execution.error) is ProviderRateLimitedError


def test_an_outage_at_the_flex_tier_falls_back_to_the_fallback_model_as_any_outage() -> None:
    provider = FakeProvider(calls(ProviderUnavailableError("503"), FLEX_TIER))
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(provider, ModelTiers(FLEX_MODEL, fallback="o4-mini"))

    execution = gateway.execute(definition, definition.parse_input(CLASSIFY), tier=CallTier.FLEX)

    assert [(request.model, request.service_tier) for request in provider.requests] == [
        (FLEX_MODEL, FLEX_TIER),
        ("o4-mini", FLEX_TIER),
    ]
    assert (execution.error, execution.model, execution.via) == (None, "o4-mini", Via.FLEX)


def test_a_batch_answer_records_its_standard_cost_beside_its_batch_price() -> None:
    definition = JobRegistry().get("classify")
    gateway = ModelGateway(FakeProvider(), ModelTiers(FLEX_MODEL))
    answer = Completion(json.dumps(VALID_OUTPUTS["classify"]), FLEX_MODEL, 100, 20, latency_ms=0)

    execution = gateway.execute_answer(definition, definition.parse_input(CLASSIFY), Answered(answer, "batch_1"))

    assert execution.via is Via.BATCH
    assert execution.cost_usd == GPT_5_MINI_100_20_FLEX  # the batch price is half too
    assert execution.standard_cost_usd == GPT_5_MINI_100_20


@given(
    input_tokens=st.integers(0, 10**8),
    output_tokens=st.integers(0, 10**6),
    tier=st.sampled_from([FLEX_TIER, "default", "priority", None]),
)
def test_an_attempt_never_costs_more_than_its_standard_cost(
    input_tokens: int, output_tokens: int, tier: str | None
) -> None:
    def script(request: CompletionRequest) -> Completion:
        answer = json.dumps(VALID_OUTPUTS["classify"])
        return Completion(answer, request.model, input_tokens, output_tokens, latency_ms=1, service_tier=tier)

    execution = attempt(FakeProvider(script), CallTier.FLEX)

    assert 0 <= execution.cost_usd <= execution.standard_cost_usd
    assert (execution.cost_usd < execution.standard_cost_usd) == (
        tier in (FLEX_TIER, None) and execution.standard_cost_usd > 0
    )


# --- OpenAI's wire ---------------------------------------------------------------------------------


def openai_attempt(
    handler: Any, tier: CallTier = CallTier.FLEX, model: str = FLEX_MODEL
) -> tuple[Execution, list[dict[str, Any]]]:
    """An attempt through the OpenAI adapter against `handler(body) -> httpx.Response`: its execution and
    the bodies it posted."""
    bodies: list[dict[str, Any]] = []

    def transport(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        response: httpx.Response = handler(body)
        return response

    client = httpx.Client(transport=httpx.MockTransport(transport))
    provider = OpenAICompatibleProvider("https://api.example.com/v1", static_api_key("k"), client=client)
    definition = JobRegistry().get("classify")
    execution = ModelGateway(provider, ModelTiers(model)).execute(
        definition, definition.parse_input(CLASSIFY), tier=tier
    )
    return execution, bodies


def answer(body: dict[str, Any]) -> httpx.Response:
    """A valid answer, naming the tier it was asked for as the one that served it."""
    content = json.dumps(VALID_OUTPUTS["classify"])
    completion = openai_completion(content, model=body["model"]) | {"service_tier": body.get("service_tier", "default")}
    return httpx.Response(200, json=completion)


def refusal(status: int, **error: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": "Resource Unavailable", "param": None, **error}})


def test_a_flex_request_carries_service_tier_flex_and_is_a_request_the_sdk_takes() -> None:
    execution, (body,) = openai_attempt(answer)

    assert body["service_tier"] == "flex"
    assert sdk_request(body) == body
    assert (execution.via, execution.service_tier) == (Via.FLEX, "flex")


def test_openai_reasoning_models_get_max_completion_tokens_and_their_own_temperature() -> None:
    _, (reasoning,) = openai_attempt(answer, CallTier.STANDARD, model="o4-mini")
    _, (chat,) = openai_attempt(answer, CallTier.STANDARD, model=NO_FLEX_MODEL)

    assert (reasoning["max_completion_tokens"], "max_tokens" in reasoning, "temperature" in reasoning) == (
        256,
        False,
        False,
    )
    assert (chat["max_tokens"], chat["temperature"], "max_completion_tokens" in chat) == (256, 0, False)
    assert sdk_request(reasoning) == reasoning


@pytest.mark.parametrize(
    "error",
    [{"type": "resource_unavailable", "code": "resource_unavailable"}, {"type": "server_error"}, {}],
    ids=["resource_unavailable", "another", "none"],
)
def test_a_429_to_a_flex_request_that_is_not_the_accounts_rate_limit_is_flex_unavailable(error: dict[str, str]) -> None:
    execution, bodies = openai_attempt(lambda body: refusal(429, **error))

    assert len(bodies) == 1
    assert isinstance(execution.error, FlexUnavailableError)
    assert execution.error.later


@pytest.mark.parametrize(
    "error",
    [
        {"type": "requests", "code": "rate_limit_exceeded"},
        {"type": "tokens", "code": "rate_limit_exceeded"},
        {"type": "insufficient_quota", "code": "insufficient_quota"},
    ],
)
def test_the_accounts_rate_limit_met_by_a_flex_request_stays_a_rate_limit(error: dict[str, str]) -> None:
    execution, _ = openai_attempt(lambda body: refusal(429, **error))

    assert type(execution.error) is ProviderRateLimitedError


def test_a_429_resource_unavailable_to_a_standard_request_is_a_plain_rate_limit() -> None:
    execution, _ = openai_attempt(lambda body: refusal(429, code="resource_unavailable"), CallTier.STANDARD)

    assert type(execution.error) is ProviderRateLimitedError


def test_a_400_naming_service_tier_sends_the_call_to_the_standard_tier_at_once() -> None:
    def handler(body: dict[str, Any]) -> httpx.Response:
        if body.get("service_tier") == "flex":
            return refusal(400, type="invalid_request_error", code="invalid_value", param="service_tier")
        return answer(body)

    execution, bodies = openai_attempt(handler)

    assert [body.get("service_tier") for body in bodies] == ["flex", None]
    assert (execution.error, execution.via, execution.service_tier) == (None, Via.FLEX, "default")


@pytest.mark.parametrize("tier", [["flex"], 7, "x" * 100, "flex\u0000", None])
def test_a_served_tier_that_is_not_a_short_word_is_recorded_as_none(tier: object) -> None:
    def handler(body: dict[str, Any]) -> httpx.Response:
        content = json.dumps(VALID_OUTPUTS["classify"])
        return httpx.Response(200, json=openai_completion(content) | {"service_tier": tier})

    execution, _ = openai_attempt(handler)

    assert execution.error is None
    assert execution.service_tier is None


def test_every_model_of_the_flex_list_has_a_price() -> None:
    prices = PriceTable()

    for model in ("gpt-5", "gpt-5-mini", "gpt-5-nano", "o3", "o4-mini", "openai.gpt-oss-20b-1:0"):
        assert prices.offers_flex(model)
        assert model in DEFAULT_PRICES
    assert not prices.offers_flex("gpt-4o-mini")
    assert not prices.offers_flex("gpt-5-chat-latest")
    assert prices.offers_flex("us.amazon.nova-pro-v1:0")  # an inference profile of a model with one
