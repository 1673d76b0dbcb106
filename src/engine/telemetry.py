"""What the runner counts per job type and model (engine.observability.job_metrics): outcomes,
attempts, retries by reason, provider latency, tokens by kind and cost, answers reused; and per
lane, how long jobs took from creation to answer. docs/operations.md lists each metric and the
dashboard and alarms built on them."""

from __future__ import annotations

from engine.core import AttemptRecord, JobStatus, Lane, Via
from engine.core.outcomes import Outcome, Released, target_status
from engine.observability import MetricUnit, job_metrics

# The job's status after an attempt, as the outcome metric names it (the worker's fates).
OUTCOME_NAMES = {
    JobStatus.SUCCEEDED: "Jobs_succeeded",
    JobStatus.FAILED: "Jobs_failed",
    JobStatus.QUEUED: "Jobs_retried",
    JobStatus.CANCELLED: "Jobs_cancelled",
}
# Token counts by kind (OpenTelemetry's gen_ai.token.type, as a suffix).
TOKEN_METRICS = {
    "gen_ai.client.token.usage.input": "input_tokens",
    "gen_ai.client.token.usage.output": "output_tokens",
    "gen_ai.client.token.usage.cached_input": "cached_input_tokens",
    "gen_ai.client.token.usage.cache_write_input": "cache_write_input_tokens",
    "gen_ai.client.token.usage.reasoning": "reasoning_tokens",
}


def count_outcome(job_type: str | None, outcome: Outcome, attempt: AttemptRecord | None) -> None:
    """An attempt's end: its outcome, and what its provider calls took and cost. A job handed back
    before any provider call (held by a shared limit or a budget, deferred) is no attempt's outcome:
    the runner counts it where it decides it (`count_retry`)."""
    if attempt is None and isinstance(outcome, Released):
        return
    count_ended(job_type, target_status(outcome))
    if attempt is None:
        return
    if isinstance(outcome, Released) and outcome.error is not None:
        count_retry(job_type, outcome.error.code.value)
    model = attempt.model
    if attempt.via is Via.REUSE:
        # An answer already paid for: no attempt reached the provider; the call it saved is counted.
        job_metrics.add(job_type, model, "AnswersReused", 1, MetricUnit.Count)
        return
    job_metrics.add(job_type, model, "Attempts", 1, MetricUnit.Count)
    job_metrics.add(job_type, model, "gen_ai.client.operation.duration", attempt.latency_ms / 1000, MetricUnit.Seconds)
    for name, field in TOKEN_METRICS.items():
        job_metrics.add(job_type, model, name, getattr(attempt, field), MetricUnit.Count)
    job_metrics.add(job_type, model, "CostUsd", float(attempt.cost_usd), MetricUnit.NoUnit)


def count_latency(lane: Lane, seconds: float) -> None:
    """How long a job took from its creation to its answer, by lane: what someone waited for it."""
    job_metrics.add_by_lane(lane.value, "JobLatency", seconds, MetricUnit.Seconds)


def count_ended(job_type: str | None, status: JobStatus) -> None:
    """A job's status after an attempt, or a job the runner ended without one (a refused claim:
    deadline passed, attempts spent, cancel requested)."""
    job_metrics.add(job_type, None, OUTCOME_NAMES[status], 1, MetricUnit.Count)


def count_retry(job_type: str | None, reason: str) -> None:
    """A job handed back for a later try: `reason` is an error code, `held` (another worker holds
    it), `throttled` (its model's shared limit) or `over_budget` (its user's budget)."""
    job_metrics.add(job_type, None, f"Retries_{reason}", 1, MetricUnit.Count)
