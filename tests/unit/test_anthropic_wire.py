"""The wire between the engine and Anthropic, held to the official SDK's own types: every body the
engine's Anthropic adapter posts (a real-time request, a batch's requests) is one the SDK's
`MessageCreateParamsNonStreaming` and batch `Request` take as they are, and every answer and object the
local provider's Anthropic API serves is one the SDK's response models take.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from anthropic.types.shared import ErrorResponse

from aijobs.local.provider import LocalProvider
from engine.core.attachments import MediaType
from engine.definitions import JobDefinition
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.anthropic import AnthropicProvider, message_body
from engine.gateway.anthropic_batch import AnthropicBatchProvider
from engine.gateway.batches import BatchLine
from engine.gateway.openai import static_api_key
from tests.support.anthropic_sdk import sdk_batch, sdk_batch_request, sdk_request
from tests.support.attachment_files import image, pdf
from tests.support.providers import completion_request
from tests.unit.test_attachment_wire import attached
from tests.unit.test_openai_wire import CALLING_DEFINITIONS, REPAIRABLE_INPUTS

# A model Anthropic does not list for its JSON output format: by default it answers through a forced tool.
MODEL = "claude-opus-4-1"
# Forced tool (the model is not given the JSON output format), and the JSON output format (it is).
JSON_OUTPUT: list[tuple[str, ...]] = [(), (MODEL,)]


def posted_bodies(
    server: LocalProvider, definition: JobDefinition, raw_input: dict[str, Any], json_output: tuple[str, ...]
) -> list[Any]:
    """The bodies the engine's gateway posts for one attempt of a job, through its Anthropic adapter."""
    bodies: list[Any] = []

    def keep(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    with httpx.Client(trust_env=False, event_hooks={"request": [keep]}) as client:
        adapter = AnthropicProvider(
            server.anthropic_url, static_api_key(None), json_output_models=json_output, client=client
        )
        execution = ModelGateway(adapter, ModelTiers(MODEL)).execute(definition, definition.parse_input(raw_input))
    assert execution.error is None, execution.error
    return bodies


@pytest.mark.parametrize("json_output", JSON_OUTPUT, ids=["tool", "json_output"])
@pytest.mark.parametrize("definition", CALLING_DEFINITIONS, ids=lambda definition: definition.name)
def test_every_body_the_gateway_posts_is_a_request_the_sdk_takes_as_it_is(
    definition: JobDefinition, json_output: tuple[str, ...], server: LocalProvider
) -> None:
    # Given a job whose first answer is wrong, so that the attempt re-asks
    bodies = posted_bodies(server, definition, REPAIRABLE_INPUTS[definition.name], json_output)

    # Then both requests (the first, and the re-ask with the rejected answer) are the SDK's, to the letter
    assert [[message["role"] for message in body["messages"]] for body in bodies] == [
        ["user"],
        ["user", "assistant", "user"],
    ]
    for body in bodies:
        assert sdk_request(body) == body
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert ("output_config" in body) is bool(json_output)
        assert ("tool_choice" in body) is not bool(json_output)


def test_attachments_go_as_image_document_and_text_blocks_the_sdk_takes() -> None:
    # Given a request carrying an image, a PDF and a text file
    attachments = (
        attached("photo.png", image(MediaType.PNG)),
        attached("invoice.pdf", pdf(1, "Invoice 4711")),
        attached("notes.txt", b"plain notes"),
    )
    body = message_body(completion_request(MODEL, attachments=attachments), json_output=False)

    # Then the user turn is the prompt's text, then the blocks, each as the SDK types them
    assert sdk_request(body) == body
    blocks = body["messages"][0]["content"]
    assert [block["type"] for block in blocks] == ["text", "image", "document", "text"]
    assert blocks[1]["source"]["media_type"] == "image/png"
    assert blocks[2]["source"] == {
        "type": "base64",
        "media_type": "application/pdf",
        "data": blocks[2]["source"]["data"],
    }
    assert blocks[2]["title"] == "invoice.pdf"
    assert "plain notes" in blocks[3]["text"]


def test_a_batch_s_body_and_each_of_its_requests_are_the_sdk_s(server: LocalProvider) -> None:
    # Given a batch of three requests submitted through the adapter
    bodies: list[Any] = []

    def keep(request: httpx.Request) -> None:
        if request.method == "POST":
            bodies.append(json.loads(request.content))

    lines = [BatchLine(f"j{index:010d}", completion_request(MODEL)) for index in range(3)]
    with httpx.Client(trust_env=False, event_hooks={"request": [keep]}) as client:
        adapter = AnthropicBatchProvider(server.anthropic_url, static_api_key(None), client=client)
        adapter.submit(lines, {"aijobs_batch": "w.1"})

    # Then the body, and each request in it, are what the SDK's types take as they are
    (body,) = bodies
    assert sdk_batch(body) == body
    for request in body["requests"]:
        assert sdk_batch_request(request) == request
        assert request["params"] == message_body(completion_request(MODEL), json_output=False)


def test_what_the_local_anthropic_api_answers_is_the_sdk_s(server: LocalProvider, http: httpx.Client) -> None:
    headers = {"x-api-key": "any", "anthropic-version": "2023-06-01"}
    body = message_body(completion_request(MODEL), json_output=False)

    # A message
    answered = http.post(f"{server.anthropic_url}/v1/messages", json=body, headers=headers)
    assert answered.status_code == 200
    Message.model_validate(answered.json())

    # An error
    refused = http.post(f"{server.anthropic_url}/v1/messages", json={**body, "max_tokens": 0}, headers=headers)
    assert refused.status_code == 400
    assert ErrorResponse.model_validate(refused.json()).error.type == "invalid_request_error"

    # A batch, and its results once it has ended (the server answers batches at once)
    requests = [{"custom_id": "a-1", "params": body}, {"custom_id": "a-2", "params": {**body, "max_tokens": 0}}]
    created = http.post(f"{server.anthropic_url}/v1/messages/batches", json={"requests": requests}, headers=headers)
    batch = MessageBatch.model_validate(created.json())
    ended = MessageBatch.model_validate(
        http.get(f"{server.anthropic_url}/v1/messages/batches/{batch.id}", headers=headers).json()
    )
    assert ended.processing_status == "ended"
    assert ended.results_url is not None
    lines = http.get(ended.results_url, headers=headers).text.splitlines()
    results = [MessageBatchIndividualResponse.model_validate_json(line) for line in lines]
    assert [result.result.type for result in results] == ["succeeded", "errored"]
    listed = http.get(f"{server.anthropic_url}/v1/messages/batches", headers=headers).json()
    assert [MessageBatch.model_validate(item).id for item in listed["data"]] == [batch.id]
