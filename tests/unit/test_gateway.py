"""ModelGateway.execute with a scripted provider; ModelTiers."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import ErrorCode
from engine.core.errors import (
    JobError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.definitions import JobDefinition, JobRegistry
from engine.gateway import (
    ChatTurn,
    Completion,
    CompletionRequest,
    Execution,
    ModelGateway,
    ModelTiers,
    PriceTable,
)
from engine.gateway.gateway import MIN_CALL_SECONDS, Answered, TimeLeft, strip_code_fence
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.gateway.pricing import ModelPrice
from tests.support.providers import VALID_OUTPUTS, FakeProvider, Script, openai_completion

# gpt-4o-mini at 0.15 / 0.60 USD per million tokens: 100 in + 20 out.
GPT_4O_MINI_100_20 = Decimal("0.000027")
# gpt-4o at 2.50 / 10.00 USD per million tokens: 100 in + 20 out.
GPT_4O_100_20 = Decimal("0.00045")
WITH_FALLBACK = ModelTiers("gpt-4o-mini", fallback="gpt-4o")
CLASSIFY_VALID = json.dumps(VALID_OUTPUTS["classify"])
WRONG_LABEL = {"label": "eggs", "confidence": 0.5}
WRONG_LABEL_REASON = "label 'eggs' is not one of the 2 labels offered"

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
    repair_attempts: int | None = None,
    time_left: TimeLeft | None = None,
) -> Execution:
    definition = definition or JobRegistry().get(job_type)
    repairs = {} if repair_attempts is None else {"repair_attempts": repair_attempts}
    gateway = ModelGateway(provider, tiers or ModelTiers("gpt-4o-mini"), prices, **repairs)
    job_input = definition.parse_input(INPUTS[definition.name])
    return gateway.execute(definition, job_input, time_left)


def scripted(*answers: Any) -> Script:
    """Answer the n-th call with answers[n] (an output dict, raw content, a Completion or an error)."""
    remaining = list(answers)

    def script(_: CompletionRequest) -> Any:
        assert remaining, "the provider was called more often than scripted"
        return remaining.pop(0)

    return script


def by_model(answers: dict[str, Any]) -> Script:
    """Answer by the requested model: a value for every call, or a list of values taken one per call."""

    def script(request: CompletionRequest) -> Any:
        answer = answers[request.model]
        return answer.pop(0) if isinstance(answer, list) else answer

    return script


def re_ask(rejected: str, reason: str) -> tuple[ChatTurn, ChatTurn]:
    """The two turns a re-ask adds after the user prompt."""
    return (
        ChatTurn("assistant", rejected),
        ChatTurn("user", f"Your answer was not accepted: {reason}. Answer again with only the corrected JSON object."),
    )


@pytest.mark.parametrize("job_type", sorted(VALID_OUTPUTS))
def test_a_valid_answer_carries_output_tokens_and_cost(job_type: str) -> None:
    provider = FakeProvider()

    execution = run(provider, job_type)

    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS[job_type]
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == GPT_4O_MINI_100_20
    assert execution.latency_ms == 5
    assert (execution.provider, execution.tier, execution.model) == ("fake", "primary", "gpt-4o-mini")
    assert (execution.prompt.key, execution.prompt.version) == (job_type, "2")


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
        output_schema=definition.output_schema(definition.parse_input(INPUTS["classify"])),
        max_tokens=256,
        timeout_seconds=60.0,  # the definition's timeout: no invocation clock was given
        conversation=(),
        # The prefix requests of the job type share, for the provider's prompt cache: its prompt's version
        cache_key="classify:2",
    )
    assert "Win a free cruise now!" in request.user
    assert (execution.calls, execution.tier) == (1, "primary")


@pytest.mark.parametrize(
    ("job_type", "path", "narrowed"),
    [
        ("classify", ("properties", "label"), {"type": "string", "enum": ["spam", "ham"]}),
        ("answer_with_citations", ("properties", "citations", "items"), {"type": "string", "enum": ["d1"]}),
        ("summarize", (), None),
    ],
)
def test_the_request_carries_the_output_schema_narrowed_to_the_input(
    job_type: str, path: tuple[str, ...], narrowed: dict[str, Any] | None
) -> None:
    provider = FakeProvider()
    definition = JobRegistry().get(job_type)

    run(provider, job_type)

    # Then classify offers the input's labels and answer_with_citations its document ids, as enums
    schema = provider.requests[0].output_schema
    if narrowed is None:
        assert schema == definition.output_json_schema
    else:
        node = schema
        for key in path:
            node = node[key]
        assert node == narrowed
        assert schema != definition.output_json_schema
    # And the other keywords are the output model's own
    assert schema["required"] == definition.output_json_schema["required"]


def test_a_schema_narrowed_per_input_is_asked_for_on_every_call_of_the_attempt() -> None:
    provider = FakeProvider(
        by_model({"gpt-4o-mini": [WRONG_LABEL, ProviderUnavailableError("503")], "gpt-4o": CLASSIFY_VALID})
    )

    run(provider, tiers=WITH_FALLBACK)

    labels = [request.output_schema["properties"]["label"]["enum"] for request in provider.requests]
    assert labels == [["spam", "ham"]] * 3


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
    # Given a model that gives the same invalid answer every time (one repair by default)
    provider = FakeProvider(lambda _: answer, input_tokens=300, output_tokens=50)

    execution = run(provider, job_type)

    # Then the answer and its re-ask both cost tokens, and the error is the last answer's
    assert execution.output is None
    assert execution.error is not None
    assert execution.error.code is code
    assert execution.error.retryable is False
    assert (provider.calls, execution.calls) == (2, 2)
    assert (execution.input_tokens, execution.output_tokens) == (600, 100)
    assert execution.cost_usd == Decimal("0.000150")  # 2 * (300 * 0.15 + 50 * 0.60) / 1e6
    assert execution.latency_ms == 10
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")


@pytest.mark.parametrize(
    ("job_type", "answer", "code"),
    [
        ("classify", "this is not json", ErrorCode.SCHEMA_VALIDATION_FAILED),
        ("classify", {"label": "eggs", "confidence": 0.5}, ErrorCode.BUSINESS_VALIDATION_FAILED),
        ("answer_with_citations", {"answer": "a", "citations": ["d7"]}, ErrorCode.REFERENCE_VALIDATION_FAILED),
    ],
)
def test_without_repairs_an_invalid_answer_costs_one_call(job_type: str, answer: Any, code: ErrorCode) -> None:
    provider = FakeProvider(lambda _: answer, input_tokens=300, output_tokens=50)

    execution = run(provider, job_type, repair_attempts=0)

    assert execution.error is not None
    assert execution.error.code is code
    assert (provider.calls, execution.calls) == (1, 1)
    assert (execution.input_tokens, execution.output_tokens) == (300, 50)
    assert execution.cost_usd == Decimal("0.000075")  # (300 * 0.15 + 50 * 0.60) / 1e6
    assert provider.requests[0].conversation == ()


@pytest.mark.parametrize("finish_reason", ["length", "content_filter", ""])
def test_an_empty_answer_is_a_schema_failure_naming_the_finish_reason(finish_reason: str) -> None:
    def empty(request: CompletionRequest) -> Completion:
        return Completion("", request.model, 40, 0, latency_ms=3, finish_reason=finish_reason)

    provider = FakeProvider(empty)

    execution = run(provider)

    # Then the empty answer is re-asked once, and both calls' tokens are paid for
    reason = f"the model returned no content (finish_reason {finish_reason or 'unknown'})"
    assert execution.error is not None
    assert execution.error.code is ErrorCode.SCHEMA_VALIDATION_FAILED
    assert execution.error.message == reason
    assert (provider.calls, execution.calls) == (2, 2)
    assert (execution.input_tokens, execution.output_tokens) == (80, 0)
    assert execution.cost_usd == Decimal("0.000012")  # 2 * 40 * 0.15 / 1e6
    assert provider.requests[1].conversation == re_ask("", reason)


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
    assert (execution.input_tokens, execution.output_tokens, execution.cost_usd) == (0, 0, Decimal(0))
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")
    assert execution.calls == 1


def test_an_unpriced_model_costs_zero_but_keeps_its_tokens() -> None:
    execution = run(FakeProvider(), tiers=ModelTiers("my-local-llama"))

    assert execution.model == "my-local-llama"
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == Decimal(0)


def test_custom_prices_are_used_for_the_cost() -> None:
    prices = PriceTable({"gpt-4o-mini": ModelPrice.of(1, 2)})

    execution = run(FakeProvider(), prices=prices)

    assert execution.cost_usd == Decimal("0.00014")  # (100 * 1 + 20 * 2) / 1e6


def test_every_call_adds_its_cached_cache_write_and_reasoning_tokens_and_what_caching_saved() -> None:
    # Given a first answer the job type refuses (re-asked), then a valid one, each with cache hits
    def completion(content: str, cached: int, written: int, reasoning: int) -> Completion:
        return Completion(
            content,
            "gpt-4o-mini",
            input_tokens=1_000,
            output_tokens=100,
            latency_ms=5,
            cached_input_tokens=cached,
            cache_write_input_tokens=written,
            reasoning_tokens=reasoning,
        )

    provider = FakeProvider(
        scripted(
            completion(json.dumps(WRONG_LABEL), cached=0, written=800, reasoning=60),
            completion(CLASSIFY_VALID, cached=800, written=0, reasoning=40),
        )
    )

    execution = run(provider)

    # Then the attempt carries both calls' tokens of every kind, and the cost of each kind
    assert execution.calls == 2
    assert (execution.input_tokens, execution.cached_input_tokens, execution.cache_write_input_tokens) == (
        2_000,
        800,
        800,
    )
    assert (execution.output_tokens, execution.reasoning_tokens) == (200, 100)
    # 400 uncached + 800 cache-write input at 0.15, 800 cached at 0.075, 200 output at 0.60 (per million)
    assert execution.cost_usd == Decimal("0.00036")
    assert execution.cache_savings_usd == Decimal("0.00006")


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

    assert [request.model for request in provider.requests] == ["gpt-4o"]
    assert (execution.tier, execution.model, execution.calls) == ("fallback", "gpt-4o", 1)
    assert execution.cost_usd == Decimal("0.00045")  # (100 * 2.50 + 20 * 10.00) / 1e6


# --- repair -------------------------------------------------------------------------------------


def test_a_repairable_answer_is_re_asked_and_the_corrected_answer_is_the_output() -> None:
    # Given a model whose first answer offers a label the input does not, and whose second is valid
    provider = FakeProvider(scripted(WRONG_LABEL, VALID_OUTPUTS["classify"]))

    execution = run(provider)

    # Then the second answer is the output, and both calls are paid for
    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS["classify"]
    assert (provider.calls, execution.calls) == (2, 2)
    assert (execution.input_tokens, execution.output_tokens) == (200, 40)
    assert execution.cost_usd == 2 * GPT_4O_MINI_100_20
    assert execution.latency_ms == 10
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")
    # And the re-ask is the same request to the same model, with the rejected answer and the reason after it
    first, second = provider.requests
    assert first.conversation == ()
    assert second == replace(first, conversation=re_ask(json.dumps(WRONG_LABEL), WRONG_LABEL_REASON))


def test_a_re_ask_after_a_schema_failure_carries_the_raw_answer_and_the_schema_error() -> None:
    provider = FakeProvider(scripted("this is not json", CLASSIFY_VALID))

    execution = run(provider)

    assert execution.error is None
    (rejected, explanation) = provider.requests[1].conversation
    assert rejected == ChatTurn("assistant", "this is not json")
    assert explanation.role == "user"
    assert explanation.content.startswith("Your answer was not accepted: output: Invalid JSON")
    assert explanation.content.endswith(". Answer again with only the corrected JSON object.")


def test_the_error_of_an_unrepaired_attempt_is_the_last_answers() -> None:
    # Given a first answer that is not JSON and a second that offers an unknown label
    provider = FakeProvider(scripted("this is not json", WRONG_LABEL))

    execution = run(provider)

    assert execution.error is not None
    assert execution.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert execution.error.message == WRONG_LABEL_REASON
    assert (execution.calls, execution.input_tokens, execution.output_tokens) == (2, 200, 40)


def test_without_repairs_a_repairable_answer_fails_after_one_call() -> None:
    provider = FakeProvider(scripted(WRONG_LABEL, VALID_OUTPUTS["classify"]))

    execution = run(provider, repair_attempts=0)

    assert execution.output is None
    assert execution.error is not None
    assert execution.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert (provider.calls, execution.calls) == (1, 1)
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == GPT_4O_MINI_100_20


def test_two_repairs_re_ask_with_the_whole_exchange_so_far() -> None:
    # Given a model that answers wrongly twice, then rightly
    provider = FakeProvider(scripted("this is not json", WRONG_LABEL, VALID_OUTPUTS["classify"]))

    execution = run(provider, repair_attempts=2)

    # Then the third answer is the output and all three calls are paid for
    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS["classify"]
    assert (provider.calls, execution.calls) == (3, 3)
    assert (execution.input_tokens, execution.output_tokens) == (300, 60)
    assert execution.cost_usd == 3 * GPT_4O_MINI_100_20
    # And the last re-ask carries both rejected answers, each followed by its reason
    first_turns, second_turns, third_turns = (request.conversation for request in provider.requests)
    assert first_turns == ()
    assert len(second_turns) == 2
    assert third_turns[:2] == second_turns
    assert third_turns[2:] == re_ask(json.dumps(WRONG_LABEL), WRONG_LABEL_REASON)
    assert {request.model for request in provider.requests} == {"gpt-4o-mini"}


def test_two_repairs_that_all_fail_cost_three_calls() -> None:
    provider = FakeProvider(lambda _: WRONG_LABEL, input_tokens=300, output_tokens=50)

    execution = run(provider, repair_attempts=2)

    assert execution.error is not None
    assert execution.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert (provider.calls, execution.calls) == (3, 3)
    assert (execution.input_tokens, execution.output_tokens) == (900, 150)
    assert execution.cost_usd == Decimal("0.000225")  # 3 * (300 * 0.15 + 50 * 0.60) / 1e6


@pytest.mark.parametrize(
    "error",
    [
        ProviderRateLimitedError("429", retry_after_seconds=3),
        ProviderRejectedError("401", status_code=401),
        ProviderTimeoutError("timeout"),
        ProviderUnavailableError("503"),
    ],
)
def test_a_provider_error_is_not_re_asked(error: JobError) -> None:
    provider = FakeProvider(lambda _: error)

    execution = run(provider, repair_attempts=2)

    assert execution.error is error
    assert (provider.calls, execution.calls) == (1, 1)


def test_a_provider_error_on_the_re_ask_ends_the_attempt_but_keeps_the_first_answers_tokens() -> None:
    # Given a wrong first answer, then a 429 on the re-ask
    limited = ProviderRateLimitedError("429", retry_after_seconds=3)
    provider = FakeProvider(scripted(WRONG_LABEL, limited))

    execution = run(provider)

    assert execution.error is limited
    assert (provider.calls, execution.calls) == (2, 2)
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == GPT_4O_MINI_100_20


# --- fallback -----------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [ProviderUnavailableError("503"), ProviderTimeoutError("timeout")])
def test_an_unavailable_or_slow_primary_falls_back_to_the_fallback_model(error: JobError) -> None:
    # Given a primary model that fails and a fallback model that answers
    provider = FakeProvider(by_model({"gpt-4o-mini": error, "gpt-4o": VALID_OUTPUTS["classify"]}))

    execution = run(provider, tiers=WITH_FALLBACK)

    # Then the fallback model's answer is the output, recorded under the fallback tier
    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS["classify"]
    assert [request.model for request in provider.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert (execution.tier, execution.model) == ("fallback", "gpt-4o")
    # And both calls count, though only the answered one is billed (at the fallback model's price)
    assert execution.calls == 2
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)
    assert execution.cost_usd == GPT_4O_100_20
    # And the fallback model gets the same prompt, afresh
    primary, fallback = provider.requests
    assert fallback == replace(primary, model="gpt-4o")


@pytest.mark.parametrize(
    "error", [ProviderRateLimitedError("429", retry_after_seconds=3), ProviderRejectedError("400", status_code=400)]
)
def test_a_rate_limit_or_a_rejection_does_not_fall_back(error: JobError) -> None:
    provider = FakeProvider(by_model({"gpt-4o-mini": error, "gpt-4o": VALID_OUTPUTS["classify"]}))

    execution = run(provider, tiers=WITH_FALLBACK)

    assert execution.error is error
    assert [request.model for request in provider.requests] == ["gpt-4o-mini"]
    assert (execution.tier, execution.model, execution.calls) == ("primary", "gpt-4o-mini", 1)


def test_a_failing_answer_does_not_fall_back() -> None:
    provider = FakeProvider(by_model({"gpt-4o-mini": WRONG_LABEL, "gpt-4o": VALID_OUTPUTS["classify"]}))

    execution = run(provider, tiers=WITH_FALLBACK)

    assert execution.error is not None
    assert execution.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert [request.model for request in provider.requests] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")


@pytest.mark.parametrize("error", [ProviderUnavailableError("503"), ProviderTimeoutError("timeout")])
def test_without_a_fallback_model_the_primarys_error_ends_the_attempt(error: JobError) -> None:
    provider = FakeProvider(lambda _: error)

    execution = run(provider, tiers=ModelTiers("gpt-4o-mini"))

    assert execution.error is error
    assert (provider.calls, execution.calls) == (1, 1)
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")


def test_a_fallback_equal_to_the_primary_is_not_asked_twice() -> None:
    error = ProviderUnavailableError("503")
    provider = FakeProvider(lambda _: error)

    execution = run(provider, tiers=ModelTiers("gpt-4o-mini", "gpt-4o-mini"))

    assert execution.error is error
    assert (provider.calls, execution.tier) == (1, "primary")


def test_when_both_models_fail_the_error_is_the_fallbacks() -> None:
    primary_error, fallback_error = ProviderUnavailableError("503"), ProviderTimeoutError("timeout")
    provider = FakeProvider(by_model({"gpt-4o-mini": primary_error, "gpt-4o": fallback_error}))

    execution = run(provider, tiers=WITH_FALLBACK)

    assert execution.error is fallback_error
    assert (execution.tier, execution.model, execution.calls) == ("fallback", "gpt-4o", 2)
    assert (execution.input_tokens, execution.output_tokens, execution.cost_usd) == (0, 0, Decimal(0))


def test_the_fallback_model_gets_repairs_of_its_own() -> None:
    # Given an unavailable primary, and a fallback whose first answer is wrong
    provider = FakeProvider(
        by_model({"gpt-4o-mini": ProviderUnavailableError("503"), "gpt-4o": [WRONG_LABEL, CLASSIFY_VALID]})
    )

    execution = run(provider, tiers=WITH_FALLBACK)

    assert execution.error is None
    assert [request.model for request in provider.requests] == ["gpt-4o-mini", "gpt-4o", "gpt-4o"]
    assert provider.requests[2].conversation == re_ask(json.dumps(WRONG_LABEL), WRONG_LABEL_REASON)
    assert (execution.tier, execution.model, execution.calls) == ("fallback", "gpt-4o", 3)
    assert (execution.input_tokens, execution.output_tokens) == (200, 40)
    assert execution.cost_usd == 2 * GPT_4O_100_20


def test_a_primary_that_answers_wrongly_then_goes_down_falls_back_with_a_fresh_conversation() -> None:
    # Given a primary whose first answer is wrong and whose re-ask fails with a 503
    provider = FakeProvider(
        by_model({"gpt-4o-mini": [WRONG_LABEL, ProviderUnavailableError("503")], "gpt-4o": CLASSIFY_VALID})
    )

    execution = run(provider, tiers=WITH_FALLBACK)

    # Then the fallback answers the prompt alone, and the primary's answer is paid for too
    assert execution.error is None
    assert [request.model for request in provider.requests] == ["gpt-4o-mini", "gpt-4o-mini", "gpt-4o"]
    assert provider.requests[2].conversation == ()
    assert (execution.tier, execution.model, execution.calls) == ("fallback", "gpt-4o", 3)
    assert (execution.input_tokens, execution.output_tokens) == (200, 40)
    assert execution.cost_usd == GPT_4O_MINI_100_20 + GPT_4O_100_20


def test_a_fallback_tier_job_type_does_not_fall_back_to_the_primary() -> None:
    # Given a job type of the fallback tier whose model is down
    definition = replace(JobRegistry().get("classify"), model_tier="fallback")
    error = ProviderUnavailableError("503")
    provider = FakeProvider(by_model({"gpt-4o": error, "gpt-4o-mini": CLASSIFY_VALID}))

    execution = run(provider, definition=definition, tiers=WITH_FALLBACK)

    assert execution.error is error
    assert [request.model for request in provider.requests] == ["gpt-4o"]
    assert (execution.tier, execution.model, execution.calls) == ("fallback", "gpt-4o", 1)


def test_a_fallback_tier_job_type_uses_the_primary_when_no_fallback_is_configured() -> None:
    definition = replace(JobRegistry().get("classify"), model_tier="fallback")
    provider = FakeProvider()

    execution = run(provider, definition=definition, tiers=ModelTiers("gpt-4o-mini"))

    assert execution.error is None
    assert [request.model for request in provider.requests] == ["gpt-4o-mini"]
    assert (execution.tier, execution.model, execution.calls) == ("primary", "gpt-4o-mini", 1)
    assert execution.cost_usd == GPT_4O_MINI_100_20


# --- time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("left", "timeout"), [(12.5, 12.5), (59.9, 59.9), (60.0, 60.0), (600.0, 60.0)])
def test_the_time_left_caps_the_calls_timeout(left: float, timeout: float) -> None:
    provider = FakeProvider()

    execution = run(provider, time_left=lambda: left)

    assert execution.error is None
    assert provider.requests[0].timeout_seconds == timeout


def test_the_time_left_is_read_again_for_each_call() -> None:
    # Given an invocation clock that loses 40 s during the first (wrong) answer
    clock = {"left": 100.0}

    def slow_wrong_then_valid(request: CompletionRequest) -> Any:
        if not request.conversation:
            clock["left"] = 25.0
            return WRONG_LABEL
        return CLASSIFY_VALID

    provider = FakeProvider(slow_wrong_then_valid)

    execution = run(provider, time_left=lambda: clock["left"])

    assert execution.error is None
    assert [request.timeout_seconds for request in provider.requests] == [60.0, 25.0]


@pytest.mark.parametrize("left", [0.999, 0.0, -4.0])
def test_with_less_than_a_second_left_no_call_starts(left: float) -> None:
    provider = FakeProvider()

    execution = run(provider, time_left=lambda: left)

    assert isinstance(execution.error, ProviderTimeoutError)
    assert execution.error.retryable is True
    assert provider.calls == 0
    assert execution.calls == 0
    assert (execution.input_tokens, execution.output_tokens, execution.cost_usd) == (0, 0, Decimal(0))


def test_with_exactly_the_minimum_left_the_call_starts() -> None:
    provider = FakeProvider()

    execution = run(provider, time_left=lambda: MIN_CALL_SECONDS)

    assert execution.error is None
    assert provider.requests[0].timeout_seconds == MIN_CALL_SECONDS


def test_with_no_time_left_and_a_fallback_model_no_call_starts_at_all() -> None:
    provider = FakeProvider()

    execution = run(provider, tiers=WITH_FALLBACK, time_left=lambda: 0.5)

    assert isinstance(execution.error, ProviderTimeoutError)
    assert (provider.calls, execution.calls) == (0, 0)
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")


def test_a_repair_is_not_started_when_time_ran_out() -> None:
    # Given a wrong first answer after which less than a second is left
    clock = {"left": 30.0}

    def wrong_and_slow(_: CompletionRequest) -> Any:
        clock["left"] = 0.5
        return WRONG_LABEL

    provider = FakeProvider(wrong_and_slow)

    execution = run(provider, time_left=lambda: clock["left"])

    # Then the attempt ends with a timeout (retryable) after one call, whose tokens are kept
    assert isinstance(execution.error, ProviderTimeoutError)
    assert (provider.calls, execution.calls) == (1, 1)
    assert (execution.input_tokens, execution.output_tokens) == (100, 20)


def test_a_fallback_is_not_started_when_time_ran_out() -> None:
    clock = {"left": 30.0}

    def down_and_slow(_: CompletionRequest) -> Any:
        clock["left"] = 0.5
        return ProviderUnavailableError("503")

    provider = FakeProvider(down_and_slow)

    execution = run(provider, tiers=WITH_FALLBACK, time_left=lambda: clock["left"])

    # Then the attempt ends with the primary's own error, recorded against the primary
    assert isinstance(execution.error, ProviderUnavailableError)
    assert [request.model for request in provider.requests] == ["gpt-4o-mini"]
    assert execution.calls == 1
    assert (execution.tier, execution.model) == ("primary", "gpt-4o-mini")


def test_a_sub_second_job_timeout_still_calls_when_time_is_plentiful() -> None:
    definition = replace(JobRegistry().get("classify"), timeout_seconds=0.5)
    provider = FakeProvider()

    execution = run(provider, definition=definition, time_left=lambda: 100.0)

    assert execution.error is None
    assert provider.requests[0].timeout_seconds == 0.5


# --- code fences --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        f"```json\n{CLASSIFY_VALID}\n```",
        f"```\n{CLASSIFY_VALID}\n```",
        f"  \n```json\n{CLASSIFY_VALID}\n```\n",
        f"```JSON\n{CLASSIFY_VALID}```",
        '```json\n{\n  "label": "spam",\n  "confidence": 0.93\n}\n```',
    ],
)
def test_an_answer_in_a_json_code_fence_is_accepted(content: str) -> None:
    provider = FakeProvider(lambda _: content)

    execution = run(provider)

    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == VALID_OUTPUTS["classify"]
    assert execution.calls == 1


def test_a_fenced_answer_is_still_validated() -> None:
    fenced = f"```json\n{json.dumps(WRONG_LABEL)}\n```"
    provider = FakeProvider(scripted(fenced, CLASSIFY_VALID))

    execution = run(provider)

    # The re-ask quotes the answer as the model gave it, fence included
    assert execution.error is None
    assert provider.requests[1].conversation == re_ask(fenced, WRONG_LABEL_REASON)


@pytest.mark.parametrize(
    ("content", "stripped"),
    [
        ('```json\n{"a": 1}\n```', '{"a": 1}'),
        ('```\n{"a": 1}\n```', '{"a": 1}'),
        ('\n```json\n{"a": 1}\n```\n\n', '{"a": 1}'),
        ('{"a": 1}', '{"a": 1}'),
        (' {"a": 1} ', ' {"a": 1} '),
        ('```json {"a": 1}```', '```json {"a": 1}```'),
        ('```json\n{"a": 1}', '```json\n{"a": 1}'),
        ('{"a": "```"}', '{"a": "```"}'),
    ],
)
def test_strip_code_fence(content: str, stripped: str) -> None:
    assert strip_code_fence(content) == stripped


# --- ModelTiers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tiers", "tier", "chain"),
    [
        (ModelTiers("p"), "primary", [("primary", "p")]),
        (ModelTiers("p"), "fallback", [("primary", "p")]),
        (ModelTiers("p", None), "fallback", [("primary", "p")]),
        (ModelTiers("p", ""), "primary", [("primary", "p")]),
        (ModelTiers("p", ""), "fallback", [("primary", "p")]),
        (ModelTiers("p", "p"), "primary", [("primary", "p")]),
        (ModelTiers("p", "f"), "primary", [("primary", "p"), ("fallback", "f")]),
        (ModelTiers("p", "f"), "fallback", [("fallback", "f")]),
    ],
)
def test_model_tiers_chain_the_models_to_try_for_a_tier(
    tiers: ModelTiers, tier: str, chain: list[tuple[str, str]]
) -> None:
    assert tiers.chain(tier) == chain


def test_the_fake_provider_answers_json() -> None:
    # Guards the shared fixture the gateway tests lean on.
    completion = FakeProvider().complete(
        CompletionRequest("m", "s", "u", "classify", {}, max_tokens=1, timeout_seconds=1)
    )

    assert json.loads(completion.content) == VALID_OUTPUTS["classify"]


# --- answers the gateway must survive -----------------------------------------------------------


def test_a_lone_surrogate_in_an_answer_over_http_is_re_asked_in_valid_utf8() -> None:
    # Given an OpenAI-compatible provider whose first answer's JSON carries a `\ud800` escape
    contents = iter(['{"label": "sp\ud800am", "confidence": 0.9}', CLASSIFY_VALID])
    sent: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, text=json.dumps(openai_completion(next(contents))))

    client = httpx.Client(transport=httpx.MockTransport(answer))
    provider = OpenAICompatibleProvider("https://llm.example/v1", static_api_key("k"), client=client)
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Win", "labels": ["spam", "ham"]})

    # When the gateway runs the attempt
    execution = ModelGateway(provider, ModelTiers("gpt-4o-mini")).execute(definition, job_input)

    # Then the answer is rejected, the re-ask is sent (encodable) and the second answer is the output
    assert execution.error is None
    assert execution.output is not None
    assert execution.calls == 2
    assert "sp\ufffdam" in sent[1].decode()


def test_a_job_types_rule_that_raises_ends_the_attempt_with_its_usage() -> None:
    def broken_rule(job_input: Any, output: Any) -> str | None:
        raise KeyError("a bug in the rule")

    definition = replace(JobRegistry().get("classify"), business_rule=broken_rule)
    job_input = definition.parse_input({"text": "Win", "labels": ["spam", "ham"]})

    execution = ModelGateway(FakeProvider(), ModelTiers("gpt-4o-mini")).execute(definition, job_input)

    assert execution.error is not None
    assert (execution.error.code, execution.error.retryable) == (ErrorCode.INTERNAL_ERROR, True)
    assert (execution.calls, execution.input_tokens, execution.output_tokens) == (1, 100, 20)


def test_an_adapter_that_raises_unexpectedly_keeps_the_usage_of_earlier_calls() -> None:
    calls = iter([json.dumps(WRONG_LABEL), RuntimeError("a bug in the adapter")])

    def script(_: CompletionRequest) -> Any:
        answer = next(calls)
        if isinstance(answer, Exception):
            raise answer
        return answer

    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Win", "labels": ["spam", "ham"]})

    execution = ModelGateway(FakeProvider(script), ModelTiers("gpt-4o-mini")).execute(definition, job_input)

    assert execution.error is not None
    assert execution.error.code is ErrorCode.INTERNAL_ERROR
    assert (execution.calls, execution.input_tokens) == (2, 100)


# --- the plan: what an attempt can use at most ----------------------------------------------------


def bytes_sent(request: CompletionRequest) -> int:
    """The most input tokens a call can be billed: one per byte of everything it sends."""
    sent = [request.system, request.user, json.dumps(request.output_schema)]
    sent += [turn.content for turn in request.conversation]
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in sent)


def byte_billing(answers: list[str]) -> Script:
    """A provider billing each call at the most it can: a token per byte sent, and max_tokens of
    output; answering `answers` in turn."""

    def complete(request: CompletionRequest) -> Completion:
        return Completion(answers.pop(0), request.model, bytes_sent(request), request.max_tokens, latency_ms=1)

    return complete


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=400), repairs=st.integers(min_value=0, max_value=2))
def test_no_attempt_costs_more_than_its_plans_worst_case(text: str, repairs: int) -> None:
    # Given a classify job of any text, and a provider that refuses every repair until the last
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": text, "labels": ["spam", "ham"]})
    answers = [json.dumps(WRONG_LABEL)] * repairs + [CLASSIFY_VALID]
    provider = FakeProvider(byte_billing(answers))
    gateway = ModelGateway(provider, WITH_FALLBACK, repair_attempts=repairs)

    plan = gateway.plan(definition, job_input)
    execution = gateway.execute(definition, job_input)

    # Then the attempt (every re-ask included) costs no more than the plan reserved
    assert execution.calls == repairs + 1
    assert execution.cost_usd <= plan.worst_case_usd
    first = provider.requests[0]
    assert bytes_sent(first) + first.max_tokens <= plan.first_call_tokens
    assert plan.model == "gpt-4o-mini"


def test_the_worst_case_counts_the_fallback_models_calls_too() -> None:
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input(INPUTS["classify"])

    alone = ModelGateway(FakeProvider(), ModelTiers("gpt-4o-mini")).plan(definition, job_input)
    with_fallback = ModelGateway(FakeProvider(), WITH_FALLBACK).plan(definition, job_input)
    unpriced = ModelGateway(FakeProvider(), ModelTiers("my-local-llama")).plan(definition, job_input)

    assert alone.first_call_tokens == with_fallback.first_call_tokens > definition.max_tokens
    assert with_fallback.worst_case_usd > alone.worst_case_usd > 0
    assert unpriced.worst_case_usd == 0  # a model without a price cannot be budgeted


@pytest.mark.parametrize(("attachments", "version"), [(0, "2"), (2, "attachments-1")])
def test_a_batch_answer_priced_alone_names_the_prompt_its_request_was_rendered_with(
    attachments: int, version: str
) -> None:
    definition = JobRegistry().get("summarize")
    gateway = ModelGateway(FakeProvider(scripted()), ModelTiers("gpt-4o-mini"))
    answered = Answered(Completion(json.dumps({"summary": "short"}), "gpt-4o-mini", 100, 20, 5), "batch-1")
    job_input = definition.parse_input(INPUTS["summarize"])

    execution = gateway.price_answer(definition, job_input, answered, attachments)

    assert (execution.prompt.version, execution.calls, execution.batch_id) == (version, 1, "batch-1")
    assert execution.cost_usd == GPT_4O_MINI_100_20 / 2  # a batch's answer at the batch price
