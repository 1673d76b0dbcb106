"""Dead letters: a message the engine gives up on is kept, and the job it names ends `failed`.

Used by the dead-letter function (every message that reached the dead-letter queue) and by the
worker (a message that named no usable job, or one that kept failing in an unexpected way).
Every message is first stored durably (body, attributes, receive count, the job it names), also
garbage that names no job, in one write that also lists it by day and points to it from the job
it names (`aijobs dead-letters`, `aijobs inspect`); then
- a job that exists, is not finished and no worker holds ends `failed` with the given code;
- a full job request whose job was never created is created `failed`, its input stored, so that
  `aijobs status` shows it and `aijobs retry` runs it;
- a bad message that names a job id fails that job with the message's own error.
A message that cannot be stored raises, so that it stays on its queue. On the dead-letter queue
itself, a message the table cannot take for a reason that will not pass by itself (a refusal, not
throttling or an outage) is kept whole in the payload bucket instead (`dead-letters/unrecorded/`)
and acknowledged; it stays on the queue only when the bucket refuses it too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from engine.core import DeadLetterFate, Delivery, ErrorCode, Job, JobErrorInfo, JobStatus, Lane
from engine.core.ports import BadMessage, DeadLetterStore
from engine.definitions import JobRegistry
from engine.intake import BadMessageError, JobRequest, parse_message, sha256_hex
from engine.observability import count, log_unexpected, logger
from engine.text import one_line, valid_text

# Whether an exception may pass by itself (engine.aws_errors.is_transient in Lambda).
TransientCheck = Callable[[Exception], bool]


def _always_transient(_: Exception) -> bool:
    return True


class DeadLetterRecorder:
    def __init__(
        self,
        store: DeadLetterStore,
        registry: JobRegistry,
        clock: Callable[[], float] = time.time,
        is_transient: TransientCheck = _always_transient,
    ) -> None:
        self._store = store
        self._registry = registry
        self._clock = clock
        # Without a way to tell, every failure is taken as one that may pass: the message stays.
        self._is_transient = is_transient

    def arrived(self, delivery: Delivery) -> DeadLetterFate:
        """A message of the dead-letter queue: kept, and the job it names ended; what became of it. One
        the table does not take is kept in the payload bucket instead (`unrecorded`), unless the failure
        may pass by itself: then this raises, and the message stays on its queue."""
        attributes = dict(delivery.attributes)
        try:
            fate = self.record(delivery.message_id, delivery.body, attributes, delivery.receive_count)
        except Exception as exc:
            _count(DeadLetterFate.UNRECORDED)
            log_unexpected("a dead letter could not be recorded", exc, message_id=delivery.message_id)
            if self._is_transient(exc):
                raise
            self._keep_unrecorded(delivery.message_id, delivery.body, attributes, delivery.receive_count, exc)
            return DeadLetterFate.UNRECORDED
        _count(fate)
        count("Jobs_dead_lettered")
        return fate

    def _keep_unrecorded(
        self, message_id: str, body: str, attributes: dict[str, str], receive_count: int, exc: Exception
    ) -> None:
        """Keep in the payload bucket a dead letter the table refused for good (raises when the bucket
        refuses it too: it stays on its queue)."""
        document = {
            "message_id": message_id,
            "body": valid_text(body),
            "attributes": attributes,
            "receive_count": receive_count,
            "reason": _arrival(receive_count),
            "not_recorded_because": one_line(f"{type(exc).__name__}: {_error_code(exc)}"),
            "kept_at": self._now_ms(),
        }
        key = self._store.keep_unrecorded(message_id, json.dumps(document, ensure_ascii=False).encode())
        logger.warning("dead letter kept in the payload bucket", extra={"message_id": message_id, "key": key})

    def record(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, str],
        receive_count: int,
        reason: str | None = None,
        code: ErrorCode = ErrorCode.DEAD_LETTERED,
    ) -> DeadLetterFate:
        """Keep the message, then end the job it names with `code`; returns what became of the job."""
        reason = reason or _arrival(receive_count)
        request, bad = self._parse(body, message_id)
        job_id = _named_job(request, bad)
        now = self._keep(message_id, body, attributes, receive_count, reason, job_id)
        error = JobErrorInfo(code, reason, retryable=False)
        if job_id is None:
            return DeadLetterFate.RECORDED
        job = self._store.get_job(job_id)
        if job is None:
            return self._create(job_id, body, request, bad, error, now)
        return self._end(job, request, error, now, message_id)

    def keep(self, message_id: str, body: str, attributes: dict[str, str], receive_count: int, reason: str) -> int:
        """Keep the message durably, touching no job; returns the time it was recorded at."""
        request, bad = self._parse(body, message_id)
        return self._keep(message_id, body, attributes, receive_count, reason, _named_job(request, bad))

    def _keep(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, str],
        receive_count: int,
        reason: str,
        job_id: str | None,
    ) -> int:
        now = self._now_ms()
        self._store.record_dead_letter(message_id, body, attributes, receive_count, reason, now, job_id)
        return now

    def fail_bad_message(self, bad: BadMessage, body: str, now_ms: int, lane: Lane = Lane.INTERACTIVE) -> Job | None:
        """Record the job a bad message names as `failed` with the message's error, in the lane the
        message names when that is valid, else in `lane` (the lane of the queue it came from).

        Returns None when recorded, or the job that exists already under that id (whose
        `request_hash` is the body's hash when it was recorded from this same message).
        """
        if bad.job_id is None:
            raise ValueError("a bad message without a job id names no job to fail")
        error = bad.error
        return self._store.create_failed_job(
            bad.job_id,
            error.info(),
            now_ms,
            job_type=bad.known("job_type"),
            user_id=bad.known("user_id"),
            max_attempts=bad.known("max_attempts") or 0,
            message_hash=sha256_hex(body),
            lane=Lane(bad.known("lane") or lane),
        )

    def _parse(self, body: str, message_id: str) -> tuple[JobRequest | None, BadMessageError | None]:
        try:
            return parse_message(body, message_id, self._registry), None
        except BadMessageError as bad:
            return None, bad
        except Exception as exc:
            # The message may be given up on because parsing it fails: it is kept, naming no job.
            log_unexpected("a dead letter could not be parsed", exc, message_id=message_id)
            return None, None

    def _create(
        self,
        job_id: str,
        body: str,
        request: JobRequest | None,
        bad: BadMessageError | None,
        error: JobErrorInfo,
        now: int,
    ) -> DeadLetterFate:
        if request is not None and request.new_job is not None and request.raw_input is not None:
            existing = self._store.create_dead_lettered_job(job_id, request.new_job, request.raw_input, error, now)
        elif bad is not None:
            existing = self.fail_bad_message(bad, body, now)
        else:
            return DeadLetterFate.RECORDED  # a reference to a job that does not exist
        if existing is None:
            logger.warning("job recorded as failed from a dead letter", extra={"job_id": job_id})
            return DeadLetterFate.FAILED
        return DeadLetterFate.RECORDED

    def _end(
        self, job: Job, request: JobRequest | None, error: JobErrorInfo, now: int, message_id: str
    ) -> DeadLetterFate:
        if job.status.is_terminal:
            return DeadLetterFate.RECORDED
        new_job = request.new_job if request else None
        if new_job is not None and new_job.request_hash != job.request_hash:
            return DeadLetterFate.RECORDED  # another request under the same id: the job is not this message's
        if job.lease_remaining_ms(now) > 0:
            return DeadLetterFate.HELD  # a worker still runs it and will finish it
        if job.cancel_requested:
            ended = self._store.end_job(job, JobStatus.CANCELLED, None, now)
            return DeadLetterFate.CANCELLED if ended else DeadLetterFate.RECORDED
        carried_input = request.raw_input if request else None
        store_input = carried_input if not job.input_stored else None
        if self._store.end_job(job, JobStatus.FAILED, error, now, store_input):
            logger.warning(
                "job failed from a dead letter",
                extra={"job_id": job.job_id, "message_id": message_id, "code": error.code.value},
            )
            return DeadLetterFate.FAILED
        return DeadLetterFate.RECORDED

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _count(fate: DeadLetterFate) -> None:
    count(f"DeadLetters_{fate.value}")


def _arrival(receive_count: int) -> str:
    return f"reached the dead-letter queue after {receive_count} receives"


def _error_code(exc: Exception) -> str:
    """What refused the write, without its message (which could quote the body): an AWS error code."""
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return str(code) if code else "no error code"


def _named_job(request: JobRequest | None, bad: BadMessageError | None) -> str | None:
    """The job a body names: its `job_id` (the message id when it has none), unless the id is unusable."""
    return request.job_id if request else bad.job_id if bad else None
