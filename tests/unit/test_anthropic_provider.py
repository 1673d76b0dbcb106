"""The Anthropic adapter against scripted responses (httpx.MockTransport): what it sends, how it reads
an answer and its usage, and the typed error of every status class."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, Literal

import httpx
import pytest
from anthropic.types import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from engine.core import Via
from engine.core.errors import (
    JobError,
    OutputTooLargeError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.definitions import JobRegistry
from engine.gateway import ChatTurn, ModelGateway, ModelTiers
from engine.gateway.anthropic import (
    ANTHROPIC_VERSION,
    JSON_OUTPUT_MODELS,
    AnthropicProvider,
    api_root,
    json_output_schema,
    message_completion,
    within_json_output_limits,
)
from engine.gateway.openai import MAX_RESPONSE_BYTES, static_api_key
from engine.gateway.pricing import PriceTable
from tests.support.anthropic_sdk import sdk_request
from tests.support.providers import CLASSIFY_SCHEMA, completion_request

Handler = Callable[[httpx.Request], httpx.Response]
MODEL = "claude-haiku-4-5"
# A model Anthropic does not list for its JSON output format: it answers through the forced tool.
TOOL_MODEL = "claude-opus-4-1"
ANSWER = {"label": "spam", "confidence": 0.9}


def message(
    content: list[dict[str, Any]] | None = None,
    *,
    stop_reason: str = "tool_use",
    input_tokens: int = 40,
    output_tokens: int = 12,
    cache_read: int = 0,
    cache_write: int = 0,
) -> dict[str, Any]:
    """A Message as Anthropic answers it (checked against the SDK's model)."""
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content
        if content is not None
        else [{"type": "tool_use", "id": "toolu_1", "name": "classify", "input": ANSWER}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        },
    }
    Message.model_validate(body)
    return body


def error(error_type: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": "said in words"}, "request_id": "req_1"}


class Recorder:
    def __init__(self, respond: Handler) -> None:
        self.respond = respond
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.respond(request)

    @property
    def body(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.requests[-1].content)
        return loaded


def provider_for(handler: Handler, key: str | None = "sk-ant-test", **kwargs: Any) -> AnthropicProvider:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return AnthropicProvider("https://api.anthropic.com", static_api_key(key), client=client, **kwargs)


def failure_of(handler: Handler) -> JobError:
    with pytest.raises(JobError) as caught:
        provider_for(handler).complete(completion_request(MODEL))
    assert "\n" not in caught.value.message
    return caught.value


# --- the request -----------------------------------------------------------------------------------


def test_a_request_goes_to_v1_messages_with_the_key_and_version_headers() -> None:
    # Given Anthropic's API
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))

    # When a completion is asked for
    provider_for(recorder).complete(completion_request(MODEL))

    # Then it is one POST to /v1/messages, the key in x-api-key (no bearer token), the API version named
    (request,) = recorder.requests
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test"
    assert request.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "authorization" not in request.headers
    assert "anthropic-beta" not in request.headers


@pytest.mark.parametrize(
    ("base", "root"),
    [
        ("https://api.anthropic.com", "https://api.anthropic.com"),
        ("https://api.anthropic.com/", "https://api.anthropic.com"),
        ("https://api.anthropic.com/v1", "https://api.anthropic.com"),
        ("https://proxy.example/anthropic/v1/", "https://proxy.example/anthropic"),
    ],
)
def test_a_base_url_is_taken_with_or_without_its_v1(base: str, root: str) -> None:
    assert api_root(base) == root


def test_without_a_key_no_x_api_key_header_is_sent() -> None:
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))
    provider_for(recorder, key=None).complete(completion_request(MODEL))
    assert "x-api-key" not in recorder.requests[0].headers


def test_structured_output_is_one_forced_tool_whose_input_schema_is_the_output_schema() -> None:
    # Given a model not named for the JSON output format
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))

    # When a completion is asked for
    completion = provider_for(recorder).complete(completion_request(TOOL_MODEL))

    # Then the request forces the one tool, its prefix (tool, then system) marked for the prompt cache
    body = recorder.body
    assert body["tools"] == [
        {
            "name": "classify",
            "description": "Give your answer by calling this tool; its input is the answer.",
            "input_schema": CLASSIFY_SCHEMA,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "classify"}
    assert body["system"] == [{"type": "text", "text": "You classify texts.", "cache_control": {"type": "ephemeral"}}]
    assert "output_config" not in body
    assert body["max_tokens"] == 256
    assert sdk_request(body) == body
    # And the answer is the tool call's input
    assert json.loads(completion.content) == ANSWER
    assert completion.finish_reason == "tool_use"


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-sonnet-4-5-20250929"])
def test_a_model_named_for_the_json_output_format_answers_in_it(model: str) -> None:
    # Given the model (or a dated version of it) named in AI_JSON_OUTPUT_MODELS
    text = [{"type": "text", "text": json.dumps(ANSWER)}]
    recorder = Recorder(lambda _: httpx.Response(200, json=message(text, stop_reason="end_turn")))
    provider = provider_for(recorder, json_output_models=("claude-sonnet-4-5",))

    # When a completion is asked for
    completion = provider.complete(completion_request(model))

    # Then the request asks for the JSON output format, and no tool; the answer is the text
    body = recorder.body
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": json_output_schema(CLASSIFY_SCHEMA)}}
    assert "tools" not in body
    assert "tool_choice" not in body
    assert sdk_request(body) == body
    assert json.loads(completion.content) == ANSWER


def test_a_model_that_only_shares_a_prefix_is_not_taken_for_a_json_output_model() -> None:
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))
    provider_for(recorder, json_output_models=("claude-opus-4",)).complete(completion_request(TOOL_MODEL))
    assert "tool_choice" in recorder.body


@pytest.mark.parametrize("model", [*JSON_OUTPUT_MODELS, "claude-haiku-4-5-20251001"])
def test_the_models_anthropic_lists_for_the_json_output_format_answer_in_it_unconfigured(model: str) -> None:
    recorder = Recorder(lambda _: httpx.Response(200, json=message([{"type": "text", "text": json.dumps(ANSWER)}])))
    provider_for(recorder).complete(completion_request(model))
    assert "output_config" in recorder.body
    assert "tool_choice" not in recorder.body


def test_the_json_output_schema_is_closed_and_keeps_what_the_format_cannot_check_in_its_descriptions() -> None:
    schema = {
        "type": "object",
        "title": "Answer",
        "properties": {
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "description": "how sure"},
            "due": {"type": ["string", "null"], "pattern": "^[0-9]{4}$", "format": "date"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 2},
        },
        "required": ["confidence"],
    }

    assert json_output_schema(schema) == {
        "type": "object",
        "properties": {
            "confidence": {"type": "number", "description": 'how sure\n\n{"minimum": 0, "maximum": 1}'},
            "due": {"type": ["string", "null"], "pattern": "^[0-9]{4}$", "format": "date"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "description": '{"maxLength": 5}'},
                "description": '{"minItems": 2}',
            },
        },
        "required": ["confidence"],
        "additionalProperties": False,
    }


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    breed: str


class Pet(BaseModel):
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


def test_a_discriminated_union_goes_to_the_json_output_format_as_any_of() -> None:
    # Given an output model whose union pydantic writes as oneOf (a discriminated union)
    schema = Pet.model_json_schema()
    assert "oneOf" in schema["properties"]["pet"]

    # When it becomes the JSON output format's schema
    shaped = json_output_schema(schema)

    # Then the union is kept, as the anyOf the format takes, and only the discriminator is described
    pet = shaped["properties"]["pet"]
    assert pet["anyOf"] == [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]
    assert "oneOf" not in json.dumps(shaped)
    assert json.loads(pet["description"]).keys() == {"discriminator"}


@pytest.mark.parametrize(
    "pattern",
    [r"^(?=.*[0-9])[a-z0-9]+$", r"^(?!x)[a-z]+$", r"(?<=a)b", r"(?<!a)b", r"^(a)\1$", r"\bword\b", r"(?P<x>a)(?P=x)"],
)
def test_a_pattern_the_json_output_format_cannot_take_goes_into_the_description(pattern: str) -> None:
    # Given a field whose pattern has a lookaround, a backreference or a word boundary, which the format refuses
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}, "required": ["code"]}

    # When it becomes the JSON output format's schema
    code = json_output_schema(schema)["properties"]["code"]

    # Then the pattern is not sent as one, but described (the engine still checks it on the answer)
    assert "pattern" not in code
    assert json.loads(code["description"]) == {"pattern": pattern}


@pytest.mark.parametrize("pattern", [r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", r"^\d+(\.\d+)?$", r"^a\\b$", r"^(?:ab)+$"])
def test_a_simple_pattern_is_kept_in_the_json_output_format(pattern: str) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}, "required": ["code"]}

    assert json_output_schema(schema)["properties"]["code"] == {"type": "string", "pattern": pattern}


def test_a_re_ask_is_the_conversation_with_no_empty_text() -> None:
    # Given a re-ask after an empty answer
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))
    conversation = (ChatTurn("assistant", ""), ChatTurn("user", "Your answer was not accepted."))

    provider_for(recorder).complete(completion_request(MODEL, conversation=conversation))

    # Then the turns follow the prompt, the empty one as a placeholder (Anthropic refuses empty text)
    body = recorder.body
    assert [(turn["role"], turn["content"]) for turn in body["messages"][1:]] == [
        ("assistant", "(no answer)"),
        ("user", "Your answer was not accepted."),
    ]
    assert sdk_request(body) == body


def test_without_a_system_prompt_the_tool_carries_the_cache_breakpoint() -> None:
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))
    provider_for(recorder).complete(completion_request(TOOL_MODEL, system=""))
    assert "system" not in recorder.body
    assert recorder.body["tools"][0]["cache_control"] == {"type": "ephemeral"}


# --- the answer ----------------------------------------------------------------------------------


def test_usage_counts_cache_reads_and_writes_in_the_input_and_prices_them_apart() -> None:
    # Given an answer whose input was partly read from the prompt cache and partly written to it
    body = message(input_tokens=40, output_tokens=12, cache_read=1000, cache_write=200)
    completion = provider_for(lambda _: httpx.Response(200, json=body)).complete(completion_request(MODEL))

    # Then the engine's input tokens hold all three, and each kind is priced at its own rate
    assert (completion.input_tokens, completion.cached_input_tokens, completion.cache_write_input_tokens) == (
        1240,
        1000,
        200,
    )
    cost = PriceTable().cost(MODEL, completion)
    # claude-haiku-4-5: $1 input, $0.10 cache read, $1.25 cache write, $5 output per million
    assert cost.usd == Decimal("0.000040") + Decimal("0.000100") + Decimal("0.000250") + Decimal("0.000060")
    assert PriceTable().cost(MODEL, completion, Via.BATCH).usd == cost.usd / 2


def test_an_answer_cut_off_at_max_tokens_says_so() -> None:
    cut = message([{"type": "text", "text": '{"label": "sp'}], stop_reason="max_tokens")
    completion = provider_for(lambda _: httpx.Response(200, json=cut)).complete(completion_request(MODEL))
    assert (completion.content, completion.finish_reason) == ('{"label": "sp', "max_tokens")


def test_an_answer_of_two_megabytes_is_read_whole() -> None:
    large = "x" * 2_000_000
    body = message([{"type": "text", "text": large}], stop_reason="end_turn")
    completion = provider_for(lambda _: httpx.Response(200, json=body)).complete(completion_request(MODEL))
    assert len(completion.content) == 2_000_000


def test_a_body_past_the_bound_is_refused_unread() -> None:
    assert isinstance(
        failure_of(lambda _: httpx.Response(200, content=b"x" * (MAX_RESPONSE_BYTES + 1))), OutputTooLargeError
    )


def test_a_lone_surrogate_in_an_answer_is_re_asked_in_valid_utf8() -> None:
    # Given a first answer whose JSON carries a `\ud800` escape (json.dumps writes the lone surrogate so)
    answers = iter(['{"label": "sp\ud800am", "confidence": 0.9}', json.dumps(ANSWER)])
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        text = [{"type": "text", "text": next(answers)}]
        return httpx.Response(200, text=json.dumps(message(text, stop_reason="end_turn")))

    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Win", "labels": ["spam", "ham"]})

    # When the gateway runs the attempt
    execution = ModelGateway(provider_for(answer), ModelTiers(MODEL)).execute(definition, job_input)

    # Then the answer is rejected, the re-ask goes out as valid UTF-8 the SDK takes, the second answer is the output
    assert execution.error is None
    assert execution.calls == 2
    assert "sp\ufffdam" in sent[1]["messages"][1]["content"]
    assert sdk_request(sent[1]) == sent[1]


# --- errors, by status and type ------------------------------------------------------------------


def test_429_is_rate_limited_with_its_retry_after() -> None:
    failure = failure_of(lambda _: httpx.Response(429, json=error("rate_limit_error"), headers={"retry-after": "7"}))
    assert isinstance(failure, ProviderRateLimitedError)
    assert failure.retry_after_seconds == 7


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(529, "overloaded_error"), (500, "api_error"), (503, "api_error"), (504, "timeout_error")],
)
def test_overloaded_and_server_errors_are_unavailable(status: int, error_type: str) -> None:
    assert isinstance(failure_of(lambda _: httpx.Response(status, json=error(error_type))), ProviderUnavailableError)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ],
)
def test_the_request_s_own_faults_are_rejected(status: int, error_type: str) -> None:
    failure = failure_of(lambda _: httpx.Response(status, json=error(error_type)))
    assert isinstance(failure, ProviderRejectedError)
    assert failure.status_code == status
    assert error_type in failure.message
    assert "said in words" not in failure.message  # the provider's text is neither kept nor read


def test_a_401_reads_a_rotated_key_again_and_asks_once_more() -> None:
    # Given a key that was rotated in its secret
    keys = iter(["old-key", "new-key"])

    def source(*, refresh: bool = False) -> str | None:
        return next(keys)

    recorder = Recorder(
        lambda request: (
            httpx.Response(200, json=message())
            if request.headers["x-api-key"] == "new-key"
            else httpx.Response(401, json=error("authentication_error"))
        )
    )
    client = httpx.Client(transport=httpx.MockTransport(recorder))

    # When a call meets a 401
    completion = AnthropicProvider("https://api.anthropic.com", source, client=client).complete(
        completion_request(MODEL)
    )

    # Then the key is read again and the call made once more, with it
    assert [request.headers["x-api-key"] for request in recorder.requests] == ["old-key", "new-key"]
    assert json.loads(completion.content) == ANSWER


@pytest.mark.parametrize(
    ("error_type", "expected"),
    [
        ("overloaded_error", ProviderUnavailableError),
        ("api_error", ProviderUnavailableError),
        ("rate_limit_error", ProviderRateLimitedError),
        ("invalid_request_error", ProviderRejectedError),
        ("a_type_not_known_yet", ProviderUnavailableError),
    ],
)
def test_a_200_whose_body_is_an_error_is_the_error_of_its_type(error_type: str, expected: type[JobError]) -> None:
    assert type(failure_of(lambda _: httpx.Response(200, json=error(error_type)))) is expected


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"type": "message"}',
        b'{"type": "message", "content": "text", "usage": {}}',
        b'{"type": "completion"}',
    ],
)
def test_a_200_that_is_not_a_message_is_unavailable(body: bytes) -> None:
    assert isinstance(failure_of(lambda _: httpx.Response(200, content=body)), ProviderUnavailableError)


@pytest.mark.parametrize("tokens", [-1, 10**9, "12", True])
def test_usage_that_is_no_token_count_is_unavailable(tokens: object) -> None:
    body = message()
    body["usage"]["cache_read_input_tokens"] = tokens
    assert isinstance(failure_of(lambda _: httpx.Response(200, json=body)), ProviderUnavailableError)


def test_a_timeout_is_a_timeout() -> None:
    def slow(_: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow")

    assert isinstance(failure_of(slow), ProviderTimeoutError)


def test_a_broken_connection_is_unavailable() -> None:
    def broken(_: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    assert isinstance(failure_of(broken), ProviderUnavailableError)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
MESSAGE_KEYS = st.sampled_from(["type", "content", "usage", "model", "stop_reason", "error"])


@given(
    st.dictionaries(MESSAGE_KEYS, JSON, max_size=6)
    | st.dictionaries(MESSAGE_KEYS, JSON, max_size=6).map(lambda body: {**message(), **body})
    | JSON
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_200_body_is_a_completion_or_a_typed_error_never_a_crash(body: Any) -> None:
    try:
        completion = message_completion(200, json.dumps(body).encode(), MODEL, latency_ms=0)
    except JobError:
        return
    assert completion.input_tokens >= completion.cached_input_tokens + completion.cache_write_input_tokens
    assert isinstance(completion.content, str)


@given(JSON)
@settings(max_examples=200)
def test_any_schema_becomes_an_output_format_schema_without_a_crash(schema: Any) -> None:
    shaped = json_output_schema(schema) if isinstance(schema, dict) else None
    assert shaped is None or isinstance(shaped, dict)


def nullable_fields(count: int) -> dict[str, Any]:
    """extract's kind of output schema: `count` fields, each a string or null, all required."""
    fields = {f"field_{n}": {"anyOf": [{"type": "string"}, {"type": "null"}]} for n in range(count)}
    return {"type": "object", "properties": fields, "required": list(fields), "additionalProperties": False}


@pytest.mark.parametrize(("fields", "json_output"), [(16, True), (17, False)])
def test_a_schema_past_the_json_output_formats_union_limit_goes_as_a_forced_tool(
    fields: int, json_output: bool
) -> None:
    # Given a model that has the JSON output format, and an answer of `fields` nullable fields
    recorder = Recorder(lambda _: httpx.Response(200, json=message()))

    # When a completion is asked for
    provider_for(recorder).complete(completion_request(MODEL, output_schema=nullable_fields(fields)))

    # Then at most 16 unions go in the output format; more go as the forced tool's input schema
    assert ("output_config" in recorder.body, "tool_choice" in recorder.body) == (json_output, not json_output)
    assert sdk_request(recorder.body) == recorder.body


def test_optional_properties_past_the_json_output_formats_limit_go_as_a_forced_tool() -> None:
    many = {f"p{n}": {"type": "string"} for n in range(25)}
    nested = {"type": "object", "properties": {"inner": {"type": "object", "properties": many}}, "required": ["inner"]}
    assert not within_json_output_limits(nested)
    assert within_json_output_limits({"type": "object", "properties": dict(list(many.items())[:24])})
    # A property named "properties" is a name, not a keyword
    named = {"type": "object", "properties": {"properties": {"type": "string"}}, "required": ["properties"]}
    assert within_json_output_limits(named)
