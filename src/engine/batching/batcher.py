"""The batcher: gathers closed windows into provider batches, polls them, and ends their jobs.

Run on a schedule (every minute in AWS, every few seconds in the embedded stack), one pass at a
time. A pass
1. moves each batch in flight on (engine.core.batches): creates at the provider one recorded
   but not created (adopting the batch a stopped pass created, found by its metadata), polls those
   due, cancels one once every job it holds has reached its rescue time, hands each job it has not
   answered back to real time at that job's own hand-back time, and concludes those that ended;
2. gathers the parts of each closed window into one batch per model (within the provider's limits
   of lines and bytes): its manifest, then its record, then the parts deleted, then the batch created.
Nothing a job needs waits on the provider: a status, cancel, search or results call that fails is
made again on the next pass, while each job's hand-back comes at its time regardless, and whatever
the batch answers later is kept as usage. Its jobs are ended by engine.batching.conclusion, entry by
entry, so that a pass that stopped anywhere is taken up by the next one.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.batching.conclusion import NO_ANSWERS, Answers, Conclusion, EntryFate, GoneOver, not_answered_in_time
from engine.batching.entries import BatchEntry, Manifest, Part, line_id
from engine.batching.files import BatchFiles, PartKey
from engine.batching.intake import BatchTiming
from engine.core.batches import BatchPhase, BatchRecord, BatchRecords, BatchState
from engine.core.errors import JobError, ProviderTimeoutError, ProviderUnavailableError, RetryableError
from engine.core.ports import JobReader
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest, ModelGateway
from engine.gateway.batches import BatchLine, BatchProvider, BatchStatus
from engine.observability import log_unexpected, logger
from engine.queue import JobQueues
from engine.runner import JobRunner, RemainingMs

# The metadata naming a batch's record, given to the provider when the batch is created.
METADATA_KEY = "aijobs_batch"
# A pass stops when its invocation has less than this left (a conclusion goes on in the next pass).
STOP_MARGIN_MS = 30_000
# The most lines a record keeps to go over again; past it, a conclusion stops where it is.
MAX_REDO = 1_000
# A batch the provider has not said has ended this long after it was recorded (its 24-hour window
# long past, and every job's deadline: the longest is 7 days) is ended as unanswerable.
GIVE_UP_MS = 8 * 86_400_000


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._files = files
        self._provider = provider
        self._gateway = gateway
        self._registry = registry
        self._timing = timing
        self._clock = clock
        self._runner = runner
        self._conclusion = Conclusion(runner, jobs, registry, queues)

    def run(self, remaining_ms: RemainingMs | None = None) -> Counter[str]:
        """One pass: what it did (created, adopted, ended, jobs_finished, errors, ...)."""
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
                self._creating(record, report, remaining_ms)
            case BatchPhase.PENDING | BatchPhase.CANCELLING:
                self._poll(record, report, remaining_ms)
            case BatchPhase.CONCLUDING:
                self._conclude(record, report, remaining_ms)
            case BatchPhase.ENDED:
                pass

    def _creating(self, record: BatchRecord, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        """A batch recorded but not known to be created: adopt the one a stopped pass created, else
        create it. While the provider cannot be searched it is not created again (it may exist), and
        its jobs are handed back as their times come."""
        now = self._now_ms()
        try:
            found = self._provider.find({METADATA_KEY: record.key})
        except Exception as exc:
            log_unexpected("a batch's provider batch could not be looked for", exc, batch=record.key)
            report["adopt_retried"] += 1
            if now - record.created_at >= GIVE_UP_MS:
                self._end_unanswered(record, "its provider batch could not be looked for", report, remaining_ms)
                return
            self._save(record, self._hand_back_due(record, now, report))
            return
        if found:
            for extra in found[1:]:  # created twice (never both recorded): the newest is kept
                try:
                    self._provider.cancel(extra)
                    report["duplicates_cancelled"] += 1
                except Exception as exc:
                    log_unexpected("a second provider batch could not be cancelled", exc, batch=record.key)
            report["adopted"] += 1
            self._pending(record, found[0], now)
            return
        self._create(record, self._files.manifest(record.key), report, remaining_ms)

    def _create(
        self, record: BatchRecord, manifest: Manifest, report: Counter[str], remaining_ms: RemainingMs | None
    ) -> None:
        """Create a recorded batch at the provider; or end it unanswered when too late or too small."""
        now = self._now_ms()
        if now >= record.abandon_at or record.handed_back_through:
            self._end_unanswered(record, "not created before its rescue time", report, remaining_ms)
            return
        if len(manifest.lines) < max(self._provider.min_lines, 1):
            self._end_unanswered(record, "too few requests for a batch", report, remaining_ms)
            return
        try:
            batch_id = self._provider.submit(self._lines(manifest), {METADATA_KEY: record.key})
        except RetryableError as exc:
            logger.warning("a batch could not be created yet", extra={"batch": record.key, "error": exc.message})
            self._save(record, replace(record, detail=exc.message, updated_at=now))
            report["create_retried"] += 1
            return
        except JobError as exc:
            self._end_unanswered(record, f"refused by the provider: {exc.message}", report, remaining_ms)
            return
        report["created"] += 1
        self._pending(record, batch_id, now)

    def _pending(self, record: BatchRecord, batch_id: str, now: int) -> None:
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
        """Read the batch's status when due, cancel it once its rescue time came, hand back its jobs
        whose hand-back time came: each step whatever the others' calls answered."""
        now = self._now_ms()
        cancel_due = not record.cancel_sent and now >= record.rescue_at
        hand_back_due = (not record.handed_back and now >= record.abandon_at) or bool(record.redo)
        if now < record.next_poll_at and not cancel_due and not hand_back_due:
            return
        assert record.batch_id is not None
        polled = replace(record, next_poll_at=now + self._timing.poll_ms, updated_at=now)
        try:
            polled = _with_status(polled, self._provider.status(record.batch_id))
        except Exception as exc:
            log_unexpected("a batch's status could not be read", exc, batch=record.key)
            report["status_retried"] += 1
        if polled.state is not None and polled.state.ended:
            concluding = self._save(record, replace(polled, phase=BatchPhase.CONCLUDING))
            self._conclude(concluding, report, remaining_ms)
            return
        if cancel_due:
            polled = replace(polled, phase=BatchPhase.CANCELLING)
            try:
                self._provider.cancel(record.batch_id)
                polled = replace(polled, cancel_sent=True)
                report["cancelled"] += 1
            except Exception as exc:
                log_unexpected("a batch could not be cancelled yet", exc, batch=record.key)
                report["cancel_retried"] += 1
        if hand_back_due:
            polled = self._hand_back_due(polled, now, report)
        saved = self._save(record, polled)
        if now - record.created_at >= GIVE_UP_MS:
            self._end_unanswered(saved, "the provider never said it ended", report, remaining_ms)

    def _hand_back_due(self, record: BatchRecord, now: int, report: Counter[str]) -> BatchRecord:
        """Hand back every job of the batch whose hand-back time has come (and those to go over again):
        the record as it then is."""
        if record.handed_back and not record.redo:
            return record
        manifest = self._files.manifest(record.key)
        due = [
            (custom_id, entry)
            for custom_id, entry in manifest.entries.items()
            if record.handed_back_through < self._hand_back_at(entry) <= now or custom_id in record.redo
        ]
        gone = self._conclusion.go_over(due, None, record.batch_id, not_answered_in_time(), frozenset(record.redo))
        _count(report, gone)
        later = [at for at in map(self._hand_back_at, manifest.entries.values()) if at > now]
        if len(gone.again) > MAX_REDO:
            # Too many to name: the next pass goes over every one due again.
            return replace(record, redo=tuple(line for line in record.redo if line in gone.again))
        return replace(
            record,
            handed_back_through=now,
            abandon_at=min(later, default=record.abandon_at),
            handed_back=not later,
            redo=gone.again,
            returned=record.returned + gone.fates.get(EntryFate.RETURNED, 0),
        )

    def _end_unanswered(
        self, record: BatchRecord, detail: str, report: Counter[str], remaining_ms: RemainingMs | None
    ) -> None:
        """A batch whose answers will never be read: its jobs are concluded as unanswered."""
        logger.warning("a batch ends unanswered", extra={"batch": record.key, "detail": detail})
        state = record.state if record.batch_id is not None else BatchState.FAILED
        concluding = replace(
            record,
            phase=BatchPhase.CONCLUDING,
            state=state,
            detail=detail,
            unanswerable=True,
            updated_at=self._now_ms(),
        )
        self._conclude(self._save(record, concluding), report, remaining_ms)

    # --- concluding ----------------------------------------------------------------------------

    def _conclude(self, record: BatchRecord, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        """Go over each entry with the batch's answers; the record keeps how far it got."""
        manifest = self._files.manifest(record.key)
        answers = self._answers(record, report)
        if answers is None:
            now = self._now_ms()
            if now - record.created_at >= GIVE_UP_MS:
                answers = NO_ANSWERS  # (its jobs were all handed back long ago)
            else:
                # Its results cannot be read yet: its jobs still go back at their times; read again later.
                waiting = self._hand_back_due(replace(record, next_poll_at=now + self._timing.poll_ms), now, report)
                self._save(record, replace(waiting, updated_at=now))
                return
        if answers is not NO_ANSWERS and (stray := answers.unmatched(manifest.entries)):
            logger.error("a batch answered lines it was not sent", extra={"batch": record.key, "count": stray})
            report["answers_unmatched"] += stray
        why = _unanswered(record)
        current = record
        if current.redo:
            entries = [(line, manifest.entries[line]) for line in current.redo if line in manifest.entries]
            gone = self._conclusion.go_over(entries, answers, record.batch_id, why, frozenset(current.redo))
            current = self._save(current, _progress(current, gone, current.concluded, gone.again))
            _count(report, gone)
        ids = list(manifest.entries)
        for start in range(current.concluded, len(ids), READ_CHUNK):
            if self._out_of_time(remaining_ms):
                report["stopped_early"] += 1
                return
            entries = [(line, manifest.entries[line]) for line in ids[start : start + READ_CHUNK]]
            gone = self._conclusion.go_over(entries, answers, record.batch_id, why)
            _count(report, gone)
            if len(current.redo) + len(gone.again) > MAX_REDO:
                report["stopped_early"] += 1  # too many to go over again: this chunk is gone over again whole
                current = self._save(current, _progress(current, gone, current.concluded, current.redo))
                return
            current = self._save(current, _progress(current, gone, start + len(entries), current.redo + gone.again))
        if current.redo:
            return  # gone over again on the next pass
        self._files.delete_manifest(record.key)
        now = self._now_ms()
        self._save(current, replace(current, phase=BatchPhase.ENDED, ended_at=now, updated_at=now))
        report["ended"] += 1

    def _answers(self, record: BatchRecord, report: Counter[str]) -> Answers | None:
        """The batch's answers; NO_ANSWERS when none will come; None when they cannot be read now."""
        if record.batch_id is None or record.unanswerable or record.state is BatchState.FAILED:
            return NO_ANSWERS
        try:
            return Answers.of(self._provider.answers(record.batch_id))
        except Exception as exc:
            log_unexpected("a batch's results could not be read", exc, batch=record.key)
            report["results_retried"] += 1
            return None

    # --- gathering closed windows --------------------------------------------------------------

    def _gather(self, report: Counter[str], remaining_ms: RemainingMs | None) -> None:
        now = self._now_ms()
        by_model: dict[str, list[PartKey]] = defaultdict(list)
        for key in self._files.parts():
            if self._timing.closes_at(key.window) <= now:
                by_model[key.model].append(key)
        for model, keys in by_model.items():
            parts = [part for key in keys if (part := self._read_part(key, report)) is not None]
            for chunk in self._chunks(parts):
                if self._out_of_time(remaining_ms):
                    report["stopped_early"] += 1
                    return
                self._open(model, chunk, report, remaining_ms)

    def _read_part(self, key: PartKey, report: Counter[str]) -> Part | None:
        """A part, or None: one that cannot be read now waits for the next pass, and one that can never
        be read (not a part's JSON) is set aside (batches/unreadable/), where the alarm counts it."""
        try:
            return self._files.read_part(key)
        except (ValueError, KeyError, TypeError) as exc:
            log_unexpected("a batch part is unreadable; set aside", exc, part=key.key)
            self._files.set_aside(key)
            report["parts_unreadable"] += 1
        except Exception as exc:
            log_unexpected("a batch part could not be read; read again next pass", exc, part=key.key)
            report["errors"] += 1
        return None

    def _chunks(self, parts: list[Part]) -> list[_Chunk]:
        """The parts in batches within the provider's limits of lines and bytes (a part is never split),
        nearest deadline first, so that a batch's jobs tend to share their rescue times."""
        chunks: list[_Chunk] = []
        count = 0
        for part in sorted(parts, key=lambda part: min((entry.deadline_at for entry in part.entries), default=0)):
            lines: list[BatchLine] = []
            entries: dict[str, BatchEntry] = {}
            for entry in part.entries:
                custom_id = line_id(count)
                count += 1
                entries[custom_id] = entry
                try:
                    line = BatchLine(custom_id, self._request(entry))
                except Exception as exc:
                    # In no line: it goes back to real time once its batch is recorded, and fails there as
                    # it must (an attachment gone meanwhile, a job type whose code fails).
                    log_unexpected("a batched job's request could not be made", exc, job_id=entry.job_id)
                    continue
                if self._provider.line_bytes(line) > self._provider.max_bytes:
                    continue  # too large for any batch (its attachments, encoded): it runs in real time
                lines.append(line)
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
        """Record a new batch of `chunk`'s parts, delete them, and create the batch. From its record on,
        the batch answers for its jobs: each ends, or goes back to real time, through it."""
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
        deadlines = [entry.deadline_at for entry in chunk.entries.values()]
        record = BatchRecord(
            key=key,
            model=model,
            provider=self._provider.name,
            lines=len(chunk.entries),
            phase=BatchPhase.CREATING,
            created_at=now,
            updated_at=now,
            rescue_at=max(deadlines) - self._timing.rescue_ms,
            abandon_at=min(deadlines) - self._timing.rescue_ms * 2 // 3,
        )
        if not self._records.create(record):
            logger.error("a batch was recorded by another pass at once", extra={"batch": key})
            return
        self._files.delete_parts(list(manifest.parts))
        report["recorded"] += 1
        unlined = [
            (custom_id, entry) for custom_id, entry in manifest.entries.items() if custom_id not in manifest.lines
        ]
        if unlined and len(unlined) < len(manifest.entries):
            # In no line (too large for a batch, or its request could not be made): to real time at once.
            gone = self._conclusion.go_over(unlined, NO_ANSWERS, None, _NOT_IN_A_LINE)
            _count(report, gone)
            record = self._save(record, replace(record, redo=gone.again))
        self._create(record, manifest, report, remaining_ms)

    def _lines(self, manifest: Manifest) -> list[BatchLine]:
        return [
            BatchLine(custom_id, self._request(entry))
            for custom_id, entry in manifest.entries.items()
            if custom_id in manifest.lines
        ]

    def _request(self, entry: BatchEntry) -> CompletionRequest:
        """An entry's first call, as its line: its attachments read again (they are not kept with it)."""
        definition = self._registry.get(entry.job_type)
        attachments = self._runner.load_attachments(entry.attachments, definition)
        return self._gateway.batch_request(definition, definition.parse_input(entry.job_input), attachments)

    # --- helpers -------------------------------------------------------------------------------

    def _hand_back_at(self, entry: BatchEntry) -> int:
        """When a job its batch has not answered goes back to real time: two thirds of the rescue time
        before its deadline (a third is left after its claim's lease, which outlives this)."""
        return entry.deadline_at - self._timing.rescue_ms * 2 // 3

    def _save(self, read: BatchRecord, record: BatchRecord) -> BatchRecord:
        saved = replace(record, updated_at=max(record.updated_at, read.updated_at + 1))
        if not self._records.save(saved, read):
            raise RuntimeError(f"batch {record.key} changed while this pass held it")
        return saved

    def _out_of_time(self, remaining_ms: RemainingMs | None) -> bool:
        return remaining_ms is not None and remaining_ms() < STOP_MARGIN_MS

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


# Entries concluded between two saves of the record (as many as one read of their jobs).
READ_CHUNK = 100


def _with_status(record: BatchRecord, status: BatchStatus) -> BatchRecord:
    return replace(record, state=status.state, detail=status.detail, answered=status.answered, failed=status.failed)


def _progress(record: BatchRecord, gone: GoneOver, concluded: int, redo: tuple[str, ...]) -> BatchRecord:
    fates = gone.fates
    return replace(
        record,
        concluded=concluded,
        redo=tuple(dict.fromkeys(redo)),
        finished=record.finished + fates.get(EntryFate.FINISHED, 0) + fates.get(EntryFate.RETRIED, 0),
        returned=record.returned + fates.get(EntryFate.RETURNED, 0),
        discarded=record.discarded + fates.get(EntryFate.DISCARDED, 0),
    )


def _count(report: Counter[str], gone: GoneOver) -> None:
    for fate, count in gone.fates.items():
        report[f"jobs_{fate.value}"] += count
    if gone.again:
        report["jobs_again"] += len(gone.again)


_NOT_IN_A_LINE = ProviderUnavailableError("it could not go in a batch's line")


def _unanswered(record: BatchRecord) -> JobError:
    """Why a job its batch holds has no answer: the batch failed, expired or was cancelled without one."""
    match record.state:
        case BatchState.EXPIRED:
            return ProviderTimeoutError(f"batch {record.batch_id} expired before answering it")
        case BatchState.CANCELLED:
            return ProviderTimeoutError(f"batch {record.batch_id} was cancelled before answering it")
        case BatchState.FAILED:
            return ProviderUnavailableError(f"its batch failed: {record.detail or 'no reason given'}")
        case _ if record.unanswerable:
            return ProviderUnavailableError(f"its batch will not answer: {record.detail}")
        case _:
            return ProviderUnavailableError(f"batch {record.batch_id} has no line for it")
