"""The local provider takes the images and PDFs the engine sends, as OpenAI takes them (aijobs.local.attachments):
it refuses a part that does not decode to what it claims, bills each as OpenAI's formulas do for the model
asked for, and reads fault markers from a PDF's text as from the prompt; in real time and in batch lines.
"""

from __future__ import annotations

import base64
import io
import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from aijobs.local.attachments import image_tokens, page_texts
from aijobs.local.faults import FaultKind
from aijobs.local.provider import LocalProvider
from aijobs.local.samples import INVOICE, PANORAMA, PRODUCT_PHOTO, SCANNED_FORM, sample
from engine.attachments.inspection import inspect
from engine.core.attachments import Attachment, AttachmentRef
from engine.gateway import attachment_tokens as estimates
from engine.gateway.openai import chat_completion_body
from tests.support.providers import completion_request
from tests.support.text_pdfs import A4, text_pdf

COMPLETIONS = "/v1/chat/completions"


def read(name: str, data: bytes) -> Attachment:
    """An attachment as the engine reads it."""
    return inspect(AttachmentRef("bucket", f"attachments/{name}", name), data)


def body_with(*attachments: Attachment, model: str = "gpt-4o", user: str = "Text: read the attachments") -> Any:
    """The body the engine posts for a classify call carrying `attachments`."""
    request = completion_request(model, user=user, attachments=attachments)
    return chat_completion_body(request, "json_schema")


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str, detail: str = "high") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def file_part(file_data: str, filename: str = "invoice.pdf") -> dict[str, Any]:
    return {"type": "file", "file": {"filename": filename, "file_data": file_data}}


def with_part(part: dict[str, Any]) -> Any:
    body = body_with()
    body["messages"][1]["content"] = [{"type": "text", "text": "Text: read the attachments"}, part]
    return body


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, height), 200).save(out, "PNG")
    return out.getvalue()


def post(http: httpx.Client, server: LocalProvider, body: Any) -> httpx.Response:
    return http.post(f"{server.url}/chat/completions", json=body)


def prompt_tokens(http: httpx.Client, server: LocalProvider, body: Any) -> int:
    response = post(http, server, body)
    assert response.status_code == 200, response.text
    tokens: int = response.json()["usage"]["prompt_tokens"]
    return tokens


# --- refusals -------------------------------------------------------------------------------------

PNG_AS_JPEG = data_url("image/png", sample(PRODUCT_PHOTO))
TEXT = b"Dear customer, your invoice is attached."
BROKEN_PNG = sample(SCANNED_FORM)[:8] + b"\x00" * 40
TRUNCATED_PDF = sample(INVOICE)[: len(sample(INVOICE)) // 2]
REFUSALS = {
    "an image by URL (nothing is fetched)": (
        image_part("https://example.com/cat.png"),
        "image_url.url",
        "invalid_image_url",
    ),
    "an image data URL that is not base64": (
        image_part("data:image/png," + "x" * 8),
        "image_url.url",
        "invalid_value",
    ),
    "an image whose base64 is not base64": (
        image_part("data:image/png;base64,@@not*base64@@"),
        "image_url.url",
        "invalid_value",
    ),
    "an image of a MIME type OpenAI does not take": (
        image_part(data_url("image/tiff", sample(SCANNED_FORM))),
        "image_url.url",
        "invalid_value",
    ),
    "a data:image/png that is a JPEG": (image_part(PNG_AS_JPEG), "image_url.url", "invalid_image_format"),
    "a data:image/png that is text": (image_part(data_url("image/png", TEXT)), "image_url.url", "invalid_image_format"),
    "a data:image/png of a broken header": (
        image_part(data_url("image/png", BROKEN_PNG)),
        "image_url.url",
        "invalid_image_format",
    ),
    "a file of another MIME type than PDF": (
        file_part(data_url("text/plain", TEXT)),
        "file.file_data",
        "invalid_value",
    ),
    "a file whose base64 is not base64": (
        file_part("data:application/pdf;base64,JVBERi0%%%"),
        "file.file_data",
        "invalid_value",
    ),
    "a data:application/pdf that is a PNG": (
        file_part(data_url("application/pdf", sample(SCANNED_FORM))),
        "file.file_data",
        "invalid_value",
    ),
    "a truncated PDF": (file_part(data_url("application/pdf", TRUNCATED_PDF)), "file.file_data", "invalid_value"),
    "an encrypted PDF": (
        file_part(data_url("application/pdf", text_pdf(["secret"], password="pw"))),
        "file.file_data",
        "invalid_value",
    ),
    "a file by id (the provider keeps none for chat)": (
        {"type": "file", "file": {"file_id": "file-abc"}},
        "file.file_id",
        "invalid_value",
    ),
}


@pytest.mark.parametrize(("part", "param", "code"), REFUSALS.values(), ids=list(REFUSALS))
def test_a_part_that_is_not_what_it_claims_is_a_400_naming_it_and_billed_nothing(
    part: dict[str, Any], param: str, code: str, server: LocalProvider, http: httpx.Client
) -> None:
    response = post(http, server, with_part(part))

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        f"messages[1].content[1].{param}",
        code,
    )
    assert "\n" not in error["message"]
    assert [(entry.status, entry.prompt_tokens, entry.attachment_tokens) for entry in server.log] == [(400, 0, 0)]


def test_what_the_engine_sends_of_every_sample_it_takes_is_answered(server: LocalProvider, http: httpx.Client) -> None:
    attachments = [read(name, sample(name)) for name in (INVOICE, SCANNED_FORM, PRODUCT_PHOTO, PANORAMA)]

    response = post(http, server, body_with(*attachments))

    assert response.status_code == 200, response.text
    assert [entry.status for entry in server.log] == [200]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.sampled_from([sample(INVOICE), sample(SCANNED_FORM), sample(PRODUCT_PHOTO)]).flatmap(
            lambda whole: st.integers(0, len(whole)).map(lambda cut: whole[:cut])
        ),
    ),
    mime=st.sampled_from(["image/png", "image/jpeg", "image/webp", "image/gif", "application/pdf"]),
)
def test_no_bytes_crash_the_provider_they_are_answered_or_refused(
    data: bytes, mime: str, server: LocalProvider, http: httpx.Client
) -> None:
    part = file_part(data_url(mime, data)) if mime == "application/pdf" else image_part(data_url(mime, data))

    response = post(http, server, with_part(part))

    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["param"].startswith("messages[1].content[1].")


# --- what they cost -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "width", "height", "tokens"),
    [
        # 1024 x 1024: its short side down to 768, 2 x 2 tiles: 85 + 4 x 170 (OpenAI's worked example)
        ("gpt-4o", 1024, 1024, 765),
        ("gpt-4o-mini", 1024, 1024, 2833 + 4 * 5667),
        # 2048 x 4096: fit in 2048 (1024 x 2048), short side to 768 (768 x 1536): 2 x 3 tiles
        ("gpt-4o", 2048, 4096, 85 + 6 * 170),
        # 300 x 200: one tile
        ("gpt-4o", 300, 200, 255),
        ("o3", 300, 200, 75 + 150),
        # 1867 x 1400: short side to 768, the long one 1024.18 px, a renderer's 1024: 2 x 2 tiles (the
        # engine's estimate takes it at 1025 px: 3 x 2)
        ("gpt-4o", 1867, 1400, 765),
        # a patch model: 1800 x 2400 is past 1,536 patches, scaled to 1056 x 1408: 33 x 44 = 1,452 patches
        # (OpenAI's worked example), x 1.62
        ("gpt-4.1-mini", 1800, 2400, math.ceil(1452 * 1.62)),
        ("gpt-4.1-mini", 1024, 1024, math.ceil(1024 * 1.62)),
    ],
)
def test_an_image_is_billed_by_openais_formula_for_the_model(
    model: str, width: int, height: int, tokens: int, server: LocalProvider, http: httpx.Client
) -> None:
    text_only = prompt_tokens(http, server, body_with(model=model))

    billed = prompt_tokens(http, server, body_with(read("scan.png", png(width, height)), model=model))

    assert billed - text_only == tokens
    assert image_tokens(model, width, height) == tokens
    assert server.log[-1].attachment_tokens == tokens


def test_an_image_at_detail_low_costs_the_models_base(server: LocalProvider, http: httpx.Client) -> None:
    body = with_part(image_part(data_url("image/png", png(4000, 3000)), detail="low"))
    body["model"] = "gpt-4o-mini"
    text_only = prompt_tokens(http, server, body_with(model="gpt-4o-mini"))

    assert prompt_tokens(http, server, body) - text_only == 2833


def test_a_pdf_is_billed_an_image_of_each_page_at_150_dpi_and_its_text(
    server: LocalProvider, http: httpx.Client
) -> None:
    # Given the 2-page invoice (US letter, 612 x 792 pt): each page rendered at 150 DPI is 1275 x 1650 px,
    # its short side down to 768 leaves 768 x 994: 2 x 2 tiles
    invoice = sample(INVOICE)
    text = "".join(page_texts(invoice))
    assert "INV-2026-4711" in text
    text_only = prompt_tokens(http, server, body_with(model="gpt-4o-mini"))

    billed = prompt_tokens(http, server, body_with(read(INVOICE, invoice), model="gpt-4o-mini"))

    assert billed - text_only == 2 * (2833 + 4 * 5667) + math.ceil(len(text) / 4)


def test_an_a4_page_is_rendered_from_its_own_size(server: LocalProvider, http: httpx.Client) -> None:
    # 595 x 842 pt at 150 DPI: 1240 x 1754 px (1239.6 and 1754.2, rounded); short side to 768: 768 x 1086,
    # 2 x 3 tiles. The page says "12345678": with its line break, 9 characters, 3 tokens.
    pdf = text_pdf(["12345678"], size=A4)
    assert page_texts(pdf) == ["12345678\n"]
    text_only = prompt_tokens(http, server, body_with())

    billed = prompt_tokens(http, server, body_with(read("a4.pdf", pdf)))

    assert billed - text_only == 85 + 6 * 170 + 3


def test_a_pdf_of_blank_pages_is_billed_their_images_and_no_text(server: LocalProvider, http: httpx.Client) -> None:
    # Three blank A4 pages: no text, not even the breaks between pages.
    pdf = text_pdf(["", "", ""], size=A4)
    text_only = prompt_tokens(http, server, body_with())

    billed = prompt_tokens(http, server, body_with(read("blank.pdf", pdf)))

    assert billed - text_only == 3 * (85 + 6 * 170)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(["gpt-4o", "gpt-4o-mini", "o3", "gpt-4.1-mini", "gpt-5-nano"]),
    width=st.integers(1, 20_000),
    height=st.integers(1, 20_000),
)
def test_the_engines_estimate_of_an_image_is_never_below_what_the_provider_bills(
    model: str, width: int, height: int
) -> None:
    assert estimates.image_tokens("openai", model, width, height) >= image_tokens(model, width, height)


# --- fault markers and batches --------------------------------------------------------------------


def test_a_fault_marker_in_a_pdfs_text_is_served_as_in_the_prompt(server: LocalProvider, http: httpx.Client) -> None:
    marked = read("claim.pdf", text_pdf(["Claim 88", "Please pay. fault:unavailable*1"]))
    other = read("claim.pdf", text_pdf(["Claim 89", "Please pay. fault:unavailable*1"]))

    statuses = [post(http, server, body_with(attachment)).status_code for attachment in (marked, marked, other)]

    # the count is kept per prompt and PDF text: another PDF under the same prompt is served its own
    assert statuses == [503, 200, 503]
    assert [entry.fault for entry in server.log] == [FaultKind.UNAVAILABLE, None, FaultKind.UNAVAILABLE]


def test_a_fault_marker_in_a_text_attachment_is_served_too(server: LocalProvider, http: httpx.Client) -> None:
    note = read("note.txt", b"Customer note: refund me. fault:non_json")

    response = post(http, server, body_with(note))

    assert response.status_code == 200
    assert server.log[0].fault is FaultKind.NON_JSON


def upload_batch(http: httpx.Client, server: LocalProvider, bodies: list[Any]) -> str:
    lines = [{"custom_id": str(n), "method": "POST", "url": COMPLETIONS, "body": body} for n, body in enumerate(bodies)]
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    files = {"file": ("in.jsonl", content)}
    file_id = http.post(f"{server.url}/files", files=files, data={"purpose": "batch"}).json()["id"]
    request = {"input_file_id": file_id, "endpoint": COMPLETIONS, "completion_window": "24h"}
    batch_id: str = http.post(f"{server.url}/batches", json=request).json()["id"]
    return batch_id


def results(http: httpx.Client, server: LocalProvider, batch: dict[str, Any], which: str) -> list[dict[str, Any]]:
    file_id = batch[f"{which}_file_id"]
    if file_id is None:
        return []
    raw = http.get(f"{server.url}/files/{file_id}/content").content
    return [json.loads(line) for line in raw.splitlines()]


def test_a_batch_line_with_attachments_is_billed_as_in_real_time_and_a_bad_one_refused(
    server: LocalProvider, http: httpx.Client
) -> None:
    # Given what a request with the invoice and the photo is billed in real time
    invoice, photo = read(INVOICE, sample(INVOICE)), read(PRODUCT_PHOTO, sample(PRODUCT_PHOTO))
    text_only = prompt_tokens(http, server, body_with())
    realtime = prompt_tokens(http, server, body_with(invoice, photo))
    server.reset()

    # When a batch carries the same request, and one whose "PNG" is a JPEG
    batch_id = upload_batch(http, server, [body_with(invoice, photo), with_part(image_part(PNG_AS_JPEG))])
    batch = http.get(f"{server.url}/batches/{batch_id}").json()

    # Then the first is billed as in real time, the second refused as in real time
    (answered,) = results(http, server, batch, "output")
    (refused,) = results(http, server, batch, "error")
    assert answered["response"]["body"]["usage"]["prompt_tokens"] == realtime
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "messages[1].content[1].image_url.url"
    logged = sorted((entry.status, entry.attachment_tokens, entry.batch_id) for entry in server.log)
    assert logged == [(200, realtime - text_only, batch_id), (400, 0, batch_id)]


def test_a_batch_fault_marker_in_a_pdfs_text_is_the_batchs_fault(server: LocalProvider, http: httpx.Client) -> None:
    marked = read("claim.pdf", text_pdf(["Claim 90 batch-fault:expire_half"]))

    batch_id = upload_batch(http, server, [body_with(marked), body_with()])
    batch = http.get(f"{server.url}/batches/{batch_id}").json()

    assert (batch["status"], batch["request_counts"]["completed"]) == ("expired", 1)


# --- an answer from the output schema -------------------------------------------------------------


def test_a_request_with_attachments_is_answered_from_its_output_schema(
    server: LocalProvider, http: httpx.Client
) -> None:
    response = post(http, server, body_with(read(INVOICE, sample(INVOICE))))

    answer = json.loads(response.json()["choices"][0]["message"]["content"])
    assert set(answer) == {"label", "confidence"}
