"""BedrockBatchProvider over a stubbed bedrock client and the payload bucket on moto: the records and the
job it creates, the states it maps, the results it reads back."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from engine.core.batches import BatchState
from engine.core.errors import (
    JobError,
    OutputTooLargeError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from engine.gateway.batches import BatchLine
from engine.gateway.bedrock import converse_completion
from engine.gateway.bedrock_batch import MAX_LINE_BYTES, MIN_RECORDS, BedrockBatchProvider
from engine.gateway.schema import SCHEMA_PREAMBLE
from engine.store.payloads import PayloadStore
from tests.support.providers import CLASSIFY_SCHEMA, completion_request

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
BUCKET = "aijobs-payloads-test"
ROLE = "arn:aws:iam::123456789012:role/aijobs-batch"
JOB_ARN = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abc123def456"
# botocore's pattern for a job name (the service model's ModelInvocationJobName).
JOB_NAME = re.compile(r"^[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}$")


@pytest.fixture
def bucket() -> Iterator[PayloadStore]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield PayloadStore(BUCKET, lambda: s3)


@pytest.fixture
def client() -> Any:
    return boto3.client("bedrock", region_name="us-east-1")


@pytest.fixture
def stubber(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stubbed:
        yield stubbed
        stubbed.assert_no_pending_responses()


@pytest.fixture
def adapter(bucket: PayloadStore, client: Any) -> BedrockBatchProvider:
    return BedrockBatchProvider(bucket, ROLE, client=client)


def lines(count: int = MIN_RECORDS, model: str = MODEL) -> list[BatchLine]:
    return [BatchLine(f"job-{i}", completion_request(model, user=f"Text: {i}")) for i in range(count)]


def read(bucket: PayloadStore, key: str) -> bytes:
    file = io.BytesIO()
    bucket.download(key, file)
    return file.getvalue()


def job(status: str = "InProgress", **fields: Any) -> dict[str, Any]:
    """A GetModelInvocationJob response."""
    return {
        "jobArn": JOB_ARN,
        "jobName": "aijobs-x-unique1",
        "modelId": MODEL,
        "roleArn": ROLE,
        "status": status,
        "submitTime": "2026-01-01T00:00:00Z",
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/batches/aijobs-x-unique1/input.jsonl"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/batches/aijobs-x-unique1/output/"}},
        **fields,
    }


def created_jobs(stubber: Stubber) -> list[dict[str, Any]]:
    """The parameters of every CreateModelInvocationJob the client is asked for, from now on."""
    created: list[dict[str, Any]] = []
    stubber.client.meta.events.register(
        "provide-client-params.bedrock.CreateModelInvocationJob", lambda params, **_: created.append(dict(params))
    )
    return created


def client_error(stubber: Stubber, operation: str, code: str, status: int) -> None:
    stubber.add_client_error(operation, service_error_code=code, http_status_code=status)


# --- submit ----------------------------------------------------------------------------------------


def test_a_batch_is_a_jsonl_of_converse_records_in_the_bucket_and_a_converse_job_over_it(
    stubber: Stubber, adapter: BedrockBatchProvider, bucket: PayloadStore
) -> None:
    batch_lines = lines()
    created = created_jobs(stubber)
    stubber.add_response("create_model_invocation_job", {"jobArn": JOB_ARN})

    batch_id = adapter.submit(batch_lines, {"aijobs_batch": "record-1"})

    assert batch_id == JOB_ARN
    (created,) = created
    name = created["jobName"]
    assert JOB_NAME.match(name)
    assert name.startswith("aijobs-")
    folder = f"s3://{BUCKET}/batches/{name}/"
    assert created == {
        "jobName": name,
        "clientRequestToken": name,
        "roleArn": ROLE,
        "modelId": MODEL,
        "modelInvocationType": "Converse",
        "inputDataConfig": {"s3InputDataConfig": {"s3InputFormat": "JSONL", "s3Uri": folder + "input.jsonl"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": folder + "output/"}},
        "timeoutDurationInHours": 24,
    }
    records = [json.loads(raw) for raw in read(bucket, f"batches/{name}/input.jsonl").splitlines()]
    assert [record["recordId"] for record in records] == [line.custom_id for line in batch_lines]
    first = records[0]["modelInput"]
    # A Converse body: no model (the job names it), no tool (Converse batch jobs refuse toolConfig),
    # the schema asked for in the system prompt
    assert set(first) == {"messages", "system", "inferenceConfig"}
    assert first["messages"] == [{"role": "user", "content": [{"text": "Text: 0"}]}]
    assert first["inferenceConfig"] == {"maxTokens": 256, "temperature": 0}
    (system,) = first["system"]
    preamble_at = system["text"].index(SCHEMA_PREAMBLE)
    assert system["text"].startswith("You classify texts.")
    assert json.loads(system["text"][preamble_at + len(SCHEMA_PREAMBLE) :]) == CLASSIFY_SCHEMA


def test_a_submission_made_again_for_the_same_record_is_the_same_job_to_bedrock(
    stubber: Stubber, adapter: BedrockBatchProvider
) -> None:
    # Given a submission whose answer was lost (the pass stopped after CreateModelInvocationJob)
    created = created_jobs(stubber)
    for _ in range(2):
        stubber.add_response("create_model_invocation_job", {"jobArn": JOB_ARN})

    # When the same record's batch is submitted again
    for _ in range(2):
        adapter.submit(lines(), {"aijobs_batch": "record-1"})

    # Then both carry the same name and request token: Bedrock makes one job of them
    assert created[0]["clientRequestToken"] == created[1]["clientRequestToken"] == created[0]["jobName"]
    assert created[0]["jobName"] == created[1]["jobName"]


def test_the_same_metadata_names_jobs_alike_and_other_metadata_otherwise(
    stubber: Stubber, adapter: BedrockBatchProvider
) -> None:
    created = created_jobs(stubber)
    for _ in range(3):
        stubber.add_response("create_model_invocation_job", {"jobArn": JOB_ARN})

    for metadata in ({"aijobs_batch": "a", "model": "m"}, {"model": "m", "aijobs_batch": "a"}, {"aijobs_batch": "b"}):
        adapter.submit(lines(), metadata)

    assert created[0]["jobName"] == created[1]["jobName"] != created[2]["jobName"]


def test_a_lines_bytes_are_what_it_adds_to_the_input(
    stubber: Stubber, adapter: BedrockBatchProvider, bucket: PayloadStore
) -> None:
    batch_lines = lines()
    stubber.add_response("create_model_invocation_job", {"jobArn": JOB_ARN})

    adapter.submit(batch_lines, {})

    (key,) = bucket.keys("batches/")
    assert sum(adapter.line_bytes(line) for line in batch_lines) == len(read(bucket, key))


def test_the_limits_are_bedrocks_quota_defaults_and_the_minimum_can_be_the_accounts(
    bucket: PayloadStore, client: Any
) -> None:
    default = BedrockBatchProvider(bucket, ROLE, client=client)
    raised = BedrockBatchProvider(bucket, ROLE, client=client, min_lines=1000)

    assert (default.min_lines, default.max_lines, default.max_bytes) == (100, 50_000, 1_000_000_000)
    assert raised.min_lines == 1000


@pytest.mark.parametrize("count", [MIN_RECORDS - 1, 50_001])
def test_a_batch_out_of_the_record_limits_is_refused_before_any_call(
    count: int, adapter: BedrockBatchProvider, stubber: Stubber, bucket: PayloadStore
) -> None:
    line = lines(1)[0]

    with pytest.raises(ValueError, match="records"):
        adapter.submit([line] * count, {})

    assert bucket.keys("") == []


def test_a_batch_of_two_models_is_refused(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    with pytest.raises(ValueError, match="one model"):
        adapter.submit([*lines(50), *lines(50, model="amazon.nova-lite-v1:0")], {})


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("ThrottlingException", 429, ProviderRateLimitedError),
        ("ServiceQuotaExceededException", 400, ProviderRateLimitedError),
        ("ValidationException", 400, ProviderRejectedError),
        ("AccessDeniedException", 403, ProviderRejectedError),
        ("InternalServerException", 500, ProviderUnavailableError),
    ],
)
def test_a_refused_create_is_the_engines_error_for_its_code(
    code: str, status: int, error: type[JobError], adapter: BedrockBatchProvider, stubber: Stubber
) -> None:
    client_error(stubber, "create_model_invocation_job", code, status)

    with pytest.raises(error):
        adapter.submit(lines(), {})


def test_a_bucket_that_cannot_be_written_is_rejected(client: Any) -> None:
    with mock_aws():
        missing = PayloadStore("no-such-bucket", lambda: boto3.client("s3", region_name="us-east-1"))
        adapter = BedrockBatchProvider(missing, ROLE, client=client)

        with pytest.raises(ProviderRejectedError):
            adapter.submit(lines(), {})


# --- status ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("Submitted", BatchState.PENDING),
        ("Validating", BatchState.PENDING),
        ("Scheduled", BatchState.PENDING),
        ("InProgress", BatchState.PENDING),
        ("Stopping", BatchState.PENDING),
        ("Completed", BatchState.COMPLETED),
        ("PartiallyCompleted", BatchState.COMPLETED),
        ("Failed", BatchState.FAILED),
        ("Stopped", BatchState.CANCELLED),
        ("Expired", BatchState.EXPIRED),
    ],
)
def test_each_job_status_maps_to_a_state(
    status: str, state: BatchState, adapter: BedrockBatchProvider, stubber: Stubber
) -> None:
    stubber.add_response(
        "get_model_invocation_job",
        job(status, successRecordCount=90, errorRecordCount=10),
        expected_params={"jobIdentifier": JOB_ARN},
    )

    found = adapter.status(JOB_ARN)

    assert (found.batch_id, found.state, found.detail, found.answered, found.failed) == (JOB_ARN, state, status, 90, 10)


def test_a_job_that_is_gone_is_rejected(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    client_error(stubber, "get_model_invocation_job", "ResourceNotFoundException", 404)

    with pytest.raises(ProviderRejectedError):
        adapter.status(JOB_ARN)


# --- answers ---------------------------------------------------------------------------------------


def converse_output(text: str, input_tokens: int = 100, output_tokens: int = 20, **usage: int) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": input_tokens, "outputTokens": output_tokens, **usage},
        "metrics": {"latencyMs": 900},
    }


def put_results(bucket: PayloadStore, *values: object, key: str = "input.jsonl.out") -> None:
    content = b"".join(value if isinstance(value, bytes) else json.dumps(value).encode() + b"\n" for value in values)
    bucket.put(f"batches/aijobs-x-unique1/output/abc123def456/{key}", content, "application/jsonl")


def test_each_result_record_is_read_as_a_real_time_converse_answer_is(
    adapter: BedrockBatchProvider, stubber: Stubber, bucket: PayloadStore
) -> None:
    output = converse_output('{"label": "spam", "confidence": 0.9}', cacheReadInputTokens=1500, cacheWriteInputTokens=0)
    put_results(bucket, {"recordId": "job-0", "modelInput": {"messages": []}, "modelOutput": output})
    put_results(bucket, {"totalRecordCount": 1}, key="manifest.json.out")
    stubber.add_response("get_model_invocation_job", job("Completed"))

    (answer,) = adapter.answers(JOB_ARN)

    assert (answer.custom_id, answer.error) == ("job-0", None)
    assert answer.completion == converse_completion(MODEL, output, latency_ms=0)
    assert answer.completion is not None
    assert (answer.completion.input_tokens, answer.completion.cached_input_tokens) == (1600, 1500)


@pytest.mark.parametrize(
    ("error_code", "error"),
    [
        (400, ProviderRejectedError),
        ("400", ProviderRejectedError),
        (429, ProviderRateLimitedError),
        (500, ProviderUnavailableError),
        ("ModelTimeout", ProviderUnavailableError),
    ],
)
def test_a_failed_record_carries_the_error_of_its_code(
    error_code: object, error: type[JobError], adapter: BedrockBatchProvider, stubber: Stubber, bucket: PayloadStore
) -> None:
    put_results(
        bucket, {"recordId": "job-1", "modelInput": {}, "error": {"errorCode": error_code, "errorMessage": "x"}}
    )
    stubber.add_response("get_model_invocation_job", job("PartiallyCompleted"))

    (answer,) = adapter.answers(JOB_ARN)

    assert (answer.custom_id, answer.completion, type(answer.error)) == ("job-1", None, error)


def test_results_of_every_output_file_are_read_and_unreadable_records_explained_or_skipped(
    adapter: BedrockBatchProvider, stubber: Stubber, bucket: PayloadStore
) -> None:
    put_results(
        bucket,
        {"recordId": "job-0", "modelOutput": converse_output("{}")},
        {"recordId": "job-1", "modelOutput": {"output": "not a message"}},
        {"modelOutput": converse_output("{}")},
        b'{"recordId": "job-2", "modelOutput": {"output": \n',
        key="part-1.jsonl.out",
    )
    huge = {"recordId": "job-3", "modelOutput": converse_output("x" * (MAX_LINE_BYTES + 1))}
    put_results(bucket, huge, {"recordId": "job-4", "modelOutput": converse_output("{}")}, key="part-2.jsonl.out")
    stubber.add_response("get_model_invocation_job", job("Expired"))

    answers = {answer.custom_id: type(answer.error) for answer in adapter.answers(JOB_ARN)}

    assert answers == {
        "job-0": type(None),
        "job-1": ProviderUnavailableError,
        "job-2": ProviderUnavailableError,
        "job-3": OutputTooLargeError,
        "job-4": type(None),
    }


def test_a_job_writing_outside_the_payload_bucket_is_unavailable(
    adapter: BedrockBatchProvider, stubber: Stubber
) -> None:
    elsewhere = {"s3OutputDataConfig": {"s3Uri": "s3://someone-else/out/"}}
    stubber.add_response("get_model_invocation_job", job("Completed", outputDataConfig=elsewhere))

    with pytest.raises(ProviderUnavailableError):
        list(adapter.answers(JOB_ARN))


# --- cancel ----------------------------------------------------------------------------------------


def test_cancel_stops_the_job(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    stubber.add_response("stop_model_invocation_job", {}, expected_params={"jobIdentifier": JOB_ARN})

    adapter.cancel(JOB_ARN)


def test_stopping_a_job_that_ended_meanwhile_is_no_error(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    client_error(stubber, "stop_model_invocation_job", "ValidationException", 400)
    stubber.add_response("get_model_invocation_job", job("Completed"))

    adapter.cancel(JOB_ARN)


def test_a_refused_stop_of_a_job_still_running_is_an_error(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    client_error(stubber, "stop_model_invocation_job", "AccessDeniedException", 403)
    stubber.add_response("get_model_invocation_job", job("InProgress"))

    with pytest.raises(ProviderRejectedError):
        adapter.cancel(JOB_ARN)


def test_a_throttled_stop_is_rate_limited_and_tried_again_later(
    adapter: BedrockBatchProvider, stubber: Stubber
) -> None:
    client_error(stubber, "stop_model_invocation_job", "ThrottlingException", 429)

    with pytest.raises(ProviderRateLimitedError):
        adapter.cancel(JOB_ARN)


# --- find ------------------------------------------------------------------------------------------


def summary(arn: str) -> dict[str, Any]:
    return {
        "jobArn": arn,
        "jobName": "aijobs-x",
        "modelId": MODEL,
        "roleArn": ROLE,
        "submitTime": "2026-01-01T00:00:00Z",
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/in.jsonl"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/out/"}},
    }


def test_find_lists_the_jobs_named_for_the_metadata_newest_first_page_by_page(
    adapter: BedrockBatchProvider, stubber: Stubber
) -> None:
    created = created_jobs(stubber)
    stubber.add_response("create_model_invocation_job", {"jobArn": JOB_ARN})
    adapter.submit(lines(), {"aijobs_batch": "record-1"})
    listed = {"sortBy": "CreationTime", "sortOrder": "Descending", "maxResults": 100}
    name_part = created[0]["jobName"]
    stubber.add_response(
        "list_model_invocation_jobs",
        {"invocationJobSummaries": [summary(JOB_ARN + "2")], "nextToken": "page-2"},
        expected_params={"nameContains": name_part, **listed},
    )
    stubber.add_response(
        "list_model_invocation_jobs",
        {"invocationJobSummaries": [summary(JOB_ARN)]},
        expected_params={"nameContains": name_part, "nextToken": "page-2", **listed},
    )

    assert adapter.find({"aijobs_batch": "record-1"}) == [JOB_ARN + "2", JOB_ARN]


@pytest.mark.parametrize(
    ("counts", "records"),
    [
        ({"successRecordCount": 2, "errorRecordCount": 0}, 1),  # a file cut short
        ({"successRecordCount": 1, "errorRecordCount": 1}, 1),  # an error record missing
        ({"successRecordCount": 3, "errorRecordCount": 0}, 0),  # no result file at all
    ],
)
def test_results_holding_fewer_records_than_the_job_counts_are_an_error_to_read_again(
    counts: dict[str, int], records: int, adapter: BedrockBatchProvider, stubber: Stubber, bucket: PayloadStore
) -> None:
    if records:
        put_results(bucket, {"recordId": "job-0", "modelOutput": converse_output("{}")})
    stubber.add_response("get_model_invocation_job", job("Completed", **counts))

    with pytest.raises(ProviderUnavailableError, match="counts"):
        list(adapter.answers(JOB_ARN))


def test_results_of_a_job_still_running_are_an_error(adapter: BedrockBatchProvider, stubber: Stubber) -> None:
    stubber.add_response("get_model_invocation_job", job("InProgress"))

    with pytest.raises(ProviderUnavailableError, match="has not ended"):
        list(adapter.answers(JOB_ARN))
