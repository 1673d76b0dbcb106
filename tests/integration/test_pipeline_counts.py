"""A pipeline moved on exactly once on moto (docs/pipelines.md): every child's end counted on its parent
once however often and from however many threads its stream record comes, the usage summed exactly,
the parent queued once; a record of a parent that moved on counts nothing; a child that ends after its
pipeline failed still adds its usage; a copy of a waiting parent's message sends its open children's;
the reconciler's recount of a step whose records were lost; a PDF cut into page ranges in the payload
bucket, written once."""

from __future__ import annotations

import io
import random
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import boto3
import pytest
from pypdf import PdfReader

from aijobs.stack import StackResources
from engine.attachments.pages import PageRanges, part_key
from engine.core import (
    Ack,
    AttemptOutcome,
    AttemptRecord,
    ChildOf,
    ErrorCode,
    Failed,
    Fate,
    Job,
    JobErrorInfo,
    JobStatus,
    NewJob,
    Succeeded,
    Waits,
)
from engine.core.attachments import AttachmentRef
from engine.definitions import JobRegistry
from engine.intake import request_hash
from engine.pipelines import ChildEnds, Pipelines, child_id
from engine.queue import JobQueue, JobQueues
from engine.reconciler import Reconciled, Reconciler
from engine.store import DynamoJobStore
from engine.store.attachments import S3Attachments
from engine.store.payloads import PayloadStore
from tests.support.documents import pdf

CHILDREN = 12


class SentQueue(JobQueue):
    """A queue that keeps what is sent to it."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, body: dict[str, Any], group_id: str | None = None) -> str:
        self.sent.append(body)
        return str(len(self.sent))


def now_ms() -> int:
    return int(time.time() * 1000)


def new_job(job_type: str, job_input: dict[str, Any], parent: ChildOf | None = None) -> NewJob:
    return NewJob(job_type, "u-1", 1, 3, 3600, request_hash(job_type, "u-1", job_input), parent=parent)


def waiting_parent(store: DynamoJobStore) -> Job:
    """A summarize_long parent waiting on its first step of CHILDREN children, each of them ended."""
    text = {"text": "a long text", "max_words": 50}
    store.create_job("p-1", new_job("summarize_long", text), text, now_ms())
    parent = store.claim_job("p-1", "w-1", 60_000, now_ms(), None)
    for part in range(CHILDREN):
        child_input = {"text": f"part {part}", "max_words": 50}
        job_id = child_id("p-1", 0, part)
        store.create_job(
            job_id, new_job("summarize", child_input, ChildOf("p-1", "parts", 0, part)), child_input, now_ms()
        )
    store.finish_job(parent, Waits(0, CHILDREN, (CHILDREN,)), now_ms())
    return parent


INVALID = JobErrorInfo(ErrorCode.SCHEMA_VALIDATION_FAILED, "the answer is not JSON", False)


def end_child(store: DynamoJobStore, part: int, succeeded: bool = True) -> Job:
    job_id = child_id("p-1", 0, part)
    claimed = store.claim_job(job_id, f"w-{part}", 60_000, now_ms(), None)
    attempt = AttemptRecord(
        job_id=job_id,
        attempt=1,
        user_id="u-1",
        job_type="summarize",
        started_at=now_ms(),
        finished_at=now_ms(),
        outcome=AttemptOutcome.SUCCEEDED if succeeded else AttemptOutcome.FAILED,
        input_tokens=100 + part,
        output_tokens=10 + part,
        cost_usd=Decimal("0.000123") * (part + 1),
    )
    outcome = Succeeded({"summary": f"summary {part}"}, "h") if succeeded else Failed(INVALID)
    store.finish_job(claimed, outcome, now_ms(), attempt)
    ended = store.get_job(job_id)
    assert ended is not None
    return ended


@pytest.fixture
def sent() -> SentQueue:
    return SentQueue()


@pytest.fixture
def ends(store: DynamoJobStore, sent: SentQueue) -> ChildEnds:
    return ChildEnds(store, JobQueues.of(sent), JobRegistry())


def test_every_child_is_counted_once_from_duplicated_records_on_several_threads(
    store: DynamoJobStore, stack: StackResources, ends: ChildEnds, sent: SentQueue
) -> None:
    waiting_parent(store)
    children = [end_child(store, part) for part in range(CHILDREN)]
    # Each child's record three times, in no order, from eight threads at once
    records = [child for child in children for _ in range(3)]
    random.Random(5).shuffle(records)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda child: ends.ended([child]), records))

    parent = store.get_job("p-1")
    assert parent is not None
    assert parent.status is JobStatus.QUEUED
    assert parent.pipeline is not None
    assert parent.pipeline.ended == frozenset(range(CHILDREN))
    assert parent.pipeline.failed == frozenset()
    assert parent.usage.input_tokens == sum(child.usage.input_tokens for child in children)
    assert parent.usage.output_tokens == sum(child.usage.output_tokens for child in children)
    assert parent.usage.cost_usd == sum((child.usage.cost_usd for child in children), Decimal(0))
    assert parent.usage.attempts == CHILDREN
    # The parent's message went out at least once, and only the parent's
    assert sent.sent
    assert {body["job_id"] for body in sent.sent} == {"p-1"}


def test_no_message_is_sent_before_the_last_child_is_counted(
    store: DynamoJobStore, ends: ChildEnds, sent: SentQueue
) -> None:
    waiting_parent(store)
    children = [end_child(store, part) for part in range(CHILDREN)]

    for child in children[:-1]:
        ends.ended([child, child])
    assert sent.sent == []
    assert store.get_job("p-1").status is JobStatus.WAITING  # type: ignore[union-attr]

    ends.ended([children[-1]])
    assert sent.sent == [{"job_id": "p-1"}]


def test_a_record_of_a_parent_that_moved_on_counts_nothing(
    store: DynamoJobStore, ends: ChildEnds, sent: SentQueue
) -> None:
    waiting_parent(store)
    children = [end_child(store, part) for part in range(CHILDREN)]
    for child in children:
        ends.ended([child])
    moved = store.get_job("p-1")
    assert moved is not None
    # The parent claimed and waiting on its next step: a late copy of a first step's record
    claimed = store.claim_job("p-1", "w-2", 60_000, now_ms(), None)
    store.finish_job(claimed, Waits(1, 1, (CHILDREN, 1)), now_ms())
    before = store.get_job("p-1")

    ends.ended([children[0]])

    after = store.get_job("p-1")
    assert after == before


def test_the_reconciler_recounts_a_step_whose_records_were_lost_once_with_the_usage_summed_exactly(
    store: DynamoJobStore, ends: ChildEnds, sent: SentQueue
) -> None:
    # Given a waiting parent whose children all ended, a third of their records counted, the rest lost
    waiting_parent(store)
    children = [end_child(store, part) for part in range(CHILDREN)]
    for child in children[: CHILDREN // 3]:
        ends.ended([child])
    later = (now_ms() + 16 * 60_000) / 1000
    reconciler = Reconciler(store, JobQueues.of(sent), clock=lambda: later, pipelines=ends)

    # When the reconciler passes twice, and a lost record turns up after all
    first, second = reconciler.run(), reconciler.run()
    moved = list(sent.sent)
    ends.ended([children[-1]])

    # Then the parent moved on once, every child counted once (the late record sends the queued parent's
    # message again, which its claim makes harmless, and counts nothing)
    assert first[Reconciled.RECOUNTED] == 1
    assert Reconciled.RECOUNTED not in second
    assert moved == [{"job_id": "p-1"}]
    parent = store.get_job("p-1")
    assert parent is not None
    assert parent.status is JobStatus.QUEUED
    assert parent.usage.input_tokens == sum(child.usage.input_tokens for child in children)
    assert parent.usage.cost_usd == sum((child.usage.cost_usd for child in children), Decimal(0))
    assert parent.usage.attempts == CHILDREN


def test_a_pdf_is_cut_into_page_ranges_in_the_payload_bucket_each_written_once(
    stack: StackResources, payloads: PayloadStore
) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=stack.payload_bucket, Key="uploads/report.pdf", Body=pdf(45))
    pages = PageRanges(
        S3Attachments(lambda: s3),
        payloads,
        {stack.payload_bucket},
        max_bytes=32 * 1024 * 1024,
        max_parts=1000,
        max_part_pages=100,
    )
    ref = AttachmentRef(stack.payload_bucket, "uploads/report.pdf", "report.pdf")

    parts = pages.split(ref, 20, lambda part, first, last: part_key(f"p-1:s0:{part}", first, last))
    again = pages.split(ref, 20, lambda part, first, last: part_key(f"p-1:s0:{part}", first, last))

    assert again == parts
    assert [part.key for part in parts] == [
        "attachments/p-1:s0:0/pages-1-20.pdf",
        "attachments/p-1:s0:1/pages-21-40.pdf",
        "attachments/p-1:s0:2/pages-41-45.pdf",
    ]
    counted = [len(PdfReader(io.BytesIO(payloads.get(part.key))).pages) for part in parts]
    assert counted == [20, 20, 5]


def test_a_child_that_ends_after_its_pipeline_failed_still_adds_its_usage(
    store: DynamoJobStore, ends: ChildEnds, sent: SentQueue
) -> None:
    # Given a waiting parent whose first child fails: the parent is moved on, and its worker fails it
    waiting_parent(store)
    first = end_child(store, 0, succeeded=False)
    ends.ended([first])
    assert sent.sent == [{"job_id": "p-1"}]
    claimed = store.claim_job("p-1", "w-parent", 60_000, now_ms(), None)
    store.finish_job(claimed, Failed(JobErrorInfo(ErrorCode.STEP_FAILED, "step 'parts' failed", False)), now_ms())

    # When its other children end afterwards, their records delivered twice
    late = [end_child(store, part) for part in range(1, CHILDREN)]
    for child in late:
        ends.ended([child, child])

    # Then the failed pipeline's usage is all its children's, each counted once, and nothing moved it on again
    parent = store.get_job("p-1")
    assert parent is not None
    children = [first, *late]
    assert parent.status is JobStatus.FAILED
    assert parent.usage.input_tokens == sum(child.usage.input_tokens for child in children)
    assert parent.usage.cost_usd == sum((child.usage.cost_usd for child in children), Decimal(0))
    assert parent.usage.attempts == CHILDREN
    assert parent.pipeline is not None
    assert parent.pipeline.ended == frozenset(range(CHILDREN))
    assert sent.sent == [{"job_id": "p-1"}]


def test_a_copy_of_a_waiting_parent_s_message_sends_the_messages_of_its_children_not_counted(
    store: DynamoJobStore, ends: ChildEnds, sent: SentQueue
) -> None:
    # Given a parent that waits on its children (as after an invocation that died before it sent their
    # messages), five of which have ended and been counted
    waiting_parent(store)
    for part in range(5):
        ends.ended([end_child(store, part)])
    parent = store.get_job("p-1")
    assert parent is not None

    # When a copy of its message finds it waiting
    disposition = Pipelines(store, JobQueues.of(sent), JobRegistry()).on_waiting(parent)

    # Then the messages of the seven others are sent again, and the copy is acknowledged
    assert disposition == Ack(Fate.DUPLICATE)
    assert sent.sent == [{"job_id": child_id("p-1", 0, part)} for part in range(5, CHILDREN)]
