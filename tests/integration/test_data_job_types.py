"""Jobs of data job types through the worker's handler on moto (docs/jobtypes.md): two DynamoDB requests each,
like any other job, once the catalog has read the labels; the version a first claim resolved kept on
the job item and its attempts, and run again by a retry after production moved.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import boto3
import pytest

from aijobs.stack import StackResources
from engine.core import JobStatus, NewJob
from engine.core.errors import ProviderUnavailableError
from engine.definitions import JobRegistry
from engine.definitions.catalog import DEFAULT_REFRESH_SECONDS, DataJobTypes
from engine.definitions.data import check_job_type, compile_job_type
from engine.events import EventPublisher
from engine.gateway import CompletionRequest
from engine.intake import request_hash
from engine.job_type_tally import JobTypeTally
from engine.store import DynamoJobStore
from engine.store.items import job_key
from engine.store.job_types import JobTypeTable
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader, WorkerFactory
from tests.support.clock import Clock
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider
from tests.unit.test_data_job_types import NAME, TICKET, triage

SUCCESS_REQUESTS = {"UpdateItem": 1, "TransactWriteItems": 1}
# What a cold catalog adds to its first job, once per refresh period: the heads, then the version.
FIRST_READS = {"Query": 1, "GetItem": 1}
ANSWER = {"label": "billing", "confidence": 0.9}


@pytest.fixture
def clock() -> Clock:
    return Clock(now_ms=int(time.time() * 1000))


@pytest.fixture
def types(stack: StackResources) -> JobTypeTable:
    """The job types as the CLI writes them, on a client of its own (its requests are not counted)."""
    return JobTypeTable(stack.table_name, boto3.client("dynamodb"))


@pytest.fixture
def registry(stack: StackResources, dynamodb: Any, clock: Clock) -> JobRegistry:
    """The worker's registry with the data job types of the table, read on the counted client."""
    return JobRegistry(data=DataJobTypes(JobTypeTable(stack.table_name, dynamodb), compile_job_type, clock=clock))


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(lambda request: ANSWER if request.schema_name == NAME else _code_answer(request))


def _code_answer(request: CompletionRequest) -> dict[str, Any]:
    return {"label": "spam", "confidence": 0.93}


def push(types: JobTypeTable, count: int) -> None:
    for version in range(1, count + 1):
        file = check_job_type(triage(version))
        types.push(NAME, file.document(), file.sha256, int(time.time() * 1000), by="ana")


def data_message(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "job_type": NAME, "user_id": "user-1", "input": TICKET, **fields}


def handle(worker: WorkerHandler, body: dict[str, Any], receive_count: int = 1) -> dict[str, Any]:
    response: dict[str, Any] = worker.handle(
        sqs_event(sqs_record(body, receive_count=receive_count)), InvocationContext()
    )
    return response


def prompt_versions(provider: FakeProvider) -> list[str]:
    return [request.system.rsplit("v", 1)[-1].rstrip(").") for request in provider.requests]


def failing_once(provider: FakeProvider) -> None:
    answers: list[Any] = [ProviderUnavailableError("provider unavailable (HTTP 503)")]
    provider.script = lambda request: answers.pop() if answers else ANSWER


def test_a_data_job_costs_the_two_requests_of_a_code_job(
    worker: WorkerHandler,
    types: JobTypeTable,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a data job type; the first job of a cold worker reads its labels and its version once
    push(types, 1)
    assert handle(worker, data_message("dt-cold")) == {"batchItemFailures": []}
    assert dict(dynamodb_requests.operations) == SUCCESS_REQUESTS | FIRST_READS

    # When a code job and a data job run on the warm worker
    dynamodb_requests.reset()
    assert handle(worker, job_message("classify", "code-1")) == {"batchItemFailures": []}
    code_requests = dict(dynamodb_requests.operations)
    dynamodb_requests.reset()
    assert handle(worker, data_message("dt-warm")) == {"batchItemFailures": []}
    data_requests = dict(dynamodb_requests.operations)

    # Then each cost one claim and one finishing write
    assert data_requests == code_requests == SUCCESS_REQUESTS
    job = table.job("dt-warm")
    assert (job.status, job.output, job.job_type_version) == (JobStatus.SUCCEEDED, ANSWER, 1)
    attempt = table.attempt("dt-warm", 1)
    assert attempt is not None
    assert (attempt["job_type_version"], attempt["prompt_key"], attempt["prompt_version"]) == (1, NAME, "v1")


def test_a_batch_of_ten_data_jobs_costs_twenty_requests(
    worker: WorkerHandler, types: JobTypeTable, dynamodb_requests: RequestCounter
) -> None:
    push(types, 1)
    assert handle(worker, data_message("dt-warm-up")) == {"batchItemFailures": []}
    dynamodb_requests.reset()

    records = [sqs_record(data_message(f"dt-batch-{n}")) for n in range(10)]
    assert worker.handle(sqs_event(*records), InvocationContext()) == {"batchItemFailures": []}

    assert dict(dynamodb_requests.operations) == {"UpdateItem": 10, "TransactWriteItems": 10}


def test_a_retry_runs_the_version_the_first_claim_recorded_after_production_moved(
    make_worker: WorkerFactory, provider: FakeProvider, types: JobTypeTable, table: TableReader, clock: Clock
) -> None:
    # Given a job whose first attempt ran v1 (production) and was put back after a 503
    push(types, 2)
    worker = make_worker(clock=clock)
    failing_once(provider)
    assert len(handle(worker, data_message("dt-retry"))["batchItemFailures"]) == 1
    item = table.job_item("dt-retry")
    assert item is not None
    assert (item["status"], item["job_type_version"]) == ("queued", 1)

    # When production moves to v2, the worker sees it, and the message comes back
    types.promote(NAME, 2, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)
    assert handle(worker, data_message("dt-retry"), receive_count=2) == {"batchItemFailures": []}

    # Then the retry ran v1: the job item and both attempts say so
    assert prompt_versions(provider) == ["1", "1"]
    job = table.job("dt-retry")
    assert (job.status, job.attempt_count, job.job_type_version) == (JobStatus.SUCCEEDED, 2, 1)
    attempts = [table.attempt("dt-retry", n) for n in (1, 2)]
    assert [attempt["job_type_version"] for attempt in attempts if attempt is not None] == [1, 1]
    # And a new job runs v2
    assert handle(worker, data_message("dt-after")) == {"batchItemFailures": []}
    assert table.job("dt-after").job_type_version == 2


def test_a_submitted_job_records_the_version_of_its_first_claim_on_its_item_and_keeps_it(
    make_worker: WorkerFactory,
    provider: FakeProvider,
    types: JobTypeTable,
    table: TableReader,
    side_store: DynamoJobStore,
    clock: Clock,
) -> None:
    # Given a job submitted without a version (left to its first claim), whose first attempt failed
    push(types, 2)
    new_job = NewJob(NAME, "user-1", 1, 3, 86_400, request_hash(NAME, "user-1", TICKET))
    side_store.create_job("dt-sub", new_job, TICKET, clock.now_ms)
    item = table.job_item("dt-sub")
    assert item is not None
    assert "job_type_version" not in item
    worker = make_worker(clock=clock)
    failing_once(provider)
    assert len(handle(worker, {"job_id": "dt-sub"})["batchItemFailures"]) == 1
    item = table.job_item("dt-sub")
    assert item is not None
    assert item["job_type_version"] == 1

    # When production moves and the job is tried again
    types.promote(NAME, 2, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)
    assert handle(worker, {"job_id": "dt-sub"}, receive_count=2) == {"batchItemFailures": []}

    # Then it ran v1 again, and says v1
    assert prompt_versions(provider) == ["1", "1"]
    assert table.job("dt-sub").job_type_version == 1


class Bus:
    def put_events(self, **params: Any) -> Any:
        return {"FailedEntryCount": 0, "Entries": [{"EventId": "e"} for _ in params["Entries"]]}


def test_the_re_asks_of_a_data_job_reach_its_version_s_stats(
    worker: WorkerHandler, provider: FakeProvider, types: JobTypeTable, table: TableReader
) -> None:
    # Given a data job whose first answer breaks its rule and whose re-ask is accepted
    push(types, 1)
    answers = [ANSWER, {"label": "spam", "confidence": 0.5}]
    provider.script = lambda request: answers.pop()
    assert handle(worker, data_message("dt-reask")) == {"batchItemFailures": []}
    attempt = table.attempt("dt-reask", 1)
    assert attempt is not None
    assert attempt["calls"] == 2
    assert table.job("dt-reask").status is JobStatus.SUCCEEDED

    # When its finishing write, as the stream gives it, is tallied
    new = table.client.get_item(TableName=table.table_name, Key=job_key("dt-reask"), ConsistentRead=True)["Item"]
    old = new | {"status": {"S": "running"}}
    record = {"eventName": "MODIFY", "dynamodb": {"NewImage": new, "OldImage": old, "SequenceNumber": "1"}}
    JobTypeTally(types, EventPublisher(Bus(), "bus")).record([record])  # type: ignore[arg-type]

    # Then its version's stats count one job, succeeded, and its one re-ask
    (stats,) = types.stats(NAME)
    assert (stats.jobs, stats.succeeded, stats.validation_failures, stats.cost_usd > Decimal(0)) == (1, 1, 0, True)
    assert stats.reasks == 1
