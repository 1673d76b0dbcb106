"""BedrockConverseProvider over a stubbed bedrock-runtime client: the request, the answer, the error codes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    SSLError,
)
from botocore.stub import ANY, Stubber

from engine.core import ErrorCode
from engine.core.errors import (
    FlexUnavailableError,
    JobError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.definitions import JobRegistry
from engine.gateway import ChatTurn, CompletionRequest, ModelGateway, ModelTiers
from engine.gateway.bedrock import (
    BedrockConverseProvider,
    ConverseClient,
    cache_point_min_tokens,
    default_client_factory,
    system_blocks,
)
from tests.support.providers import CLASSIFY_SCHEMA
from tests.support.providers import completion_request as support_request

MODEL = "amazon.nova-lite-v1:0"
ENDPOINT = "https://bedrock-runtime.us-east-1.amazonaws.com"


def completion_request(**overrides: Any) -> CompletionRequest:
    return support_request(MODEL, **overrides)


def converse_response(
    *blocks: dict[str, Any], stop_reason: str = "tool_use", input_tokens: int = 100, output_tokens: int = 20
) -> dict[str, Any]:
    """A Converse response body as boto3 returns it."""
    return {
        "output": {"message": {"role": "assistant", "content": list(blocks)}},
        "stopReason": stop_reason,
        "usage": {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": input_tokens + output_tokens,
        },
        "metrics": {"latencyMs": 42},
    }


def tool_use(answer: dict[str, Any], name: str = "classify") -> dict[str, Any]:
    return {"toolUse": {"toolUseId": "tooluse_1", "name": name, "input": answer}}


@pytest.fixture
def client() -> Any:
    return boto3.client("bedrock-runtime", region_name="us-east-1")


@pytest.fixture
def stubber(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stubbed:
        yield stubbed
        stubbed.assert_no_pending_responses()


@pytest.fixture
def provider(client: Any) -> BedrockConverseProvider:
    return BedrockConverseProvider(lambda _: client)


class RaisingClient:
    """A client whose call fails before any answer, as botocore's transport does."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def converse(self, **_: Any) -> Mapping[str, Any]:
        raise self.exc


class AnsweringClient:
    """A client that returns any body, unchecked by the service model."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def converse(self, **_: Any) -> Mapping[str, Any]:
        response: Mapping[str, Any] = self.response
        return response


def failure_of(client: ConverseClient) -> JobError:
    with pytest.raises(JobError) as caught:
        BedrockConverseProvider(lambda _: client).complete(completion_request())
    assert "\n" not in caught.value.message
    return caught.value


# --- the request --------------------------------------------------------------------------------


def test_the_request_forces_one_tool_whose_input_schema_is_the_output_schema(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})),
        expected_params={
            "modelId": MODEL,
            "system": [{"text": "You classify texts."}],
            "messages": [{"role": "user", "content": [{"text": "Text: win a cruise"}]}],
            "inferenceConfig": {"maxTokens": 256, "temperature": 0},
            "toolConfig": {
                "tools": [
                    {"toolSpec": {"name": "classify", "description": ANY, "inputSchema": {"json": CLASSIFY_SCHEMA}}}
                ],
                "toolChoice": {"tool": {"name": "classify"}},
            },
        },
    )

    provider.complete(completion_request())


def test_the_conversation_follows_the_user_prompt_as_text_turns(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    conversation = (
        ChatTurn("assistant", '{"label": "eggs", "confidence": 0.5}'),
        ChatTurn("user", "Your answer was not accepted: label 'eggs' is not offered."),
    )
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})),
        expected_params={
            "modelId": MODEL,
            "system": ANY,
            "messages": [
                {"role": "user", "content": [{"text": "Text: win a cruise"}]},
                {"role": "assistant", "content": [{"text": '{"label": "eggs", "confidence": 0.5}'}]},
                {"role": "user", "content": [{"text": "Your answer was not accepted: label 'eggs' is not offered."}]},
            ],
            "inferenceConfig": ANY,
            "toolConfig": ANY,
        },
    )

    provider.complete(completion_request(conversation=conversation))


def test_an_empty_answer_in_the_conversation_is_sent_as_a_non_blank_turn(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    # Bedrock refuses blank text blocks; the re-ask after an empty answer must still be sendable.
    conversation = (ChatTurn("assistant", ""), ChatTurn("user", "Answer again."))
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})),
        expected_params={
            "modelId": MODEL,
            "system": ANY,
            "messages": [
                {"role": "user", "content": [{"text": "Text: win a cruise"}]},
                {"role": "assistant", "content": [{"text": "(no answer)"}]},
                {"role": "user", "content": [{"text": "Answer again."}]},
            ],
            "inferenceConfig": ANY,
            "toolConfig": ANY,
        },
    )

    provider.complete(completion_request(conversation=conversation))


def test_an_empty_system_prompt_is_left_out(stubber: Stubber, provider: BedrockConverseProvider) -> None:
    # A system block must not be blank; no system prompt is sent as none at all.
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})),
        expected_params={"modelId": MODEL, "messages": ANY, "inferenceConfig": ANY, "toolConfig": ANY},
    )

    provider.complete(completion_request(system=""))


# --- the answer ---------------------------------------------------------------------------------


# --- the prompt cache point ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("anthropic.claude-3-7-sonnet-20250219-v1:0", 1024),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", 1024),
        ("anthropic.claude-opus-4-1-20250805-v1:0", 1024),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", 2048),
        ("global.anthropic.claude-haiku-4-5-20251001-v1:0", 4096),
        ("anthropic.claude-opus-4-5-20251101-v1:0", 4096),
        ("amazon.nova-lite-v1:0", 1000),
        ("eu.amazon.nova-pro-v1:0", 1000),
    ],
)
def test_a_system_prompt_long_enough_for_the_models_cache_is_followed_by_a_cache_point(
    model: str, minimum: int, client: Any
) -> None:
    # Tokens are estimated as UTF-8 bytes / 4: 4 x minimum bytes are just enough, one byte less is not
    long_enough, too_short = "a" * (4 * minimum), "a" * (4 * minimum - 1)
    with Stubber(client) as stubber:
        for system, blocks in (
            (long_enough, [{"text": long_enough}, {"cachePoint": {"type": "default"}}]),
            (too_short, [{"text": too_short}]),
        ):
            stubber.add_response(
                "converse",
                converse_response(tool_use({"label": "spam", "confidence": 0.9})),
                expected_params={
                    "modelId": model,
                    "system": blocks,
                    "messages": ANY,
                    "inferenceConfig": ANY,
                    "toolConfig": ANY,
                },
            )
            BedrockConverseProvider(lambda _: client).complete(support_request(model, system=system))
        stubber.assert_no_pending_responses()


@pytest.mark.parametrize("model", ["meta.llama3-70b-instruct-v1:0", "anthropic.claude-3-haiku-20240307-v1:0"])
def test_a_model_without_a_known_prompt_cache_gets_no_cache_point_however_long_the_prompt(
    model: str, stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    system = "a" * 100_000
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})),
        expected_params={
            "modelId": model,
            "system": [{"text": system}],
            "messages": ANY,
            "inferenceConfig": ANY,
            "toolConfig": ANY,
        },
    )

    provider.complete(support_request(model, system=system))


def test_multibyte_text_counts_its_bytes_toward_the_minimum() -> None:
    # 1024 tokens on Claude 3.7 Sonnet: 4096 bytes, so 1366 three-byte characters but not 1365
    model = "anthropic.claude-3-7-sonnet-20250219-v1:0"
    assert cache_point_min_tokens(model) == 1024
    assert system_blocks("語" * 1366, model)[-1] == {"cachePoint": {"type": "default"}}
    assert system_blocks("語" * 1365, model) == [{"text": "語" * 1365}]
    assert system_blocks("", model) == []


def test_a_tool_call_is_the_answer_as_json_with_usage_and_stop_reason(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_response(
        "converse",
        converse_response(
            {"text": "Let me classify that."},
            tool_use({"label": "ham", "confidence": 0.1}),
            input_tokens=812,
            output_tokens=40,
        ),
    )

    completion = provider.complete(completion_request())

    assert json.loads(completion.content) == {"label": "ham", "confidence": 0.1}
    assert completion.input_tokens == 812
    assert completion.output_tokens == 40
    assert completion.finish_reason == "tool_use"
    assert completion.model == MODEL
    assert completion.latency_ms >= 0


def test_cache_reads_and_writes_are_added_to_the_input_tokens_they_are_apart_from(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    response = converse_response(tool_use({"label": "ham", "confidence": 0.1}), input_tokens=100, output_tokens=20)
    response["usage"] |= {"cacheReadInputTokens": 1_024, "cacheWriteInputTokens": 2_048}
    stubber.add_response("converse", response)

    completion = provider.complete(completion_request())

    assert completion.input_tokens == 3_172
    assert (completion.cached_input_tokens, completion.cache_write_input_tokens) == (1_024, 2_048)
    assert (completion.output_tokens, completion.reasoning_tokens) == (20, 0)


def test_the_first_tool_call_is_the_answer(stubber: Stubber, provider: BedrockConverseProvider) -> None:
    stubber.add_response(
        "converse",
        converse_response(
            tool_use({"label": "spam", "confidence": 0.9}), tool_use({"label": "ham", "confidence": 0.2})
        ),
    )

    completion = provider.complete(completion_request())

    assert json.loads(completion.content) == {"label": "spam", "confidence": 0.9}


def test_a_text_answer_is_passed_on_for_validation_to_explain(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_response(
        "converse", converse_response({"text": "I think it is "}, {"text": "spam."}, stop_reason="end_turn")
    )

    completion = provider.complete(completion_request())

    assert completion.content == "I think it is spam."
    assert completion.finish_reason == "end_turn"
    assert (completion.input_tokens, completion.output_tokens) == (100, 20)


def test_an_answer_with_neither_tool_call_nor_text_is_empty(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_response("converse", converse_response(stop_reason="max_tokens", output_tokens=256))

    completion = provider.complete(completion_request())

    assert completion.content == ""
    assert completion.finish_reason == "max_tokens"
    assert completion.output_tokens == 256


@pytest.mark.parametrize(
    "response",
    [
        {},
        {"output": {}},
        {"output": {"message": None}},
        {"output": {"message": {"role": "assistant"}}},
        {"output": {"message": {"role": "assistant", "content": "text"}}},
        {"output": {"message": {"role": "assistant", "content": ["text"]}}},
        {"output": {"message": {"role": "assistant", "content": [{"toolUse": {"name": "classify"}}]}}},
        {"output": {"message": {"role": "assistant", "content": []}}, "usage": "n/a"},
        {"output": {"message": {"role": "assistant", "content": []}}, "usage": {"inputTokens": "many"}},
        None,
    ],
)
def test_a_malformed_response_is_unavailable(response: Any) -> None:
    error = failure_of(AnsweringClient(response))

    assert isinstance(error, ProviderUnavailableError)
    assert error.message == "Bedrock answered with a malformed Converse response"


# --- error codes --------------------------------------------------------------------------------


def error_for(stubber: Stubber, provider: BedrockConverseProvider, code: str, status: int) -> JobError:
    stubber.add_client_error(
        "converse",
        service_error_code=code,
        service_message="model said: Text: win a cruise",
        http_status_code=status,
    )
    with pytest.raises(JobError) as caught:
        provider.complete(completion_request())
    # Bedrock's own text (which may quote the prompt) stays out of the recorded reason.
    assert "win a cruise" not in caught.value.message
    return caught.value


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ThrottlingException", 429),
        ("ServiceQuotaExceededException", 400),
        ("TooManyRequestsException", 429),  # any other code sent with 429
    ],
)
def test_throttling_is_rate_limited_without_a_retry_after(
    stubber: Stubber, provider: BedrockConverseProvider, code: str, status: int
) -> None:
    error = error_for(stubber, provider, code, status)

    assert isinstance(error, ProviderRateLimitedError)
    assert error.code is ErrorCode.PROVIDER_RATE_LIMITED
    assert error.consumes_attempt is False
    assert error.retry_after_seconds is None
    assert error.message == f"Bedrock rate limit ({code}, HTTP {status})"


def test_a_model_timeout_is_a_timeout(stubber: Stubber, provider: BedrockConverseProvider) -> None:
    error = error_for(stubber, provider, "ModelTimeoutException", 408)

    assert isinstance(error, ProviderTimeoutError)
    assert error.code is ErrorCode.PROVIDER_TIMEOUT
    assert error.retryable is True


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("InternalServerException", 500),
        ("ServiceUnavailableException", 503),
        ("ModelNotReadyException", 429),
        ("ModelErrorException", 424),
        ("InternalFailure", 500),  # any other code sent with 5xx
        ("SomethingNew", 502),
        ("ConflictException", 409),
    ],
)
def test_a_service_or_model_fault_is_unavailable(
    stubber: Stubber, provider: BedrockConverseProvider, code: str, status: int
) -> None:
    error = error_for(stubber, provider, code, status)

    assert isinstance(error, ProviderUnavailableError)
    assert error.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert error.retryable is True
    assert error.message == f"Bedrock unavailable ({code}, HTTP {status})"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ValidationException", 400),
        ("AccessDeniedException", 403),
        ("ResourceNotFoundException", 404),
        ("UnrecognizedClientException", 403),  # any other code sent with 4xx
        ("SomethingNew", 422),
    ],
)
def test_a_bad_request_model_or_permission_is_rejected_for_good(
    stubber: Stubber, provider: BedrockConverseProvider, code: str, status: int
) -> None:
    error = error_for(stubber, provider, code, status)

    assert isinstance(error, ProviderRejectedError)
    assert error.code is ErrorCode.PROVIDER_REJECTED
    assert error.retryable is False
    assert error.status_code == status
    assert error.message == f"Bedrock rejected the request ({code}, HTTP {status})"


def test_an_unknown_code_with_408_is_a_timeout(stubber: Stubber, provider: BedrockConverseProvider) -> None:
    assert isinstance(error_for(stubber, provider, "RequestTimeout", 408), ProviderTimeoutError)


def test_a_request_botocore_refuses_to_send_is_rejected(client: Any) -> None:
    # maxTokens has a minimum of 1 in the service model, which botocore checks before sending.
    # (An answer is queued only so that nothing could reach the network if it did not.)
    provider = BedrockConverseProvider(lambda _: client)
    with Stubber(client) as stubbed:
        stubbed.add_response("converse", converse_response(tool_use({"label": "spam", "confidence": 0.9})))

        with pytest.raises(ProviderRejectedError) as caught:
            provider.complete(completion_request(max_tokens=0))

    assert caught.value.status_code is None


@pytest.mark.parametrize(
    "exc",
    [
        ReadTimeoutError(endpoint_url=ENDPOINT),
        ConnectTimeoutError(endpoint_url=ENDPOINT),
    ],
)
def test_a_read_or_connect_timeout_is_a_timeout(exc: Exception) -> None:
    error = failure_of(RaisingClient(exc))

    assert isinstance(error, ProviderTimeoutError)
    assert error.message == "no answer from Bedrock within 30s"


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url=ENDPOINT),
        ConnectionClosedError(endpoint_url=ENDPOINT),
        SSLError(endpoint_url=ENDPOINT, error=OSError("handshake failed")),
    ],
)
def test_a_connection_failure_is_unavailable(exc: Exception) -> None:
    error = failure_of(RaisingClient(exc))

    assert isinstance(error, ProviderUnavailableError)
    assert error.message == f"Bedrock connection failed: {type(exc).__name__}"


# --- clients per timeout ------------------------------------------------------------------------


class CountingFactory:
    def __init__(self) -> None:
        self.timeouts: list[int] = []

    def __call__(self, read_timeout: int) -> ConverseClient:
        self.timeouts.append(read_timeout)
        return AnsweringClient(converse_response(tool_use({"label": "spam", "confidence": 0.9})))


def test_one_client_is_built_per_whole_second_timeout_and_reused() -> None:
    factory = CountingFactory()
    provider = BedrockConverseProvider(factory)

    for timeout in [12.5, 13.0, 12.01, 30.0, 0.2, 30.0]:
        provider.complete(completion_request(timeout_seconds=timeout))

    assert factory.timeouts == [13, 30, 1]


def test_the_least_recently_used_client_is_dropped_past_eight() -> None:
    factory = CountingFactory()
    provider = BedrockConverseProvider(factory)

    for timeout in [1, 2, 3, 4, 5, 6, 7, 8, 1, 9, 1, 2]:
        provider.complete(completion_request(timeout_seconds=float(timeout)))

    # 2 was the least recently used when 9 came in, so it is built again; 1 was kept.
    assert factory.timeouts == [1, 2, 3, 4, 5, 6, 7, 8, 9, 2]


def test_nothing_is_built_until_the_first_call() -> None:
    factory = CountingFactory()

    BedrockConverseProvider(factory)

    assert factory.timeouts == []


@pytest.mark.parametrize(("read_timeout", "connect_timeout"), [(60, 5), (3, 3)])
def test_default_clients_carry_the_timeout_and_leave_retries_to_the_engine(
    read_timeout: int, connect_timeout: int
) -> None:
    client: Any = default_client_factory("eu-west-1")(read_timeout)

    config = client.meta.config
    assert client.meta.service_model.service_name == "bedrock-runtime"
    assert client.meta.region_name == "eu-west-1"
    assert config.read_timeout == read_timeout
    assert config.connect_timeout == connect_timeout
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}
    assert config.max_pool_connections == 32


# --- through the gateway ------------------------------------------------------------------------


def test_a_classify_job_runs_through_the_gateway(stubber: Stubber, client: Any) -> None:
    # Given the built-in classify job type on Nova Lite, whose first answer offers no such label
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Win a free cruise now!", "labels": ["spam", "ham"]})
    # The tool's input schema is the one for this input: the label is one of the labels offered.
    input_schema = definition.output_schema(job_input)
    assert input_schema["properties"]["label"] == {"type": "string", "enum": ["spam", "ham"]}
    first_request = {
        "modelId": MODEL,
        "system": [{"text": ANY}],
        "messages": [{"role": "user", "content": [{"text": ANY}]}],
        "inferenceConfig": {"maxTokens": 256, "temperature": 0},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "classify",
                        "description": ANY,
                        "inputSchema": {"json": input_schema},
                    }
                }
            ],
            "toolChoice": {"tool": {"name": "classify"}},
        },
    }
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "eggs", "confidence": 0.5}), input_tokens=900, output_tokens=30),
        expected_params=first_request,
    )
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.93}), input_tokens=1000, output_tokens=20),
        expected_params={**first_request, "messages": [ANY, {"role": "assistant", "content": ANY}, ANY]},
    )
    factory_timeouts: list[int] = []

    def factory(read_timeout: int) -> ConverseClient:
        factory_timeouts.append(read_timeout)
        client_: ConverseClient = client
        return client_

    gateway = ModelGateway(BedrockConverseProvider(factory), ModelTiers(MODEL))

    # When the gateway executes it with 12.5 s left
    execution = gateway.execute(definition, job_input, time_left=lambda: 12.5)

    # Then the re-ask is answered, and both calls are counted and priced at Nova Lite's rates
    assert execution.error is None
    assert execution.output is not None
    assert execution.output.model_dump() == {"label": "spam", "confidence": 0.93}
    assert (execution.input_tokens, execution.output_tokens) == (1900, 50)
    assert execution.cost_usd == Decimal("0.000126")  # (1900 * 0.06 + 50 * 0.24) / 1e6
    assert execution.model == MODEL
    assert factory_timeouts == [13]


# --- the flex tier ---------------------------------------------------------------------------------


def test_a_flex_request_names_converses_service_tier_and_reads_the_tier_that_served_it(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    # The stubber holds the request and the response to botocore's service model of Converse.
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})) | {"serviceTier": {"type": "flex"}},
        expected_params={
            "serviceTier": {"type": "flex"},
            "modelId": "amazon.nova-pro-v1:0",
            "system": ANY,
            "messages": ANY,
            "inferenceConfig": ANY,
            "toolConfig": ANY,
        },
    )

    completion = provider.complete(support_request("amazon.nova-pro-v1:0", service_tier="flex"))

    assert completion.service_tier == "flex"


def test_a_standard_request_names_no_service_tier(stubber: Stubber, provider: BedrockConverseProvider) -> None:
    stubber.add_response(
        "converse",
        converse_response(tool_use({"label": "spam", "confidence": 0.9})) | {"serviceTier": {"type": "default"}},
        expected_params={"modelId": MODEL, "system": ANY, "messages": ANY, "inferenceConfig": ANY, "toolConfig": ANY},
    )

    assert provider.complete(completion_request()).service_tier == "default"


def test_a_flex_request_the_service_cannot_serve_now_is_flex_unavailable(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_client_error("converse", service_error_code="ServiceUnavailableException", http_status_code=503)

    with pytest.raises(FlexUnavailableError) as caught:
        provider.complete(completion_request(service_tier="flex"))

    assert caught.value.later
    assert caught.value.code is ErrorCode.PROVIDER_RATE_LIMITED


def test_a_throttled_flex_request_is_a_rate_limit_the_standard_tier_shares(
    stubber: Stubber, provider: BedrockConverseProvider
) -> None:
    stubber.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)

    with pytest.raises(ProviderRateLimitedError) as caught:
        provider.complete(completion_request(service_tier="flex"))

    assert not isinstance(caught.value, FlexUnavailableError)
