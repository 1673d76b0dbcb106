"""Ending a batch's jobs: each entry finished with its answer, handed back, or its late answer kept.

Going over an entry is idempotent, so that a pass that stopped anywhere (a crash, a throttled send, a
DynamoDB error) can go over it again on the next pass and change nothing that was done:
- a job its batch claim still holds is finished with its answer (the decision made first; when it
  queues the job again, its message is sent before the write), or, unanswered, handed back (its
  message sent first, then released);
- a job the batch no longer holds has its answer, if any, kept as an attempt of the claim it answered
  (written once: a record of that claim is never written twice), its reservation given back once
  (the claim is marked settled with the write that gives it back);
- a job that an earlier go-over queued again, with its claim unchanged since, gets its message once
  more when that go-over may have stopped before sending it (a duplicate message is harmless: claims
  are exclusive).
An entry whose go-over raised, or whose message SQS refused, is named in the result, to be gone over
again. docs/batches.md has the design.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from functools import partial

from engine.batching.entries import BatchEntry
from engine.core import Ack, Delivery, Failed, Fate, Job, JobStatus, Lane, Retry, Settlement
from engine.core.errors import AttachmentInvalidError, JobError, ProviderTimeoutError, ProviderUnavailableError
from engine.core.ports import JobReader
from engine.decisions import Decision
from engine.definitions import JobRegistry
from engine.gateway import Answered, Completion
from engine.gateway.batches import BatchAnswer
from engine.intake import JobRequest
from engine.observability import log_unexpected, logger
from engine.queue import JobQueues, Resend
from engine.runner import Claimed, JobRunner

# Jobs read in one request while entries are gone over (BatchGetItem's most).
READ_JOBS = 100
# A job handed back is sent again this long before it is released: its message cannot be lost, and
# arrives once the job is queued.
RESEND_DELAY_SECONDS = 5


class EntryFate(StrEnum):
    """What going over an entry did (counted as `jobs_<fate>`)."""

    FINISHED = "finished"  # its answer ended its job
    RETRIED = "retried"  # its answer queued its job again (a re-ask failed): its message sent
    RETURNED = "returned"  # handed back to real time
    DISCARDED = "discarded"  # answered after its batch no longer held it: kept as usage
    RECORDED_BEFORE = "recorded_before"  # that answer was kept already (an earlier go-over)
    WAITING = "waiting"  # held, not answered yet, not due: its batch may still answer it
    GONE = "gone"  # neither held nor answered: nothing left to do


@dataclass
class Answers:
    """What a batch answered, by line: a completion wins over an error the provider gave the same line,
    and completions it gave a line more than once are paid for too (counted with the first)."""

    completions: dict[str, list[Completion]] = field(default_factory=dict)
    errors: dict[str, JobError] = field(default_factory=dict)

    @classmethod
    def of(cls, answers: Iterable[BatchAnswer]) -> Answers:
        read = cls()
        for answer in answers:
            if answer.completion is not None:
                read.completions.setdefault(answer.custom_id, []).append(answer.completion)
            elif answer.error is not None:
                read.errors.setdefault(answer.custom_id, answer.error)
        return read

    def answered(self, custom_id: str, batch_id: str) -> Answered | None:
        completions = self.completions.get(custom_id)
        if not completions:
            return None
        return Answered(completions[0], batch_id, tuple(completions[1:]))

    def error(self, custom_id: str) -> JobError | None:
        return self.errors.get(custom_id)

    def unmatched(self, custom_ids: Iterable[str]) -> int:
        """Lines answered that name none of `custom_ids` (a provider's mistake: no job to charge)."""
        known = set(custom_ids)
        return len((self.completions.keys() | self.errors.keys()) - known)


# A batch that will answer nothing more: every entry's answer is known (none).
NO_ANSWERS = Answers()


@dataclass(frozen=True, slots=True)
class GoneOver:
    """What a go-over of entries did: each fate's count, and the lines to go over again."""

    fates: Mapping[EntryFate, int]
    again: tuple[str, ...]


@dataclass
class _Step:
    """One entry's part of a go-over, between its decision and its write."""

    entry: BatchEntry
    job: Job | None
    fate: EntryFate
    write: Callable[[], object] | None = None
    # The message to send before the write (its delay), when the write queues the job.
    send_delay: int | None = None
    # Whether the write waits for the message (a release does; an answer's write, already paid for, does not).
    needs_message: bool = False
    failed: bool = False


class Conclusion:
    """Goes over a batch's entries as the batcher asks: when their hand-back time comes (answers not
    known yet) and when the batch has ended (its answers known)."""

    def __init__(self, runner: JobRunner, jobs: JobReader, registry: JobRegistry, queues: JobQueues) -> None:
        self._runner = runner
        self._jobs = jobs
        self._registry = registry
        self._queues = queues

    def go_over(
        self,
        entries: Sequence[tuple[str, BatchEntry]],
        answers: Answers | None,
        batch_id: str | None,
        unanswered: JobError,
        again: frozenset[str] = frozenset(),
    ) -> GoneOver:
        """Go over `entries` (line id, entry): with `answers` once the batch has ended, else only to hand
        back those held (they are due). `unanswered` is why a held job has no answer; `again`, the lines
        gone over before that may have stopped halfway."""
        fates: defaultdict[EntryFate, int] = defaultdict(int)
        failed: list[str] = []
        for start in range(0, len(entries), READ_JOBS):
            chunk = entries[start : start + READ_JOBS]
            try:
                jobs = self._jobs.get_jobs([entry.job_id for _, entry in chunk])
            except Exception as exc:
                log_unexpected("a batch's jobs could not be read", exc, count=len(chunk))
                failed.extend(custom_id for custom_id, _ in chunk)
                continue
            steps: list[tuple[str, _Step]] = []
            for custom_id, entry in chunk:
                try:
                    step = self._step(
                        custom_id, entry, jobs.get(entry.job_id), answers, batch_id, unanswered, custom_id in again
                    )
                except Exception as exc:
                    log_unexpected("a batched job could not be gone over", exc, job_id=entry.job_id)
                    failed.append(custom_id)
                    continue
                steps.append((custom_id, step))
            self._send([step for _, step in steps])
            for custom_id, step in steps:
                if step.failed:
                    failed.append(custom_id)
                    if step.needs_message:
                        continue  # not released without its message: the next go-over sends it again
                try:
                    if step.write is not None:
                        step.write()
                except Exception as exc:
                    log_unexpected("a batched job's end could not be written", exc, job_id=step.entry.job_id)
                    if not step.failed:
                        failed.append(custom_id)
                    continue
                fates[step.fate] += 1
        return GoneOver(dict(fates), tuple(failed))

    # --- one entry -----------------------------------------------------------------------------

    def _step(
        self,
        custom_id: str,
        entry: BatchEntry,
        job: Job | None,
        answers: Answers | None,
        batch_id: str | None,
        unanswered: JobError,
        again: bool,
    ) -> _Step:
        answered = answers.answered(custom_id, batch_id) if answers is not None and batch_id is not None else None
        if job is not None and job.status is JobStatus.RUNNING and job.lease_owner == entry.owner:
            if answered is not None:
                return self._conclude(entry, job, answered)
            why = (answers.error(custom_id) if answers is not None else None) or unanswered
            settlement = _settlement(entry, job, Decimal(0))
            return _Step(
                entry,
                job,
                EntryFate.RETURNED,
                lambda: self._runner.hand_back(job, why, settlement),
                send_delay=RESEND_DELAY_SECONDS,
                needs_message=True,
            )
        if job is None:
            return _Step(entry, job, EntryFate.GONE)
        resend = again and job.status is JobStatus.QUEUED and job.claim_count == entry.claim_count
        if answered is not None:
            return self._keep(entry, job, answered, resend)
        fate = EntryFate.GONE if answers is not None else EntryFate.WAITING
        settlement = _settlement(entry, job, Decimal(0)) if answers is not None else None
        write = None
        if settlement is not None and settlement.returned_usd:
            write = partial(self._runner.give_back, job.job_id, settlement)
        return _Step(entry, job, fate, write, send_delay=0 if resend else None)

    def _conclude(self, entry: BatchEntry, job: Job, answered: Answered) -> _Step:
        """A held job's answer: decided (validated, re-asked in real time) first, written after its
        message is sent when the decision queues it again."""
        try:
            claimed = self._claimed(entry, job)
        except Exception as exc:
            log_unexpected("a batched job's type or input cannot be read back", exc, job_id=entry.job_id)
            why = ProviderUnavailableError("its answer could not be read")
            return _Step(
                entry,
                job,
                EntryFate.RETURNED,
                lambda: self._runner.hand_back(job, why, _settlement(entry, job, Decimal(0))),
                send_delay=RESEND_DELAY_SECONDS,
                needs_message=True,
            )
        try:
            claimed = replace(claimed, attachments=self._runner.load_attachments(entry.attachments, claimed.definition))
            decision: Decision = self._runner.answer(claimed, answered)
        except AttachmentInvalidError as exc:
            # Gone since the claim (or no longer within the limits): the answer is kept as usage, and the
            # job ends as any attempt that finds its attachments cannot go.
            decision = Decision(Failed(exc.info()), Ack(Fate.FAILED), self._runner.price_unused(claimed, answered))
        spent = decision.attempt.cost_usd if decision.attempt is not None else Decimal(0)
        settlement = _settlement(entry, job, spent)
        requeues = decision.requeues and isinstance(decision.then, Retry)
        delay = decision.then.visibility_seconds if isinstance(decision.then, Retry) else 0
        return _Step(
            entry,
            job,
            EntryFate.RETRIED if requeues else EntryFate.FINISHED,
            lambda: self._runner.finish(job, claimed.request, decision, settlement, claimed.attachments_read),
            send_delay=delay if requeues else None,
        )

    def _keep(self, entry: BatchEntry, job: Job, answered: Answered, resend: bool) -> _Step:
        """An answer to a job its batch no longer holds: kept as an attempt of the claim it answered."""
        claimed = self._claimed(entry, replace(job, claim_count=entry.claim_count))
        attempt = self._runner.price_unused(claimed, answered)
        settlement = _settlement(entry, job, attempt.cost_usd)
        step = _Step(entry, job, EntryFate.DISCARDED, send_delay=0 if resend else None)

        def write() -> None:
            if not self._runner.record_unused(attempt, settlement, job.parent):
                step.fate = EntryFate.RECORDED_BEFORE

        step.write = write
        return step

    def _claimed(self, entry: BatchEntry, job: Job) -> Claimed:
        definition = self._registry.get(entry.job_type)
        job_input = definition.parse_input(entry.job_input)
        request = JobRequest(entry.job_id, None, definition, job_input, entry.job_input)
        delivery = Delivery(entry.message_id, entry.body, entry.receive_count, lane=entry.lane)
        return Claimed(job, request, definition, job_input, delivery, entry.job_input)

    # --- messages ------------------------------------------------------------------------------

    def _send(self, steps: Sequence[_Step]) -> None:
        """Send the steps' messages, by lane, ten or 1 MiB to a request; mark each step SQS refused."""
        by_lane: dict[Lane, list[tuple[_Step, Resend]]] = defaultdict(list)
        for step in steps:
            if step.send_delay is not None:
                resend = Resend(step.entry.body, step.entry.user_id, step.send_delay)
                by_lane[step.entry.lane].append((step, resend))
        for lane, pairs in by_lane.items():
            refused = {id(message) for message in self._queues[lane].resend([message for _, message in pairs])}
            for step, message in pairs:
                if id(message) in refused:
                    step.failed = True
            if refused:
                logger.error("messages of batched jobs were refused", extra={"lane": lane.value, "count": len(refused)})


def _settlement(entry: BatchEntry, job: Job, spent: Decimal) -> Settlement | None:
    """What ending this entry's claim does to its user's budget: its reservation given back unless an
    earlier write gave it back, and `spent` counted; None for a user without a cap."""
    if not entry.reserved_day or entry.user_id is None:
        return None
    returned = Decimal(0) if entry.claim_count in job.batch_settled else entry.reserved_usd
    if not returned and not spent:
        return None
    return Settlement(entry.claim_count, entry.user_id, entry.reserved_day, returned, spent)


def not_answered_in_time() -> JobError:
    """Why a job is handed back before its batch ended: its own hand-back time came."""
    return ProviderTimeoutError("it had not answered before the job's rescue time")
