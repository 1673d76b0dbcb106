"""OpenAICompatibleProvider over httpx.MockTransport: the request, the status classes, the envelope."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from engine.core import ErrorCode
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
from engine.gateway.openai import (
    JOB_TYPE_HEADER,
    MAX_RESPONSE_BYTES,
    OpenAICompatibleProvider,
    StructuredOutput,
    parse_retry_after,
    static_api_key,
)
from engine.gateway.schema import SCHEMA_PREAMBLE
from tests.support.providers import CLASSIFY_SCHEMA, completion_request, openai_completion

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that records requests and answers with `respond`."""

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


def ok(content: str = '{"label": "spam", "confidence": 0.9}', **kwargs: Any) -> Handler:
    return lambda _: httpx.Response(200, json=openai_completion(content, **kwargs))


def provider_for(
    handler: Handler, api_key: str | None = "sk-test", base_url: str = "http://llm.local/v1/", **kwargs: Any
) -> OpenAICompatibleProvider:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return OpenAICompatibleProvider(base_url, static_api_key(api_key), client=client, **kwargs)


def raising(exc: Exception) -> Handler:
    def handler(_: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def failure_of(handler: Handler) -> JobError:
    with pytest.raises(JobError) as caught:
        provider_for(handler).complete(completion_request())
    assert "\n" not in caught.value.message
    return caught.value


# --- the request --------------------------------------------------------------------------------


def test_the_request_is_a_chat_completion_with_a_strict_json_schema() -> None:
    recorder = Recorder(ok())

    provider_for(recorder).complete(completion_request())

    request = recorder.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "http://llm.local/v1/chat/completions"
    body = recorder.body
    assert body["model"] == "gpt-4o-mini"
    assert body["max_tokens"] == 256
    assert body["messages"] == [
        {"role": "system", "content": "You classify texts."},
        {"role": "user", "content": "Text: win a cruise"},
    ]
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "classify"
    assert response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["label", "confidence"]
    assert set(schema["properties"]) == {"label", "confidence"}


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_the_prompt_cache_key_names_the_job_type_and_prompt_version_when_there_is_one(mode: StructuredOutput) -> None:
    recorder = Recorder(ok())

    provider_for(recorder, structured_output=mode).complete(completion_request(cache_key="classify:2"))
    provider_for(recorder, structured_output=mode).complete(completion_request())

    assert [json.loads(request.content).get("prompt_cache_key") for request in recorder.requests] == [
        "classify:2",
        None,
    ]


def test_a_job_through_the_gateway_sends_its_job_types_prompt_cache_key() -> None:
    recorder = Recorder(ok())
    gateway = ModelGateway(provider_for(recorder), ModelTiers("gpt-4o-mini"))
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Win a cruise", "labels": ["spam", "ham"]})

    gateway.execute(definition, job_input)

    assert recorder.body["prompt_cache_key"] == f"classify:{definition.render_prompt(job_input).version}"


def test_the_strict_schema_requires_every_property_even_optional_ones() -> None:
    recorder = Recorder(ok())
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 3}},
        "required": ["a"],
    }

    provider_for(recorder).complete(completion_request(output_schema=schema))

    sent = recorder.body["response_format"]["json_schema"]["schema"]
    assert sent["required"] == ["a", "b"]
    assert sent["additionalProperties"] is False
    assert "default" not in sent["properties"]["b"]


def test_json_object_mode_asks_for_a_json_object_and_puts_the_schema_in_the_system_message() -> None:
    recorder = Recorder(ok())

    provider_for(recorder, structured_output="json_object").complete(completion_request())

    assert recorder.body["response_format"] == {"type": "json_object"}
    system = recorder.body["messages"][0]
    assert system["role"] == "system"
    assert system["content"] == (
        f"You classify texts.\n\n{SCHEMA_PREAMBLE}\n{json.dumps(CLASSIFY_SCHEMA, separators=(',', ':'))}"
    )
    # The schema is the last line, whole and compact: a model (or the local provider) can read it back
    assert json.loads(system["content"].splitlines()[-1]) == CLASSIFY_SCHEMA


def test_json_object_mode_sends_the_schema_for_the_input_with_its_enums() -> None:
    recorder = Recorder(ok())
    definition = JobRegistry().get("classify")
    job_input = definition.parse_input({"text": "Wïn a cruise", "labels": ["spam", "ham", "ünknown"]})
    request = completion_request(output_schema=definition.output_schema(job_input), system="")

    provider_for(recorder, structured_output="json_object").complete(request)

    preamble, schema_line = recorder.body["messages"][0]["content"].split("\n")
    assert preamble == SCHEMA_PREAMBLE
    assert json.loads(schema_line)["properties"]["label"]["enum"] == ["spam", "ham", "ünknown"]
    assert "ünknown" in schema_line  # not escaped: fewer tokens


def test_json_schema_mode_keeps_the_enums_in_the_strict_schema() -> None:
    recorder = Recorder(ok())
    definition = JobRegistry().get("answer_with_citations")
    job_input = definition.parse_input(
        {"question": "q", "documents": [{"id": "d1", "text": "t"}, {"id": "d2", "text": "u"}]}
    )

    provider_for(recorder).complete(completion_request(output_schema=definition.output_schema(job_input)))

    schema = recorder.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["citations"]["items"] == {"type": "string", "enum": ["d1", "d2"]}
    assert recorder.body["messages"][0]["content"] == "You classify texts."  # the schema is not repeated


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_the_job_type_is_sent_in_a_header(mode: StructuredOutput) -> None:
    recorder = Recorder(ok())

    provider_for(recorder, structured_output=mode).complete(completion_request(schema_name="soak_quick_classify"))

    assert recorder.requests[0].headers[JOB_TYPE_HEADER] == "soak_quick_classify"
    assert JOB_TYPE_HEADER == "X-Aijobs-Job-Type"


@pytest.mark.parametrize("name", ["", "naïve", "two\nlines"])
def test_a_job_type_no_header_can_carry_is_not_sent(name: str) -> None:
    recorder = Recorder(ok())

    provider_for(recorder).complete(completion_request(schema_name=name))

    assert JOB_TYPE_HEADER not in recorder.requests[0].headers


REPAIR_TURNS = (
    ChatTurn("assistant", '{"label": "eggs", "confidence": 0.5}'),
    ChatTurn("user", "Your answer was not accepted: label 'eggs' is not offered. Answer again."),
)


def test_the_conversation_turns_are_sent_after_the_user_message_in_order() -> None:
    recorder = Recorder(ok())

    provider_for(recorder).complete(completion_request(conversation=REPAIR_TURNS))

    assert recorder.body["messages"] == [
        {"role": "system", "content": "You classify texts."},
        {"role": "user", "content": "Text: win a cruise"},
        {"role": "assistant", "content": '{"label": "eggs", "confidence": 0.5}'},
        {"role": "user", "content": "Your answer was not accepted: label 'eggs' is not offered. Answer again."},
    ]
    assert recorder.body["response_format"]["type"] == "json_schema"


def test_json_object_mode_sends_the_same_messages_with_the_schema_appended_to_the_system_message() -> None:
    schema_mode, object_mode = Recorder(ok()), Recorder(ok())
    request = completion_request(conversation=REPAIR_TURNS)

    provider_for(schema_mode).complete(request)
    provider_for(object_mode, structured_output="json_object").complete(request)

    assert object_mode.body["response_format"] == {"type": "json_object"}
    assert "json_schema" not in json.dumps(object_mode.body)
    object_messages, schema_messages = object_mode.body["messages"], schema_mode.body["messages"]
    assert object_messages[0]["content"].startswith(schema_messages[0]["content"] + "\n\n" + SCHEMA_PREAMBLE)
    assert object_messages[1:] == schema_messages[1:]
    assert len(object_messages) == 4
    ignored = {"response_format", "messages"}
    assert {key: value for key, value in object_mode.body.items() if key not in ignored} == {
        key: value for key, value in schema_mode.body.items() if key not in ignored
    }
    assert object_mode.requests[0].headers[JOB_TYPE_HEADER] == schema_mode.requests[0].headers[JOB_TYPE_HEADER]


def test_the_api_key_is_sent_as_a_bearer_token() -> None:
    recorder = Recorder(ok())

    provider_for(recorder, api_key="sk-secret").complete(completion_request())

    assert recorder.requests[0].headers["authorization"] == "Bearer sk-secret"


@pytest.mark.parametrize("api_key", [None, ""])
def test_without_an_api_key_no_authorization_header_is_sent(api_key: str | None) -> None:
    recorder = Recorder(ok())

    provider_for(recorder, api_key=api_key).complete(completion_request())

    assert "authorization" not in recorder.requests[0].headers


def test_the_api_key_is_read_at_each_call() -> None:
    # Given a key source that rotates (Secrets Manager with a max age)
    keys = iter(["sk-1", "sk-2"])
    recorder = Recorder(ok())
    client = httpx.Client(transport=httpx.MockTransport(recorder))
    provider = OpenAICompatibleProvider("http://llm.local/v1", lambda refresh=False: next(keys), client=client)

    provider.complete(completion_request())
    provider.complete(completion_request())

    assert [r.headers["authorization"] for r in recorder.requests] == ["Bearer sk-1", "Bearer sk-2"]


# --- the answer ---------------------------------------------------------------------------------


def test_a_completion_carries_content_usage_and_finish_reason() -> None:
    handler = ok(
        '{"label": "ham", "confidence": 0.1}', prompt_tokens=812, completion_tokens=40, model="gpt-4o-mini-2024"
    )

    completion = provider_for(handler).complete(completion_request())

    assert completion.content == '{"label": "ham", "confidence": 0.1}'
    assert completion.input_tokens == 812
    assert completion.output_tokens == 40
    assert completion.model == "gpt-4o-mini-2024"
    assert completion.finish_reason == "stop"
    assert completion.latency_ms >= 0


def test_cached_and_reasoning_tokens_are_read_as_parts_of_input_and_output() -> None:
    envelope = openai_completion(
        "{}", prompt_tokens=2_000, completion_tokens=300, cached_tokens=1_536, reasoning_tokens=256
    )

    completion = provider_for(lambda _: httpx.Response(200, json=envelope)).complete(completion_request())

    assert (completion.input_tokens, completion.cached_input_tokens, completion.cache_write_input_tokens) == (
        2_000,
        1_536,
        0,
    )
    assert (completion.output_tokens, completion.reasoning_tokens) == (300, 256)


def test_a_provider_without_token_details_reports_no_cached_or_reasoning_tokens() -> None:
    envelope = openai_completion("{}")
    envelope["usage"] = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None}

    completion = provider_for(lambda _: httpx.Response(200, json=envelope)).complete(completion_request())

    assert (completion.cached_input_tokens, completion.reasoning_tokens) == (0, 0)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 11}},
        {"prompt_tokens": 10, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 3}},
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": -1}},
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": "5"}},
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": [5]},
    ],
)
def test_token_details_that_cannot_be_parts_of_the_counts_are_a_malformed_envelope(usage: dict[str, Any]) -> None:
    envelope = openai_completion("{}")
    envelope["usage"] = usage

    assert isinstance(failure_of(lambda _: httpx.Response(200, json=envelope)), ProviderUnavailableError)


def test_a_completion_without_usage_counts_zero_tokens() -> None:
    envelope = openai_completion("{}")
    del envelope["usage"]

    completion = provider_for(lambda _: httpx.Response(200, json=envelope)).complete(completion_request())

    assert (completion.input_tokens, completion.output_tokens) == (0, 0)


def test_a_refusal_has_empty_content() -> None:
    envelope = openai_completion("{}")
    envelope["choices"][0] = {"index": 0, "message": {"role": "assistant", "content": None, "refusal": "no"}}

    completion = provider_for(lambda _: httpx.Response(200, json=envelope)).complete(completion_request())

    assert completion.content == ""
    assert completion.finish_reason == "refusal"
    assert completion.input_tokens == 100


def test_a_missing_model_in_the_envelope_falls_back_to_the_requested_one() -> None:
    envelope = openai_completion("{}")
    del envelope["model"]

    completion = provider_for(lambda _: httpx.Response(200, json=envelope)).complete(completion_request(model="m-1"))

    assert completion.model == "m-1"


# --- status classification ------------------------------------------------------------------------


def test_429_is_rate_limited_with_retry_after_in_seconds() -> None:
    error = failure_of(lambda _: httpx.Response(429, headers={"Retry-After": "17"}))

    assert isinstance(error, ProviderRateLimitedError)
    assert error.code is ErrorCode.PROVIDER_RATE_LIMITED
    assert error.retryable is True
    assert error.consumes_attempt is False
    assert error.retry_after_seconds == 17.0


def test_429_with_an_http_date_gives_the_seconds_until_then() -> None:
    when = datetime.now(UTC).replace(microsecond=0).timestamp() + 120
    header = format_datetime(datetime.fromtimestamp(when, tz=UTC), usegmt=True)

    error = failure_of(lambda _: httpx.Response(429, headers={"Retry-After": header}))

    assert isinstance(error, ProviderRateLimitedError)
    assert error.retry_after_seconds is not None
    assert 100 <= error.retry_after_seconds <= 120


def test_429_without_retry_after_leaves_the_delay_to_backoff() -> None:
    error = failure_of(lambda _: httpx.Response(429))

    assert isinstance(error, ProviderRateLimitedError)
    assert error.retry_after_seconds is None


def test_408_is_a_timeout() -> None:
    error = failure_of(lambda _: httpx.Response(408))

    assert isinstance(error, ProviderTimeoutError)
    assert error.code is ErrorCode.PROVIDER_TIMEOUT
    assert error.retryable is True


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.WriteTimeout("write timed out"),
        httpx.PoolTimeout("pool timed out"),
    ],
)
def test_a_timeout_exception_is_a_timeout(exc: Exception) -> None:
    error = failure_of(raising(exc))

    assert isinstance(error, ProviderTimeoutError)
    assert error.message == "no answer from the provider within 30s"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 529])
def test_5xx_is_unavailable(status: int) -> None:
    error = failure_of(lambda _: httpx.Response(status, json={"error": {"message": "overloaded"}}))

    assert isinstance(error, ProviderUnavailableError)
    assert error.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert error.retryable is True
    assert error.message == f"provider unavailable (HTTP {status})"


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("connection refused"),
        httpx.RemoteProtocolError("server disconnected"),
        httpx.ReadError("connection reset"),
    ],
)
def test_a_connection_failure_is_unavailable(exc: Exception) -> None:
    error = failure_of(raising(exc))

    assert isinstance(error, ProviderUnavailableError)
    assert error.message == f"provider connection failed: {type(exc).__name__}"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_client_error_is_rejected_for_good(status: int) -> None:
    error = failure_of(lambda _: httpx.Response(status, json={"error": {"message": "invalid model, do not retry"}}))

    assert isinstance(error, ProviderRejectedError)
    assert error.code is ErrorCode.PROVIDER_REJECTED
    assert error.retryable is False
    assert error.status_code == status
    # The provider's own text (which may quote the prompt) stays out of the message.
    assert error.message == f"provider rejected the request (HTTP {status})"


def test_a_refusal_names_the_providers_code_and_the_parameter_at_fault_but_never_its_message() -> None:
    error = {
        "message": "Invalid schema for 'classify': the prompt 'Win a free cruise' ...",
        "type": "invalid_request_error",
        "param": "response_format.json_schema",
        "code": "invalid_json_schema",
    }

    refused = failure_of(lambda _: httpx.Response(400, json={"error": error}))

    assert refused.message == (
        "provider rejected the request (HTTP 400 invalid_json_schema (param response_format.json_schema))"
    )


def test_identifiers_of_an_error_body_that_are_not_identifiers_are_left_out() -> None:
    error = {"type": "invalid request\nWin a free cruise", "code": "x" * 65, "param": "messages[0] content"}

    refused = failure_of(lambda _: httpx.Response(400, json={"error": error}))

    assert refused.message == "provider rejected the request (HTTP 400)"


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="<html>gateway</html>"),
        httpx.Response(200, json={}),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": ["text"]}),
        httpx.Response(200, json={"choices": [{"text": "legacy"}]}),
        httpx.Response(200, json=["not", "an", "object"]),
        httpx.Response(200, json=None),
    ],
)
def test_a_malformed_200_envelope_is_unavailable(response: httpx.Response) -> None:
    error = failure_of(lambda _: response)

    assert isinstance(error, ProviderUnavailableError)
    assert error.message == "provider answered with a malformed completion envelope"


@pytest.mark.parametrize(
    "envelope",
    [
        {"choices": [{"message": None}]},
        {"choices": [{"message": "text"}]},
        {"choices": [{"message": {"content": "{}"}}], "usage": "n/a"},
        {"choices": [{"message": {"content": "{}"}}], "usage": {"prompt_tokens": "many"}},
    ],
)
def test_a_malformed_message_or_usage_is_unavailable(envelope: dict[str, Any]) -> None:
    error = failure_of(lambda _: httpx.Response(200, json=envelope))

    assert isinstance(error, ProviderUnavailableError)


@pytest.mark.parametrize("tokens", [10**200, 100_000_001, -1])
def test_a_token_count_no_call_can_have_is_a_malformed_envelope(tokens: int) -> None:
    # DynamoDB holds 38 digits; 10**200 tokens would stop the finishing write, not be recorded.
    envelope = openai_completion("{}", prompt_tokens=tokens)

    assert isinstance(failure_of(lambda _: httpx.Response(200, json=envelope)), ProviderUnavailableError)


class StreamCounter(httpx.SyncByteStream):
    """A response body of `size` bytes, counting how much of it was read."""

    def __init__(self, size: int, chunk: int = 64 * 1024) -> None:
        self.size, self.chunk, self.read = size, chunk, 0

    def __iter__(self) -> Any:
        while self.read < self.size:
            step = min(self.chunk, self.size - self.read)
            self.read += step
            yield b" " * step


def test_a_response_body_past_the_bound_is_refused_unread() -> None:
    # Given a provider (or a proxy in front of it) that answers 16 MB
    body = StreamCounter(16 * 1024 * 1024)

    error = failure_of(lambda _: httpx.Response(200, stream=body))

    # Then the body is read no further than the bound, and the answer cannot be stored: for good
    assert isinstance(error, OutputTooLargeError)
    assert error.code is ErrorCode.OUTPUT_TOO_LARGE
    assert body.read <= MAX_RESPONSE_BYTES + body.chunk


def test_a_body_within_the_bound_is_read_whole() -> None:
    envelope = openai_completion('{"label": "spam", "confidence": 0.9}')
    padding = " " * (MAX_RESPONSE_BYTES - 2 * len(json.dumps(envelope)))
    text = json.dumps(envelope)[:-1] + padding + "}"

    completion = provider_for(lambda _: httpx.Response(200, text=text)).complete(completion_request())

    assert completion.content == '{"label": "spam", "confidence": 0.9}'


class RotatingKey:
    """A secret whose cached value is stale until refreshed."""

    def __init__(self, cached: str, current: str) -> None:
        self.cached, self.current, self.refreshes = cached, current, 0

    def __call__(self, *, refresh: bool = False) -> str:
        if refresh:
            self.refreshes += 1
            self.cached = self.current
        return self.cached


def by_key(valid: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {valid}":
            return httpx.Response(401, json={"error": {"message": "invalid key"}})
        return ok()(request)

    return handler


def test_a_401_refreshes_a_rotated_key_and_asks_once_more() -> None:
    # Given a key rotated in Secrets Manager while the worker still holds the old one
    key = RotatingKey(cached="sk-old", current="sk-new")
    recorder = Recorder(by_key("sk-new"))
    provider = OpenAICompatibleProvider(
        "http://llm.local/v1", key, client=httpx.Client(transport=httpx.MockTransport(recorder))
    )

    completion = provider.complete(completion_request())

    # Then the secret is read again once, the call repeated once with the new key, and it succeeds
    assert completion.content
    assert key.refreshes == 1
    assert [r.headers["authorization"] for r in recorder.requests] == ["Bearer sk-old", "Bearer sk-new"]


def test_a_401_with_a_key_that_did_not_change_is_rejected_without_asking_again() -> None:
    key = RotatingKey(cached="sk-bad", current="sk-bad")
    recorder = Recorder(by_key("sk-good"))
    provider = OpenAICompatibleProvider(
        "http://llm.local/v1", key, client=httpx.Client(transport=httpx.MockTransport(recorder))
    )

    with pytest.raises(ProviderRejectedError):
        provider.complete(completion_request())

    assert key.refreshes == 1
    assert len(recorder.requests) == 1


def test_a_401_after_the_refresh_is_rejected_after_exactly_two_calls() -> None:
    key = RotatingKey(cached="sk-old", current="sk-newer-but-wrong")
    recorder = Recorder(by_key("sk-right"))
    provider = OpenAICompatibleProvider(
        "http://llm.local/v1", key, client=httpx.Client(transport=httpx.MockTransport(recorder))
    )

    with pytest.raises(ProviderRejectedError) as caught:
        provider.complete(completion_request())

    assert caught.value.status_code == 401
    assert len(recorder.requests) == 2


# --- parse_retry_after ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("0", 0.0),
        ("5", 5.0),
        (" 12 ", 12.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=1_800_000_000.0) == expected


def test_parse_retry_after_reads_an_http_date_relative_to_now() -> None:
    now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC).timestamp()

    assert parse_retry_after("Wed, 02 Dec 2026 10:01:30 GMT", now=now) == 90.0


def test_parse_retry_after_reads_a_date_without_zone_as_utc() -> None:
    now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC).timestamp()

    assert parse_retry_after("Wed, 02 Dec 2026 10:00:10 -0000", now=now) == 10.0


@pytest.mark.parametrize("value", ["nan", "inf", "Infinity", "1e400"])
def test_parse_retry_after_rejects_non_finite_numbers(value: str) -> None:
    assert parse_retry_after(value, now=0.0) is None
