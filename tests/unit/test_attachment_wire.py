"""Attachments as the gateway sends them, held to the providers' published request types: an OpenAI
chat completion and a batch line with image, file and text parts to the SDK's
CompletionCreateParamsNonStreaming (a body equal to its validated self), a Bedrock converse() with
image and document blocks to botocore's parameter validation, and any file name to Bedrock's
document-name rules.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.stub import Stubber
from hypothesis import given
from hypothesis import strategies as st

from engine.attachments.inspection import inspect
from engine.core.attachments import Attachment, AttachmentRef, MediaType
from engine.gateway.batches import BatchLine
from engine.gateway.bedrock import BedrockConverseProvider
from engine.gateway.openai import chat_completion_body, static_api_key
from engine.gateway.openai_batch import OpenAIBatchProvider
from engine.gateway.parts import BEDROCK_NAME_CHARS, bedrock_document_name
from tests.support.attachment_files import image, pdf
from tests.support.openai_sdk import sdk_request
from tests.support.providers import completion_request


def attached(name: str, data: bytes) -> Attachment:
    return inspect(AttachmentRef("payloads", f"attachments/{name}", name), data)


ATTACHMENTS = (
    attached("invoice 4711.pdf", pdf(2, "Invoice 4711")),
    attached("scan.png", image(MediaType.PNG)),
    attached("photo.jpg", image(MediaType.JPEG)),
    attached("notes.txt", b"Due 2026-01-31"),
)


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_a_chat_completion_with_images_a_pdf_and_a_text_is_a_request_the_sdk_takes_as_it_is(mode: Any) -> None:
    body = chat_completion_body(completion_request(attachments=ATTACHMENTS), mode)

    assert sdk_request(body) == body
    [user] = [message for message in body["messages"] if message["role"] == "user"]
    kinds = [part["type"] for part in user["content"]]
    assert kinds == ["text", "file", "image_url", "image_url", "text"]  # the instructions first
    file = user["content"][1]["file"]
    assert file["filename"] == "invoice 4711.pdf"
    assert base64.b64decode(file["file_data"].removeprefix("data:application/pdf;base64,")) == ATTACHMENTS[0].data
    assert user["content"][2]["image_url"]["url"].startswith("data:image/png;base64,")


def test_a_batch_line_carries_the_same_content_and_is_a_request_the_sdk_takes() -> None:
    uploads: list[bytes] = []

    def openai(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/files"):
            uploads.append(request.read())
            return httpx.Response(200, json={"id": "file-1", "object": "file"})
        return httpx.Response(200, json={"id": "batch_1", "object": "batch"})

    request = completion_request(attachments=ATTACHMENTS)
    client = httpx.Client(transport=httpx.MockTransport(openai))
    batches = OpenAIBatchProvider("https://api.openai.test/v1", static_api_key("k"), client=client)

    batches.submit([BatchLine("line-0", request)], {})

    [upload] = uploads
    [line] = [json.loads(text) for text in upload.split(b"\r\n") if text.startswith(b'{"custom_id"')]
    assert line["custom_id"] == "line-0"
    assert line["body"] == chat_completion_body(request, "json_schema")
    assert sdk_request(line["body"]) == line["body"]


@pytest.fixture
def bedrock() -> Iterator[tuple[Stubber, BedrockConverseProvider]]:
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    with Stubber(client) as stubbed:
        yield stubbed, BedrockConverseProvider(lambda _: client)
        stubbed.assert_no_pending_responses()


def test_a_converse_call_with_image_and_document_blocks_passes_botocore_s_validation(
    bedrock: tuple[Stubber, BedrockConverseProvider],
) -> None:
    stubber, provider = bedrock
    twice = (*ATTACHMENTS, attached("invoice 4711.pdf", pdf(1, "Again")))
    answer = {"toolUse": {"toolUseId": "t1", "name": "classify", "input": {"label": "spam", "confidence": 0.9}}}
    sent: list[dict[str, Any]] = []
    stubber.add_response(
        "converse",
        {
            "output": {"message": {"role": "assistant", "content": [answer]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120},
            "metrics": {"latencyMs": 42},
        },
    )
    stubber.client.meta.events.register(
        "provide-client-params.bedrock-runtime.Converse", lambda params, **_: sent.append(params)
    )

    # (The Stubber validates the parameters against the service model before it answers.)
    provider.complete(completion_request("amazon.nova-lite-v1:0", attachments=twice))

    [params] = sent
    content = params["messages"][0]["content"]
    assert list(content[0]) == ["text"]
    assert [next(iter(block)) for block in content[1:]] == ["document", "image", "image", "text", "document"]
    assert content[1]["document"] == {"format": "pdf", "name": "invoice 4711", "source": {"bytes": ATTACHMENTS[0].data}}
    assert content[5]["document"]["name"] == "invoice 4711 (2)"
    assert content[2]["image"] == {"format": "png", "source": {"bytes": ATTACHMENTS[1].data}}


BEDROCK_NAME = re.compile(r"[A-Za-z0-9\-\(\)\[\]]+( [A-Za-z0-9\-\(\)\[\]]+)*")


@given(names=st.lists(st.text(max_size=300), min_size=1, max_size=20))
def test_any_file_names_become_valid_unique_bedrock_document_names(names: list[str]) -> None:
    taken: set[str] = set()

    cleaned = [bedrock_document_name(name, taken) for name in names]

    assert len(set(cleaned)) == len(cleaned)
    for name in cleaned:
        assert 1 <= len(name) <= BEDROCK_NAME_CHARS
        assert BEDROCK_NAME.fullmatch(name), name
