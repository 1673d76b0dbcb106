"""The local provider's Anthropic Messages API (aijobs.local.messages): what it answers, what it bills
(cache reads and writes apart), the faults it serves in Anthropic's shapes, and what it refuses as
Anthropic refuses it; each refusal is also a body the SDK's request types refuse or one only
Anthropic's side checks (marked so)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from anthropic.types.shared import ErrorResponse

from aijobs.local.provider import LocalProvider
from engine.core.attachments import MediaType
from engine.core.errors import JobError, ProviderRateLimitedError, ProviderRejectedError, ProviderUnavailableError
from engine.gateway.anthropic import AnthropicProvider, message_body
from engine.gateway.attachment_tokens import attachment_tokens, image_tokens
from engine.gateway.openai import static_api_key
from tests.support.anthropic_sdk import sdk_request, sdk_takes
from tests.support.attachment_files import image, pdf
from tests.support.providers import CLASSIFY_SCHEMA, completion_request
from tests.unit.test_attachment_wire import attached

MODEL = "claude-haiku-4-5"
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


@pytest.fixture
def keyed() -> Any:
    with LocalProvider(api_key="k", latency_seconds=0, batch_delay_seconds=0) as provider:
        yield provider


def body(**overrides: Any) -> dict[str, Any]:
    return message_body(completion_request(**{"model": MODEL, **overrides}), json_output=False)


def post(server: LocalProvider, http: httpx.Client, sent: object, headers: dict[str, str] = HEADERS) -> httpx.Response:
    return http.post(f"{server.anthropic_url}/v1/messages", content=json.dumps(sent), headers=headers)


def adapter(server: LocalProvider, **kwargs: Any) -> AnthropicProvider:
    return AnthropicProvider(server.anthropic_url, static_api_key("k"), **kwargs)


# --- answers and usage -------------------------------------------------------------------------


# Claude Haiku 4.5 answers in the JSON output format; Claude Opus 4.1 (not listed for it) through a tool.
@pytest.mark.parametrize(
    ("model", "finish"), [("claude-opus-4-1", "tool_use"), (MODEL, "end_turn")], ids=["tool", "json_output"]
)
def test_the_answer_meets_the_schema_sent_as_a_tool_or_as_the_output_format(
    keyed: LocalProvider, model: str, finish: str
) -> None:
    completion = adapter(keyed).complete(completion_request(model))
    answer = json.loads(completion.content)
    assert set(answer) == set(CLASSIFY_SCHEMA["required"])
    assert 0 <= answer["confidence"] <= 1
    assert completion.finish_reason == finish


def test_a_repeated_cached_prefix_is_written_once_then_read_and_the_log_bills_both(keyed: LocalProvider) -> None:
    # Given two requests of one job type (same tool and system, marked for the cache)
    provider = adapter(keyed)
    first = provider.complete(completion_request(MODEL, user="Text: one"))
    second = provider.complete(completion_request(MODEL, user="Text: two"))

    # Then the first wrote the prefix to the cache, the second read it; both count it in their input
    assert (first.cache_write_input_tokens, first.cached_input_tokens) == (second.cached_input_tokens, 0)
    assert second.cache_write_input_tokens == 0
    assert 0 < second.cached_input_tokens < second.input_tokens
    log = keyed.log
    assert [(entry.api, entry.prompt_tokens, entry.cached_tokens, entry.cache_write_tokens) for entry in log] == [
        ("anthropic", first.input_tokens, 0, first.cache_write_input_tokens),
        ("anthropic", second.input_tokens, second.cached_input_tokens, 0),
    ]
    assert [entry.completion_tokens for entry in log] == [first.output_tokens, second.output_tokens]


def test_an_image_and_a_pdf_are_billed_as_anthropic_bills_them(keyed: LocalProvider) -> None:
    plain = adapter(keyed).complete(completion_request(MODEL))
    photo = attached("photo.png", image(MediaType.PNG, 1000, 750))
    with_image = adapter(keyed).complete(completion_request(MODEL, attachments=(photo,)))
    assert with_image.input_tokens - plain.input_tokens == image_tokens("anthropic", MODEL, 1000, 750) == 1000
    # And the engine's estimate, which budgets reserve, is never below what was billed
    invoice = attached("invoice.pdf", pdf(3, "Invoice 4711 " * 40))
    with_pdf = adapter(keyed).complete(completion_request(MODEL, attachments=(invoice,)))
    assert with_pdf.input_tokens - plain.input_tokens <= attachment_tokens("anthropic", MODEL, [invoice])
    assert with_image.input_tokens - plain.input_tokens <= attachment_tokens("anthropic", MODEL, [photo])
    invoice = attached("invoice.pdf", pdf(2, "fault:unavailable"))
    with pytest.raises(ProviderUnavailableError):
        adapter(keyed).complete(completion_request(MODEL, attachments=(invoice,)))


# --- faults ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("marker", "status", "error_type", "expected"),
    [
        ("fault:rate_limited", 429, "rate_limit_error", ProviderRateLimitedError),
        ("fault:unavailable", 529, "overloaded_error", ProviderUnavailableError),
        ("fault:server_error", 500, "api_error", ProviderUnavailableError),
    ],
)
def test_faults_are_served_in_anthropic_s_shapes(
    keyed: LocalProvider, http: httpx.Client, marker: str, status: int, error_type: str, expected: type[JobError]
) -> None:
    answered = post(keyed, http, body(user=f"Text: {marker}"))
    assert answered.status_code == status
    assert ErrorResponse.model_validate(answered.json()).error.type == error_type
    if status == 429:
        assert answered.headers["retry-after"] == "1"
    with pytest.raises(expected):
        adapter(keyed).complete(completion_request(MODEL, user=f"Text: {marker}"))
    assert {entry.prompt_tokens for entry in keyed.log} == {0}


def test_a_repairable_answer_is_mended_by_the_re_ask(keyed: LocalProvider) -> None:
    from engine.definitions.classify import CLASSIFY
    from engine.gateway import ModelGateway, ModelTiers

    job_input = CLASSIFY.parse_input({"text": "Win fault:repairable", "labels": ["spam", "ham"]})
    execution = ModelGateway(adapter(keyed), ModelTiers(MODEL)).execute(CLASSIFY, job_input)
    assert execution.error is None
    assert (execution.calls, [entry.repair for entry in keyed.log]) == (2, [False, True])


# --- credentials and refusals ----------------------------------------------------------------------


def test_the_key_goes_in_x_api_key_and_the_version_is_required(keyed: LocalProvider, http: httpx.Client) -> None:
    assert post(keyed, http, body(), {"anthropic-version": "2023-06-01", "x-api-key": "wrong"}).status_code == 401
    assert (
        post(keyed, http, body(), {"anthropic-version": "2023-06-01", "authorization": "Bearer k"}).status_code == 401
    )
    missing = post(keyed, http, body(), {"x-api-key": "k"})
    assert (missing.status_code, missing.json()["error"]["type"]) == (400, "invalid_request_error")
    assert post(keyed, http, body()).status_code == 200


def _without(field: str) -> Callable[[dict[str, Any]], None]:
    return lambda sent: sent.pop(field)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(sent: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = sent
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


PNG = base64.b64encode(image(MediaType.PNG)).decode()
JPEG = base64.b64encode(image(MediaType.JPEG)).decode()
# (what is changed in the engine's body, whether the SDK's types refuse it too)
REFUSED: list[tuple[str, Callable[[dict[str, Any]], None], bool]] = [
    ("no model", _without("model"), True),
    ("no max_tokens", _without("max_tokens"), True),
    ("no messages", _without("messages"), True),
    ("an unknown field", _set("temperature_x", 1), True),
    ("max_tokens of 0", _set("max_tokens", 0), False),  # Anthropic's side checks the range
    ("empty messages", _set("messages", []), False),
    ("a role of no kind", _set("messages.0.role", "tool"), True),
    ("an empty text", _set("messages.0.content.0.text", ""), False),
    ("an unknown block", _set("messages.0.content.0", {"type": "video", "data": "x"}), True),
    (
        "a tool_use from the user",
        _set("messages.0.content.0", {"type": "tool_use", "id": "t", "name": "n", "input": {}}),
        False,
    ),
    (
        "an image by URL",
        _set("messages.0.content.0", {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}),
        False,
    ),
    (
        "an image that is not its media type",
        _set(
            "messages.0.content.0",
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": JPEG}},
        ),
        False,
    ),
    (
        "an image of a type it does not take",
        _set(
            "messages.0.content.0",
            {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}},
        ),
        True,
    ),
    (
        "base64 that is not",
        _set(
            "messages.0.content.0",
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}},
        ),
        False,
    ),
    ("a tool name it refuses", _set("tools.0.name", "a tool"), False),
    ("an input schema not an object", _set("tools.0.input_schema", {"type": "string"}), False),
    ("a tool_choice naming no tool", _set("tool_choice.name", "other"), False),
    ("a tool_choice of no known type", _set("tool_choice.type", "required"), True),
    ("a cache_control not ephemeral", _set("system.0.cache_control", {"type": "persistent"}), True),
    ("an output format that is no schema", _set("output_config", {"format": {"type": "json_object"}}), True),
    ("streaming", _set("stream", True), True),
]


@pytest.mark.parametrize(
    ("change", "sdk_refuses"),
    [(change, refuses) for _, change, refuses in REFUSED],
    ids=[name for name, _, _ in REFUSED],
)
def test_a_request_anthropic_refuses_is_a_400_in_its_shape_billed_nothing(
    keyed: LocalProvider, http: httpx.Client, change: Callable[[dict[str, Any]], None], sdk_refuses: bool
) -> None:
    # Given the engine's own body, changed in one place
    sent = copy.deepcopy(body())
    change(sent)

    # When it is posted
    refused = post(keyed, http, sent)

    # Then it is refused as Anthropic refuses it, and billed nothing
    assert refused.status_code == 400
    assert ErrorResponse.model_validate(refused.json()).error.type == "invalid_request_error"
    assert [(entry.status, entry.prompt_tokens) for entry in keyed.log] == [(400, 0)]
    # And the SDK's types agree where they can tell (refusing it, or dropping a field they do not know)
    assert (not sdk_takes(sent) or sdk_request(sent) != sent) is sdk_refuses


def test_a_refusal_is_rejected_for_good_by_the_engine(keyed: LocalProvider) -> None:
    with pytest.raises(ProviderRejectedError):
        adapter(keyed).complete(completion_request(MODEL, max_tokens=0))


def test_a_body_that_is_not_json_is_a_400(keyed: LocalProvider, http: httpx.Client) -> None:
    refused = http.post(f"{keyed.anthropic_url}/v1/messages", content=b"{", headers=HEADERS)
    assert refused.status_code == 400
    ErrorResponse.model_validate(refused.json())


def test_a_model_it_does_not_serve_is_not_found(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, models=["claude-haiku-4-5"]) as server:
        missing = post(server, http, body(model="claude-opus-4-6"))
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "not_found_error")


def test_a_lone_surrogate_is_refused_in_a_request_and_in_a_batch_s_request(
    keyed: LocalProvider, http: httpx.Client
) -> None:
    # Given the engine's body with a lone surrogate in its prompt (json.dumps writes it as its escape)
    sent = body(user="Text: \ud800")

    # Then a request is refused with a 400, and a batch's request errs with the same error
    refused = post(keyed, http, sent)
    assert (refused.status_code, refused.json()["error"]["type"]) == (400, "invalid_request_error")
    requests = {"requests": [{"custom_id": "a-1", "params": sent}]}
    created = http.post(f"{keyed.anthropic_url}/v1/messages/batches", content=json.dumps(requests), headers=HEADERS)
    results = http.get(f"{keyed.anthropic_url}/v1/messages/batches/{created.json()['id']}/results", headers=HEADERS)
    assert json.loads(results.text)["result"]["error"]["error"]["type"] == "invalid_request_error"


def test_a_body_of_a_mebibyte_is_answered(keyed: LocalProvider, http: httpx.Client) -> None:
    answered = post(keyed, http, body(user="Text: " + "word " * 210_000))
    assert answered.status_code == 200
    assert keyed.log[-1].prompt_tokens > 250_000
