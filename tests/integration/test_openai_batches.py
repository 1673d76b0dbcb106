"""The OpenAI-compatible batch adapter against the local provider's Files and Batches APIs, over HTTP:
each state a batch can end in, its answers, and the provider's log that bills them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from aijobs.local.batches import BatchFault
from aijobs.local.protocol import estimate_tokens
from aijobs.local.provider import PREFIX_BLOCK_CHARS, LocalProvider
from engine.core.batches import BatchState
from engine.core.errors import ProviderRateLimitedError, ProviderRejectedError, ProviderUnavailableError
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest
from engine.gateway.batches import BatchAnswer, BatchLine, BatchStatus
from engine.gateway.gateway import prompt_cache_key
from engine.gateway.openai import StructuredOutput, static_api_key
from engine.gateway.openai_batch import OpenAIBatchProvider
from engine.gateway.schema import system_with_schema
from tests.support.waiting import eventually

REGISTRY = JobRegistry()
CLASSIFY = REGISTRY.get("classify")
MODES: list[StructuredOutput] = ["json_schema", "json_object"]


def classify_request(text: str, labels: tuple[str, ...] = ("spam", "ham")) -> CompletionRequest:
    """A classify job's request, as the engine's gateway builds it."""
    job_input = CLASSIFY.parse_input({"text": text, "labels": list(labels)})
    prompt = CLASSIFY.render_prompt(job_input)
    return CompletionRequest(
        model="gpt-4o-mini",
        system=prompt.system,
        user=prompt.user,
        schema_name=CLASSIFY.name,
        output_schema=CLASSIFY.output_schema(job_input),
        max_tokens=CLASSIFY.max_tokens,
        timeout_seconds=30.0,
        cache_key=prompt_cache_key(CLASSIFY.name, prompt.version),
    )


def classify_lines(count: int, marker: str = "") -> list[BatchLine]:
    return [BatchLine(f"job-{i}", classify_request(f"Message number {i} {marker}".strip())) for i in range(count)]


@pytest.fixture(scope="module")
def server() -> Iterator[LocalProvider]:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=0) as provider:
        yield provider


@pytest.fixture
def provider(server: LocalProvider) -> Iterator[LocalProvider]:
    server.reset()
    server.batch_fault = None
    yield server
    server.batch_fault = None


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        yield client


def batches_of(
    provider: LocalProvider, http: httpx.Client, mode: StructuredOutput = "json_schema"
) -> OpenAIBatchProvider:
    return OpenAIBatchProvider(provider.url, static_api_key(None), structured_output=mode, client=http)


def ended(adapter: OpenAIBatchProvider, batch_id: str) -> BatchStatus:
    """The batch's status once it has ended (polled, as the engine polls it)."""

    def status_if_ended() -> BatchStatus | None:
        status = adapter.status(batch_id)
        return status if status.state.ended else None

    status = eventually(status_if_ended, what="the batch's end")
    assert status is not None
    return status


def by_id(answers: Iterator[BatchAnswer]) -> dict[str, BatchAnswer]:
    return {answer.custom_id: answer for answer in answers}


@pytest.mark.parametrize("mode", MODES)
def test_a_completed_batch_answers_every_line_validly_and_the_log_bills_each_answer(
    mode: StructuredOutput, provider: LocalProvider, http: httpx.Client
) -> None:
    adapter = batches_of(provider, http, mode)
    lines = classify_lines(4)

    batch_id = adapter.submit(lines, {"aijobs_batch": f"completed-{mode}"})
    status = ended(adapter, batch_id)
    answers = by_id(adapter.answers(batch_id))

    assert (status.state, status.answered, status.failed) == (BatchState.COMPLETED, 4, 0)
    assert sorted(answers) == [line.custom_id for line in lines]
    job_input = CLASSIFY.parse_input({"text": "any", "labels": ["spam", "ham"]})
    for line in lines:
        completion = answers[line.custom_id].completion
        assert completion is not None
        assert CLASSIFY.validate_output(job_input, completion.content).model_dump()["label"] in ("spam", "ham")
    log = provider.log
    assert [(entry.batch_id, entry.status, entry.job_type) for entry in log] == [(batch_id, 200, "classify")] * 4
    billed = sorted((entry.prompt_tokens, entry.completion_tokens, entry.cached_tokens) for entry in log)
    recorded = sorted(
        (answer.completion.input_tokens, answer.completion.output_tokens, answer.completion.cached_input_tokens)
        for answer in answers.values()
        if answer.completion is not None
    )
    assert billed == recorded


def test_a_batch_is_pending_until_its_delay_has_passed(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=3600) as slow:
        adapter = batches_of(slow, http)
        batch_id = adapter.submit(classify_lines(2), {})

        status = adapter.status(batch_id)

        assert (status.state, status.detail) == (BatchState.PENDING, "in_progress")
        assert slow.log == []


def test_an_expired_batch_answered_half_its_lines_and_the_rest_are_missing(
    provider: LocalProvider, http: httpx.Client
) -> None:
    provider.batch_fault = BatchFault.EXPIRE_HALF
    adapter = batches_of(provider, http)

    batch_id = adapter.submit(classify_lines(5), {})
    status = ended(adapter, batch_id)
    answers = by_id(adapter.answers(batch_id))

    assert (status.state, status.answered) == (BatchState.EXPIRED, 2)
    assert sorted(answers) == ["job-0", "job-1"]
    assert all(answer.completion is not None for answer in answers.values())
    assert [entry.batch_id for entry in provider.log] == [batch_id] * 2


def test_failed_lines_carry_the_error_of_their_status_and_the_others_are_answered(
    provider: LocalProvider, http: httpx.Client
) -> None:
    provider.batch_fault = BatchFault.FAILED_LINES
    adapter = batches_of(provider, http)

    batch_id = adapter.submit(classify_lines(4), {})
    status = ended(adapter, batch_id)
    answers = by_id(adapter.answers(batch_id))

    assert (status.state, status.answered, status.failed) == (BatchState.COMPLETED, 2, 2)
    assert {custom_id: type(answer.error) for custom_id, answer in answers.items()} == {
        "job-0": type(None),
        "job-1": ProviderUnavailableError,
        "job-2": type(None),
        "job-3": ProviderUnavailableError,
    }
    # A failed line is a call that billed nothing
    assert sorted((entry.status, entry.prompt_tokens > 0) for entry in provider.log) == [
        (200, True),
        (200, True),
        (500, False),
        (500, False),
    ]


def test_a_lines_fault_marker_applies_to_that_line_alone(provider: LocalProvider, http: httpx.Client) -> None:
    adapter = batches_of(provider, http)
    lines = [
        BatchLine("limited", classify_request("fault:rate_limited please")),
        BatchLine("invalid", classify_request("fault:business_invalid please")),
        BatchLine("plain", classify_request("nothing odd here")),
    ]

    batch_id = adapter.submit(lines, {})
    ended(adapter, batch_id)
    answers = by_id(adapter.answers(batch_id))

    assert isinstance(answers["limited"].error, ProviderRateLimitedError)
    invalid = answers["invalid"].completion
    assert invalid is not None
    assert json.loads(invalid.content)["label"] not in ("spam", "ham")  # answered, against the job type's rule
    assert answers["plain"].completion is not None


def test_a_line_for_a_model_the_provider_lacks_is_rejected(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, batch_delay_seconds=0, models=["gpt-4o-mini"]) as strict:
        adapter = batches_of(strict, http)
        other = BatchLine("other", replace(classify_request("x"), model="nope"))

        batch_id = adapter.submit([*classify_lines(1), other], {})
        ended(adapter, batch_id)
        answers = by_id(adapter.answers(batch_id))

        assert answers["job-0"].completion is not None
        assert isinstance(answers["other"].error, ProviderRejectedError)


def test_a_stalled_batch_stays_pending_until_cancelled_and_then_answered_nothing(
    provider: LocalProvider, http: httpx.Client
) -> None:
    provider.batch_fault = BatchFault.STALL
    adapter = batches_of(provider, http)
    batch_id = adapter.submit(classify_lines(3), {})

    # Due at once (no delay), a stalled batch is still pending however often it is asked
    assert {adapter.status(batch_id).state for _ in range(3)} == {BatchState.PENDING}

    adapter.cancel(batch_id)
    status = ended(adapter, batch_id)

    assert (status.state, status.answered) == (BatchState.CANCELLED, 0)
    assert list(adapter.answers(batch_id)) == []
    assert provider.log == []
    adapter.cancel(batch_id)  # cancelling it again, once it ended, is no error


def test_a_batch_fault_marker_in_a_line_picks_the_batchs_fault(provider: LocalProvider, http: httpx.Client) -> None:
    adapter = batches_of(provider, http)

    batch_id = adapter.submit(classify_lines(2, marker="batch-fault:stall"), {})

    assert adapter.status(batch_id).state is BatchState.PENDING
    adapter.cancel(batch_id)
    assert ended(adapter, batch_id).state is BatchState.CANCELLED


def test_batches_are_found_by_their_metadata_newest_first(provider: LocalProvider, http: httpx.Client) -> None:
    adapter = batches_of(provider, http)
    mine = {"aijobs_batch": "record-find", "model": "gpt-4o-mini"}

    first = adapter.submit(classify_lines(1), mine)
    adapter.submit(classify_lines(1), {"aijobs_batch": "someone-else"})
    second = adapter.submit(classify_lines(1), mine)

    assert adapter.find(mine) == [second, first]
    assert adapter.find({"aijobs_batch": "record-none"}) == []


def test_batch_lines_read_a_long_shared_instruction_prefix_from_the_prompt_cache(
    provider: LocalProvider, http: httpx.Client
) -> None:
    # Given requests whose system messages share a long instruction prefix, then differ (json_object
    # mode appends each job's own schema: classify's labels)
    instructions = "Follow these house rules for every message. " * 100
    labels = [("spam", "ham"), ("billing", "support"), ("a", "b"), ("x", "y")]
    requests = [replace(classify_request(f"text {i}", labels[i]), system=instructions) for i in range(4)]
    systems = [system_with_schema(instructions, request.output_schema) for request in requests]
    adapter = batches_of(provider, http, "json_object")

    batch_id = adapter.submit([BatchLine(f"job-{i}", request) for i, request in enumerate(requests)], {})
    ended(adapter, batch_id)
    answers = by_id(adapter.answers(batch_id))

    # Then each line after the first reads, from the cache, the blocks it shares with an earlier one
    cached = [answers[f"job-{i}"].completion for i in range(4)]
    assert [completion.cached_input_tokens if completion else None for completion in cached] == [
        0,
        *(estimate_tokens(systems[i][: shared_blocks(systems[i], systems[:i])]) for i in range(1, 4)),
    ]
    assert all(completion and completion.cached_input_tokens >= len(instructions) // 8 for completion in cached[1:])
    assert sum(entry.cached_tokens for entry in provider.log) == sum(c.cached_input_tokens for c in cached if c)


def shared_blocks(text: str, earlier: list[str]) -> int:
    """The characters of `text`'s longest prefix, in whole blocks, that an earlier text starts with."""
    longest = 0
    for other in earlier:
        common = next(
            (i for i, (a, b) in enumerate(zip(text, other, strict=False)) if a != b), min(len(text), len(other))
        )
        longest = max(longest, common // PREFIX_BLOCK_CHARS * PREFIX_BLOCK_CHARS)
    return longest
