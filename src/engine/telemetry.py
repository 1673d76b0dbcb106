"""What the runner counts per job type and model (engine.observability.job_metrics): outcomes,
attempts, retries by reason, provider latency, tokens by kind and cost. docs/operations.md lists
each metric and the dashboard and alarms built on them."""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit

from engine.core import AttemptRecord, JobStatus
from engine.core.outcomes import Failed, Outcome, Released, target_status
from engine.observability import job_metrics

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
    """An attempt's end: its outcome, and what its provider calls took and cost."""
    job_metrics.add(job_type, None, OUTCOME_NAMES[target_status(outcome)], 1, MetricUnit.Count)
    error = outcome.error if isinstance(outcome, Failed | Released) else None
    if isinstance(outcome, Released) and error is not None:
        count_retry(job_type, error.code.value)
    if attempt is None:
        return
    model = attempt.model
    job_metrics.add(job_type, model, "Attempts", 1, MetricUnit.Count)
    job_metrics.add(job_type, model, "gen_ai.client.operation.duration", attempt.latency_ms / 1000, MetricUnit.Seconds)
    for name, field in TOKEN_METRICS.items():
        job_metrics.add(job_type, model, name, getattr(attempt, field), MetricUnit.Count)
    job_metrics.add(job_type, model, "CostUsd", float(attempt.cost_usd), MetricUnit.NoUnit)


def count_retry(job_type: str | None, reason: str) -> None:
    """A job handed back for a later try: `reason` is an error code, `held` (another worker holds
    it), `throttled` (its model's shared limit) or `over_budget` (its user's budget)."""
    job_metrics.add(job_type, None, f"Retries_{reason}", 1, MetricUnit.Count)
