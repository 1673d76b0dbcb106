"""The client's submit holds a job type that reads documents to a text or an attachment, on moto.

A submission with neither is refused before anything is written (no DynamoDB request, no message),
as the worker would record it (`input_validation_failed`); one with a text is created and queued.
"""

from __future__ import annotations

from typing import Any

import pytest

from aijobs.client import AiJobsClient, InvalidArgumentError
from aijobs.stack import StackResources
from engine.core import ErrorCode, JobStatus
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader, queued_bodies

FIELDS = [{"name": "total", "description": "the amount due", "type": "number"}]


@pytest.mark.parametrize(
    ("job_type", "job_input"),
    [
        ("summarize", {"text": ""}),
        ("classify", {"text": "", "labels": ["invoice", "receipt"]}),
        ("extract", {"fields": FIELDS}),
        ("extract", {"fields": FIELDS, "text": ""}),
    ],
)
def test_a_submission_with_nothing_to_read_is_refused_before_anything_is_written(
    job_type: str,
    job_input: dict[str, Any],
    jobs_client: AiJobsClient,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    stack: StackResources,
    sqs: Any,
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        jobs_client.submit(job_type, "user-1", job_input, job_id="nothing-1")

    assert caught.value.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert caught.value.argument == "input"
    assert caught.value.detail == f"input.text: {job_type} needs a text or at least one attachment, and has neither"
    assert dynamodb_requests.total == 0
    assert table.job_item("nothing-1") is None
    assert queued_bodies(sqs, stack.queue_url) == []


def test_an_extract_submission_with_a_text_is_created_and_queued(
    jobs_client: AiJobsClient, table: TableReader, stack: StackResources, sqs: Any
) -> None:
    result = jobs_client.submit("extract", "user-1", {"fields": FIELDS, "text": "Total: EUR 120.50"}, job_id="text-1")

    assert (result.created, result.status) == (True, JobStatus.QUEUED)
    assert table.job("text-1").job_type == "extract"
    assert queued_bodies(sqs, stack.queue_url) == [{"job_id": "text-1"}]
