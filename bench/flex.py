"""The flex figures of `make bench`: what background jobs cost at the provider's flex tier against the same
jobs at its standard tier, and whether every one still ends before its deadline.

On the embedded stack (moto, the local provider over HTTP, the worker's event source mappings), side by
side in one run: the same background jobs, deadlines spread from 15 to 37 minutes away (too near for a
batch with its default settings), twice: with AIJOBS_FLEX=on, where the local provider answers flex
slower and refuses a share of flex requests with its 429 "Resource Unavailable"; then with it off.
Their cost as the jobs' usage records it; each job's end against its deadline; the refusals and the
answers served at the standard tier from the provider's own log.
`python -m bench.flex` runs it alone (`--jobs 50` for a quicker run).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from decimal import Decimal

from rich.console import Console

from bench.batches import Run, embedded, send, until_ended
from bench.report import Figure, print_figures
from engine.core import JobStatus

JOBS = 200
# A model OpenAI sells at a flex tier (priced at half its standard price).
MODEL = "gpt-5-mini"
# The jobs' deadlines: from 15 to 37 minutes away, evenly.
NEAREST_DEADLINE_SECONDS, FARTHEST_DEADLINE_SECONDS = 15 * 60, 37 * 60
# The local provider at flex: slower than its standard tier, and refusing a tenth of flex requests.
FLEX_LATENCY_SECONDS = 0.2
REFUSAL_RATE = 0.1


@dataclass(frozen=True, slots=True)
class FlexRun:
    run: Run
    # Flex requests the provider refused (429), and answers it served at its standard tier.
    refused: int
    standard_answers: int

    @property
    def in_time(self) -> int:
        """Jobs that succeeded before their deadline."""
        return sum(
            1
            for job in self.run.jobs.values()
            if job.status is JobStatus.SUCCEEDED
            and job.finished_at is not None
            and job.finished_at < (job.deadline_at or 0)
        )


def deadlines(jobs: int) -> list[int]:
    """Each job's deadline in seconds, evenly from the nearest to the farthest."""
    span = FARTHEST_DEADLINE_SECONDS - NEAREST_DEADLINE_SECONDS
    return [NEAREST_DEADLINE_SECONDS + span * n // max(jobs - 1, 1) for n in range(jobs)]


def run(jobs: int, flex: bool) -> FlexRun:
    ids = [f"job-{n:05d}" for n in range(jobs)]  # the same jobs each run (each on a stack of its own)
    environment = {"AI_MODEL_PRIMARY": MODEL, "AIJOBS_FLEX": "on" if flex else "off"}
    options = {"provider_flex_latency_seconds": FLEX_LATENCY_SECONDS, "provider_flex_refusal_rate": REFUSAL_RATE}
    with embedded(environment, **options) as (stack, requests, store):
        started = time.monotonic()
        send(stack, ids, deadlines(jobs))
        ended = until_ended(store, ids)
        seconds = time.monotonic() - started
        assert stack.provider is not None
        log = stack.provider.log
    refused = sum(1 for entry in log if entry.status == 429)
    standard = sum(1 for entry in log if entry.status == 200 and entry.service_tier != "flex")
    return FlexRun(Run(ended, sum(requests.of("dynamodb").values()), seconds), refused, standard)


def flex_figures(console: Console, jobs: int = JOBS) -> list[Figure]:
    console.print(f"flex: {jobs} background jobs at the flex tier, then at the standard tier ...")
    flexed = run(jobs, flex=True)
    standard = run(jobs, flex=False)
    ratio = flexed.run.cost / standard.run.cost
    recorded = sum((job.usage.standard_cost_usd for job in flexed.run.jobs.values()), Decimal(0))
    in_time = flexed.in_time + standard.in_time
    return [
        Figure(
            "flex ÷ standard tier: cost of the same background jobs",
            f"{ratio:.3f}  (${flexed.run.cost:.4f} / ${standard.run.cost:.4f}; recorded in real time ${recorded:.4f})",
            "<= 0.55",
            ratio <= Decimal("0.55"),
            f"{jobs} classify jobs as SQS messages on the background queue, deadlines "
            f"{NEAREST_DEADLINE_SECONDS // 60} to {FARTHEST_DEADLINE_SECONDS // 60} min away, AIJOBS_FLEX on then off; "
            f"{MODEL} list prices, flex at 0.5; "
            f"the local provider answers flex in {FLEX_LATENCY_SECONDS:g} s and refuses {REFUSAL_RATE:.0%} of flex "
            f"requests (429): {flexed.refused} refused, {flexed.standard_answers} answers at the standard tier; "
            f"{flexed.run.seconds:.0f} s at flex, {standard.run.seconds:.0f} s at the standard tier",
        ),
        Figure(
            "flex: background jobs ended before their deadline",
            f"{in_time / (2 * jobs):.0%}  ({flexed.in_time} of {jobs} at flex, {standard.in_time} of {jobs} standard)",
            "100%",
            in_time == 2 * jobs,
            "each job succeeded, and its finished_at came before its deadline_at, as the table records them",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=JOBS, help="background jobs at the flex tier, and at the standard")
    args = parser.parse_args(argv)
    print_figures("aijobs bench, flex", lambda console: flex_figures(console, args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
