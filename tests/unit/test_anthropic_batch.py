"""The Message Batches adapter against a scripted Anthropic API (httpx.MockTransport) and against the
local provider's: what it submits, how it reads status and results, cancel, and finding a batch by
the record it was submitted for."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aijobs.local.provider import LocalProvider
from engine.core.batches import BatchState
from engine.core.errors import (
    JobError,
    OutputTooLargeError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from engine.gateway.anthropic import message_body
from engine.gateway.anthropic_batch import (
    MAX_BYTES,
    MAX_LINE_BYTES,
    MAX_LINES,
    AnthropicBatchProvider,
    batch_tag,
)
from engine.gateway.batches import BatchLine
from engine.gateway.openai import static_api_key
from tests.support.anthropic_sdk import sdk_batch
from tests.support.providers import completion_request
from tests.unit.test_anthropic_provider import JSON, MODEL, error, message

Handler = Callable[[httpx.Request], httpx.Response]
METADATA = {"aijobs_batch": "0001764979200000.1a2b3c4d.part-1"}
TAG = batch_tag(METADATA)
ROOT = "https://api.anthropic.com"


def batch(
    batch_id: str = "msgbatch_1",
    status: str = "ended",
    *,
    succeeded: int = 0,
    errored: int = 0,
    canceled: int = 0,
    expired: int = 0,
    processing: int = 0,
    cancelled_at: str | None = None,
    created_at: str = "2026-12-06T01:00:00Z",
) -> dict[str, Any]:
    return {
        "id": batch_id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": processing,
            "succeeded": succeeded,
            "errored": errored,
            "canceled": canceled,
            "expired": expired,
        },
        "ended_at": None,
        "created_at": created_at,
        "expires_at": "2026-12-07T01:00:00Z",
        "archived_at": None,
        "cancel_initiated_at": cancelled_at,
        "results_url": f"{ROOT}/v1/messages/batches/{batch_id}/results" if status == "ended" else None,
    }


def result(line: str, kind: str, tag: str = TAG, **fields: Any) -> bytes:
    return json.dumps({"custom_id": f"{tag}-{line}", "result": {"type": kind, **fields}}).encode() + b"\n"


class Api:
    """Routes (method, path) to a response or a handler; records every request."""

    def __init__(self, routes: dict[tuple[str, str], Handler | dict[str, Any] | bytes]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json=error("not_found_error"))
        if isinstance(route, bytes):
            return httpx.Response(200, content=route)
        if isinstance(route, dict):
            return httpx.Response(200, json=route)
        return route(request)

    def paths(self) -> list[str]:
        return [f"{request.method} {request.url.path}" for request in self.requests]


def adapter(api: Api, base_url: str = ROOT) -> AnthropicBatchProvider:
    client = httpx.Client(transport=httpx.MockTransport(api))
    return AnthropicBatchProvider(base_url, static_api_key("sk-ant-test"), client=client)


def lines(count: int = 2) -> list[BatchLine]:
    return [BatchLine(f"j{index:010d}", completion_request(MODEL)) for index in range(count)]


# --- submit ----------------------------------------------------------------------------------------


def test_a_batch_is_one_post_of_its_requests_each_tagged_with_its_record() -> None:
    # Given Anthropic's batches endpoint
    api = Api({("POST", "/v1/messages/batches"): batch(status="in_progress", processing=2)})

    # When two lines are submitted for a record
    batch_id = adapter(api, f"{ROOT}/v1").submit(lines(2), METADATA)

    # Then one POST carries both, each custom_id the record's tag and the line's id, params the real-time body
    assert batch_id == "msgbatch_1"
    (request,) = api.requests
    assert (request.headers["x-api-key"], request.headers["anthropic-version"]) == ("sk-ant-test", "2023-06-01")
    body = json.loads(request.content)
    assert sdk_batch(body) == body
    assert [item["custom_id"] for item in body["requests"]] == [f"{TAG}-j0000000000", f"{TAG}-j0000000001"]
    # (exactly a real-time call's: MODEL, Claude Haiku 4.5, answers in the JSON output format)
    assert body["requests"][0]["params"] == message_body(completion_request(MODEL), json_output=True)
    assert len(TAG) + 1 + len("j0000000000") <= 64


def test_line_bytes_add_up_to_the_body_and_the_limits_are_anthropic_s() -> None:
    api = Api({("POST", "/v1/messages/batches"): batch(status="in_progress")})
    provider = adapter(api)
    submitted = lines(3)
    provider.submit(submitted, METADATA)
    assert (
        sum(provider.line_bytes(line) for line in submitted)
        == len(api.requests[0].content) - len(b'{"requests":[]}') + 1
    )
    assert (
        (provider.min_lines, provider.max_lines, provider.max_bytes)
        == (1, MAX_LINES, MAX_BYTES)
        == (1, 100_000, 256_000_000)
    )


def test_a_line_id_anthropic_would_refuse_is_refused_before_anything_is_sent() -> None:
    api = Api({})
    with pytest.raises(ValueError, match="custom_id"):
        adapter(api).submit([BatchLine("line.1", completion_request(MODEL))], METADATA)
    assert api.requests == []


@pytest.mark.parametrize(
    ("status", "expected"),
    [(429, ProviderRateLimitedError), (529, ProviderUnavailableError), (400, ProviderRejectedError)],
)
def test_a_refused_submit_is_the_error_of_its_status(status: int, expected: type[JobError]) -> None:
    api = Api({("POST", "/v1/messages/batches"): lambda _: httpx.Response(status, json=error("any"))})
    with pytest.raises(expected):
        adapter(api).submit(lines(1), METADATA)


# --- status ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("object_", "state", "counts"),
    [
        (batch(status="in_progress", processing=3), BatchState.PENDING, (0, 0)),
        (batch(status="canceling", processing=3, cancelled_at="2026-12-06T02:00:00Z"), BatchState.PENDING, (0, 0)),
        (batch(succeeded=2, errored=1), BatchState.COMPLETED, (2, 1)),
        (batch(succeeded=1, expired=2), BatchState.EXPIRED, (1, 0)),
        (batch(succeeded=1, canceled=2, cancelled_at="2026-12-06T02:00:00Z"), BatchState.CANCELLED, (1, 0)),
    ],
)
def test_a_status_is_the_batch_s_processing_status_and_counts(
    object_: dict[str, Any], state: BatchState, counts: tuple[int, int]
) -> None:
    status = adapter(Api({("GET", "/v1/messages/batches/msgbatch_1"): object_})).status("msgbatch_1")
    assert (status.state, (status.answered, status.failed)) == (state, counts)


@pytest.mark.parametrize("body", [error("overloaded_error"), {"id": "msgbatch_1", "type": "message"}, [1]])
def test_a_200_that_is_no_batch_is_an_error_to_poll_again(body: Any) -> None:
    api = Api({("GET", "/v1/messages/batches/msgbatch_1"): lambda _: httpx.Response(200, json=body)})
    with pytest.raises(ProviderUnavailableError):
        adapter(api).status("msgbatch_1")


# --- results ---------------------------------------------------------------------------------------


def test_results_of_every_type() -> None:
    # Given an ended batch with a result of each kind
    results = b"".join(
        [
            result("j0000000000", "succeeded", message=message(cache_read=30)),
            result("j0000000001", "errored", error=error("invalid_request_error")),
            result("j0000000002", "errored", error=error("overloaded_error")),
            result("j0000000003", "canceled"),
            result("j0000000004", "expired"),
        ]
    )
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(succeeded=1, errored=2, canceled=1, expired=1),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): results,
        }
    )

    # When its answers are read
    answers = {answer.custom_id: answer for answer in adapter(api).answers("msgbatch_1")}

    # Then a success is a completion read as a real-time one, an error the typed error of its type,
    # and requests never run are no answer (handed back to real time by the batcher)
    assert set(answers) == {"j0000000000", "j0000000001", "j0000000002"}
    completion = answers["j0000000000"].completion
    assert completion is not None
    assert (completion.input_tokens, completion.cached_input_tokens, completion.model) == (70, 30, MODEL)
    assert isinstance(answers["j0000000001"].error, ProviderRejectedError)
    assert isinstance(answers["j0000000002"].error, ProviderUnavailableError)


def test_results_are_read_from_the_results_url_on_the_api_s_host_only() -> None:
    # Given a batch whose results_url names another host
    foreign = batch(succeeded=1) | {"results_url": "https://collector.example/steal"}
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): foreign,
            ("GET", "/v1/messages/batches/msgbatch_1/results"): result("j0000000000", "succeeded", message=message()),
        }
    )

    answers = list(adapter(api).answers("msgbatch_1"))

    # Then the key goes to the API's documented results path, never to that host
    assert [answer.custom_id for answer in answers] == ["j0000000000"]
    assert all(request.url.host == "api.anthropic.com" for request in api.requests)


def test_results_that_hold_fewer_lines_than_counted_are_an_error_to_read_again() -> None:
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(succeeded=2),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): result("j0000000000", "succeeded", message=message()),
        }
    )
    with pytest.raises(ProviderUnavailableError, match="hold 1 lines; the batch counts 2"):
        list(adapter(api).answers("msgbatch_1"))


def test_results_of_a_batch_still_running_are_an_error() -> None:
    api = Api({("GET", "/v1/messages/batches/msgbatch_1"): batch(status="in_progress", processing=1)})
    with pytest.raises(ProviderUnavailableError, match="has not ended"):
        list(adapter(api).answers("msgbatch_1"))
    assert api.paths() == ["GET /v1/messages/batches/msgbatch_1"]


def test_a_result_line_past_the_bound_is_an_answer_too_large_and_the_rest_are_read() -> None:
    huge = message([{"type": "text", "text": "x" * (MAX_LINE_BYTES + 10)}], stop_reason="end_turn")
    results = result("j0000000000", "succeeded", message=huge) + result("j0000000001", "succeeded", message=message())
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(succeeded=2),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): results,
        }
    )
    answers = list(adapter(api).answers("msgbatch_1"))
    assert [answer.custom_id for answer in answers] == ["j0000000000", "j0000000001"]
    assert isinstance(answers[0].error, OutputTooLargeError)
    assert answers[1].completion is not None


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        json.dumps(
            {"custom_id": f"{TAG}-j0000000000", "result": {"type": "succeeded", "message": {"type": "message"}}}
        ).encode()
        + b"\n",
        json.dumps({"custom_id": f"{TAG}-j0000000000", "result": {"type": "something_new"}}).encode() + b"\n",
    ],
)
def test_a_malformed_result_is_the_provider_s_fault_for_its_line(line: bytes) -> None:
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(succeeded=0),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): line,
        }
    )
    answers = list(adapter(api).answers("msgbatch_1"))
    assert all(isinstance(answer.error, ProviderUnavailableError) for answer in answers)


# --- cancel ----------------------------------------------------------------------------------------


def test_cancel_posts_to_the_batch_s_cancel() -> None:
    api = Api({("POST", "/v1/messages/batches/msgbatch_1/cancel"): batch(status="canceling")})
    adapter(api).cancel("msgbatch_1")
    assert api.paths() == ["POST /v1/messages/batches/msgbatch_1/cancel"]


def test_a_refused_cancel_of_a_batch_that_has_ended_is_no_error_and_stands_otherwise() -> None:
    refuse = lambda _: httpx.Response(400, json=error("invalid_request_error"))  # noqa: E731
    ended = Api(
        {
            ("POST", "/v1/messages/batches/msgbatch_1/cancel"): refuse,
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(),
        }
    )
    adapter(ended).cancel("msgbatch_1")
    running = Api(
        {
            ("POST", "/v1/messages/batches/msgbatch_1/cancel"): refuse,
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(status="in_progress"),
        }
    )
    with pytest.raises(ProviderRejectedError):
        adapter(running).cancel("msgbatch_1")


# --- find: adopting a batch by its record ----------------------------------------------------------


def listing(*batches: dict[str, Any], has_more: bool = False) -> dict[str, Any]:
    return {"data": list(batches), "has_more": has_more, "first_id": None, "last_id": None}


def test_an_ended_batch_is_found_by_the_tag_of_its_first_result_and_read_once() -> None:
    # Given three ended batches, one of them submitted for the record (by a pass that died since)
    api = Api(
        {
            ("GET", "/v1/messages/batches"): listing(
                batch("msgbatch_3", succeeded=1), batch("msgbatch_2", succeeded=1), batch("msgbatch_1", succeeded=1)
            ),
            ("GET", "/v1/messages/batches/msgbatch_3/results"): result(
                "j0000000000", "succeeded", tag="0" * 16, message=message()
            ),
            ("GET", "/v1/messages/batches/msgbatch_2/results"): result("j0000000000", "succeeded", message=message()),
            (
                "GET",
                "/v1/messages/batches/msgbatch_1/results",
            ): b'{"custom_id": "not-the-engine-s", "result": {"type": "canceled"}}\n',
        }
    )
    provider = adapter(api)

    # When a new process looks for the record's batch, twice
    first = provider.find(METADATA)
    second = provider.find(METADATA)

    # Then it is found, and each ended batch's results were read once
    assert first == second == ["msgbatch_2"]
    assert api.paths().count("GET /v1/messages/batches/msgbatch_2/results") == 1
    assert api.paths().count("GET /v1/messages/batches/msgbatch_1/results") == 1


def test_an_ended_batch_is_told_apart_whatever_the_order_of_its_first_result_s_fields() -> None:
    # Given results whose first line holds a long message before its custom_id
    long_answer = message([{"type": "text", "text": "x" * 20_000}], stop_reason="end_turn")
    line = json.dumps({"result": {"type": "succeeded", "message": long_answer}, "custom_id": f"{TAG}-j0"})
    api = Api(
        {
            ("GET", "/v1/messages/batches"): listing(batch("msgbatch_1", succeeded=2)),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): line.encode() + b"\n" + result("j1", "canceled"),
        }
    )

    assert adapter(api).find(METADATA) == ["msgbatch_1"]


def test_a_batch_this_process_submitted_is_found_while_it_runs() -> None:
    api = Api(
        {
            ("POST", "/v1/messages/batches"): batch("msgbatch_9", status="in_progress"),
            ("GET", "/v1/messages/batches"): listing(batch("msgbatch_9", status="in_progress")),
        }
    )
    provider = adapter(api)
    provider.submit(lines(1), METADATA)
    assert provider.find(METADATA) == ["msgbatch_9"]
    assert provider.find({"aijobs_batch": "another"}) == []


def test_a_running_batch_that_cannot_be_told_apart_makes_find_an_error_to_look_again() -> None:
    # Given a batch still running that this process did not submit (it may be the record's)
    api = Api(
        {("GET", "/v1/messages/batches"): listing(batch("msgbatch_5", status="in_progress"), batch("msgbatch_4"))}
    )
    api.routes[("GET", "/v1/messages/batches/msgbatch_4/results")] = result("j0", "canceled", tag="f" * 16)

    # Then find does not say "none" (the batcher would create the batch again): it is asked again later
    with pytest.raises(ProviderUnavailableError, match="cannot be told apart"):
        adapter(api).find(METADATA)


def test_find_pages_through_the_listing_and_stops_at_batches_too_old_to_be_the_record_s() -> None:
    # Given a first page of recent batches, then a page whose last batch is older than the batcher ever waits
    pages = {
        None: listing(batch("msgbatch_3", succeeded=1), has_more=True),
        "msgbatch_3": listing(
            batch("msgbatch_2", succeeded=1), batch("msgbatch_1", created_at="2020-01-01T00:00:00Z"), has_more=True
        ),
    }

    def page(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=pages[request.url.params.get("after_id")])

    api = Api(
        {
            ("GET", "/v1/messages/batches"): page,
            ("GET", "/v1/messages/batches/msgbatch_3/results"): result(
                "j0", "succeeded", tag="a" * 16, message=message()
            ),
            ("GET", "/v1/messages/batches/msgbatch_2/results"): result("j0", "succeeded", message=message()),
        }
    )

    # When the record's batch is looked for
    found = adapter(api).find(METADATA)

    # Then the second page was asked for after the first's last batch, and the old batch never read
    assert found == ["msgbatch_2"]
    assert "GET /v1/messages/batches/msgbatch_1/results" not in api.paths()
    assert [
        request.url.params.get("limit") for request in api.requests if request.url.path == "/v1/messages/batches"
    ] == ["100", "100"]


# --- against the local provider's Message Batches API ------------------------------------------------


@pytest.fixture
def slow_batches() -> Any:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=3600) as provider:
        yield provider


def test_the_local_api_runs_a_batch_through_the_adapter(server: LocalProvider) -> None:
    # Given a batch of three lines, the second of which the local provider refuses (max_tokens 0)
    provider = AnthropicBatchProvider(server.anthropic_url, static_api_key(None))
    refused = BatchLine("j0000000001", completion_request(MODEL, max_tokens=0))
    batch_id = provider.submit([lines(1)[0], refused, BatchLine("j0000000002", completion_request(MODEL))], METADATA)

    # When it has ended
    status = provider.status(batch_id)
    answers = {answer.custom_id: answer for answer in provider.answers(batch_id)}

    # Then the answers are read, the refused line as a rejected request, and the batch is found by a stranger
    assert (status.state, status.answered, status.failed) == (BatchState.COMPLETED, 2, 1)
    assert isinstance(answers["j0000000001"].error, ProviderRejectedError)
    assert all(answers[line].completion is not None for line in ("j0000000000", "j0000000002"))
    assert AnthropicBatchProvider(server.anthropic_url, static_api_key(None)).find(METADATA) == [batch_id]
    assert [entry.batch_id for entry in server.log] == [batch_id] * 3


def test_a_local_batch_cancelled_while_running_ends_with_its_requests_canceled(slow_batches: LocalProvider) -> None:
    provider = AnthropicBatchProvider(slow_batches.anthropic_url, static_api_key(None))
    batch_id = provider.submit(lines(2), METADATA)

    provider.cancel(batch_id)

    status = provider.status(batch_id)
    assert status.state is BatchState.CANCELLED
    assert list(provider.answers(batch_id)) == []
    assert slow_batches.log == []


@given(st.lists(JSON, max_size=6))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_any_results_lines_are_answers_or_skipped_never_a_crash(values: list[Any]) -> None:
    # Given results of any JSON lines, some shaped like results
    lines = b"".join(json.dumps(value).encode() + b"\n" for value in values)
    api = Api(
        {
            ("GET", "/v1/messages/batches/msgbatch_1"): batch(),
            ("GET", "/v1/messages/batches/msgbatch_1/results"): lines,
        }
    )

    # Then each line is an answer with exactly one of a completion or an error, or no answer
    for answer in adapter(api).answers("msgbatch_1"):
        assert (answer.completion is None) != (answer.error is None)
