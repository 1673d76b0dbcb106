"""`make soak` at a small size (`python -m bench.soak`): jobs of every fault and lane and a pipeline of
every plan, under duplicated deliveries, a stream that repeats its records and killed invocations; the
run must pass every check of its table, so that a change that breaks the soak (or what it checks) fails
`make test`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The checks of the pipelines' part that the table must show (bench.soak_pipelines).
PIPELINE_ROWS = (
    "steps advanced twice",
    "children run twice at once",
    "parents whose usage differs",
    "invocations killed as planned",
)


def test_a_small_soak_with_every_pipeline_plan_passes_every_check() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--jobs", "20", "--pipelines", "9", "--budget", "240"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )

    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "soak passed" in result.stdout
    assert "FAIL" not in result.stdout
    for row in PIPELINE_ROWS:
        assert row in result.stdout
