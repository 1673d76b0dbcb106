"""The worker: a batch of deliveries from one queue, and a disposition for each.

Every batch goes one way. Its jobs are claimed side by side. They are admitted together when shared
limits are set or someone is capped (engine.fleet: one reservation per user, one take per model);
otherwise admission passes them through at no cost. Background jobs whose deadlines allow it are
kept for a provider's batch (engine.batching.intake, docs/batches.md) instead of run. Each of the
others runs on a thread of its own once it is admitted, background jobs as capacity comes (the
provider call dominates). A delivery's disposition is available as soon as it is decided, for the
caller to act on. When the batch is done, what the calls did not use is settled. Lambda's side (SQS
records, batch item failures, hiding a message for its disposition's time) belongs to handlers.worker.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import partial

from engine.batching.intake import Batched, BatchIntake, Keeping, NotKept, Planner, RunNow
from engine.core import Ack, Delivery, Disposition, Fate, Lane, Retry
from engine.core.errors import InternalError
from engine.definitions.pipelines import PipelineDefinition
from engine.fleet.admission import Admission, Ask, Verdict
from engine.observability import log_unexpected
from engine.retry import backoff_seconds
from engine.runner import FINISH_MARGIN_MS, Claimed, JobRunner, RemainingMs

# A batch holds at most 10 SQS records; each gets a thread of its own.
BATCH_CONCURRENCY = 10


class Worker:
    def __init__(
        self,
        runner: JobRunner,
        concurrency: int = BATCH_CONCURRENCY,
        admission: Admission | None = None,
        planner: Planner | None = None,
        batching: BatchIntake | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._runner = runner
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="aijobs-record")
        # Shared limits and budgets (engine.fleet): None when neither is configured.
        self._admission = admission
        self._planner = planner
        # The providers' batch APIs (docs/batches.md): None when off.
        self._batching = batching
        self._rng = rng or random.Random()

    @contextmanager
    def running(
        self, deliveries: Sequence[Delivery], remaining_ms: RemainingMs | None = None
    ) -> Iterator[list[Future[Disposition]]]:
        """Run a batch of deliveries from one queue. Yields each one's disposition, in order, each resolved as
        soon as it is decided; leaving waits for them all, then settles what admission took and the
        calls did not use."""
        lane = deliveries[0].lane if deliveries else Lane.INTERACTIVE
        # Shared limits, or someone capped: the batch is admitted; else admission lets it through.
        admission = self._admission if self._admission is not None and self._admission.active() else None
        # Background jobs may go to a provider's batch: claimed with its terms, then kept for it.
        batching = self._batching if lane is Lane.BACKGROUND else None
        claim = partial(self._runner.claim, remaining_ms=remaining_ms, batch=batching.terms() if batching else None)
        steps = list(self._executor.map(claim, deliveries))
        dispositions: dict[int, Future[Disposition]] = {
            index: _decided(step) for index, step in enumerate(steps) if not isinstance(step, Claimed)
        }
        claimed = {index: step for index, step in enumerate(steps) if isinstance(step, Claimed)}
        # A pipeline calls no model (engine.pipelines): no batch, no budget, no shared limit.
        for index, step in list(claimed.items()):
            if isinstance(step.definition, PipelineDefinition):
                dispositions[index] = self._executor.submit(self._runner.run, claimed.pop(index), remaining_ms)
        batched = {index: step for index, step in claimed.items() if step.job.batch}
        if batching is not None and batched:
            dispositions |= self._keep(batching, batched, admission, remaining_ms)
        to_run = {index: step for index, step in claimed.items() if index not in batched}
        verdicts = self._admit(admission, to_run, remaining_ms) if admission is not None else {}
        settled: set[int] = set()
        for index, step in to_run.items():
            run = partial(self._run, step, remaining_ms, admission=admission, settled=settled, index=index)
            admitted = verdicts.get(index)
            dispositions[index] = self._executor.submit(run) if admitted is None else self._once(admitted, run)
        try:
            yield [dispositions[index] for index in range(len(deliveries))]
        finally:
            wait(dispositions.values())
            if admission is not None and verdicts:
                admission.settle(
                    [
                        admitted.result()
                        for index, admitted in verdicts.items()
                        if index not in settled and admitted.done() and admitted.exception() is None
                    ]
                )

    def _once(self, admitted: Future[Verdict], run: Callable[[Verdict], Disposition]) -> Future[Disposition]:
        """The disposition of a job run on its own thread as soon as its verdict is known (no thread waits
        for a verdict meanwhile)."""
        disposition: Future[Disposition] = Future()

        def ran(done: Future[Disposition]) -> None:
            error = done.exception()
            if error is None:
                disposition.set_result(done.result())
            else:
                disposition.set_exception(error)

        admitted.add_done_callback(lambda verdict: self._executor.submit(run, verdict.result()).add_done_callback(ran))
        return disposition

    def _run(
        self,
        step: Claimed,
        remaining_ms: RemainingMs | None,
        verdict: Verdict | None = None,
        *,
        admission: Admission | None,
        settled: set[int],
        index: int,
    ) -> Disposition:
        """Run a claimed job with its verdict (none when it was not admitted)."""
        disposition = self._runner.run(step, remaining_ms, verdict)
        if verdict is not None and admission is not None and isinstance(disposition, Retry):
            # The job is queued again: what it holds of its user's budget goes back before its message
            # can come back, lest its next claim find the budget still reserved.
            settled.add(index)
            admission.settle([verdict])
        return disposition

    def _keep(
        self,
        batching: BatchIntake,
        batched: dict[int, Claimed],
        admission: Admission | None,
        remaining_ms: RemainingMs | None,
    ) -> dict[int, Future[Disposition]]:
        """The dispositions of the jobs claimed into a provider's batch, once kept for it."""
        kept = batching.keep(list(batched.values()), admission)
        return {
            index: self._keeping(step, keeping, remaining_ms)
            for (index, step), keeping in zip(batched.items(), kept, strict=True)
        }

    def _keeping(self, step: Claimed, keeping: Keeping, remaining_ms: RemainingMs | None) -> Future[Disposition]:
        """What becomes of a job claimed into a batch, once the intake said what it did with it."""
        match keeping:
            case Batched():
                return _decided(Ack(Fate.BATCHED))
            case RunNow(verdict=verdict):
                return self._executor.submit(self._runner.run, step, remaining_ms, verdict)
            case NotKept():
                return self._executor.submit(self._hand_back, step)

    def _hand_back(self, step: Claimed) -> Disposition:
        """Queue again a job whose part could not be written (it may not wait for a batch that does not
        know it); its message comes back after a backoff."""
        retry = Retry(Fate.ERROR, backoff_seconds(step.delivery.receive_count, self._rng), "not kept")
        try:
            handed = self._runner.hand_back(step.job, InternalError("it could not be kept for its batch"))
        except Exception as exc:
            log_unexpected("a job that could not be kept for its batch is still held", exc)
            return retry
        return retry if isinstance(handed, Retry) else handed

    def _admit(
        self, admission: Admission, claimed: dict[int, Claimed], remaining_ms: RemainingMs | None
    ) -> dict[int, Future[Verdict]]:
        """The batch's claimed jobs' budgets and capacity (engine.fleet.admission): a verdict each, as
        soon as it is known; those waiting for capacity that can come within the invocation wait."""
        if self._planner is None or not claimed:
            return {}
        planned: list[tuple[int, Claimed, Ask]] = []
        for index, step in claimed.items():
            try:
                plan = self._planner(step.definition, step.job_input, step.attachments)
            except Exception as exc:
                # The job type's own code (its prompt, its schema) failed: the job runs unadmitted,
                # where its attempt fails the same way before any call and the runner records it.
                log_unexpected("a job could not be planned", exc, job_id=step.job.job_id)
                continue
            planned.append((index, step, Ask(step.job.user_id, plan, step.job.lane)))
        if not planned:
            return {}
        call_within = None
        if remaining_ms is not None:
            # A job must call by then to have its timeout and the finishing write within the invocation.
            longest = max(step.definition.timeout_seconds for _, step, _ in planned) * 1000
            call_within = int(max(remaining_ms() - longest - FINISH_MARGIN_MS, 0))
        verdicts: list[Future[Verdict]] = [Future() for _ in planned]
        threading.Thread(
            target=admission.admit_as_capacity_comes,
            args=([ask for _, _, ask in planned], call_within, lambda at, verdict: verdicts[at].set_result(verdict)),
            name="aijobs-admission",
            daemon=True,
        ).start()
        return {index: verdict for (index, _, _), verdict in zip(planned, verdicts, strict=True)}


def _decided(disposition: Disposition) -> Future[Disposition]:
    decided: Future[Disposition] = Future()
    decided.set_result(disposition)
    return decided
