"""OpenAIBatchProvider over httpx.MockTransport: the files and batches it sends, the states and answers it reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from email.message import Message
from typing import Any

import httpx
import pytest

from engine.core.batches import BatchState
from engine.core.errors import (
    JobError,
    OutputTooLargeError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)
from engine.gateway.batches import BatchLine
from engine.gateway.openai import OpenAICompatibleProvider, StructuredOutput, chat_completion_body, static_api_key
from engine.gateway.openai_batch import MAX_FIND_PAGES, MAX_LINE_BYTES, OpenAIBatchProvider
from tests.support.providers import completion_request, openai_completion

Handler = Callable[[httpx.Request], httpx.Response]
BASE = "http://llm.local/v1"


class Api:
    """A scripted Files and Batches API: answers by (method, path), records every request."""

    def __init__(self, routes: dict[tuple[str, str], Handler | dict[str, Any]] | None = None) -> None:
        self.routes = routes or {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.path.removeprefix("/v1")))
        if route is None:
            return httpx.Response(404, json={"error": {"message": "no route"}})
        return route(request) if callable(route) else httpx.Response(200, json=route)

    def paths(self) -> list[str]:
        return [f"{request.method} {request.url.path.removeprefix('/v1')}" for request in self.requests]


def adapter(api: Api, mode: StructuredOutput = "json_schema", key: str | None = "sk-test") -> OpenAIBatchProvider:
    client = httpx.Client(transport=httpx.MockTransport(api))
    return OpenAIBatchProvider(BASE + "/", static_api_key(key), structured_output=mode, client=client)


def lines(count: int = 2) -> list[BatchLine]:
    return [BatchLine(f"job-{i}", completion_request(user=f"Text: {i}", cache_key="classify:2")) for i in range(count)]


def multipart(request: httpx.Request) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data request: name -> (file name, content)."""
    header = Message()
    header["Content-Type"] = request.headers["content-type"]
    boundary = str(header.get_param("boundary")).encode()
    fields = {}
    for part in request.content.split(b"--" + boundary)[1:-1]:
        head, _, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        disposition = Message()
        disposition["Content-Disposition"] = next(
            line.split(b":", 1)[1].decode().strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-disposition")
        )
        filename = disposition.get_param("filename", header="content-disposition")
        name = str(disposition.get_param("name", header="content-disposition"))
        fields[name] = (str(filename) if filename else None, content.removesuffix(b"\r\n"))
    return fields


def batch(status: str = "in_progress", **fields: Any) -> dict[str, Any]:
    return {"id": "batch_1", "object": "batch", "status": status, **fields}


def submitted_api() -> Api:
    return Api({("POST", "/files"): {"id": "file-in", "object": "file"}, ("POST", "/batches"): batch("validating")})


# --- submit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_a_batch_is_a_jsonl_file_of_exactly_the_real_time_bodies_then_a_batch_over_it(mode: StructuredOutput) -> None:
    api = submitted_api()
    batch_lines = lines(3)

    batch_id = adapter(api, mode).submit(batch_lines, {"aijobs_batch": "record-1"})

    assert batch_id == "batch_1"
    assert api.paths() == ["POST /files", "POST /batches"]
    upload, create = api.requests
    assert all(request.headers["authorization"] == "Bearer sk-test" for request in api.requests)
    fields = multipart(upload)
    assert fields["purpose"] == (None, b"batch")
    filename, content = fields["file"]
    assert filename is not None
    assert filename.endswith(".jsonl")
    assert content.endswith(b"\n")
    assert [json.loads(line) for line in content.splitlines()] == [
        {
            "custom_id": line.custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_completion_body(line.request, mode),
        }
        for line in batch_lines
    ]
    assert json.loads(create.content) == {
        "input_file_id": "file-in",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"aijobs_batch": "record-1"},
    }


def test_a_lines_bytes_are_what_it_adds_to_the_input_file() -> None:
    api = submitted_api()
    provider = adapter(api)
    batch_lines = lines(3)

    provider.submit(batch_lines, {})

    _, content = multipart(api.requests[0])["file"]
    assert [provider.line_bytes(line) for line in batch_lines] == [len(line) + 1 for line in content.splitlines()]


def test_the_providers_limits_are_openais() -> None:
    provider = adapter(Api())
    assert (provider.min_lines, provider.max_lines, provider.max_bytes) == (1, 50_000, 200_000_000)


@pytest.mark.parametrize("count", [0, 50_001])
def test_a_batch_out_of_the_line_limits_is_refused_before_any_request(count: int) -> None:
    api = Api()
    line = lines(1)[0]

    with pytest.raises(ValueError, match="lines"):
        adapter(api).submit([line] * count, {})

    assert api.requests == []


def test_a_batch_past_the_byte_limit_is_refused_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api()
    provider = adapter(api)
    monkeypatch.setattr(provider, "max_bytes", provider.line_bytes(lines(1)[0]))

    with pytest.raises(ValueError, match="bytes"):
        provider.submit(lines(2), {})

    assert api.requests == []


@pytest.mark.parametrize(
    ("status", "error"),
    [(429, ProviderRateLimitedError), (500, ProviderUnavailableError), (400, ProviderRejectedError)],
)
def test_a_refused_create_is_the_engines_error_for_its_status(status: int, error: type[JobError]) -> None:
    api = Api(
        {
            ("POST", "/files"): {"id": "file-in"},
            ("POST", "/batches"): lambda _: httpx.Response(status, headers={"Retry-After": "7"}, json={}),
        }
    )

    with pytest.raises(error) as caught:
        adapter(api).submit(lines(1), {})

    if isinstance(caught.value, ProviderRateLimitedError):
        assert caught.value.retry_after_seconds == 7


def test_a_rotated_key_is_read_again_once_when_refused_with_401() -> None:
    api = Api(
        {
            ("POST", "/files"): lambda request: (
                httpx.Response(401, json={})
                if request.headers["authorization"] == "Bearer sk-old"
                else httpx.Response(200, json={"id": "file-in"})
            ),
            ("POST", "/batches"): batch(),
        }
    )
    client = httpx.Client(transport=httpx.MockTransport(api))
    current = {"key": "sk-old"}

    def source(*, refresh: bool = False) -> str:
        if refresh:
            current["key"] = "sk-new"  # the secret was rotated
        return current["key"]

    OpenAIBatchProvider(BASE, source, client=client).submit(lines(1), {})

    assert [request.headers["authorization"] for request in api.requests] == [
        "Bearer sk-old",
        "Bearer sk-new",
        "Bearer sk-new",
    ]


def test_a_connection_failure_is_unavailable_and_a_timeout_a_timeout() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(ProviderUnavailableError):
        adapter(Api({("GET", "/batches/batch_1"): refuse})).status("batch_1")
    with pytest.raises(ProviderTimeoutError):
        adapter(Api({("GET", "/batches/batch_1"): slow})).status("batch_1")


def test_an_answer_that_is_not_an_object_is_unavailable() -> None:
    api = Api({("GET", "/batches/batch_1"): lambda _: httpx.Response(200, content=b"[1, 2]")})

    with pytest.raises(ProviderUnavailableError):
        adapter(api).status("batch_1")


# --- status ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("validating", BatchState.PENDING),
        ("in_progress", BatchState.PENDING),
        ("finalizing", BatchState.PENDING),
        ("cancelling", BatchState.PENDING),
        ("completed", BatchState.COMPLETED),
        ("expired", BatchState.EXPIRED),
        ("cancelled", BatchState.CANCELLED),
        ("failed", BatchState.FAILED),
        ("a_status_added_later", BatchState.PENDING),
    ],
)
def test_each_batch_status_maps_to_a_state(status: str, state: BatchState) -> None:
    counts = {"total": 10, "completed": 7, "failed": 2}
    api = Api({("GET", "/batches/batch_1"): batch(status, request_counts=counts)})

    found = adapter(api).status("batch_1")

    assert (found.batch_id, found.state, found.answered, found.failed) == ("batch_1", state, 7, 2)
    assert found.detail.startswith(status)


def test_a_failed_batch_says_why_and_missing_counts_are_zero() -> None:
    errors = {"object": "list", "data": [{"code": "invalid_json_line", "message": "...", "line": 3}]}
    api = Api({("GET", "/batches/batch_1"): batch("failed", errors=errors, request_counts=None)})

    found = adapter(api).status("batch_1")

    assert (found.state, found.detail, found.answered, found.failed) == (
        BatchState.FAILED,
        "failed (invalid_json_line)",
        0,
        0,
    )


# --- answers ---------------------------------------------------------------------------------------


def output_line(custom_id: str, status: int, body: object) -> dict[str, Any]:
    return {"id": f"req-{custom_id}", "custom_id": custom_id, "response": {"status_code": status, "body": body}}


def results_api(output: list[object] | None, errors: list[object] | None = None) -> Api:
    def file_of(values: list[object]) -> Handler:
        content = b"".join(
            value if isinstance(value, bytes) else json.dumps(value).encode() + b"\n" for value in values
        )
        return lambda _: httpx.Response(200, content=content)

    routes: dict[tuple[str, str], Handler | dict[str, Any]] = {
        ("GET", "/batches/batch_1"): batch(
            "completed", output_file_id="file-out" if output is not None else None, error_file_id="file-err"
        )
    }
    if output is not None:
        routes["GET", "/files/file-out/content"] = file_of(output)
    routes["GET", "/files/file-err/content"] = file_of(errors or [])
    return Api(routes)


def test_an_answered_line_is_read_exactly_as_a_real_time_answer_is() -> None:
    envelope = openai_completion(
        '{"label": "spam", "confidence": 0.9}',
        prompt_tokens=2_000,
        completion_tokens=300,
        cached_tokens=1_536,
        reasoning_tokens=256,
    )
    real_time_client = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, json=envelope)))
    real_time = OpenAICompatibleProvider(BASE, static_api_key(None), client=real_time_client)
    expected = real_time.complete(completion_request())

    (answer,) = adapter(results_api([output_line("job-0", 200, envelope)])).answers("batch_1")

    assert answer.custom_id == "job-0"
    assert answer.error is None
    assert answer.completion is not None
    assert answer.completion.latency_ms == 0  # no call of its own to time
    assert answer.completion == replace(expected, latency_ms=0)
    assert (answer.completion.cached_input_tokens, answer.completion.reasoning_tokens) == (1_536, 256)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, ProviderRateLimitedError),
        (408, ProviderTimeoutError),
        (500, ProviderUnavailableError),
        (503, ProviderUnavailableError),
        (400, ProviderRejectedError),
        (404, ProviderRejectedError),
    ],
)
def test_a_failed_line_carries_the_error_a_real_time_call_would_raise_for_its_status(
    status: int, error: type[JobError]
) -> None:
    body = {"error": {"message": "no", "type": "server_error"}}

    (answer,) = adapter(results_api([], [output_line("job-1", status, body)])).answers("batch_1")

    assert (answer.custom_id, answer.completion) == ("job-1", None)
    assert type(answer.error) is error


def test_output_and_error_files_are_both_read_and_lines_never_run_are_left_out() -> None:
    ok = openai_completion("{}")
    api = results_api(
        [output_line("job-0", 200, ok), output_line("job-2", 200, ok)],
        [
            output_line("job-1", 500, {"error": {}}),
            {"custom_id": "job-3", "response": None, "error": {"code": "batch_expired", "message": "..."}},
            {"custom_id": "job-4", "response": None, "error": {"code": "batch_cancelled", "message": "..."}},
            {"custom_id": "job-5", "response": None, "error": {"code": "server_error", "message": "..."}},
        ],
    )

    answers = {answer.custom_id: answer for answer in adapter(api).answers("batch_1")}

    assert sorted(answers) == ["job-0", "job-1", "job-2", "job-5"]
    assert answers["job-0"].completion is not None
    assert isinstance(answers["job-1"].error, ProviderUnavailableError)
    assert isinstance(answers["job-5"].error, ProviderUnavailableError)
    assert api.paths() == ["GET /batches/batch_1", "GET /files/file-out/content", "GET /files/file-err/content"]


def test_a_malformed_completion_is_unavailable_and_lines_naming_no_request_are_skipped() -> None:
    api = results_api(
        [
            output_line("job-0", 200, {"choices": []}),
            {"response": {"status_code": 200, "body": openai_completion("{}")}},
            b"\n",
            b"not json at all\n",
            b'{"id": "r", "custom_id": "job-1", "response": {"status_code": 2\n',
        ]
    )

    answers = list(adapter(api).answers("batch_1"))

    assert [(answer.custom_id, type(answer.error)) for answer in answers] == [
        ("job-0", ProviderUnavailableError),
        ("job-1", ProviderUnavailableError),
    ]


def test_a_line_past_the_bound_is_too_large_and_skipped_unread() -> None:
    huge = output_line("job-0", 200, openai_completion("x" * (MAX_LINE_BYTES + 10)))
    api = results_api([huge, output_line("job-1", 200, openai_completion("{}"))])

    answers = list(adapter(api).answers("batch_1"))

    assert [(answer.custom_id, type(answer.error)) for answer in answers] == [
        ("job-0", OutputTooLargeError),
        ("job-1", type(None)),
    ]


def test_a_batch_without_an_output_file_reads_only_its_error_file() -> None:
    api = results_api(None, [output_line("job-0", 500, {})])

    answers = list(adapter(api).answers("batch_1"))

    assert [answer.custom_id for answer in answers] == ["job-0"]
    assert "GET /files/file-out/content" not in api.paths()


def test_a_file_that_cannot_be_read_is_the_engines_error_for_its_status() -> None:
    api = results_api([])
    api.routes["GET", "/files/file-out/content"] = lambda _: httpx.Response(503, json={})

    with pytest.raises(ProviderUnavailableError):
        list(adapter(api).answers("batch_1"))


# --- cancel ----------------------------------------------------------------------------------------


def test_cancel_asks_the_provider_to_stop_the_batch() -> None:
    api = Api({("POST", "/batches/batch_1/cancel"): batch("cancelling")})

    adapter(api).cancel("batch_1")

    assert api.paths() == ["POST /batches/batch_1/cancel"]


def test_cancelling_a_batch_that_ended_meanwhile_is_no_error() -> None:
    api = Api(
        {
            ("POST", "/batches/batch_1/cancel"): lambda _: httpx.Response(400, json={}),
            ("GET", "/batches/batch_1"): batch("completed"),
        }
    )

    adapter(api).cancel("batch_1")

    assert api.paths() == ["POST /batches/batch_1/cancel", "GET /batches/batch_1"]


def test_a_refused_cancel_of_a_batch_still_running_is_an_error() -> None:
    api = Api(
        {
            ("POST", "/batches/batch_1/cancel"): lambda _: httpx.Response(400, json={}),
            ("GET", "/batches/batch_1"): batch("in_progress"),
        }
    )

    with pytest.raises(ProviderRejectedError):
        adapter(api).cancel("batch_1")


# --- find ------------------------------------------------------------------------------------------


def listing(pages: dict[str | None, tuple[list[dict[str, Any]], bool]]) -> Handler:
    """GET /batches answering, for each `after`, its page and whether more follow."""

    def respond(request: httpx.Request) -> httpx.Response:
        assert request.url.params["limit"] == "100"
        data, more = pages[request.url.params.get("after")]
        return httpx.Response(200, json={"object": "list", "data": data, "has_more": more})

    return respond


def test_find_pages_through_the_batches_newest_first_and_keeps_those_with_the_metadata() -> None:
    mine = {"aijobs_batch": "record-1", "model": "m"}
    pages: dict[str | None, tuple[list[dict[str, Any]], bool]] = {
        None: ([{"id": "b5", "metadata": mine}, {"id": "b4", "metadata": {"aijobs_batch": "other"}}], True),
        "b4": ([{"id": "b3", "metadata": None}, {"id": "b2", "metadata": {**mine, "extra": "x"}}], True),
        "b2": ([{"id": "b1", "metadata": {"aijobs_batch": "record-1"}}], False),
    }
    api = Api({("GET", "/batches"): listing(pages)})

    found = adapter(api).find({"aijobs_batch": "record-1", "model": "m"})

    assert found == ["b5", "b2"]
    assert len(api.requests) == 3


def test_find_reads_a_bounded_number_of_pages() -> None:
    api = Api({("GET", "/batches"): lambda _: httpx.Response(200, json={"data": [batch()], "has_more": True})})

    assert adapter(api).find({"aijobs_batch": "x"}) == []
    assert len(api.requests) == MAX_FIND_PAGES


# --- results checked against the batch's own counts -------------------------------------------------


def test_a_200_error_body_instead_of_the_output_file_is_an_error_not_no_answers() -> None:
    api = results_api([])
    api.routes["GET", "/batches/batch_1"] = batch(
        "completed", output_file_id="file-out", error_file_id="file-err", request_counts={"completed": 2, "failed": 0}
    )
    api.routes["GET", "/files/file-out/content"] = lambda _: httpx.Response(
        200, json={"error": {"message": "temporarily unavailable", "type": "server_error"}}
    )

    with pytest.raises(ProviderUnavailableError, match="counts 2"):
        list(adapter(api).answers("batch_1"))


def test_fewer_error_lines_than_the_batch_counts_failed_is_an_error() -> None:
    api = results_api([output_line("job-0", 200, openai_completion("{}"))], [])
    api.routes["GET", "/batches/batch_1"] = batch(
        "completed", output_file_id="file-out", error_file_id="file-err", request_counts={"completed": 1, "failed": 1}
    )

    with pytest.raises(ProviderUnavailableError, match="error_file_id"):
        list(adapter(api).answers("batch_1"))


def test_answers_counted_but_no_output_file_is_an_error() -> None:
    api = results_api(None, [])
    api.routes["GET", "/batches/batch_1"] = batch(
        "completed", error_file_id="file-err", request_counts={"completed": 3, "failed": 0}
    )

    with pytest.raises(ProviderUnavailableError, match="no output_file_id"):
        list(adapter(api).answers("batch_1"))


@pytest.mark.parametrize(
    "body", [{"error": {"message": "no"}}, {"id": "batch_1", "object": "list", "status": "completed"}, {"id": "b"}]
)
def test_a_200_whose_body_is_not_a_batch_is_no_status(body: dict[str, Any]) -> None:
    api = Api({("GET", "/batches/batch_1"): body})

    with pytest.raises(ProviderUnavailableError):
        adapter(api).status("batch_1")
    with pytest.raises(ProviderUnavailableError):
        list(adapter(api).answers("batch_1"))


def test_results_of_a_batch_still_running_are_an_error() -> None:
    api = Api({("GET", "/batches/batch_1"): batch("in_progress", output_file_id="file-out")})

    with pytest.raises(ProviderUnavailableError, match="has not ended"):
        list(adapter(api).answers("batch_1"))
