"""The batcher: gathers closed windows into provider batches, polls them, and ends their jobs.

Run on a schedule (every minute in AWS, every few seconds in the embedded stack), one pass at a
time. A pass
1. moves each batch in flight on (engine.batching.records): creates at the provider one recorded
   but not created (adopting the batch a stopped pass created, found by its metadata), polls those
   due, cancels one whose rescue time came (the earliest deadline of its jobs less the rescue
   time), hands back to real time what one has not answered by its abandon time, and concludes
   those that ended;
2. gathers the parts of each closed window into one batch per model (within the provider's limits
   of lines and bytes): its manifest, then its record, then the parts deleted, then the batch created.
Concluding a batch reads its answers, and its jobs as they are now (a hundred to a read): a job its
batch claim still holds is finished through the runner with its answer, as a real-time answer
would be, or handed back to real time (a failed line, or one an expired, cancelled or failed
batch did not answer); an answer to a job the batch no longer holds is kept as usage and discarded.
A job handed back goes back to `queued` and its message is sent again, marked for real time.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.batching.entries import BatchEntry, Manifest, Part, line_id
from engine.batching.files import BatchFiles, PartKey
from engine.batching.intake import BatchTiming
from engine.batching.records import BatchPhase, BatchRecord, BatchRecords
from engine.core import Delivery, Job, JobStatus, Lane, Retry
from engine.core.errors import JobError, ProviderTimeoutError, ProviderUnavailableError, RetryableError
from engine.core.ports import JobReader
from engine.definitions import JobRegistry
from engine.fleet.admission import Admission, Pass
from engine.gateway import Answered, ModelGateway
from engine.gateway.batches import BatchAnswer, BatchLine, BatchProvider, BatchState, BatchStatus
from engine.intake import JobRequest
from engine.observability import log_unexpected, logger, metrics
from engine.queue import JobQueues, Resend
from engine.runner import Claimed, JobRunner, RemainingMs

# The metadata naming a batch's record, given to the provider when the batch is created.
METADATA_KEY = "aijobs_batch"
# A pass stops when its invocation has less than this left (a conclusion goes on in the next pass).
STOP_MARGIN_MS = 30_000
# Jobs read in one request while a batch is concluded (BatchGetItem's most).
READ_JOBS = 100
# A job handed back is sent again this long before it is released: its message cannot be lost,
# and arrives once the job is queued.
RESEND_DELAY_SECONDS = 5


@dataclass
class _Chunk:
    """Parts of one model gathered into one batch, with their lines."""

    parts: list[Part]
    entries: dict[str, BatchEntry]
    lines: list[BatchLine]
    size: int = 0


class Batcher:
    def __init__(
        self,
        records: BatchRecords,
        files: BatchFiles,
        provider: BatchProvider,
        gateway: ModelGateway,
        registry: JobRegistry,
        runner: JobRunner,
        jobs: JobReader,
        queues: JobQueues,
        timing: BatchTiming,
        *,
        admission: Admission | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._files = files
        self._provider = provider
        self._gateway = gateway
        self._registry = registry
        self._runner = runner
        self._jobs = jobs
        self._queues = queues
        self._timing = timing
        self._admission = admission
        self._clock = clock

    def handle(self, event: dict[str, Any], context: LambdaContext | None) -> dict[str, int]:
        """One scheduled pass: what it did, also as metrics `Batches_<what>`."""
        report = self.run(getattr(context, "get_remaining_time_in_millis", None))
        for what, count in report.items():
            metrics.add_metric(name=f"Batches_{what}", unit=MetricUnit.Count, value=count)
        return dict(report)

    def run(self, remaining_ms: RemainingMs | None = None) -> Counter[str]:
        report: Counter[str] = Counter()
        for record in self._records.listed(in_flight_only=True):
            if self._out_of_time(remaining_ms):
                report["stopped_early"] += 1
                return report
            try:
                self._advance(record, report, remaining_ms)
            except Exception as exc:
                log_unexpected("a batch could not be moved on", exc, batch=record.key)
                report["errors"] += 1
        try:
            self._gather(report, remaining_ms)
        except Exception as exc:
            log_unexpected("closed windows could not be gathered into batches", exc)
            report["errors"] += 1
        if report:
            logger.info("batcher pass", extra={"batcher": dict(report)})
        return report

    # --- batches in flight ---------------------------------------------------------------------

    def _advance(self, record: BatchRecord, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        match record.phase:
            case BatchPhase.CREATING:
                self._create(record, self._files.manifest(record.key), report, remaining_ms, adopt=True)
            case BatchPhase.PENDING | BatchPhase.CANCELLING:
                self._poll(record, report, remaining_ms)
            case BatchPhase.CONCLUDING:
                self._conclude(record, report, remaining_ms)
            case BatchPhase.ENDED:
                pass

    def _create(
        self,
        record: BatchRecord,
        manifest: Manifest,
        report: Counter[str],
        remaining_ms: RemainingMs | None,
        adopt: bool,
    ) -> None:
        """Create a recorded batch at the provider, or adopt the one an earlier pass created."""
        now = self._now_ms()
        metadata = {METADATA_KEY: record.key}
        found: list[str] = []
        if adopt:
            try:
                found = self._provider.find(metadata)
            except Exception as exc:
                if now < record.rescue_at:
                    # Not created again while it may exist: the next pass looks again.
                    log_unexpected("a batch's provider batch could not be looked for", exc, batch=record.key)
                    report["adopt_retried"] += 1
                    return
        if found:
            batch_id = found[0]
            for extra in found[1:]:  # created twice (never both recorded): the newest is kept
                self._provider.cancel(extra)
                report["duplicates_cancelled"] += 1
            report["adopted"] += 1
        elif now >= record.rescue_at or len(manifest.lines) < max(self._provider.min_lines, 1):
            detail = "not created before its rescue time" if now >= record.rescue_at else "too few requests for a batch"
            self._end_unanswered(record, detail, report, remaining_ms)
            return
        else:
            try:
                batch_id = self._provider.submit(self._lines(manifest), metadata)
            except RetryableError as exc:
                logger.warning("a batch could not be created yet", extra={"batch": record.key, "error": exc.message})
                self._save(record, replace(record, detail=exc.message, updated_at=now))
                report["create_retried"] += 1
                return
            except JobError as exc:
                self._end_unanswered(record, f"refused by the provider: {exc.message}", report, remaining_ms)
                return
            report["created"] += 1
        pending = replace(
            record,
            phase=BatchPhase.PENDING,
            batch_id=batch_id,
            state=BatchState.PENDING,
            next_poll_at=now + self._timing.poll_ms,
            updated_at=now,
        )
        self._save(record, pending)

    def _poll(self, record: BatchRecord, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        now = self._now_ms()
        rescue_due = record.phase is BatchPhase.PENDING and now >= record.rescue_at
        abandon_due = not record.handed_back and now >= record.abandon_at
        if now < record.next_poll_at and not rescue_due and not abandon_due:
            return
        assert record.batch_id is not None
        status = self._provider.status(record.batch_id)
        polled = self._polled(record, status, now)
        if status.state.ended:
            concluding = replace(polled, phase=BatchPhase.CONCLUDING)
            self._save(record, concluding)
            self._conclude(concluding, report, remaining_ms)
            return
        if rescue_due:
            self._provider.cancel(record.batch_id)
            polled = replace(polled, phase=BatchPhase.CANCELLING)
            report["cancelled"] += 1
        if abandon_due:
            manifest = self._files.manifest(record.key)
            why = ProviderTimeoutError("it had not answered before the job's rescue time")
            returned = self._hand_back(manifest.entries.values(), why, settle=True)
            polled = replace(polled, handed_back=True, returned=polled.returned + returned)
            report["jobs_returned"] += returned
        self._save(record, polled)

    def _polled(self, record: BatchRecord, status: BatchStatus, now: int) -> BatchRecord:
        return replace(
            record,
            state=status.state,
            detail=status.detail,
            answered=status.answered,
            failed=status.failed,
            next_poll_at=now + self._timing.poll_ms,
            updated_at=now,
        )

    def _end_unanswered(
        self, record: BatchRecord, detail: str, report: Counter[str], remaining_ms: RemainingMs | None
    ) -> None:
        """A batch that will answer nothing: its jobs go back to real time as it is concluded."""
        logger.warning("a batch ends unanswered", extra={"batch": record.key, "detail": detail})
        concluding = replace(
            record, phase=BatchPhase.CONCLUDING, state=BatchState.FAILED, detail=detail, updated_at=self._now_ms()
        )
        self._save(record, concluding)
        self._conclude(concluding, report, remaining_ms)

    # --- concluding ----------------------------------------------------------------------------

    def _conclude(self, record: BatchRecord, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        """Write each job's answer, or hand it back; the record keeps how far it got."""
        manifest = self._files.manifest(record.key)
        answers: dict[str, BatchAnswer] = {}
        if record.batch_id is not None and record.state is not BatchState.FAILED:
            answers = {answer.custom_id: answer for answer in self._provider.answers(record.batch_id)}
        ids = list(manifest.entries)
        current = record
        for start in range(record.concluded, len(ids), READ_JOBS):
            if self._out_of_time(remaining_ms):
                report["stopped_early"] += 1
                return
            chunk = ids[start : start + READ_JOBS]
            jobs = self._jobs.get_jobs([manifest.entries[custom_id].job_id for custom_id in chunk])
            fates: Counter[str] = Counter()
            resends: list[tuple[BatchEntry, int]] = []
            verdicts: list[Pass] = []
            for custom_id in chunk:
                entry = manifest.entries[custom_id]
                try:
                    fate = self._conclude_entry(
                        current, entry, answers.get(custom_id), jobs.get(entry.job_id), resends, verdicts, remaining_ms
                    )
                except Exception as exc:
                    log_unexpected("a batched job could not be concluded", exc, job_id=entry.job_id)
                    fate = "errors"
                fates[fate] += 1
            self._resend(resends)
            if self._admission is not None:
                self._admission.settle(verdicts)
            report.update({f"jobs_{fate}": count for fate, count in fates.items()})
            concluded = replace(
                current,
                concluded=start + len(chunk),
                finished=current.finished + fates["finished"],
                returned=current.returned + fates["returned"],
                updated_at=self._now_ms(),
            )
            self._save(current, concluded)
            current = concluded
        self._files.delete_manifest(record.key)
        now = self._now_ms()
        self._save(current, replace(current, phase=BatchPhase.ENDED, ended_at=now, updated_at=now))
        report["ended"] += 1

    def _conclude_entry(
        self,
        record: BatchRecord,
        entry: BatchEntry,
        answer: BatchAnswer | None,
        job: Job | None,
        resends: list[tuple[BatchEntry, int]],
        verdicts: list[Pass],
        remaining_ms: RemainingMs | None,
    ) -> str:
        """Finish, hand back, or discard one entry's answer; what became of it."""
        held = job is not None and job.status is JobStatus.RUNNING and job.lease_owner == entry.owner
        completion = answer.completion if answer is not None else None
        # Its reservation is settled here, unless the batch's unanswered jobs were handed back already.
        reservation = self._reservation(entry, settled=record.handed_back)
        if not held:
            verdicts.append(reservation)
            if job is None or completion is None or record.batch_id is None:
                return "gone"
            if self._recorded(entry, record.batch_id):
                return "recorded_before"
            claimed = self._claimed(entry, replace(job, claim_count=entry.claim_count))
            spent = self._reservation(entry, settled=True)
            self._runner.keep_unused(claimed, Answered(completion, record.batch_id), spent)
            verdicts.append(spent)
            return "discarded"
        assert job is not None
        verdicts.append(reservation)
        if completion is None or record.batch_id is None:
            why = answer.error if answer is not None and answer.error is not None else _unanswered(record)
            return self._hand_back_one(entry, job, why, resends)
        try:
            claimed = self._claimed(entry, job)
        except Exception as exc:
            log_unexpected("a batched job's type or input cannot be read back", exc, job_id=entry.job_id)
            return self._hand_back_one(entry, job, ProviderUnavailableError("its answer could not be read"), resends)
        disposition = self._runner.conclude(claimed, Answered(completion, record.batch_id), remaining_ms, reservation)
        if isinstance(disposition, Retry):
            # Queued again by its attempt's outcome (or left held after a failure): a message brings it back.
            resends.append((entry, disposition.visibility_seconds))
            return "retried"
        return "finished"

    def _hand_back_one(self, entry: BatchEntry, job: Job, why: JobError, resends: list[tuple[BatchEntry, int]]) -> str:
        # Sent first, delayed: were the release to fail after it, the job would still have its message.
        self._resend([(entry, RESEND_DELAY_SECONDS)])
        disposition = self._runner.hand_back(job, why)
        return "returned" if isinstance(disposition, Retry) else "gone"

    def _hand_back(self, entries: Iterable[BatchEntry], why: JobError, settle: bool) -> int:
        """Hand back every entry its batch still holds (a batch past its abandon time); settles each
        entry's reservation. How many went back."""
        entries = list(entries)
        returned = 0
        for start in range(0, len(entries), READ_JOBS):
            chunk = entries[start : start + READ_JOBS]
            jobs = self._jobs.get_jobs([entry.job_id for entry in chunk])
            verdicts = []
            for entry in chunk:
                job = jobs.get(entry.job_id)
                verdicts.append(self._reservation(entry, settled=not settle))
                if job is None or job.status is not JobStatus.RUNNING or job.lease_owner != entry.owner:
                    continue
                try:
                    returned += self._hand_back_one(entry, job, why, []) == "returned"
                except Exception as exc:
                    log_unexpected("a batched job could not be handed back", exc, job_id=entry.job_id)
            if self._admission is not None:
                self._admission.settle(verdicts)
        return returned

    def _resend(self, resends: Sequence[tuple[BatchEntry, int]]) -> None:
        by_lane: dict[Lane, list[Resend]] = defaultdict(list)
        for entry, delay in resends:
            by_lane[entry.lane].append(Resend(entry.body, entry.user_id, delay))
        for lane, messages in by_lane.items():
            refused = self._queues[lane].resend(messages)
            if refused:
                logger.error("messages of handed-back jobs were refused", extra={"lane": lane.value, "count": refused})

    def _recorded(self, entry: BatchEntry, batch_id: str) -> bool:
        """Whether this answer was recorded already (by a pass that stopped before saving its progress)."""
        return any(
            attempt.attempt == entry.claim_count and attempt.batch_id == batch_id
            for attempt in self._jobs.attempts(entry.job_id)
        )

    @staticmethod
    def _reservation(entry: BatchEntry, settled: bool) -> Pass:
        """The entry's reservation of its user's budget, to settle (nothing left of it once `settled`)."""
        capped = bool(entry.reserved_day)
        return Pass(
            0,
            user_id=entry.user_id if capped else None,
            day=entry.reserved_day,
            reserved_usd=Decimal(0) if settled else entry.reserved_usd,
        )

    def _claimed(self, entry: BatchEntry, job: Job) -> Claimed:
        definition = self._registry.get(entry.job_type)
        job_input = definition.parse_input(entry.job_input)
        request = JobRequest(entry.job_id, None, definition, job_input, entry.job_input)
        delivery = Delivery(entry.message_id, entry.body, entry.receive_count, lane=entry.lane)
        return Claimed(job, request, definition, job_input, delivery, entry.job_input)

    # --- gathering closed windows --------------------------------------------------------------

    def _gather(self, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        now = self._now_ms()
        by_model: dict[str, list[PartKey]] = defaultdict(list)
        for key in self._files.parts():
            if self._timing.closes_at(key.window) <= now:
                by_model[key.model].append(key)
        for model, keys in by_model.items():
            parts = [self._files.read_part(key) for key in keys]
            chunks = self._chunks(parts)
            if sum(len(chunk.lines) for chunk in chunks) < self._provider.min_lines:
                # Fewer jobs than the provider's batches take: they run in real time.
                entries = [entry for part in parts for entry in part.entries]
                report["jobs_returned"] += self._hand_back(entries, _TOO_FEW, settle=True)
                self._files.delete_parts([part.key for part in parts])
                continue
            for chunk in chunks:
                if self._out_of_time(remaining_ms):
                    report["stopped_early"] += 1
                    return
                self._open(model, chunk, report, remaining_ms)

    def _chunks(self, parts: list[Part]) -> list[_Chunk]:
        """The parts in batches within the provider's limits of lines and bytes (a part is never split)."""
        chunks: list[_Chunk] = []
        count = 0
        for part in parts:
            lines: list[BatchLine] = []
            entries: dict[str, BatchEntry] = {}
            for entry in part.entries:
                custom_id = line_id(count)
                count += 1
                entries[custom_id] = entry
                try:
                    definition = self._registry.get(entry.job_type)
                    request = self._gateway.batch_request(definition, definition.parse_input(entry.job_input))
                except Exception as exc:
                    # In no line: it goes back to real time when its batch ends, and fails there as it must.
                    log_unexpected("a batched job's request could not be made", exc, job_id=entry.job_id)
                    continue
                lines.append(BatchLine(custom_id, request))
            size = sum(self._provider.line_bytes(line) for line in lines)
            current = chunks[-1] if chunks else None
            if (
                current is None
                or len(current.lines) + len(lines) > self._provider.max_lines
                or current.size + size > self._provider.max_bytes
            ):
                current = _Chunk([], {}, [])
                chunks.append(current)
            current.parts.append(part)
            current.entries.update(entries)
            current.lines.extend(lines)
            current.size += size
        return chunks

    def _open(self, model: str, chunk: _Chunk, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        """Record a new batch of `chunk`'s parts, delete them, and create the batch."""
        first = chunk.parts[0]
        # Named by its window, its model and its first part: a pass that stopped after recording it
        # finds it again from the same parts.
        first_name = first.key.rsplit("/", 1)[-1].removesuffix(".json")
        key = f"{first.window}.{hashlib.sha256(model.encode()).hexdigest()[:8]}.{first_name}"
        existing = self._records.get(key)
        if existing is not None:
            # Recorded by a pass that stopped before deleting its parts: they are that batch's.
            self._files.delete_parts(list(self._files.manifest(key).parts))
            return
        manifest = Manifest(
            key,
            model,
            chunk.entries,
            frozenset(line.custom_id for line in chunk.lines),
            tuple(p.key for p in chunk.parts),
        )
        self._files.put_manifest(manifest)
        now = self._now_ms()
        earliest = min(entry.deadline_at for entry in chunk.entries.values())
        record = BatchRecord(
            key=key,
            model=model,
            provider=self._provider.name,
            lines=len(chunk.entries),
            phase=BatchPhase.CREATING,
            created_at=now,
            updated_at=now,
            rescue_at=earliest - self._timing.rescue_ms,
            abandon_at=earliest - self._timing.rescue_ms * 2 // 3,
        )
        if not self._records.create(record):
            logger.error("a batch was recorded by another pass at once", extra={"batch": key})
            return
        self._files.delete_parts(list(manifest.parts))
        report["recorded"] += 1
        self._create(record, manifest, report, remaining_ms, adopt=False)

    def _lines(self, manifest: Manifest) -> list[BatchLine]:
        lines = []
        for custom_id, entry in manifest.entries.items():
            if custom_id in manifest.lines:
                definition = self._registry.get(entry.job_type)
                request = self._gateway.batch_request(definition, definition.parse_input(entry.job_input))
                lines.append(BatchLine(custom_id, request))
        return lines

    # --- helpers -------------------------------------------------------------------------------

    def _save(self, read: BatchRecord, record: BatchRecord) -> None:
        if not self._records.save(record, read):
            raise RuntimeError(f"batch {record.key} changed while this pass held it")

    def _out_of_time(self, remaining_ms: RemainingMs | None) -> bool:
        return remaining_ms is not None and remaining_ms() < STOP_MARGIN_MS

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


_TOO_FEW = ProviderUnavailableError("too few jobs for the provider's batches")


def _unanswered(record: BatchRecord) -> JobError:
    """Why a job its batch holds has no answer: the batch failed, expired or was cancelled without one."""
    match record.state:
        case BatchState.EXPIRED:
            return ProviderTimeoutError(f"batch {record.batch_id} expired before answering it")
        case BatchState.CANCELLED:
            return ProviderTimeoutError(f"batch {record.batch_id} was cancelled before answering it")
        case BatchState.FAILED:
            return ProviderUnavailableError(f"its batch failed: {record.detail or 'no reason given'}")
        case _:
            return ProviderUnavailableError(f"batch {record.batch_id} has no line for it")
