"""The wire between the engine and OpenAI, held to the official SDK's own types: every body the engine's
gateway posts is a request the SDK's `CompletionCreateParamsNonStreaming` takes as it is, and every
answer and object the local provider serves is one the SDK's response models take.
A body equal to its validated self (tests.support.openai_sdk) has no field the SDK does not know and
no value it had to coerce.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

from aijobs.local.provider import LocalProvider
from engine.definitions import BUILTIN_DEFINITIONS, JobDefinition
from engine.definitions.pipelines import PipelineDefinition
from engine.gateway import CallTier, ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, StructuredOutput, chat_completion_body, static_api_key
from tests.support.openai_sdk import sdk_request
from tests.support.providers import completion_request

# The built-ins that call a model (a pipeline's steps are these).
CALLING_DEFINITIONS = [
    definition for definition in BUILTIN_DEFINITIONS if not isinstance(definition, PipelineDefinition)
]

MODES: list[StructuredOutput] = ["json_schema", "json_object"]
# An input of each built-in job type whose first answer is wrong and whose re-ask is answered rightly
# (the local provider's `fault:repairable`): each job asks twice, the second time with a re-ask.
REPAIRABLE_INPUTS: dict[str, dict[str, Any]] = {
    "classify": {"text": "Win a free cruise now! fault:repairable", "labels": ["spam", "ham"]},
    "summarize": {"text": "SQS delivers messages at least once. fault:repairable", "max_words": 10},
    "answer_with_citations": {
        "question": "How long does SQS keep messages? fault:repairable",
        "documents": [{"id": "d1", "text": "Up to 14 days."}, {"id": "d2", "text": "1 MiB per message."}],
    },
    "extract": {
        "fields": [
            {"name": "total", "description": "the amount due", "type": "number"},
            {"name": "due", "description": "the date it is due", "type": "date"},
        ],
        "text": "Invoice 4711: EUR 120.50, due 2026-01-31. fault:repairable",
    },
}


def posted_bodies(
    server: LocalProvider,
    definition: JobDefinition,
    raw_input: dict[str, Any],
    mode: str,
    model: str = "local-model",
    tier: CallTier = CallTier.STANDARD,
) -> list[Any]:
    """The bodies the engine's gateway posts for one attempt of a job, through its OpenAI adapter."""
    bodies: list[Any] = []

    def keep(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    with httpx.Client(trust_env=False, event_hooks={"request": [keep]}) as client:
        adapter = OpenAICompatibleProvider(server.url, static_api_key(None), structured_output=mode, client=client)
        execution = ModelGateway(adapter, ModelTiers(model)).execute(
            definition, definition.parse_input(raw_input), tier=tier
        )
    assert execution.error is None, execution.error
    return bodies


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("definition", CALLING_DEFINITIONS, ids=lambda definition: definition.name)
def test_every_body_the_gateway_posts_is_a_request_the_sdk_takes_as_it_is(
    definition: JobDefinition, mode: StructuredOutput, server: LocalProvider
) -> None:
    # Given a job whose first answer is wrong, so that the attempt re-asks
    bodies = posted_bodies(server, definition, REPAIRABLE_INPUTS[definition.name], mode)

    # Then both requests (the first, and the re-ask with the rejected answer) are the SDK's, to the letter
    assert [len(body["messages"]) for body in bodies] == [2, 4]
    assert [message["role"] for message in bodies[1]["messages"]] == ["system", "user", "assistant", "user"]
    for body in bodies:
        assert sdk_request(body) == body
        assert body["response_format"]["type"] == mode
    assert [entry.status for entry in server.log] == [200, 200]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("definition", CALLING_DEFINITIONS, ids=lambda definition: definition.name)
def test_every_body_of_a_flex_attempt_is_a_request_the_sdk_takes_as_it_is(
    definition: JobDefinition, mode: StructuredOutput, server: LocalProvider
) -> None:
    # Given a background job's attempt at the flex tier of an OpenAI reasoning model, which re-asks
    bodies = posted_bodies(server, definition, REPAIRABLE_INPUTS[definition.name], mode, "gpt-5-mini", CallTier.FLEX)

    # Then both requests ask the flex tier, with the reasoning model's token limit, to the SDK's letter
    assert [(body["service_tier"], "max_completion_tokens" in body, "temperature" in body) for body in bodies] == [
        ("flex", True, False)
    ] * 2
    for body in bodies:
        assert sdk_request(body) == body
    assert [(entry.asked_tier, entry.service_tier) for entry in server.log] == [("flex", "flex")] * 2


@pytest.mark.parametrize("mode", MODES)
def test_a_body_with_a_prompt_cache_key_is_the_sdks_too(mode: StructuredOutput) -> None:
    body = chat_completion_body(completion_request(cache_key="classify:3"), mode)

    assert body["prompt_cache_key"] == "classify:3"
    assert sdk_request(body) == body


def test_a_job_types_name_is_sent_as_a_structured_output_name_openai_takes(
    server: LocalProvider, http: httpx.Client
) -> None:
    # Given a job type whose name OpenAI would refuse as a structured output's name
    request = completion_request(schema_name="billing.triage v2/" + "x" * 80)

    # When the engine builds its body
    body = chat_completion_body(request, "json_schema")

    # Then the name is OpenAI's pattern, and the provider answers it
    assert body["response_format"]["json_schema"]["name"] == "billing_triage_v2_" + "x" * 46
    response = http.post(f"{server.url}/chat/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_is_a_chat_completion_as_the_sdk_reads_one(
    mode: StructuredOutput, server: LocalProvider, http: httpx.Client
) -> None:
    body = chat_completion_body(completion_request(), mode)

    response = http.post(f"{server.url}/chat/completions", json=body)

    assert response.status_code == 200
    completion = ChatCompletion.model_validate(response.json())
    assert completion.choices[0].message.content is not None
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == server.log[0].prompt_tokens


def test_a_refusal_is_an_error_object_as_the_sdk_reads_one(server: LocalProvider, http: httpx.Client) -> None:
    body = chat_completion_body(completion_request(max_tokens=0), "json_schema")

    response = http.post(f"{server.url}/chat/completions", json=body)

    assert response.status_code == 400
    error = ErrorObject.model_validate(response.json()["error"])
    assert (error.type, error.param, error.code) == ("invalid_request_error", "max_tokens", "integer_below_min_value")


def test_files_and_batches_are_the_sdks_objects_at_every_step(server: LocalProvider, http: httpx.Client) -> None:
    # Given an input file of one line the engine would write
    body = chat_completion_body(completion_request(), "json_schema")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    files = {"file": ("in.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")}

    # When it is uploaded, batched, listed and read back
    uploaded = FileObject.model_validate(
        http.post(f"{server.url}/files", files=files, data={"purpose": "batch"}).json()
    )
    described = FileObject.model_validate(http.get(f"{server.url}/files/{uploaded.id}").json())
    request = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    created = Batch.model_validate(http.post(f"{server.url}/batches", json=request).json())
    ended = Batch.model_validate(http.get(f"{server.url}/batches/{created.id}").json())
    listed = [Batch.model_validate(item) for item in http.get(f"{server.url}/batches").json()["data"]]

    # Then each is the SDK's, and the batch's one answer is a chat completion
    assert (uploaded, described.id) == (described, uploaded.id)
    assert (created.status, ended.status, [batch.id for batch in listed]) == ("in_progress", "completed", [created.id])
    assert ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (1, 0)
    assert ended.output_file_id is not None
    output = FileObject.model_validate(http.get(f"{server.url}/files/{ended.output_file_id}").json())
    (answer,) = http.get(f"{server.url}/files/{output.id}/content").content.splitlines()
    ChatCompletion.model_validate(json.loads(answer)["response"]["body"])


def test_a_cancelled_batch_is_the_sdks_at_each_status(server: LocalProvider, http: httpx.Client) -> None:
    body = chat_completion_body(completion_request(), "json_schema")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    files = {"file": ("in.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")}
    server.batch_fault = "stall"
    file_id = http.post(f"{server.url}/files", files=files, data={"purpose": "batch"}).json()["id"]
    request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    created = Batch.model_validate(http.post(f"{server.url}/batches", json=request).json())

    cancelling = Batch.model_validate(http.post(f"{server.url}/batches/{created.id}/cancel").json())
    cancelled = Batch.model_validate(http.get(f"{server.url}/batches/{created.id}").json())

    assert (cancelling.status, cancelled.status) == ("cancelling", "cancelled")
