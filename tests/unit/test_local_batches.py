"""The local provider's Files and Batches APIs over HTTP, as a client other than the engine's meets them:
uploads, validation, listing, cancelling, the rate limit, and the log of batch lines."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from aijobs.local.batches import BatchFault, multipart_fields
from aijobs.local.provider import LocalProvider
from engine.gateway.openai import chat_completion_body
from tests.support.providers import completion_request


def line(custom_id: str, user: str = "Text: hello", **fields: Any) -> dict[str, Any]:
    body = chat_completion_body(completion_request(user=user), "json_schema")
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body, **fields}


def jsonl(*values: object) -> bytes:
    return b"".join(json.dumps(value).encode() + b"\n" for value in values)


def upload(http: httpx.Client, server: LocalProvider, content: bytes, **headers: str) -> httpx.Response:
    files = {"file": ("in.jsonl", content, "application/jsonl")}
    return http.post(f"{server.url}/files", files=files, data={"purpose": "batch"}, headers=headers)


def create(http: httpx.Client, server: LocalProvider, content: bytes, **fields: Any) -> httpx.Response:
    file_id = upload(http, server, content).json()["id"]
    request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
    return http.post(f"{server.url}/batches", json=request)


def get(http: httpx.Client, server: LocalProvider, path: str) -> dict[str, Any]:
    response = http.get(f"{server.url}{path}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_an_uploaded_file_is_described_and_served_back_as_it_came(http: httpx.Client, server: LocalProvider) -> None:
    content = jsonl(line("a"), line("b"))

    uploaded = upload(http, server, content)

    assert uploaded.status_code == 200
    described = uploaded.json()
    assert (described["object"], described["purpose"], described["bytes"], described["filename"]) == (
        "file",
        "batch",
        len(content),
        "in.jsonl",
    )
    assert get(http, server, f"/files/{described['id']}") == described
    assert http.get(f"{server.url}/files/{described['id']}/content").content == content


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"purpose": "fine-tune"}, 400),  # not a batch file
        ({}, 400),  # no purpose
    ],
)
def test_an_upload_without_the_batch_purpose_is_refused(
    fields: dict[str, str], status: int, http: httpx.Client, server: LocalProvider
) -> None:
    response = http.post(f"{server.url}/files", files={"file": ("in.jsonl", b"{}\n")}, data=fields)

    assert response.status_code == status


def test_a_body_that_is_not_multipart_is_refused(http: httpx.Client, server: LocalProvider) -> None:
    assert http.post(f"{server.url}/files", json={"file": "x"}).status_code == 400


def test_the_files_and_batches_need_the_key(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, api_key="sk-local") as keyed:
        refused = upload(http, keyed, jsonl(line("a")))
        accepted = upload(http, keyed, jsonl(line("a")), Authorization="Bearer sk-local")
        listing = http.get(f"{keyed.url}/batches")

    assert (refused.status_code, accepted.status_code, listing.status_code) == (401, 200, 401)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_a_create_request_out_of_openais_rules_is_refused(
    fields: dict[str, Any], message: str, http: httpx.Client, server: LocalProvider
) -> None:
    response = create(http, server, jsonl(line("a")), **fields)

    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_a_batch_over_a_file_that_does_not_exist_is_not_found(http: httpx.Client, server: LocalProvider) -> None:
    request = {"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"}

    assert http.post(f"{server.url}/batches", json=request).status_code == 404
    assert http.get(f"{server.url}/batches/batch_none").status_code == 404


def test_a_file_with_malformed_lines_makes_a_failed_batch_naming_them(
    http: httpx.Client, server: LocalProvider
) -> None:
    content = jsonl(line("a"), line("a"), line("b", url="/v1/embeddings")) + b"not json\n"

    created = create(http, server, content)

    assert created.status_code == 200
    batch = get(http, server, f"/batches/{created.json()['id']}")
    assert batch["status"] == "failed"
    assert [(error["code"], error["line"]) for error in batch["errors"]["data"]] == [
        ("invalid_custom_id", 2),
        ("invalid_request", 3),
        ("invalid_json_line", 4),
    ]
    assert (batch["output_file_id"], batch["error_file_id"]) == (None, None)
    assert server.log == []


def test_a_completed_batch_has_an_output_file_of_chat_completions(http: httpx.Client, server: LocalProvider) -> None:
    batch = get(http, server, f"/batches/{create(http, server, jsonl(line('a'), line('b'))).json()['id']}")

    assert (batch["status"], batch["request_counts"]) == ("completed", {"total": 2, "completed": 2, "failed": 0})
    assert batch["error_file_id"] is None
    output = [
        json.loads(raw)
        for raw in http.get(f"{server.url}/files/{batch['output_file_id']}/content").content.splitlines()
    ]
    assert [(item["custom_id"], item["response"]["status_code"], item["error"]) for item in output] == [
        ("a", 200, None),
        ("b", 200, None),
    ]
    assert all(item["response"]["body"]["object"] == "chat.completion" for item in output)
    assert [entry.batch_id for entry in server.log] == [batch["id"]] * 2


def test_batch_lines_do_not_count_against_the_real_time_rate_limit(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=0, rpm=1) as limited:
        batch = get(
            http, limited, f"/batches/{create(http, limited, jsonl(*(line(str(i)) for i in range(5)))).json()['id']}"
        )
        real_time = [http.post(f"{limited.url}/chat/completions", json=line("x")["body"]).status_code for _ in range(2)]

    assert batch["request_counts"]["completed"] == 5
    assert real_time == [200, 429]  # the limit's one request a minute was still there for real time


def test_the_listing_is_newest_first_in_pages(http: httpx.Client, server: LocalProvider) -> None:
    ids = [create(http, server, jsonl(line("a"))).json()["id"] for _ in range(3)]

    first = get(http, server, "/batches?limit=2")
    rest = get(http, server, f"/batches?limit=2&after={first['last_id']}")

    assert [batch["id"] for batch in first["data"]] == [ids[2], ids[1]]
    assert (first["has_more"], first["first_id"], first["last_id"]) == (True, ids[2], ids[1])
    assert [batch["id"] for batch in rest["data"]] == [ids[0]]
    assert rest["has_more"] is False
    assert http.get(f"{server.url}/batches?limit=0").status_code == 400
    assert http.get(f"{server.url}/batches?after=batch_none").status_code == 404


def test_a_batch_that_ended_cannot_be_cancelled(http: httpx.Client, server: LocalProvider) -> None:
    batch_id = create(http, server, jsonl(line("a"))).json()["id"]
    get(http, server, f"/batches/{batch_id}")  # looked at after its delay: answered

    response = http.post(f"{server.url}/batches/{batch_id}/cancel")

    assert response.status_code == 400
    assert get(http, server, f"/batches/{batch_id}")["status"] == "completed"


def test_a_cancelled_batch_is_cancelling_then_cancelled_with_its_lines_never_run(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=3600) as slow:
        batch_id = create(http, slow, jsonl(line("a"), line("b"))).json()["id"]

        cancelling = http.post(f"{slow.url}/batches/{batch_id}/cancel").json()
        cancelled = get(http, slow, f"/batches/{batch_id}")
        errors = http.get(f"{slow.url}/files/{cancelled['error_file_id']}/content").content.splitlines()

    assert (cancelling["status"], cancelled["status"]) == ("cancelling", "cancelled")
    assert [json.loads(raw)["error"]["code"] for raw in errors] == ["batch_cancelled"] * 2
    assert slow.log == []


@pytest.mark.parametrize("fault", list(BatchFault))
def test_the_batch_fault_is_taken_when_a_batch_is_created(
    fault: BatchFault, http: httpx.Client, server: LocalProvider
) -> None:
    server.batch_fault = fault
    batch_id = create(http, server, jsonl(*(line(str(i)) for i in range(4)))).json()["id"]
    server.batch_fault = None  # later changes do not reach a batch already made

    batch = get(http, server, f"/batches/{batch_id}")

    expected = {
        BatchFault.STALL: ("in_progress", 0, 0),
        BatchFault.EXPIRE_HALF: ("expired", 2, 2),
        BatchFault.FAILED_LINES: ("completed", 2, 2),
    }[fault]
    counts = batch["request_counts"]
    assert (batch["status"], counts["completed"], counts["failed"]) == expected


def test_a_line_the_provider_gives_no_response_to_is_a_server_error_in_the_error_file(
    http: httpx.Client, server: LocalProvider
) -> None:
    batch = get(http, server, f"/batches/{create(http, server, jsonl(line('a', user='fault:drop'))).json()['id']}")

    (error,) = http.get(f"{server.url}/files/{batch['error_file_id']}/content").content.splitlines()
    assert json.loads(error)["response"] is None
    assert json.loads(error)["error"]["code"] == "server_error"
    assert [(entry.fault, entry.status) for entry in server.log] == [("drop", None)]


def test_the_multipart_parser_reads_fields_and_files() -> None:
    boundary = "XyZ"
    raw = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\nline one\r\n\r\nline two\n\r\n--XyZ--\r\n"
    )

    fields = multipart_fields(f"multipart/form-data; boundary={boundary}", raw)

    assert fields == {"purpose": (None, b"batch"), "file": ("a.jsonl", b"line one\r\n\r\nline two\n")}
    with pytest.raises(ValueError, match="multipart"):
        multipart_fields("application/json", raw)
