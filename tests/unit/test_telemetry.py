"""Metrics by job type and model (engine.telemetry, engine.observability.JobMetrics): what an
invocation's attempts add up to, written as one EMF document per (job type, model)."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from engine.core import AttemptOutcome, AttemptRecord, ErrorCode, JobErrorInfo, Lane, Via
from engine.core.outcomes import Failed, Released, Succeeded
from engine.observability import job_metrics, metrics
from engine.telemetry import count_latency, count_outcome, count_retry


def attempt(job_type: str, model: str, latency_ms: int, cost: str) -> AttemptRecord:
    return AttemptRecord(
        job_id="j",
        attempt=1,
        user_id="acme",
        job_type=job_type,
        started_at=0,
        finished_at=latency_ms,
        outcome=AttemptOutcome.SUCCEEDED,
        model=model,
        calls=1,
        input_tokens=100,
        output_tokens=20,
        cached_input_tokens=60,
        reasoning_tokens=5,
        cost_usd=Decimal(cost),
        latency_ms=latency_ms,
    )


def documents(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"_aws"')]


def test_an_invocations_attempts_are_one_document_per_job_type_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    metrics.clear_metrics()
    job_metrics.clear()  # what other tests of this process counted
    limited = JobErrorInfo(ErrorCode.PROVIDER_RATE_LIMITED, "429", retryable=True)
    count_outcome("classify", Succeeded({}, "h"), attempt("classify", "gpt-4o-mini", 400, "0.0001"))
    count_outcome("classify", Succeeded({}, "h"), attempt("classify", "gpt-4o-mini", 600, "0.0002"))
    count_outcome("classify", Released(limited), attempt("classify", "gpt-4o-mini", 50, "0"))
    count_outcome("summarize", Failed(limited), None)
    count_retry("summarize", "throttled")

    job_metrics.flush()
    docs = documents(capsys.readouterr().out)

    by_key = {(doc["job_type"], doc.get("model")): doc for doc in docs}
    assert set(by_key) == {("classify", None), ("classify", "gpt-4o-mini"), ("summarize", None)}
    calls = by_key[("classify", "gpt-4o-mini")]
    # Counts summed (one value each); durations kept one value per attempt, for percentiles
    assert calls["Attempts"] == [3]
    assert calls["gen_ai.client.operation.duration"] == [0.4, 0.6, 0.05]
    assert (calls["gen_ai.client.token.usage.input"], calls["gen_ai.client.token.usage.cached_input"]) == ([300], [180])
    assert calls["CostUsd"] == [pytest.approx(0.0003)]
    jobs = by_key[("classify", None)]
    assert (jobs["Jobs_succeeded"], jobs["Jobs_retried"], jobs["Retries_provider_rate_limited"]) == ([2], [1], [1])
    summarize = by_key[("summarize", None)]
    assert (summarize["Jobs_failed"], summarize["Retries_throttled"]) == ([1], [1])
    # And the totals the alarms read join the service-wide document
    service = metrics.serialize_metric_set()["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    assert {metric["Name"] for metric in service} >= {"Attempts", "Retries_provider_rate_limited"}
    metrics.clear_metrics()


def test_nothing_is_written_when_nothing_ran(capsys: pytest.CaptureFixture[str]) -> None:
    job_metrics.clear()
    job_metrics.flush()
    assert documents(capsys.readouterr().out) == []


def test_the_time_to_answer_is_one_document_per_lane(capsys: pytest.CaptureFixture[str]) -> None:
    job_metrics.clear()
    count_latency(Lane.INTERACTIVE, 1.5)
    count_latency(Lane.INTERACTIVE, 2.5)
    count_latency(Lane.BACKGROUND, 600.0)

    job_metrics.flush()

    by_lane = {doc["lane"]: doc for doc in documents(capsys.readouterr().out)}
    assert by_lane["interactive"]["JobLatency"] == [1.5, 2.5]  # each value kept, for percentiles
    assert by_lane["background"]["JobLatency"] == [600.0]
    assert "job_type" not in by_lane["background"]


def test_a_reused_answer_counts_as_a_success_and_a_reuse_never_as_an_attempt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a job that succeeded with an answer another job paid for (no call), and one that called
    job_metrics.clear()
    metrics.clear_metrics()
    reused = replace(attempt("classify", "gpt-4o-mini", 0, "0"), calls=0, via=Via.REUSE, reused_from="j0")
    count_outcome("classify", Succeeded({}, "h", reused_from="j0"), reused)
    count_outcome("classify", Succeeded({}, "h"), attempt("classify", "gpt-4o-mini", 400, "0.0001"))

    job_metrics.flush()
    by_key = {(doc["job_type"], doc.get("model")): doc for doc in documents(capsys.readouterr().out)}

    # Then both succeeded; one reached the provider, with its latency and cost; one reused an answer
    calls = by_key[("classify", "gpt-4o-mini")]
    assert (calls["Attempts"], calls["AnswersReused"], calls["gen_ai.client.operation.duration"]) == ([1], [1], [0.4])
    assert by_key[("classify", None)]["Jobs_succeeded"] == [2]
    metrics.clear_metrics()
