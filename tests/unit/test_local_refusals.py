"""The local provider refuses what OpenAI refuses (aijobs.local.refusals), and only that.

Each refusal is a 400 `invalid_request_error` in OpenAI's error shape, naming the parameter at fault,
billed nothing; a batch line that would be refused is a 400 in the batch's error file; the engine's
gateway takes a refusal as `provider_rejected`, for good. Each refusal is held to the official SDK's
request types where they can say it (a missing field, a type, a literal), and each accepted oddity is
one the SDK takes: what OpenAI checks only on its side (an empty array, a number's range, a URL's
scheme) is marked so.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aijobs.local.provider import LocalProvider
from aijobs.local.refusals import PART_TYPES
from aijobs.local.samples import INVOICE, PRODUCT_PHOTO, sample
from engine.core import ErrorCode
from engine.core.errors import PermanentError, ProviderRejectedError, RetryableError
from engine.definitions.classify import CLASSIFY
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, chat_completion_body, static_api_key
from tests.support.openai_sdk import sdk_takes
from tests.support.providers import completion_request

COMPLETIONS = "/v1/chat/completions"
ERROR_KEYS = {"message", "type", "param", "code"}


def engine_body() -> dict[str, Any]:
    """A body the engine posts (classify, json_schema): every case below is one change to it."""
    return chat_completion_body(completion_request(), "json_schema")


def changed(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    body = engine_body()
    change(body)
    return body


def with_user_content(content: object) -> dict[str, Any]:
    return changed(lambda body: body["messages"][1].update(content=content))


def with_message(message: object) -> dict[str, Any]:
    return changed(lambda body: body["messages"].append(message))


def with_format(response_format: object) -> dict[str, Any]:
    return changed(lambda body: body.update(response_format=response_format))


def without(*path: str | int) -> dict[str, Any]:
    def drop(body: dict[str, Any]) -> None:
        holder: Any = body
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]

    return changed(drop)


@dataclass(frozen=True)
class Refusal:
    name: str
    body: object
    param: str | None
    code: str | None
    # False where the SDK's types cannot say the rule and only OpenAI's validation refuses it.
    sdk_refuses: bool = True


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def data_url(mime: str, name: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(sample(name)).decode()}"


REFUSALS = [
    Refusal("the body is an array", [engine_body()], None, None),
    Refusal("no model", without("model"), None, None),
    Refusal("an empty model", changed(lambda body: body.update(model="")), None, None, sdk_refuses=False),
    Refusal("a model that is a number", changed(lambda body: body.update(model=4)), "model", "invalid_type"),
    Refusal("no messages", without("messages"), "messages", "missing_required_parameter"),
    Refusal("no message", changed(lambda body: body.update(messages=[])), "messages", "empty_array", False),
    Refusal("messages as a string", changed(lambda body: body.update(messages="hi")), "messages", "invalid_type"),
    Refusal("a message that is a string", with_message("hi"), "messages[2]", "invalid_type"),
    Refusal(
        "a message without a role", with_message({"content": "hi"}), "messages[2].role", "missing_required_parameter"
    ),
    Refusal("an unknown role", with_message({"role": "bot", "content": "hi"}), "messages[2].role", "invalid_value"),
    Refusal(
        "a user message without content",
        without("messages", 1, "content"),
        "messages[1].content",
        "missing_required_parameter",
    ),
    Refusal("a user message of null content", with_user_content(None), "messages[1].content", None),
    Refusal(
        "a system message of null content",
        changed(lambda body: body["messages"][0].update(content=None)),
        "messages[0].content",
        None,
    ),
    Refusal(
        "an assistant message of null content and no tool calls",
        with_message({"role": "assistant", "content": None}),
        "messages[2].content",
        None,
        sdk_refuses=False,
    ),
    Refusal(
        "content that is an object",
        with_user_content({"type": "text", "text": "hi"}),
        "messages[1].content",
        "invalid_type",
    ),
    Refusal("content of no part", with_user_content([]), "messages[1].content", "empty_array", sdk_refuses=False),
    Refusal(
        "a part of an unknown type",
        with_user_content([{"type": "image", "url": "x"}]),
        "messages[1].content[0].type",
        "invalid_value",
    ),
    Refusal(
        "a part without a type",
        with_user_content([{"text": "hi"}]),
        "messages[1].content[0].type",
        "missing_required_parameter",
    ),
    Refusal(
        "an image in a system message",
        changed(lambda body: body["messages"][0].update(content=[IMAGE])),
        "messages[0].content[0].type",
        "invalid_value",
    ),
    Refusal(
        "a text part without text",
        with_user_content([{"type": "text"}]),
        "messages[1].content[0].text",
        "missing_required_parameter",
    ),
    Refusal(
        "a text part of a number",
        with_user_content([{"type": "text", "text": 7}]),
        "messages[1].content[0].text",
        "invalid_type",
    ),
    Refusal(
        "an image part without a URL",
        with_user_content([{"type": "image_url", "image_url": {}}]),
        "messages[1].content[0].image_url.url",
        "missing_required_parameter",
    ),
    Refusal(
        "an image part whose URL is neither http(s) nor data",
        with_user_content([{"type": "image_url", "image_url": {"url": "ftp://example.com/cat.png"}}]),
        "messages[1].content[0].image_url.url",
        "invalid_value",
        sdk_refuses=False,
    ),
    Refusal(
        "an image part of an unknown detail",
        with_user_content([{"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "max"}}]),
        "messages[1].content[0].image_url.detail",
        "invalid_value",
    ),
    Refusal(
        "an audio part of an unknown format",
        with_user_content([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}]),
        "messages[1].content[0].input_audio.format",
        "invalid_value",
    ),
    Refusal(
        "a file part with neither data nor an id",
        with_user_content([{"type": "file", "file": {"filename": "a.pdf"}}]),
        "messages[1].content[0].file",
        "missing_required_parameter",
        sdk_refuses=False,
    ),
    Refusal(
        "a file part of data without its name",
        with_user_content([{"type": "file", "file": {"file_data": data_url("application/pdf", INVOICE)}}]),
        "messages[1].content[0].file.file_id",
        "missing_required_parameter",
        sdk_refuses=False,
    ),
    Refusal(
        "a tool message that answers no call",
        with_message({"role": "tool", "content": "42"}),
        "messages[2].tool_call_id",
        "missing_required_parameter",
    ),
    Refusal(
        "a response format of an unknown type", with_format({"type": "xml"}), "response_format.type", "invalid_value"
    ),
    Refusal("a response format without a type", with_format({}), "response_format.type", "missing_required_parameter"),
    Refusal(
        "a json_schema format without its json_schema",
        with_format({"type": "json_schema"}),
        "response_format.json_schema",
        "missing_required_parameter",
    ),
    Refusal(
        "a json_schema without a name",
        without("response_format", "json_schema", "name"),
        "response_format.json_schema.name",
        "missing_required_parameter",
    ),
    Refusal(
        "a json_schema whose name OpenAI's pattern refuses",
        changed(lambda body: body["response_format"]["json_schema"].update(name="my.type")),
        "response_format.json_schema.name",
        "invalid_value",
        sdk_refuses=False,
    ),
    Refusal(
        "a json_schema whose schema is not an object",
        changed(lambda body: body["response_format"]["json_schema"].update(schema="{}")),
        "response_format.json_schema.schema",
        "invalid_type",
    ),
    Refusal(
        "json_object output asked of messages that never say json",
        changed(lambda body: body.update(response_format={"type": "json_object"})),
        "messages",
        None,
        sdk_refuses=False,
    ),
    Refusal(
        "max_tokens of 0",
        changed(lambda body: body.update(max_tokens=0)),
        "max_tokens",
        "integer_below_min_value",
        False,
    ),
    Refusal(
        "max_tokens as a string", changed(lambda body: body.update(max_tokens="256")), "max_tokens", "invalid_type"
    ),
    Refusal(
        "max_tokens as a boolean", changed(lambda body: body.update(max_tokens=True)), "max_tokens", "invalid_type"
    ),
    Refusal(
        "max_completion_tokens below 1",
        changed(lambda body: body.update(max_completion_tokens=-5)),
        "max_completion_tokens",
        "integer_below_min_value",
        sdk_refuses=False,
    ),
    Refusal(
        "a temperature above 2",
        changed(lambda body: body.update(temperature=2.5)),
        "temperature",
        "decimal_above_max_value",
        sdk_refuses=False,
    ),
    Refusal(
        "a service tier of none of OpenAI's",
        changed(lambda body: body.update(service_tier="cheap")),
        "service_tier",
        "invalid_value",
    ),
    Refusal(
        "a service tier that is a number",
        changed(lambda body: body.update(service_tier=1)),
        "service_tier",
        "invalid_value",
    ),
]

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
# What OpenAI takes, odd as it looks: each is answered.
ACCEPTED = {
    "an assistant turn of tool calls and null content, and the tool's answer": changed(
        lambda body: body["messages"].extend(
            [
                {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ]
        )
    ),
    "a part of every type a user message takes": with_user_content(
        [
            {"type": "text", "text": "Text: win a cruise"},
            {"type": "image_url", "image_url": {"url": data_url("image/jpeg", PRODUCT_PHOTO), "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"filename": "a.pdf", "file_data": data_url("application/pdf", INVOICE)}},
        ]
    ),
    "a developer message instead of a system one": changed(lambda body: body["messages"][0].update(role="developer")),
    "an assistant message of a refusal part": with_message(
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}
    ),
    "an empty user message": with_user_content(""),
    "a json_schema without a schema": without("response_format", "json_schema", "schema"),
    "text output": with_format({"type": "text"}),
    "null max_tokens and temperature": changed(lambda body: body.update(max_tokens=None, temperature=None)),
    "a field OpenAI-compatible servers add (vLLM's top_k)": changed(lambda body: body.update(top_k=5)),
    "the flex tier": changed(lambda body: body.update(service_tier="flex")),
    "the project's tier, said as auto": changed(lambda body: body.update(service_tier="auto")),
}


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda refusal: refusal.name)
def test_a_request_openai_refuses_is_a_400_naming_the_parameter_at_fault(
    refusal: Refusal, server: LocalProvider, http: httpx.Client
) -> None:
    response = http.post(f"{server.url}/chat/completions", json=refusal.body)

    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    error = body["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", refusal.param, refusal.code)
    assert isinstance(error["message"], str)
    assert "\n" not in error["message"]
    assert [(entry.status, entry.prompt_tokens, entry.completion_tokens) for entry in server.log] == [(400, 0, 0)]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda refusal: refusal.name)
def test_each_refusal_is_one_the_sdks_types_make_unless_only_openais_side_checks_it(refusal: Refusal) -> None:
    assert sdk_takes(refusal.body) is not refusal.sdk_refuses


@pytest.mark.parametrize("body", ACCEPTED.values(), ids=list(ACCEPTED))
def test_what_openai_takes_is_answered(body: dict[str, Any], server: LocalProvider, http: httpx.Client) -> None:
    assert sdk_takes(body)

    response = http.post(f"{server.url}/chat/completions", json=body)

    assert response.status_code == 200, response.text
    assert [entry.status for entry in server.log] == [200]


def test_a_body_that_is_not_json_is_refused_as_openai_refuses_it(server: LocalProvider, http: httpx.Client) -> None:
    response = http.post(f"{server.url}/chat/completions", content=b'{"model": "m",')

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["message"].startswith("We could not parse the JSON body of your request")


def test_a_refused_request_is_provider_rejected_for_good_after_one_call(
    server: LocalProvider, http: httpx.Client
) -> None:
    # Given a job type whose max_tokens OpenAI would refuse, and a fallback model the gateway could try
    definition = replace(CLASSIFY, name="no_room", max_tokens=0)
    adapter = OpenAICompatibleProvider(server.url, static_api_key(None), client=http)
    gateway = ModelGateway(adapter, ModelTiers("local-model", fallback="local-fallback"))

    # When an attempt runs
    execution = gateway.execute(definition, definition.parse_input({"text": "hi", "labels": ["a", "b"]}))

    # Then the provider's 400 is provider_rejected: permanent, not re-asked, not fallen back from
    error = execution.error
    assert isinstance(error, ProviderRejectedError)
    assert isinstance(error, PermanentError)
    assert not isinstance(error, RetryableError)
    assert (error.code, error.retryable, error.status_code) == (ErrorCode.PROVIDER_REJECTED, False, 400)
    assert execution.calls == 1
    assert [entry.status for entry in server.log] == [400]


def test_a_batch_line_openai_would_refuse_is_a_400_in_the_error_file(server: LocalProvider, http: httpx.Client) -> None:
    # Given an input file of a good line and one whose user message has no content
    good = {"custom_id": "good", "method": "POST", "url": COMPLETIONS, "body": engine_body()}
    bad = {"custom_id": "bad", "method": "POST", "url": COMPLETIONS, "body": with_user_content(None)}
    content = b"".join(json.dumps(line).encode() + b"\n" for line in (good, bad))
    file_id = http.post(f"{server.url}/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}).json()[
        "id"
    ]

    # When the batch runs
    request = {"input_file_id": file_id, "endpoint": COMPLETIONS, "completion_window": "24h"}
    batch_id = http.post(f"{server.url}/batches", json=request).json()["id"]
    batch = http.get(f"{server.url}/batches/{batch_id}").json()

    # Then the batch completes, the good line answered and the bad one refused in the error file
    assert (batch["status"], batch["request_counts"]) == ("completed", {"total": 2, "completed": 1, "failed": 1})
    (refused,) = [
        json.loads(raw) for raw in http.get(f"{server.url}/files/{batch['error_file_id']}/content").content.splitlines()
    ]
    assert (refused["custom_id"], refused["error"], refused["response"]["status_code"]) == ("bad", None, 400)
    error = refused["response"]["body"]["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "messages[1].content", None)
    assert [(entry.batch_id, entry.status) for entry in server.log] == [(batch_id, 200), (batch_id, 400)]


# --- no body crashes it ---------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
PART_TYPE_NAMES = sorted({kind for kinds in PART_TYPES.values() for kind in kinds})
# A message of the right keys, each holding anything (a known role or part type, often).
MESSAGES = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from([*PART_TYPES, "bot"]) | JSON_VALUES,
        "content": st.text(max_size=20)
        | st.lists(st.fixed_dictionaries({"type": st.sampled_from(PART_TYPE_NAMES)}) | JSON_VALUES, max_size=3)
        | JSON_VALUES,
        "tool_calls": st.lists(JSON_VALUES, max_size=2) | JSON_VALUES,
        "tool_call_id": JSON_VALUES,
    },
)
# Bodies OpenAI takes, to break: the engine's in both modes and the odd ones above.
VALID_BODIES = [engine_body(), chat_completion_body(completion_request(), "json_object"), *ACCEPTED.values()]


def paths(value: object, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """The path of every value within `value`, but its own."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield (*prefix, key)
        yield from paths(item, (*prefix, key))


@st.composite
def broken_bodies(draw: st.DrawFn) -> object:
    """A body OpenAI takes, with one to three of its values deleted, replaced by anything, or given a
    message of anything beside them; now and then, any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON_VALUES)
    body: Any = copy.deepcopy(draw(st.sampled_from(VALID_BODIES)))
    for _ in range(draw(st.integers(1, 3))):
        where = list(paths(body))
        if not where:
            return body
        *path, last = draw(st.sampled_from(where))
        holder = body
        for key in path:
            holder = holder[key]
        action = draw(st.sampled_from(["delete", "replace", "add a message"]))
        if action == "delete":
            del holder[last]
        elif action == "replace":
            holder[last] = draw(MESSAGES | JSON_VALUES)
        elif isinstance(body.get("messages"), list):
            body["messages"].insert(draw(st.integers(0, len(body["messages"]))), draw(MESSAGES))
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=broken_bodies())
def test_no_body_crashes_the_provider_it_is_answered_or_refused_as_openai_would(body: object) -> None:
    provider = LocalProvider(latency_seconds=0)

    reply = provider.respond("POST", COMPLETIONS, None, json.dumps(body).encode())

    assert reply.status in (200, 400)
    assert reply.body is not None
    json.dumps(reply.body, allow_nan=False)  # what the handler sends, as strict JSON
    if reply.status == 400:
        assert set(reply.body) == {"error"}
        assert set(reply.body["error"]) == ERROR_KEYS
        assert reply.body["error"]["type"] == "invalid_request_error"
    else:
        assert reply.body["object"] == "chat.completion"
    assert [entry.status for entry in provider.log] == [reply.status]
