"""The local provider's own rate limit: GCRA per minute, with a burst, and 429 with Retry-After."""

from __future__ import annotations

import httpx
import pytest

from aijobs.local.provider import LocalProvider
from aijobs.local.ratelimit import ProviderRateLimit
from tests.support.clock import Clock
from tests.unit.test_local_provider import INPUTS, chat_body, post


def test_requests_conform_within_the_burst_then_at_the_rate() -> None:
    clock = Clock(now_ms=1_000_000)
    limit = ProviderRateLimit(rpm=60, burst_seconds=1.0, clock=clock)  # one a second

    assert [limit.admit(0) for _ in range(3)] == [None, None, 1]  # the burst: two at once
    clock.advance(0.5)
    assert limit.admit(0) == 1
    clock.advance(0.5)
    assert limit.admit(0) is None
    clock.advance(10)
    assert [limit.admit(0) for _ in range(3)] == [None, None, 1]  # idle credit is the burst, no more


def test_tokens_are_counted_per_request_and_a_large_request_goes_first_then_waits_its_cost_out() -> None:
    clock = Clock(now_ms=1_000_000)
    limit = ProviderRateLimit(tpm=6_000, burst_seconds=1.0, clock=clock)  # 100 tokens a second

    assert limit.admit(1_000) is None  # conforms when it arrives; owes 10 s
    assert limit.admit(1) == 9
    clock.advance(9)
    assert limit.admit(1) is None


def test_a_request_refused_is_not_counted() -> None:
    clock = Clock(now_ms=1_000_000)
    limit = ProviderRateLimit(rpm=60, burst_seconds=0.0, clock=clock)
    assert limit.admit(0) is None
    assert [limit.admit(0) for _ in range(5)] == [1] * 5
    clock.advance(1)
    assert limit.admit(0) is None


def test_a_limit_under_one_a_minute_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 a minute"):
        ProviderRateLimit(rpm=0)


def test_beyond_its_limit_the_provider_answers_429_with_retry_after_and_bills_nothing() -> None:
    with LocalProvider(latency_seconds=0, rpm=60) as server, httpx.Client(trust_env=False) as http:
        responses = [post(http, server, chat_body("classify", INPUTS["classify"][0])) for _ in range(3)]

    assert [response.status_code for response in responses] == [200, 200, 429]
    assert responses[2].headers["Retry-After"] == "1"
    assert responses[2].json()["error"]["code"] == "rate_limit_exceeded"
    refused = server.log[2]
    assert (refused.status, refused.limited, refused.prompt_tokens, refused.completion_tokens) == (429, True, 0, 0)
    assert not server.log[0].limited
