"""The store contract (engine.core.ports): one suite, run against the memory store and the DynamoDB store.

DynamoDB's conditions are the truth; the memory store must answer every call the same way, so that
tests of the decisions above it (runner, reconciler, dead-letter recorder) cannot pass on a store
that lies. Everything here goes through the Protocols' public methods only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    BatchTerms,
    Cancelled,
    ClaimRefusal,
    DeadLetterEntry,
    ErrorCode,
    Failed,
    Job,
    JobErrorInfo,
    JobHistory,
    JobStatus,
    Lane,
    NewJob,
    Outcome,
    Released,
    Succeeded,
    Usage,
    Via,
)
from engine.core.errors import (
    CancelRequestedError,
    ClaimRefusedError,
    ConditionRefusedError,
    JobConflictError,
    JobNotFailedError,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
)
from engine.text import bounded
from tests.contract.conftest import JobStore

NOW = 1_800_000_000_000
LEASE_MS = 60_000
DEADLINE_SECONDS = 3_600
PAYLOAD_INLINE_BYTES = 256 * 1024
DAY_MS = 86_400_000

JOB_INPUT: dict[str, Any] = {"text": "Win a free cruise — reply now", "labels": ["spam", "ham"]}
OUTPUT: dict[str, Any] = {"label": "spam", "confidence": 0.92}
TIMEOUT = JobErrorInfo(ErrorCode.PROVIDER_TIMEOUT, "the provider timed out", retryable=True)
RATE_LIMITED = JobErrorInfo(ErrorCode.PROVIDER_RATE_LIMITED, "the provider's flex tier is unavailable", retryable=True)
REJECTED = JobErrorInfo(ErrorCode.PROVIDER_REJECTED, "refused:\nthe prompt", retryable=False)
DEAD_LETTERED = JobErrorInfo(ErrorCode.DEAD_LETTERED, "the message was given up on", retryable=False)


def new_job(request_hash: str = "hash-a", *, max_attempts: int = 3, deadline_seconds: int = DEADLINE_SECONDS) -> NewJob:
    return NewJob(
        job_type="classify",
        user_id="user-1",
        schema_version=1,
        max_attempts=max_attempts,
        deadline_seconds=deadline_seconds,
        request_hash=request_hash,
    )


def submitted(**changes: Any) -> Job:
    """Job "job-1" as `new_job()` creates it at NOW, queued, with `changes` applied."""
    job = Job(
        job_id="job-1",
        job_type="classify",
        user_id="user-1",
        status=JobStatus.QUEUED,
        created_at=NOW,
        updated_at=NOW,
        max_attempts=3,
        schema_version=1,
        deadline_seconds=DEADLINE_SECONDS,
        deadline_at=NOW + DEADLINE_SECONDS * 1000,
        request_hash="hash-a",
    )
    return replace(job, **changes)


def claim(
    store: JobStore,
    job_id: str = "job-1",
    owner: str = "worker-a",
    at: int = NOW,
    request: NewJob | None = None,
) -> Job:
    """A full message's claim: the job is created when absent."""
    return store.claim_job(job_id, owner, LEASE_MS, at, request or new_job())


def attempt_of(
    job: Job,
    finished_at: int,
    outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED,
    *,
    input_tokens: int = 100,
    output_tokens: int = 20,
    cost_usd: str = "0.0012",
    error_code: ErrorCode | None = None,
) -> AttemptRecord:
    """The record of the attempt a claim (`job`, as claimed) made."""
    return AttemptRecord(
        job_id=job.job_id,
        attempt=job.claim_count,
        user_id=job.user_id,
        job_type=job.job_type,
        started_at=job.updated_at,
        finished_at=finished_at,
        outcome=outcome,
        error_code=error_code,
        provider="openai",
        tier="standard",
        model="gpt-4o-mini",
        calls=1,
        prompt_key="classify",
        prompt_version="v1",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=Decimal(cost_usd),
        latency_ms=finished_at - job.updated_at,
    )


def current(store: JobStore, job_id: str = "job-1") -> Job:
    job = store.get_job(job_id)
    assert job is not None, f"job {job_id} does not exist"
    return job


def open_ids(store: JobStore) -> set[str]:
    return {job.job_id for job in store.open_jobs(limit=1_000)}


def refusal(
    store: JobStore, job_id: str, at: int, request: NewJob | None, owner: str = "worker-b"
) -> ClaimRefusedError:
    with pytest.raises(ClaimRefusedError) as refused:
        store.claim_job(job_id, owner, LEASE_MS, at, request)
    return refused.value


# --- the claim ------------------------------------------------------------------------------------


def test_a_claim_with_a_new_job_creates_it_running_for_its_owner(job_store: JobStore) -> None:
    # Given no job "job-1"
    assert job_store.get_job("job-1") is None

    # When a full message claims it
    job = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW, new_job(max_attempts=2))

    # Then it is created running, leased to the claimer, one attempt counted, its input not stored
    assert job == submitted(
        status=JobStatus.RUNNING,
        max_attempts=2,
        attempt_count=1,
        claim_count=1,
        lease_owner="worker-a",
        lease_expires_at=NOW + LEASE_MS,
        cancel_requested=False,
        input_stored=False,
        started_at=NOW,
    )
    assert job_store.get_job("job-1") == job
    assert job_store.get_input("job-1") is None
    assert job_store.attempts("job-1") == []


def test_a_claim_of_an_absent_job_without_a_new_job_raises_not_found_and_creates_nothing(job_store: JobStore) -> None:
    # Given no job "ghost"
    # When a reference message (no new job) claims it
    with pytest.raises(JobNotFoundError) as missing:
        job_store.claim_job("ghost", "worker-a", LEASE_MS, NOW, None)

    # Then it is not found, and still absent
    assert missing.value.job_id == "ghost"
    assert job_store.get_job("ghost") is None


def test_jobs_are_read_many_at_a_time_and_absent_ones_left_out(job_store: JobStore) -> None:
    # Given 120 jobs (more than one BatchGetItem reads), one of them a background one
    ids = [f"many-{n:03d}" for n in range(120)]
    for job_id in ids:
        job_store.claim_job(job_id, "worker-a", LEASE_MS, NOW, new_job())
    background = replace(new_job(), lane=Lane.BACKGROUND)
    job_store.claim_job("many-bg", "worker-a", LEASE_MS, NOW, background)

    # When they are read with an absent one and a repeated one among them
    jobs = job_store.get_jobs([*ids, "ghost", ids[0], "many-bg"])

    # Then each existing job is there once, as a single read gives it
    assert set(jobs) == {*ids, "many-bg"}
    assert jobs[ids[7]] == job_store.get_job(ids[7])
    assert jobs["many-bg"].lane is Lane.BACKGROUND


def test_a_submitted_job_is_claimed_by_reference_keeping_its_input(job_store: JobStore) -> None:
    # Given a submitted (queued) job with its input stored
    submitted, _ = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)

    # When a reference message claims it a second later
    job = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)

    # Then it runs for the claimer, first started now, its input still stored
    assert job == replace(
        submitted,
        status=JobStatus.RUNNING,
        updated_at=NOW + 1_000,
        started_at=NOW + 1_000,
        lease_owner="worker-a",
        lease_expires_at=NOW + 1_000 + LEASE_MS,
        attempt_count=1,
        claim_count=1,
    )
    assert job.input_stored
    assert job_store.get_input("job-1") == JOB_INPUT


def test_a_claim_of_a_finished_job_is_refused_as_finished(job_store: JobStore) -> None:
    # Given a job that succeeded
    job = claim(job_store)
    job_store.finish_job(job, Succeeded(OUTPUT, "hash-out"), NOW + 1_000)
    finished = current(job_store)

    # When its message is delivered again
    refused = refusal(job_store, "job-1", NOW + 2_000, new_job())

    # Then the claim is refused as finished, with the job it met, which is unchanged
    assert (refused.reason, refused.job) == (ClaimRefusal.FINISHED, finished)
    assert current(job_store) == finished


def test_a_claim_of_a_job_whose_lease_has_not_expired_is_refused_as_held(job_store: JobStore) -> None:
    # Given a job leased to worker-a until NOW + LEASE_MS
    held = claim(job_store)

    # When another worker claims it at the very instant the lease ends
    refused = refusal(job_store, "job-1", NOW + LEASE_MS, None)

    # Then the lease still holds (it expires strictly after): refused as held, with worker-a's job
    assert (refused.reason, refused.job) == (ClaimRefusal.HELD, held)
    assert current(job_store) == held


def test_a_claim_with_another_request_hash_is_refused_as_a_conflict(job_store: JobStore) -> None:
    # Given a queued job submitted with request hash "hash-a"
    submitted, _ = job_store.create_job("job-1", new_job("hash-a"), JOB_INPUT, NOW)

    # When a message of another request (hash "hash-b") claims the same id
    refused = refusal(job_store, "job-1", NOW + 1_000, new_job("hash-b"))

    # Then it conflicts, though the job could be claimed, and the job is unchanged
    assert (refused.reason, refused.job) == (ClaimRefusal.CONFLICT, submitted)
    assert current(job_store) == submitted


def test_a_claim_of_an_abandoned_job_with_a_cancel_request_is_refused_as_cancel_requested(job_store: JobStore) -> None:
    # Given a running job whose cancel was requested, and whose worker died (its lease expired)
    claim(job_store)
    cancelling = job_store.request_cancel("job-1", NOW + 1_000)

    # When another worker claims it after the lease
    refused = refusal(job_store, "job-1", NOW + LEASE_MS + 1, new_job())

    # Then the claim is refused as cancel-requested, with the job it met
    assert (refused.reason, refused.job) == (ClaimRefusal.CANCEL_REQUESTED, cancelling)
    assert current(job_store) == cancelling


def test_a_claim_of_a_job_with_no_attempt_left_is_refused_as_attempts_spent(job_store: JobStore) -> None:
    # Given a job of one attempt, released after it
    job = claim(job_store, request=new_job(max_attempts=1))
    job_store.finish_job(job, Released(TIMEOUT), NOW + 1_000)
    released = current(job_store)
    assert (released.status, released.attempt_count) == (JobStatus.QUEUED, 1)

    # When its message comes back
    refused = refusal(job_store, "job-1", NOW + 2_000, new_job(max_attempts=1))

    # Then the claim is refused as attempts spent, with the job it met
    assert (refused.reason, refused.job) == (ClaimRefusal.ATTEMPTS_SPENT, released)
    assert current(job_store) == released


def test_a_claim_at_the_deadline_is_refused_as_deadline_passed(job_store: JobStore) -> None:
    # Given a queued job with a deadline 60 s after its submission
    submitted, _ = job_store.create_job("job-1", new_job(deadline_seconds=60), JOB_INPUT, NOW)

    # When it is claimed at the deadline itself
    refused = refusal(job_store, "job-1", NOW + 60_000, None)

    # Then the deadline has passed (it must lie strictly ahead): refused, with the job it met
    assert (refused.reason, refused.job) == (ClaimRefusal.DEADLINE_PASSED, submitted)
    assert current(job_store) == submitted


def test_a_running_job_whose_lease_expired_is_taken_over_by_another_worker(job_store: JobStore) -> None:
    # Given a job claimed by worker-a, which died
    first = claim(job_store, owner="worker-a")

    # When worker-b claims it just after the lease expired
    later = NOW + LEASE_MS + 1
    taken = job_store.claim_job("job-1", "worker-b", LEASE_MS, later, None)

    # Then worker-b holds it with a new lease; a second attempt and claim are counted; its start is kept
    assert taken == replace(
        first,
        lease_owner="worker-b",
        lease_expires_at=later + LEASE_MS,
        updated_at=later,
        attempt_count=2,
        claim_count=2,
    )
    assert current(job_store) == taken


# --- the finish -----------------------------------------------------------------------------------


def test_finishing_succeeded_writes_the_output_and_hash_clears_the_error_and_keeps_the_usage(
    job_store: JobStore,
) -> None:
    # Given a job whose first attempt was released with an error, and which was claimed again
    first = claim(job_store)
    first_attempt = attempt_of(first, NOW + 1_000, AttemptOutcome.RETRYABLE, error_code=ErrorCode.PROVIDER_TIMEOUT)
    job_store.finish_job(first, Released(TIMEOUT), NOW + 1_000, first_attempt)
    second = claim(job_store, at=NOW + 5_000)
    assert second.error == TIMEOUT

    # When its second attempt succeeds
    second_attempt = attempt_of(second, NOW + 6_000, input_tokens=50, output_tokens=10, cost_usd="0.0003")
    job_store.finish_job(second, Succeeded(OUTPUT, "hash-out"), NOW + 6_000, second_attempt)

    # Then it succeeded with its output and hash, no error, no lease, and both attempts' usage
    assert current(job_store) == replace(
        second,
        status=JobStatus.SUCCEEDED,
        updated_at=NOW + 6_000,
        finished_at=NOW + 6_000,
        lease_owner=None,
        lease_expires_at=None,
        output=OUTPUT,
        output_hash="hash-out",
        error=None,
        usage=Usage(input_tokens=150, output_tokens=30, cost_usd=Decimal("0.0015"), attempts=2),
    )
    assert job_store.attempts("job-1") == [first_attempt, second_attempt]


def test_cached_cache_write_and_reasoning_tokens_are_kept_per_attempt_and_summed_on_the_job(
    job_store: JobStore,
) -> None:
    # Given a job released after an attempt that wrote the prompt cache, and claimed again
    first = claim(job_store)
    first_attempt = replace(
        attempt_of(first, NOW + 1_000, AttemptOutcome.RETRYABLE, error_code=ErrorCode.PROVIDER_TIMEOUT),
        cache_write_input_tokens=60,
        cache_savings_usd=Decimal("-0.000012"),
    )
    job_store.finish_job(first, Released(TIMEOUT), NOW + 1_000, first_attempt)
    second = claim(job_store, at=NOW + 5_000)

    # When its second attempt, which read the cache and reasoned, succeeds
    second_attempt = replace(
        attempt_of(second, NOW + 6_000),
        cached_input_tokens=60,
        reasoning_tokens=12,
        cache_savings_usd=Decimal("0.0000045"),
    )
    job_store.finish_job(second, Succeeded(OUTPUT, "hash-out"), NOW + 6_000, second_attempt)

    # Then each record reads back as written, and the job sums every kind
    assert job_store.attempts("job-1") == [first_attempt, second_attempt]
    assert current(job_store).usage == Usage(
        input_tokens=200,
        output_tokens=40,
        cost_usd=Decimal("0.0024"),
        attempts=2,
        cached_input_tokens=60,
        cache_write_input_tokens=60,
        reasoning_tokens=12,
    )


def test_the_standard_cost_and_served_tier_of_each_attempt_are_kept_and_the_job_sums_the_standard_cost(
    job_store: JobStore,
) -> None:
    # Given a job whose first attempt, at the flex tier, was refused (no cost) and claimed again
    first = claim(job_store)
    refused = replace(
        attempt_of(first, NOW + 1_000, AttemptOutcome.RETRYABLE, input_tokens=0, output_tokens=0, cost_usd="0"),
        error_code=ErrorCode.PROVIDER_RATE_LIMITED,
        via=Via.FLEX,
    )
    job_store.finish_job(first, Released(RATE_LIMITED, refund_attempt=True), NOW + 1_000, refused)
    second = claim(job_store, at=NOW + 5_000)

    # When its second attempt is served at flex, at half its standard cost
    served = replace(
        attempt_of(second, NOW + 6_000, cost_usd="0.0006"),
        via=Via.FLEX,
        standard_cost_usd=Decimal("0.0012"),
        service_tier="flex",
    )
    job_store.finish_job(second, Succeeded(OUTPUT, "hash-out"), NOW + 6_000, served)

    # Then each record reads back as written (a standard cost equal to the cost reads back as it is)
    assert job_store.attempts("job-1") == [refused, served]
    usage = current(job_store).usage
    assert (usage.cost_usd, usage.standard_cost_usd, usage.attempts) == (Decimal("0.0006"), Decimal("0.0012"), 2)


def test_finishing_failed_writes_the_error_as_one_line_and_ends_the_job(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When its attempt fails for good (an error message of two lines)
    attempt = attempt_of(job, NOW + 1_000, AttemptOutcome.FAILED, error_code=ErrorCode.PROVIDER_REJECTED)
    job_store.finish_job(job, Failed(REJECTED), NOW + 1_000, attempt)

    # Then it failed with the error on one line, no lease, no output, and the attempt recorded
    assert current(job_store) == replace(
        job,
        status=JobStatus.FAILED,
        updated_at=NOW + 1_000,
        finished_at=NOW + 1_000,
        lease_owner=None,
        lease_expires_at=None,
        error=replace(REJECTED, message="refused:\\nthe prompt"),
        usage=Usage(input_tokens=100, output_tokens=20, cost_usd=Decimal("0.0012"), attempts=1),
    )
    assert job_store.attempts("job-1") == [attempt]


def test_finishing_released_puts_the_job_back_to_queued_with_its_error(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When its attempt is released for a retry
    job_store.finish_job(job, Released(TIMEOUT), NOW + 1_000)

    # Then it waits again, queued with the error, the attempt counted and the lease let go
    released = current(job_store)
    assert released == replace(
        job,
        status=JobStatus.QUEUED,
        updated_at=NOW + 1_000,
        lease_owner=None,
        lease_expires_at=None,
        error=TIMEOUT,
    )
    assert (released.attempt_count, released.finished_at) == (1, None)


def test_finishing_released_with_a_refund_does_not_count_the_attempt(job_store: JobStore) -> None:
    # Given a job running its second attempt
    first = claim(job_store)
    job_store.finish_job(first, Released(TIMEOUT), NOW + 1_000)
    second = claim(job_store, at=NOW + 2_000)
    assert second.attempt_count == 2

    # When the attempt is handed back without counting (a rate limit, too little time left)
    job_store.finish_job(second, Released(None, refund_attempt=True), NOW + 3_000)

    # Then one attempt is counted, two claims are, and the earlier error stays
    released = current(job_store)
    assert (released.status, released.attempt_count, released.claim_count) == (JobStatus.QUEUED, 1, 2)
    assert released.error == TIMEOUT


def test_finishing_after_a_cancel_request_raises_cancel_requested_and_writes_nothing(job_store: JobStore) -> None:
    # Given a running job whose cancel was requested while it ran
    job = claim(job_store)
    cancelling = job_store.request_cancel("job-1", NOW + 1_000)

    # When its worker finishes it succeeded
    with pytest.raises(CancelRequestedError) as cancelled:
        job_store.finish_job(job, Succeeded(OUTPUT, "hash-out"), NOW + 2_000, attempt_of(job, NOW + 2_000))

    # Then the cancel wins: nothing is written, not even the attempt
    assert cancelled.value.job_id == "job-1"
    assert current(job_store) == cancelling
    assert job_store.attempts("job-1") == []


def test_finishing_cancelled_ends_a_cancel_requested_job_and_keeps_its_usage(job_store: JobStore) -> None:
    # Given a running job whose cancel was requested while it ran
    job = claim(job_store)
    job_store.request_cancel("job-1", NOW + 1_000)

    # When its worker finishes it cancelled, with the attempt it made
    attempt = attempt_of(job, NOW + 2_000)
    job_store.finish_job(job, Cancelled(), NOW + 2_000, attempt)

    # Then it is cancelled, with no output, and the attempt's usage kept
    assert current(job_store) == replace(
        job,
        status=JobStatus.CANCELLED,
        cancel_requested=True,
        updated_at=NOW + 2_000,
        finished_at=NOW + 2_000,
        lease_owner=None,
        lease_expires_at=None,
        usage=Usage(input_tokens=100, output_tokens=20, cost_usd=Decimal("0.0012"), attempts=1),
    )
    assert job_store.attempts("job-1") == [attempt]


def test_finishing_after_a_takeover_raises_lease_lost_with_the_current_job(job_store: JobStore) -> None:
    # Given a job worker-a claimed, then worker-b took over after the lease expired
    stale = claim(job_store, owner="worker-a")
    taken = job_store.claim_job("job-1", "worker-b", LEASE_MS, NOW + LEASE_MS + 1, None)

    # When worker-a wakes up and finishes it
    with pytest.raises(LeaseLostError) as lost:
        job_store.finish_job(stale, Succeeded(OUTPUT, "stale"), NOW + LEASE_MS + 2, attempt_of(stale, NOW + LEASE_MS))

    # Then its lease is lost: the refusal carries worker-b's job, which is unchanged, and no attempt is kept
    assert lost.value.job == taken
    assert current(job_store) == taken
    assert job_store.attempts("job-1") == []


def test_finishing_the_same_claim_twice_raises_lease_lost(job_store: JobStore) -> None:
    # Given a job its worker finished succeeded
    job = claim(job_store)
    job_store.finish_job(job, Succeeded(OUTPUT, "hash-out"), NOW + 1_000)
    finished = current(job_store)

    # When it is finished again with the job as claimed
    with pytest.raises(LeaseLostError) as lost:
        job_store.finish_job(job, Failed(REJECTED), NOW + 2_000)

    # Then the second finish is refused with the finished job, which stays as it was
    assert lost.value.job == finished
    assert current(job_store) == finished


def test_finishing_an_absent_job_raises_lease_lost_with_no_job(job_store: JobStore) -> None:
    # Given a job read as running that is not in the store
    ghost = Job(
        job_id="ghost",
        job_type="classify",
        user_id="user-1",
        status=JobStatus.RUNNING,
        created_at=NOW,
        updated_at=NOW,
        lease_owner="worker-a",
        lease_expires_at=NOW + LEASE_MS,
    )

    # When it is finished
    with pytest.raises(LeaseLostError) as lost:
        job_store.finish_job(ghost, Failed(REJECTED), NOW + 1_000)

    # Then the lease is lost with no job, and nothing was created
    assert lost.value.job is None
    assert job_store.get_job("ghost") is None


def test_a_failed_finish_that_stores_the_input_makes_it_readable(job_store: JobStore) -> None:
    # Given a job a full message created (its input only in the message)
    job = claim(job_store)
    assert not job.input_stored

    # When it fails, storing the input the message carried
    job_store.finish_job(job, Failed(REJECTED), NOW + 1_000, store_input=JOB_INPUT)

    # Then its input can be read and the job says it is stored
    assert job_store.get_input("job-1") == JOB_INPUT
    assert current(job_store).input_stored


def test_a_finish_whose_input_is_not_json_raises_type_error_and_writes_nothing(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When it fails with an input to store that JSON cannot hold, and the attempt it made
    with pytest.raises(TypeError):
        job_store.finish_job(job, Failed(REJECTED), NOW + 1_000, attempt_of(job, NOW + 1_000), {"when": {1, 2}})

    # Then nothing is written: the job still runs, no attempt and no input are kept
    assert current(job_store) == job
    assert job_store.attempts("job-1") == []
    assert job_store.get_input("job-1") is None


def test_inputs_and_outputs_read_back_as_json(job_store: JobStore) -> None:
    # Given a job submitted with an input holding a tuple, and run to an output holding one
    job_store.create_job("job-1", new_job(), {"pair": (1, 2), "text": "é"}, NOW)
    job = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)
    job_store.finish_job(job, Succeeded({"labels": ("spam", "ham")}, "hash-out"), NOW + 2_000)

    # When they are read back, and the input read is changed by its reader
    job_input = job_store.get_input("job-1")
    assert job_input is not None
    job_input["pair"].append(3)

    # Then both are JSON values (the tuple a list), and the stored input is unchanged
    assert job_store.get_input("job-1") == {"pair": [1, 2], "text": "é"}
    assert current(job_store).output == {"labels": ["spam", "ham"]}


# --- a job no worker holds: settle and touch -------------------------------------------------------


def test_settling_a_job_as_it_was_read_ends_it(job_store: JobStore) -> None:
    # Given a queued job read after its deadline passed
    job_store.create_job("job-1", new_job(deadline_seconds=60), JOB_INPUT, NOW)
    read = current(job_store)

    # When it is settled failed
    settled = job_store.end_job(read, JobStatus.FAILED, REJECTED, NOW + 61_000)

    # Then it failed with the error (on one line), and is no longer open
    assert settled
    assert current(job_store) == replace(
        read,
        status=JobStatus.FAILED,
        updated_at=NOW + 61_000,
        finished_at=NOW + 61_000,
        error=replace(REJECTED, message="refused:\\nthe prompt"),
    )
    assert open_ids(job_store) == set()


def test_settling_a_job_failed_with_its_input_stores_it(job_store: JobStore) -> None:
    # Given a job a full message created, abandoned by its worker, read after the lease expired
    claim(job_store)
    read = current(job_store)

    # When it is settled failed with the input the message carried
    assert job_store.end_job(read, JobStatus.FAILED, REJECTED, NOW + LEASE_MS + 1, store_input=JOB_INPUT)

    # Then it failed, its lease let go, and its input is stored
    settled = current(job_store)
    assert (settled.status, settled.lease_owner, settled.lease_expires_at) == (JobStatus.FAILED, None, None)
    assert settled.input_stored
    assert job_store.get_input("job-1") == JOB_INPUT


def test_settling_is_refused_when_the_job_was_claimed_again_since_it_was_read(job_store: JobStore) -> None:
    # Given a running job read after its lease expired, which another worker then took over
    claim(job_store, owner="worker-a")
    read = current(job_store)
    taken = job_store.claim_job("job-1", "worker-b", LEASE_MS, NOW + LEASE_MS + 1, None)
    assert taken.status is read.status

    # When it is settled as it was read
    settled = job_store.end_job(read, JobStatus.FAILED, REJECTED, NOW + LEASE_MS + 2)

    # Then the claim count changed: refused, and worker-b's job is unchanged
    assert not settled
    assert current(job_store) == taken


def test_settling_is_refused_when_the_status_changed_since_it_was_read(job_store: JobStore) -> None:
    # Given a queued job read, then cancelled
    job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)
    read = current(job_store)
    cancelled = job_store.request_cancel("job-1", NOW + 1_000)

    # When it is settled as it was read
    settled = job_store.end_job(read, JobStatus.FAILED, REJECTED, NOW + 2_000)

    # Then it is refused, and the job stays cancelled
    assert not settled
    assert current(job_store) == cancelled


def test_settling_an_absent_job_is_refused(job_store: JobStore) -> None:
    # Given a job read as queued that is not in the store
    ghost = Job(job_id="ghost", job_type=None, user_id=None, status=JobStatus.QUEUED, created_at=NOW, updated_at=NOW)

    # When it is settled
    # Then it is refused, and nothing is created
    assert not job_store.end_job(ghost, JobStatus.CANCELLED, None, NOW + 1_000)
    assert job_store.get_job("ghost") is None


def test_touching_a_job_as_it_was_read_changes_only_its_update_time(job_store: JobStore) -> None:
    # Given a queued job read
    job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)
    read = current(job_store)

    # When it is marked re-enqueued
    touched = job_store.touch_job(read, NOW + 1_000)

    # Then it is, and only its update time changed
    assert touched
    assert current(job_store) == replace(read, updated_at=NOW + 1_000)


def test_touching_is_refused_when_the_job_changed_since_it_was_read(job_store: JobStore) -> None:
    # Given a queued job read, which a worker then claimed
    job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)
    read = current(job_store)
    claimed = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)

    # When it is marked re-enqueued as it was read, and a job that does not exist is too
    touched = job_store.touch_job(read, NOW + 2_000)
    ghost_touched = job_store.touch_job(replace(read, job_id="ghost"), NOW + 2_000)

    # Then both are refused; the claimed job is unchanged and no job is created
    assert (touched, ghost_touched) == (False, False)
    assert current(job_store) == claimed
    assert job_store.get_job("ghost") is None


# --- attempts -------------------------------------------------------------------------------------


def test_an_orphan_attempt_adds_its_usage_and_record_and_nothing_else(job_store: JobStore) -> None:
    # Given a job worker-a lost to worker-b, after worker-a's attempt had already cost tokens
    stale = claim(job_store, owner="worker-a")
    taken = job_store.claim_job("job-1", "worker-b", LEASE_MS, NOW + LEASE_MS + 1, None)

    # When worker-a keeps the usage of its discarded attempt
    orphan = attempt_of(stale, NOW + LEASE_MS + 2, input_tokens=70, output_tokens=7, cost_usd="0.0005")
    job_store.record_orphan_attempt(orphan, NOW + LEASE_MS + 2)

    # Then the usage is added and the attempt recorded; worker-b's job is otherwise unchanged
    assert current(job_store) == replace(
        taken, usage=Usage(input_tokens=70, output_tokens=7, cost_usd=Decimal("0.0005"), attempts=1)
    )
    assert job_store.attempts("job-1") == [orphan]


def test_an_orphan_attempt_of_an_absent_job_is_refused_and_not_recorded(job_store: JobStore) -> None:
    # Given no job "ghost"
    ghost = Job(
        job_id="ghost", job_type="classify", user_id="user-1", status=JobStatus.RUNNING, created_at=NOW, updated_at=NOW
    )

    # When an attempt of it is recorded
    with pytest.raises(ConditionRefusedError) as refused:
        job_store.record_orphan_attempt(attempt_of(ghost, NOW + 1_000), NOW + 1_000)

    # Then it is refused with no job, and neither the job nor the attempt exists
    assert refused.value.job is None
    assert job_store.get_job("ghost") is None
    assert job_store.attempts("ghost") == []


def test_attempts_read_back_oldest_first_whatever_order_they_were_written_in(job_store: JobStore) -> None:
    # Given a job, and the records of its attempts 10, 2 and 1 written in that order
    job = claim(job_store)
    records = [replace(attempt_of(job, NOW + number), attempt=number) for number in (10, 2, 1)]
    for record in records:
        job_store.record_orphan_attempt(record, record.finished_at)

    # When its attempts are read
    attempts = job_store.attempts("job-1")

    # Then they come back by attempt number, oldest first
    assert [record.attempt for record in attempts] == [1, 2, 10]
    assert attempts == sorted(records, key=lambda record: record.attempt)


def test_an_attempt_record_keeps_names_to_256_characters(job_store: JobStore) -> None:
    # Given a job, and an attempt whose provider gave a 300-character model name
    job = claim(job_store)
    long_name = "m" * 300

    # When the attempt is recorded
    job_store.record_orphan_attempt(replace(attempt_of(job, NOW + 1_000), model=long_name), NOW + 1_000)

    # Then its model is kept cut to 256 characters, saying how much was left out
    (recorded,) = job_store.attempts("job-1")
    assert recorded.model == bounded(long_name, 256)
    assert len(recorded.model) == 256


# --- administration: submit, cancel, retry --------------------------------------------------------


def test_creating_a_job_stores_it_queued_with_its_input(job_store: JobStore) -> None:
    # Given no job "job-1"
    # When it is submitted
    job, created = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)

    # Then it is created queued, its input stored, not yet started
    assert created
    assert job == submitted(input_stored=True)
    assert current(job_store) == job
    assert job_store.get_input("job-1") == JOB_INPUT


def test_creating_a_job_again_with_the_same_request_returns_it_uncreated(job_store: JobStore) -> None:
    # Given a submitted job, since claimed
    job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)
    claimed = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)

    # When the same request is submitted again
    job, created = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW + 2_000)

    # Then the job as it is comes back, not created, unchanged
    assert (job, created) == (claimed, False)
    assert current(job_store) == claimed


def test_creating_a_job_with_another_request_conflicts_and_keeps_the_first(job_store: JobStore) -> None:
    # Given a submitted job with request hash "hash-a"
    submitted, _ = job_store.create_job("job-1", new_job("hash-a"), JOB_INPUT, NOW)

    # When another request (hash "hash-b", another input) is submitted under the same id
    with pytest.raises(JobConflictError) as conflict:
        job_store.create_job("job-1", new_job("hash-b"), {"text": "other"}, NOW + 1_000)

    # Then it conflicts; the job and its input stay the first request's
    assert conflict.value.job_id == "job-1"
    assert current(job_store) == submitted
    assert job_store.get_input("job-1") == JOB_INPUT


def test_creating_a_job_conflicts_with_a_job_a_message_of_another_request_created(job_store: JobStore) -> None:
    # Given a job a full message created with request hash "hash-a" (no input stored)
    claimed = claim(job_store, request=new_job("hash-a"))

    # When a request with hash "hash-b" is submitted under the same id
    with pytest.raises(JobConflictError):
        job_store.create_job("job-1", new_job("hash-b"), JOB_INPUT, NOW + 1_000)

    # Then it conflicts, and the job is unchanged
    assert current(job_store) == claimed


def test_cancelling_a_queued_job_ends_it_at_once(job_store: JobStore) -> None:
    # Given a queued job
    submitted, _ = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)

    # When its cancel is requested
    cancelled = job_store.request_cancel("job-1", NOW + 1_000)

    # Then it is cancelled at once
    assert cancelled == replace(
        submitted,
        status=JobStatus.CANCELLED,
        cancel_requested=True,
        updated_at=NOW + 1_000,
        finished_at=NOW + 1_000,
    )
    assert current(job_store) == cancelled


def test_cancelling_a_running_job_marks_it_for_its_finishing_fence(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When its cancel is requested
    cancelling = job_store.request_cancel("job-1", NOW + 1_000)

    # Then it keeps running for its worker, with the request marked
    assert cancelling == replace(job, cancel_requested=True, updated_at=NOW + 1_000)
    assert current(job_store) == cancelling


def test_cancelling_a_finished_job_leaves_it_as_it_is(job_store: JobStore) -> None:
    # Given a job that succeeded
    job = claim(job_store)
    job_store.finish_job(job, Succeeded(OUTPUT, "hash-out"), NOW + 1_000)
    finished = current(job_store)

    # When its cancel is requested
    answered = job_store.request_cancel("job-1", NOW + 2_000)

    # Then the job comes back unchanged
    assert answered == finished
    assert current(job_store) == finished


def test_cancelling_an_absent_job_raises_not_found(job_store: JobStore) -> None:
    # Given no job "ghost"
    # When its cancel is requested
    with pytest.raises(JobNotFoundError):
        job_store.request_cancel("ghost", NOW)

    # Then nothing is created
    assert job_store.get_job("ghost") is None


def test_requeueing_a_failed_job_gives_it_a_fresh_budget_and_deadline(job_store: JobStore) -> None:
    # Given a submitted job that failed on its second attempt
    job_store.create_job("job-1", new_job(max_attempts=2), JOB_INPUT, NOW)
    first = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)
    job_store.finish_job(first, Released(TIMEOUT), NOW + 2_000)
    second = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 3_000, None)
    job_store.finish_job(second, Failed(REJECTED), NOW + 4_000)
    failed = current(job_store)

    # When it is requeued a day later
    later = NOW + 86_400_000
    requeued = job_store.requeue_failed_job("job-1", later)

    # Then it waits again: no attempt counted, a deadline from now, no error, not finished, open
    assert requeued == replace(
        failed,
        status=JobStatus.QUEUED,
        updated_at=later,
        attempt_count=0,
        deadline_at=later + DEADLINE_SECONDS * 1000,
        error=None,
        finished_at=None,
    )
    assert requeued.claim_count == 2
    assert current(job_store) == requeued
    assert open_ids(job_store) == {"job-1"}
    assert job_store.claim_job("job-1", "worker-b", LEASE_MS, later + 1_000, None).attempt_count == 1


def test_requeueing_a_job_that_did_not_fail_is_refused(job_store: JobStore) -> None:
    # Given a queued job
    submitted, _ = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)

    # When it is requeued
    with pytest.raises(JobNotFailedError, match="only a failed job"):
        job_store.requeue_failed_job("job-1", NOW + 1_000)

    # Then it is refused and unchanged
    assert current(job_store) == submitted


def test_requeueing_a_failed_job_without_a_stored_input_is_refused(job_store: JobStore) -> None:
    # Given a job a full message created, failed without storing its input
    job = claim(job_store)
    job_store.finish_job(job, Failed(REJECTED), NOW + 1_000)
    failed = current(job_store)

    # When it is requeued
    with pytest.raises(JobStateError, match="no stored input") as refused:
        job_store.requeue_failed_job("job-1", NOW + 2_000)

    # Then it is refused and stays failed: a job that cannot run again, not one that did not fail
    assert not isinstance(refused.value, JobNotFailedError)
    assert current(job_store) == failed


def test_requeueing_an_absent_job_raises_not_found(job_store: JobStore) -> None:
    # Given no job "ghost"
    # When it is requeued
    # Then it is not found
    with pytest.raises(JobNotFoundError):
        job_store.requeue_failed_job("ghost", NOW)


# --- dead letters ---------------------------------------------------------------------------------


def test_a_failed_job_is_recorded_for_a_message_that_could_not_run(job_store: JobStore) -> None:
    # Given no job "job-1"
    # When a message naming it is given up on
    recorded = job_store.create_failed_job(
        "job-1",
        REJECTED,
        NOW,
        job_type="classify",
        user_id="user-1",
        max_attempts=3,
        message_hash="msg-hash",
        lane=Lane.BACKGROUND,
    )

    # Then the job is recorded failed with what the message said and no input
    assert recorded is None
    assert current(job_store) == Job(
        job_id="job-1",
        job_type="classify",
        user_id="user-1",
        status=JobStatus.FAILED,
        created_at=NOW,
        updated_at=NOW,
        max_attempts=3,
        request_hash="msg-hash",
        finished_at=NOW,
        error=replace(REJECTED, message="refused:\\nthe prompt"),
        lane=Lane.BACKGROUND,
    )
    assert job_store.get_input("job-1") is None


def test_a_failed_job_is_not_recorded_over_an_existing_one(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When a failed job is recorded under its id
    existing = job_store.create_failed_job("job-1", DEAD_LETTERED, NOW + 1_000)

    # Then the job already there comes back, unchanged
    assert existing == job
    assert current(job_store) == job


def test_a_dead_lettered_request_is_recorded_failed_with_its_input_and_can_be_retried(job_store: JobStore) -> None:
    # Given no job "job-1"
    # When a full request whose job was never created is given up on
    recorded = job_store.create_dead_lettered_job("job-1", new_job(), JOB_INPUT, DEAD_LETTERED, NOW)

    # Then the job is recorded failed with its input stored, not open, and can be requeued
    assert recorded is None
    assert current(job_store) == submitted(
        status=JobStatus.FAILED, input_stored=True, finished_at=NOW, error=DEAD_LETTERED
    )
    assert job_store.get_input("job-1") == JOB_INPUT
    assert open_ids(job_store) == set()
    assert job_store.requeue_failed_job("job-1", NOW + 1_000).status is JobStatus.QUEUED


def test_a_dead_lettered_request_is_not_recorded_over_an_existing_job(job_store: JobStore) -> None:
    # Given a submitted job
    submitted, _ = job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)

    # When a request under its id is given up on, with another input
    existing = job_store.create_dead_lettered_job("job-1", new_job(), {"text": "other"}, DEAD_LETTERED, NOW + 1_000)

    # Then the job already there comes back; neither it nor its input changed
    assert existing == submitted
    assert current(job_store) == submitted
    assert job_store.get_input("job-1") == JOB_INPUT


def test_a_dead_letter_reads_back_as_it_was_recorded(job_store: JobStore) -> None:
    # Given a message body of non-ASCII text, its attributes and a reason of two lines
    body = '{"job_id": "job-1", "note": "café"}'
    attributes = {"ApproximateReceiveCount": "5", "SentTimestamp": "1800000000000"}

    # When it is kept as a dead letter
    job_store.record_dead_letter("message-1", body, attributes, 5, "unreadable:\nbody", NOW)

    # Then it reads back whole: its body, size in bytes, attributes, receive count, reason on one line
    letter = job_store.dead_letter("message-1")
    assert letter is not None
    assert (letter.message_id, letter.body, letter.body_key) == ("message-1", body, None)
    assert letter.body_bytes == len(body.encode()) == len(body) + 1
    assert (letter.attributes, letter.receive_count) == (attributes, 5)
    assert (letter.reason, letter.recorded_at) == ("unreadable:\\nbody", NOW)
    assert job_store.dead_letter("message-2") is None


def test_a_dead_letter_past_256_kib_is_kept_as_a_payload_and_reads_back_whole(job_store: JobStore) -> None:
    # Given a message body just past 256 KiB
    body = "x" * (PAYLOAD_INLINE_BYTES + 1)

    # When it is kept as a dead letter
    job_store.record_dead_letter("message-1", body, {}, 1, "too large", NOW)

    # Then it is kept by reference, and still reads back whole
    letter = job_store.dead_letter("message-1")
    assert letter is not None
    assert letter.body_key is not None
    assert (letter.body, letter.body_bytes, letter.attributes) == (body, PAYLOAD_INLINE_BYTES + 1, {})


def test_a_dead_letter_that_names_a_job_is_listed_by_day_and_in_the_jobs_history(job_store: JobStore) -> None:
    # Given a job that ran one attempt
    job = claim(job_store)
    record = attempt_of(job, NOW + 1_000, AttemptOutcome.RETRYABLE, error_code=ErrorCode.PROVIDER_TIMEOUT)
    job_store.finish_job(job, Released(TIMEOUT), NOW + 1_000, record)

    # When a message naming it is kept as a dead letter
    job_store.record_dead_letter(
        "message-1", '{"job_id": "job-1"}', {}, 100, "reached\nthe queue", NOW + 2_000, "job-1"
    )

    # Then the dead letter names the job, the day's listing holds it, and so does the job's history
    entry = DeadLetterEntry("message-1", NOW + 2_000, 100, "reached\\nthe queue", "job-1")
    letter = job_store.dead_letter("message-1")
    assert letter is not None
    assert letter.job_id == "job-1"
    assert job_store.dead_letters(NOW, NOW + 2_000) == [entry]
    assert job_store.job_history("job-1") == JobHistory(attempts=[record], dead_letters=[entry])
    assert job_store.job_history("job-2") == JobHistory(attempts=[], dead_letters=[])


def test_the_details_of_a_job_without_a_stored_input_or_of_no_job(job_store: JobStore) -> None:
    # Given a job created by a full message's claim (its input not stored)
    claim(job_store)

    # Then its details hold no input, and an absent job has none
    details = job_store.job_details("job-1")
    assert details is not None
    assert (details.job, details.history, details.input_json) == (current(job_store), JobHistory([], []), None)
    assert job_store.job_details("job-2") is None


def test_a_dead_letter_that_names_no_job_is_listed_only(job_store: JobStore) -> None:
    # When a body that names no job is kept as a dead letter
    job_store.record_dead_letter("message-1", "not json", {}, 1, "not JSON", NOW)

    # Then it is listed, naming no job, and is in no job's history
    assert job_store.dead_letters(NOW, NOW) == [DeadLetterEntry("message-1", NOW, 1, "not JSON", None)]
    letter = job_store.dead_letter("message-1")
    assert letter is not None
    assert letter.job_id is None
    assert job_store.job_history("message-1").dead_letters == []


def test_recording_a_message_again_changes_nothing(job_store: JobStore) -> None:
    # Given a message kept as a dead letter naming a job
    body = '{"job_id": "job-1"}'
    job_store.record_dead_letter("message-1", body, {"ApproximateReceiveCount": "3"}, 3, "given up", NOW, "job-1")
    first = job_store.dead_letter("message-1")

    # When it is recorded again, the same and a day later with another reason and receive count
    job_store.record_dead_letter("message-1", body, {"ApproximateReceiveCount": "3"}, 3, "given up", NOW, "job-1")
    job_store.record_dead_letter("message-1", body, {}, 100, "reached the queue", NOW + DAY_MS, "job-1")

    # Then the first recording stands: one dead letter, one listing entry, one entry in the history
    entry = DeadLetterEntry("message-1", NOW, 3, "given up", "job-1")
    assert job_store.dead_letter("message-1") == first
    assert job_store.dead_letters(NOW - DAY_MS, NOW + DAY_MS) == [entry]
    assert job_store.job_history("job-1").dead_letters == [entry]


def test_dead_letters_are_listed_newest_first_within_the_range_and_the_limit(job_store: JobStore) -> None:
    # Given dead letters recorded two days ago, yesterday, and twice in the same millisecond now
    times = {"m-a": NOW - 2 * DAY_MS, "m-b": NOW - DAY_MS, "m-c": NOW, "m-d": NOW}
    for message_id, at in times.items():
        job_store.record_dead_letter(message_id, "not json", {}, 1, "not JSON", at)

    def listed(since: int, until: int, limit: int | None = None) -> list[str]:
        return [entry.message_id for entry in job_store.dead_letters(since, until, limit)]

    # Then they come newest first (the message id orders one millisecond), across days,
    # the range's bounds included, cut to the limit
    assert listed(NOW - 3 * DAY_MS, NOW + DAY_MS) == ["m-d", "m-c", "m-b", "m-a"]
    assert listed(NOW - 3 * DAY_MS, NOW + DAY_MS, limit=3) == ["m-d", "m-c", "m-b"]
    assert listed(NOW - DAY_MS, NOW) == ["m-d", "m-c", "m-b"]
    assert listed(NOW - 2 * DAY_MS, NOW - DAY_MS) == ["m-b", "m-a"]
    assert listed(NOW - DAY_MS + 1, NOW - 1) == []


def test_a_jobs_history_is_its_attempts_and_dead_letters_oldest_first(job_store: JobStore) -> None:
    # Given a submitted job (its input stored) that ran twice, named by two dead letters
    job_store.create_job("job-1", new_job(), JOB_INPUT, NOW)
    first = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 1_000, None)
    retried = attempt_of(first, NOW + 2_000, AttemptOutcome.RETRYABLE, error_code=ErrorCode.PROVIDER_TIMEOUT)
    job_store.finish_job(first, Released(TIMEOUT), NOW + 2_000, retried)
    job_store.record_dead_letter("message-2", '{"job_id": "job-1"}', {}, 2, "later", NOW + 4_000, "job-1")
    job_store.record_dead_letter("message-1", '{"job_id": "job-1"}', {}, 1, "earlier", NOW + 3_000, "job-1")
    second = job_store.claim_job("job-1", "worker-b", LEASE_MS, NOW + 5_000, None)
    succeeded = attempt_of(second, NOW + 6_000)
    job_store.finish_job(second, Succeeded(OUTPUT, "hash"), NOW + 6_000, succeeded)

    # When its history is read, and its details
    history = job_store.job_history("job-1")
    details = job_store.job_details("job-1")

    # Then it holds both attempts and both dead letters, each oldest first, and not the input
    assert history.attempts == [retried, succeeded]
    assert [entry.message_id for entry in history.dead_letters] == ["message-1", "message-2"]
    # and its details the job as it is, the same history, and the input as the JSON it was stored as
    assert details is not None
    assert (details.job, details.history) == (current(job_store), history)
    assert details.input_json is not None
    assert json.loads(details.input_json) == JOB_INPUT


# --- reads ----------------------------------------------------------------------------------------


def test_an_input_past_256_kib_reads_back_whole(job_store: JobStore) -> None:
    # Given an input larger than a job's item keeps inline
    job_input = {"text": "y" * (PAYLOAD_INLINE_BYTES + 1)}

    # When it is submitted
    job, _ = job_store.create_job("job-1", new_job(), job_input, NOW)

    # Then it reads back whole
    assert job.input_stored
    assert job_store.get_input("job-1") == job_input


def test_open_jobs_are_exactly_the_jobs_not_finished(job_store: JobStore) -> None:
    # Given a queued job, a running one, a released one, and one each succeeded, failed and cancelled
    job_store.create_job("queued", new_job(), JOB_INPUT, NOW)
    claim(job_store, "running")
    job_store.finish_job(claim(job_store, "released"), Released(TIMEOUT), NOW + 1_000)
    job_store.finish_job(claim(job_store, "succeeded"), Succeeded(OUTPUT, "hash-out"), NOW + 1_000)
    job_store.create_failed_job("failed", REJECTED, NOW)
    job_store.create_job("cancelled", new_job(), JOB_INPUT, NOW)
    job_store.request_cancel("cancelled", NOW + 1_000)

    # When the open jobs are listed
    open_jobs = {job.job_id: job for job in job_store.open_jobs(limit=1_000)}

    # Then they are the queued, running and released jobs, as they are now
    assert set(open_jobs) == {"queued", "running", "released"}
    assert all(job == current(job_store, job_id) for job_id, job in open_jobs.items())


def test_open_jobs_never_returns_more_than_its_limit(job_store: JobStore) -> None:
    # Given twelve open jobs (spread over every shard of the index)
    for index in range(12):
        job_store.create_job(f"open-{index}", new_job(), JOB_INPUT, NOW)

    # When fewer are asked for than there are shards, or than there are jobs
    # Then no more than asked for come back
    assert len(list(job_store.open_jobs(limit=1))) == 1
    assert len(list(job_store.open_jobs(limit=10))) <= 10


def test_saved_walks_go_on_where_the_last_stopped_until_every_open_job_is_reached(job_store: JobStore) -> None:
    # Given twelve open jobs, each with its own deadline, and walks of at most eight jobs (one a
    # shard of the index): one walk cannot hold them all
    for index in range(12):
        job_store.create_job(f"open-{index:02d}", new_job(deadline_seconds=DEADLINE_SECONDS + index), JOB_INPUT, NOW)
    everyone = {f"open-{index:02d}" for index in range(12)}

    # A walk that is not saved changes nothing: the next one hands out the same jobs
    assert [job.job_id for job in job_store.open_jobs(limit=8)] == [job.job_id for job in job_store.open_jobs(limit=8)]

    # When walks are saved one after the other
    reached: set[str] = set()
    walks = 0
    while reached != everyone and walks < len(everyone):
        walk = job_store.open_jobs(limit=8)
        handed = [job.job_id for job in walk]
        assert len(handed) <= 8
        reached.update(handed)
        walk.save()
        walks += 1

    # Then every open job was reached, within one walk per job of the largest segment at most
    assert reached == everyone


# --- transitions the state machine forbids --------------------------------------------------------

QUEUED_JOB = Job(
    job_id="job-1", job_type="classify", user_id="user-1", status=JobStatus.QUEUED, created_at=NOW, updated_at=NOW
)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (JobStatus.QUEUED, Succeeded(OUTPUT, "hash-out")),
        (JobStatus.QUEUED, Released(TIMEOUT)),
        (JobStatus.SUCCEEDED, Failed(REJECTED)),
        (JobStatus.CANCELLED, Cancelled()),
        (JobStatus.FAILED, Succeeded(OUTPUT, "hash-out")),
    ],
)
def test_finishing_a_job_from_a_status_that_cannot_reach_the_outcome_raises_value_error(
    job_store: JobStore, status: JobStatus, outcome: Outcome
) -> None:
    # Given a job read in a status the outcome cannot follow
    job = replace(QUEUED_JOB, status=status)

    # When it is finished with that outcome
    with pytest.raises(ValueError, match="is not a transition"):
        job_store.finish_job(job, outcome, NOW + 1_000)

    # Then nothing is written
    assert job_store.get_job("job-1") is None


@pytest.mark.parametrize(
    ("status", "target"),
    [
        (JobStatus.QUEUED, JobStatus.QUEUED),
        (JobStatus.QUEUED, JobStatus.SUCCEEDED),
        (JobStatus.SUCCEEDED, JobStatus.FAILED),
        (JobStatus.CANCELLED, JobStatus.FAILED),
        (JobStatus.FAILED, JobStatus.CANCELLED),
    ],
)
def test_settling_a_job_to_a_status_it_cannot_reach_raises_value_error(
    job_store: JobStore, status: JobStatus, target: JobStatus
) -> None:
    # Given a job read in a status the target cannot follow
    job = replace(QUEUED_JOB, status=status)

    # When it is settled to that target
    with pytest.raises(ValueError, match="is not a transition"):
        job_store.end_job(job, target, None, NOW + 1_000)

    # Then nothing is written
    assert job_store.get_job("job-1") is None


# --- claims into a provider's batch (docs/batches.md) -----------------------------------------------

BATCH = BatchTerms(window="1799999700000", eligible_at_ms=NOW + 2_000_000, lease_before_deadline_ms=600_000)


def background_job(deadline_seconds: int = DEADLINE_SECONDS) -> NewJob:
    return replace(new_job(deadline_seconds=deadline_seconds), lane=Lane.BACKGROUND)


def test_a_batch_claim_of_a_new_background_job_holds_it_until_before_its_deadline(job_store: JobStore) -> None:
    # When a new background job is claimed into a batch window
    job = job_store.claim_job("job-1", "batch-a", LEASE_MS, NOW, background_job(), BATCH)

    # Then it runs for the batch, held until the terms' time before its deadline
    deadline = NOW + DEADLINE_SECONDS * 1000
    assert (job.status, job.batch, job.lease_owner) == (JobStatus.RUNNING, BATCH.window, "batch-a")
    assert job.lease_expires_at == deadline - BATCH.lease_before_deadline_ms
    assert (job.attempt_count, job.claim_count) == (1, 1)
    assert current(job_store) == job


def test_a_batch_claim_of_an_existing_job_too_near_its_deadline_is_refused_as_not_batchable(
    job_store: JobStore,
) -> None:
    # Given a submitted background job whose deadline is nearer than the batch's terms ask
    created, _ = job_store.create_job("job-1", background_job(deadline_seconds=600), JOB_INPUT, NOW)

    # When it is claimed into a batch, it is refused as not batchable, and is unchanged
    with pytest.raises(ClaimRefusedError) as refused:
        job_store.claim_job("job-1", "batch-a", LEASE_MS, NOW + 1_000, None, BATCH)
    assert refused.value.reason is ClaimRefusal.NOT_BATCHABLE
    assert current(job_store) == created

    # And a claim without the terms takes it to run now, its batch cleared
    job = job_store.claim_job("job-1", "worker-a", LEASE_MS, NOW + 2_000, None)
    assert (job.status, job.batch, job.lease_expires_at) == (JobStatus.RUNNING, None, NOW + 2_000 + LEASE_MS)


def test_an_interactive_job_is_not_batchable(job_store: JobStore) -> None:
    job_store.create_job("job-1", new_job(deadline_seconds=86_400), JOB_INPUT, NOW)

    with pytest.raises(ClaimRefusedError) as refused:
        job_store.claim_job("job-1", "batch-a", LEASE_MS, NOW + 1_000, None, BATCH)

    assert refused.value.reason is ClaimRefusal.NOT_BATCHABLE


def test_cancelling_a_job_waiting_in_a_batch_ends_it_at_once(job_store: JobStore) -> None:
    # Given a job held by its batch
    job = job_store.claim_job("job-1", "batch-a", LEASE_MS, NOW, background_job(), BATCH)

    # When its cancel is requested, it is cancelled at once (no worker will reach its fence)
    cancelled = job_store.request_cancel("job-1", NOW + 1_000)

    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.batch is None
    assert cancelled.lease_owner is None
    assert cancelled.finished_at == NOW + 1_000
    # And the batch's answer, when it comes, finds the job no longer its own
    with pytest.raises(LeaseLostError):
        job_store.finish_job(job, Succeeded(OUTPUT, "hash-out"), NOW + 2_000)
