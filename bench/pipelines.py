"""The pipeline figures of `make bench` (docs/pipelines.md), on the embedded stack:

1. a `summarize_long` of a 1 MB text in the background lane, twice: with the provider's batch API on
   (its children, the parts and the summary of the summaries, go through batches), then in real time;
   the parent's cost as its usage records it (its children's, summed), the one against the other;
2. the time from a pipeline's last child's end to the parent's own, for PARENTS `summarize_long`s in
   real time: the table's stream read, the child counted on its parent, the parent's message sent
   and its worker's claim and finish.
`python -m bench.pipelines` runs it alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from decimal import Decimal

from rich.console import Console

from aijobs.client import AiJobsClient
from aijobs.local.devstack import local_session
from bench.batches import batch_settings, embedded, until_ended
from bench.report import Figure, print_figures
from engine.core import Job, JobStatus
from engine.definitions.pipelines import split_text
from engine.pipelines import children_ids
from engine.store import DynamoJobStore

TEXT_BYTES = 1_000_000
PARENTS = 10
SENTENCE = "The supplier delivered the goods late, and the invoice for them was paid on the due date. "


def text_of(size: int, seed: int = 0) -> str:
    """A text of about `size` bytes, numbered so that no two parts are the same."""
    sentences = max(size // len(SENTENCE), 1)
    return "".join(f"{seed}.{n}: {SENTENCE}" for n in range(sentences))[:size]


@dataclass(frozen=True, slots=True)
class Pipeline:
    parent: Job
    children: list[Job]

    @property
    def advance_ms(self) -> int:
        """From the last child's end to the parent's."""
        last = max(child.finished_at or 0 for child in self.children)
        return (self.parent.finished_at or 0) - last


def finished(store: DynamoJobStore, job_ids: list[str]) -> list[Pipeline]:
    parents = until_ended(store, job_ids)
    pipelines = []
    for job_id in job_ids:
        parent = parents[job_id]
        if parent.status is not JobStatus.SUCCEEDED:
            raise RuntimeError(f"a bench pipeline ended {parent.status.value}: {parent.error}")
        ids = [child for step in children_ids(parent) for child in step]
        pipelines.append(Pipeline(parent, list(store.get_jobs(ids).values())))
    return pipelines


def run(texts: list[str], batched: bool) -> list[Pipeline]:
    """`summarize_long` of each text, in the background lane, on an embedded stack of their own."""
    with embedded(batch_settings() if batched else {}) as (stack, _, store):
        client = AiJobsClient.from_settings(stack.settings, local_session())
        ids = []
        for n, text in enumerate(texts):
            view = client.submit("summarize_long", "bench", {"text": text}, job_id=f"long-{n:03d}", lane="background")
            ids.append(view.job_id)
        return finished(store, ids)


def cost(pipeline: Pipeline) -> Decimal:
    return pipeline.parent.usage.cost_usd


def pipelines_figures(console: Console, text_bytes: int = TEXT_BYTES, parents: int = PARENTS) -> list[Figure]:
    text = text_of(text_bytes)
    parts = len(split_text(text))
    console.print(f"pipelines: summarize_long of {text_bytes:,} bytes ({parts} parts) through batches ...")
    (batched,) = run([text], batched=True)
    console.print("pipelines: the same in real time, and more pipelines for the advance time ...")
    small = [text_of(30_000, seed) for seed in range(1, parents + 1)]
    realtime, *timed = run([text, *small], batched=False)
    advance = sorted(pipeline.advance_ms for pipeline in [realtime, *timed])
    p95 = advance[min(len(advance) - 1, round(0.95 * (len(advance) - 1)))]
    return [
        Figure(
            f"pipelines: cost of a {text_bytes:,}-byte summarize_long, batches ÷ real time",
            f"{cost(batched) / cost(realtime):.3f}  (${cost(batched):.5f} / ${cost(realtime):.5f}; "
            f"{len(batched.children)} children each)",
            "<= 0.55",
            cost(batched) / cost(realtime) <= Decimal("0.55"),
            f"the parent's usage (its children's, summed) on the embedded stack, background lane; "
            f"AIJOBS_BATCH_API=on against off; {parts} parts of ~4000 tokens, then their summary",
        ),
        Figure(
            "pipelines: last child's end to the parent's, p95",
            f"{p95 / 1000:.2f}s  (p50 {statistics.median(advance) / 1000:.2f}s over {len(advance)} pipelines)",
            "<= 5s",
            p95 <= 5000,
            "finished_at of the parent less its last child's, in real time on the embedded stack (its stream "
            "polled every 0.2 s, SQS long polling, moto serialized)",
        ),
    ]


def main() -> int:
    print_figures("aijobs bench, pipelines", pipelines_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
