"""Answers already paid for (docs/reuse.md, docs/protocol.md), on both stores: the finish that succeeded
with a kept answer writes it under its request's key in the same write, the last one stands, a refused
finish keeps nothing, and a job that took a kept answer records where it came from.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from engine.core import AttemptRecord, JobStatus, PaidAnswer, Reusable, Succeeded, Usage, Via
from engine.core.errors import CancelRequestedError, LeaseLostError
from engine.decisions import output_hash
from engine.store import DynamoJobStore, PayloadStore
from engine.store.payloads import REUSE_INLINE_BYTES
from tests.contract.conftest import JobStore
from tests.contract.test_job_store import LEASE_MS, NOW, OUTPUT, attempt_of, claim, current, new_job

KEY = "f" * 64
HOUR = 3_600
ANSWER = json.dumps(OUTPUT, separators=(",", ":"))


def kept(answer: str = ANSWER, key: str = KEY, seconds: int = HOUR) -> Succeeded:
    """A success whose answer is kept for reuse."""
    return Succeeded(OUTPUT, output_hash(OUTPUT), kept=Reusable(key, answer, seconds))


def test_an_unknown_key_has_no_paid_answer(job_store: JobStore) -> None:
    assert job_store.paid_answer(KEY) is None


def test_a_success_with_a_kept_answer_keeps_it_under_its_key_for_its_time(job_store: JobStore) -> None:
    # Given a running job
    job = claim(job_store)

    # When it succeeds, its answer kept for an hour
    job_store.finish_job(job, kept(), NOW + 1_000, attempt_of(job, NOW + 1_000))

    # Then the answer reads back under the key: the job that paid, when, and until when
    assert job_store.paid_answer(KEY) == PaidAnswer(KEY, "job-1", ANSWER, NOW + 1_000, NOW + 1_000 + HOUR * 1000)
    # and the job is written as any success, with no source of its own
    finished = current(job_store)
    assert (finished.status, finished.output, finished.reused_from) == (JobStatus.SUCCEEDED, OUTPUT, None)


def test_a_later_success_of_the_same_key_replaces_the_kept_answer(job_store: JobStore) -> None:
    # Given an answer kept by job-1
    first = claim(job_store)
    job_store.finish_job(first, kept(), NOW + 1_000, attempt_of(first, NOW + 1_000))

    # When job-2, of the same request, succeeds later with another answer
    second = claim(job_store, "job-2", at=NOW + 5_000)
    other = json.dumps({"label": "ham", "confidence": 0.5})
    job_store.finish_job(second, kept(other), NOW + 6_000, attempt_of(second, NOW + 6_000))

    # Then the key holds job-2's, from its time
    assert job_store.paid_answer(KEY) == PaidAnswer(KEY, "job-2", other, NOW + 6_000, NOW + 6_000 + HOUR * 1000)


def test_a_success_without_a_kept_answer_keeps_none(job_store: JobStore) -> None:
    job = claim(job_store)

    job_store.finish_job(job, Succeeded(OUTPUT, output_hash(OUTPUT)), NOW + 1_000, attempt_of(job, NOW + 1_000))

    assert job_store.paid_answer(KEY) is None


def test_a_finish_refused_for_a_cancel_keeps_no_answer(job_store: JobStore) -> None:
    # Given a running job whose cancel was requested while it called
    job = claim(job_store)
    job_store.request_cancel("job-1", NOW + 500)

    # When its worker finishes it succeeded, its answer to be kept
    with pytest.raises(CancelRequestedError):
        job_store.finish_job(job, kept(), NOW + 1_000, attempt_of(job, NOW + 1_000))

    # Then nothing of that write is kept: no answer to reuse
    assert job_store.paid_answer(KEY) is None


def test_a_finish_refused_for_a_lost_lease_keeps_no_answer(job_store: JobStore) -> None:
    # Given a job taken over after its first worker's lease expired
    stale = claim(job_store, owner="worker-a")
    job_store.claim_job("job-1", "worker-b", LEASE_MS, NOW + LEASE_MS + 1, None)

    with pytest.raises(LeaseLostError):
        job_store.finish_job(stale, kept(), NOW + LEASE_MS + 2, attempt_of(stale, NOW + LEASE_MS))

    assert job_store.paid_answer(KEY) is None


def test_a_success_that_took_a_paid_answer_records_its_source_on_the_job_and_the_attempt(
    job_store: JobStore,
) -> None:
    # Given a running job, and the attempt of a reuse: no call, no tokens, no cost
    job = claim(job_store, "job-2", request=new_job("hash-b"))
    attempt = AttemptRecord(
        job_id="job-2",
        attempt=job.claim_count,
        user_id=job.user_id,
        job_type=job.job_type,
        started_at=NOW,
        finished_at=NOW + 3,
        outcome=attempt_of(job, NOW).outcome,
        provider="openai",
        model="gpt-4o-mini",
        prompt_key="classify",
        prompt_version="v1",
        via=Via.REUSE,
        reused_from="job-1",
    )

    # When it succeeds with job-1's answer
    job_store.finish_job(job, Succeeded(OUTPUT, output_hash(OUTPUT), reused_from="job-1"), NOW + 3, attempt)

    # Then the job and its attempt read back naming job-1, at no cost, and no answer is kept anew
    assert current(job_store, "job-2") == replace(
        job,
        status=JobStatus.SUCCEEDED,
        updated_at=NOW + 3,
        finished_at=NOW + 3,
        lease_owner=None,
        lease_expires_at=None,
        output=OUTPUT,
        output_hash=output_hash(OUTPUT),
        usage=Usage(attempts=1),
        reused_from="job-1",
    )
    assert job_store.attempts("job-2") == [attempt]
    assert job_store.paid_answer(KEY) is None


@pytest.mark.parametrize(
    "answer",
    [
        json.dumps({"label": "spam — ünïcödé ✓ 🚢", "confidence": 0.5}, ensure_ascii=False),
        json.dumps({"label": "s" * (REUSE_INLINE_BYTES + 1), "confidence": 0.5}),
        json.dumps({"label": "a" * 250_000, "confidence": 1}),
    ],
    ids=["unicode", "past-the-inline-bound", "as-large-as-an-output"],
)
def test_a_kept_answer_reads_back_exactly_whatever_its_size(job_store: JobStore, answer: str) -> None:
    job = claim(job_store)

    job_store.finish_job(job, kept(answer), NOW + 1_000, attempt_of(job, NOW + 1_000))

    found = job_store.paid_answer(KEY)
    assert found is not None
    assert (found.job_id, found.answer) == ("job-1", answer)


# --- DynamoDB's own: the item, the payload bucket, the retention -------------------------------------


def reuse_item(store: DynamoJobStore, dynamodb: Any) -> dict[str, Any]:
    key = {"pk": {"S": f"REUSE#{KEY}"}, "sk": {"S": "REUSE"}}
    item: dict[str, Any] = dynamodb.get_item(TableName=store.table_name, Key=key)["Item"]
    return item


def test_a_kept_answer_item_expires_one_second_after_its_end(store: DynamoJobStore, dynamodb: Any) -> None:
    job = claim(store)

    store.finish_job(job, kept(), NOW + 1_000, attempt_of(job, NOW + 1_000))

    item = reuse_item(store, dynamodb)
    assert item["answer"] == {"S": ANSWER}
    assert int(item["until"]["N"]) == NOW + 1_000 + HOUR * 1000
    assert int(item["expires_at"]["N"]) == (NOW + 1_000 + HOUR * 1000) // 1000 + 1


def test_an_answer_past_the_inline_bound_is_kept_in_the_payload_bucket_by_its_job(
    store: DynamoJobStore, dynamodb: Any, payloads: PayloadStore
) -> None:
    answer = json.dumps({"label": "s" * (REUSE_INLINE_BYTES + 1), "confidence": 0.5})
    job = claim(store)

    store.finish_job(job, kept(answer), NOW + 1_000, attempt_of(job, NOW + 1_000))

    item = reuse_item(store, dynamodb)
    assert "answer" not in item
    assert item["answer_key"] == {"S": f"answers/{KEY}/job-1.json"}
    assert payloads.get(f"answers/{KEY}/job-1.json").decode() == answer


def test_an_answer_the_bucket_refuses_is_not_kept_and_the_job_finishes(stack: Any, dynamodb: Any) -> None:
    # Given a store whose payload bucket does not exist
    store = DynamoJobStore(stack.table_name, client=dynamodb, payloads=PayloadStore("no-such-bucket"))
    job = claim(store)

    # When a job succeeds with an answer past the inline bound
    answer = json.dumps({"label": "s" * (REUSE_INLINE_BYTES + 1), "confidence": 0.5})
    store.finish_job(job, kept(answer), NOW + 1_000, attempt_of(job, NOW + 1_000))

    # Then the job is written, and no answer is kept (a later request calls the model)
    assert current(store).status is JobStatus.SUCCEEDED
    assert store.paid_answer(KEY) is None


def test_a_kept_answer_ends_with_the_table_s_retention_when_that_comes_first(stack: Any, dynamodb: Any) -> None:
    # Given a table that keeps finished jobs one day, and an answer kept for thirty
    store = DynamoJobStore(stack.table_name, client=dynamodb, retention_days=1)
    job = claim(store)

    store.finish_job(job, kept(seconds=30 * 86_400), NOW + 1_000, attempt_of(job, NOW + 1_000))

    # Then the answer's end is the job's: its `reused_from` never names a job the table has removed
    found = store.paid_answer(KEY)
    assert found is not None
    assert found.until == NOW + 1_000 + 86_400_000
