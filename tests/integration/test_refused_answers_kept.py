"""A refused answer past what an attempt record keeps (engine.store.items.MAX_REFUSED_ANSWER_CHARS) is
put whole in the payload bucket, its URI on the record, in the finishing write's path; a put that
fails leaves the cut answer and writes the outcome all the same (docs/jobtypes.md)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from aijobs.stack import StackResources
from engine.core import AttemptOutcome, ErrorCode, JobStatus
from engine.core.job import AttemptRecord, JobErrorInfo
from engine.core.outcomes import Failed
from engine.store import DynamoJobStore
from engine.store.items import MAX_REFUSED_ANSWER_CHARS
from engine.store.payloads import PayloadStore
from tests.integration.conftest import now_ms
from tests.support.events import job_message, new_job_for

REFUSED = JobErrorInfo(ErrorCode.BUSINESS_VALIDATION_FAILED, "label: not one of the labels given", False)


def record(job_id: str, answer: str) -> AttemptRecord:
    return AttemptRecord(
        job_id=job_id,
        attempt=1,
        user_id="user-1",
        job_type="classify",
        started_at=now_ms(),
        finished_at=now_ms(),
        outcome=AttemptOutcome.FAILED,
        error_code=REFUSED.code,
        refused_answer=answer,
        prompt_sha256="ab" * 32,
    )


def finish_refused(store: DynamoJobStore, job_id: str, answer: str) -> AttemptRecord:
    message = job_message(job_id=job_id)
    job = store.claim_job(job_id, "worker-1", 60_000, now_ms(), new_job_for(message))
    store.finish_job(job, Failed(REFUSED), now_ms(), attempt=record(job_id, answer))
    [kept] = store.attempts(job_id)
    return kept


def test_a_long_refused_answer_is_kept_whole_in_the_payload_bucket(
    store: DynamoJobStore, stack: StackResources
) -> None:
    answer = '{"label": "' + "é" * 40_000 + '"}'

    kept = finish_refused(store, "long-answer", answer)

    assert kept.refused_answer is not None
    assert len(kept.refused_answer) == MAX_REFUSED_ANSWER_CHARS
    assert kept.refused_answer_s3 == f"s3://{stack.payload_bucket}/refused-answers/long-answer/1.txt"
    whole = boto3.client("s3").get_object(Bucket=stack.payload_bucket, Key="refused-answers/long-answer/1.txt")
    assert whole["Body"].read().decode() == answer
    assert store.get_job("long-answer").status is JobStatus.FAILED  # type: ignore[union-attr]


def test_a_refused_answer_within_the_bound_stays_on_the_record_alone(
    store: DynamoJobStore, stack: StackResources
) -> None:
    kept = finish_refused(store, "short-answer", '{"label": "eggs"}')

    assert (kept.refused_answer, kept.refused_answer_s3) == ('{"label": "eggs"}', None)
    listed = boto3.client("s3").list_objects_v2(Bucket=stack.payload_bucket, Prefix="refused-answers/")
    assert listed.get("KeyCount", 0) == 0


class RefusingS3:
    """An S3 client whose every put is refused, as a bucket policy or an outage would."""

    def put_object(self, **_: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")


def test_a_put_that_fails_keeps_the_cut_answer_and_writes_the_outcome(stack: StackResources, dynamodb: Any) -> None:
    payloads = PayloadStore(stack.payload_bucket, lambda: RefusingS3())  # type: ignore[arg-type, return-value]
    store = DynamoJobStore(stack.table_name, client=dynamodb, payloads=payloads)

    kept = finish_refused(store, "refused-put", "x" * 100_000)

    assert kept.refused_answer is not None
    assert kept.refused_answer.endswith("more characters cut]")
    assert kept.refused_answer_s3 is None
    job = store.get_job("refused-put")
    assert job is not None
    assert job.status is JobStatus.FAILED
    assert job.error == REFUSED


@pytest.fixture
def store(stack: StackResources, dynamodb: Any, payloads: PayloadStore) -> DynamoJobStore:
    return DynamoJobStore(stack.table_name, client=dynamodb, payloads=payloads)
