"""Amazon Bedrock batch inference jobs over boto3: JSONL records in the payload bucket, one job a batch.

What AWS documents, and this adapter follows (Amazon Bedrock User Guide: "Process multiple prompts
with batch inference", "Format and upload your batch inference data", "View the results of a batch
inference job", "Code example for batch inference"; API reference: CreateModelInvocationJob,
GetModelInvocationJob, ListModelInvocationJobs, StopModelInvocationJob):

- Input: `.jsonl` objects in S3, one record a line, `{"recordId", "modelInput"}`. With the job's
  `modelInvocationType` `Converse` (the other is `InvokeModel`, the model's native body), the
  modelInput is the request body of the Converse API; the job, not the record, names the model.
- Results: one `<input file>.jsonl.out` object per input file under the output location (and a
  `manifest.json.out`), a line per record, `{"recordId", "modelInput", "modelOutput"}` with a
  Converse response as modelOutput, or an `error` object (`{"errorCode", "errorMessage"}`) in its
  place; records come back in any order. A stopped or expired job's output holds the records it
  processed.
- Converse jobs do not take tool calls: "Records that include toolConfig fail with a 400 error".
  So a record does not force the tool call a real-time call makes (engine.gateway.bedrock); its
  system prompt asks for the JSON answer (SCHEMA_PREAMBLE and the schema, as OpenAI's json_object
  mode does), and the engine validates it, and re-asks in real time, as any answer. (Native
  structured output, `outputConfig.textFormat`, is documented for batch jobs too, but only select
  models take it.) Nor does a record carry a prompt cache point: batch jobs do not document one.
- Quotas, per model and some adjustable (named in "Format and upload your batch inference data";
  valued in the AWS General Reference, "Amazon Bedrock endpoints and quotas"): "Minimum number of
  records per batch inference job" (the code example adds records "until you hit the minimum"),
  "Records per batch inference job" and "Batch inference input file size". The numbers here, 100,
  50,000 and 1 GB, are their usual defaults; an account's own are in Service Quotas, and an
  account with another minimum passes its own.
- Statuses: Submitted, Validating, Scheduled, InProgress and Stopping are pending; Completed and
  PartiallyCompleted (some records failed) have ended with results; Failed has none; Stopped and
  Expired keep the records processed before.

A job is named `aijobs-<digest of its metadata>` (the batch's record), and created with that name as
its `clientRequestToken`: a submission made again for the same record is the same job, and `find`
lists the jobs made with some metadata by `nameContains`; its input sits at
`batches/<job name>/input.jsonl` in the payload bucket and its results under
`batches/<job name>/output/`. Results are checked against the job's own `successRecordCount` and
`errorRecordCount`: fewer records than it counts is an error to read again later.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import IO, Any, Protocol, cast

import boto3
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from engine.core.batches import BatchState
from engine.core.errors import JobError, ProviderRejectedError, ProviderUnavailableError
from engine.gateway.batch_files import UnreadableLine, jsonl_line, jsonl_values, spooled, unreadable_answer
from engine.gateway.batches import BatchAnswer, BatchLine, BatchStatus, stop_unless_ended
from engine.gateway.bedrock import classified_error, converse_completion, converse_input
from engine.gateway.parts import base64_text
from engine.gateway.provider import error_for_status
from engine.gateway.schema import system_with_schema

# The quotas' defaults (see above).
MIN_RECORDS = 100
MAX_RECORDS = 50_000
MAX_INPUT_BYTES = 1_000_000_000
# A result line echoes its record's input (a job's input is at most 200,000 characters, a few MB
# as JSON) beside the answer (bounded as a real-time answer would be).
MAX_LINE_BYTES = 16 * 1024 * 1024
# Bedrock's shortest job timeout (24 to 168 hours): the window a batch is given, as with OpenAI's.
TIMEOUT_HOURS = 24
JOB_NAME_PREFIX = "aijobs-"
KEY_PREFIX = "batches/"
OUTPUT_SUFFIX = ".jsonl.out"
# `find` reads the newest jobs, PAGE_SIZE a page, at most MAX_FIND_PAGES pages.
PAGE_SIZE = 100
MAX_FIND_PAGES = 20

_STATES = {
    "Submitted": BatchState.PENDING,
    "Validating": BatchState.PENDING,
    "Scheduled": BatchState.PENDING,
    "InProgress": BatchState.PENDING,
    "Stopping": BatchState.PENDING,
    "Completed": BatchState.COMPLETED,
    "PartiallyCompleted": BatchState.COMPLETED,
    "Failed": BatchState.FAILED,
    "Stopped": BatchState.CANCELLED,
    "Expired": BatchState.EXPIRED,
}


class BatchJobsClient(Protocol):
    """The part of boto3's bedrock client (the control plane) the adapter uses."""

    def create_model_invocation_job(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def get_model_invocation_job(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def list_model_invocation_jobs(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def stop_model_invocation_job(self, **kwargs: Any) -> Mapping[str, Any]: ...


class BatchObjects(Protocol):
    """Where a job's files are kept: the payload bucket (engine.store.PayloadStore)."""

    bucket: str

    def put(self, key: str, data: bytes, content_type: str = ...) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def download(self, key: str, file: IO[bytes]) -> None: ...


class BedrockBatchProvider:
    name = "bedrock"
    max_lines = MAX_RECORDS
    max_bytes = MAX_INPUT_BYTES

    def __init__(
        self,
        objects: BatchObjects,
        role_arn: str,
        *,
        client: BatchJobsClient | None = None,
        min_lines: int = MIN_RECORDS,
    ) -> None:
        # The service role Bedrock assumes to read the input and write the results.
        self._objects = objects
        self._role_arn = role_arn
        self._client = client or cast(BatchJobsClient, boto3.client("bedrock"))
        self.min_lines = min_lines

    def line_bytes(self, line: BatchLine) -> int:
        return len(_record(line))

    def submit(self, lines: Sequence[BatchLine], metadata: Mapping[str, str]) -> str:
        if not self.min_lines <= len(lines) <= self.max_lines:
            raise ValueError(f"a batch holds {self.min_lines} to {self.max_lines} records, not {len(lines)}")
        models = {line.request.model for line in lines}
        if len(models) != 1:
            raise ValueError(f"a batch inference job runs one model, not {len(models)}")
        content = b"".join(_record(line) for line in lines)
        if len(content) > self.max_bytes:
            raise ValueError(f"a batch's input is at most {self.max_bytes} bytes, not {len(content)}")
        # Named by the metadata alone (the batch's record), with the same request token: a submission
        # made again for the same record, after an answer that was lost, is the same job.
        name = _name_part(metadata)
        folder = f"s3://{self._objects.bucket}/{KEY_PREFIX}{name}/"
        with _bedrock_errors():
            self._objects.put(f"{KEY_PREFIX}{name}/input.jsonl", content, "application/jsonl")
            job = self._client.create_model_invocation_job(
                jobName=name,
                clientRequestToken=name,
                roleArn=self._role_arn,
                modelId=models.pop(),
                modelInvocationType="Converse",
                inputDataConfig={"s3InputDataConfig": {"s3InputFormat": "JSONL", "s3Uri": folder + "input.jsonl"}},
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": folder + "output/"}},
                timeoutDurationInHours=TIMEOUT_HOURS,
            )
        return str(job["jobArn"])

    def status(self, batch_id: str) -> BatchStatus:
        return _status(batch_id, self._job(batch_id))

    def answers(self, batch_id: str) -> Iterator[BatchAnswer]:
        """The records of an ended job's output files; an error (to read them again later) when the job
        has not ended, or its files hold fewer records than its own counts say."""
        job = self._job(batch_id)
        status = _status(batch_id, job)
        if not status.state.ended:
            raise ProviderUnavailableError(f"batch inference job {batch_id} has not ended ({status.detail})")
        model = str(job.get("modelId") or "")
        prefix = _output_prefix(job, self._objects.bucket)
        with _bedrock_errors():
            keys = [key for key in self._objects.keys(prefix) if key.endswith(OUTPUT_SUFFIX)]
        read = 0
        for key in keys:
            with _bedrock_errors():
                file = spooled(partial(self._objects.download, key))
            with file:
                for value in jsonl_values(file, MAX_LINE_BYTES):
                    answer = _answer(value, model)
                    if answer is not None:
                        read += 1
                        yield answer
        if read < status.answered + status.failed:
            raise ProviderUnavailableError(
                f"batch inference job {batch_id}'s results hold {read} records; "
                f"it counts {status.answered} answered and {status.failed} failed"
            )

    def cancel(self, batch_id: str) -> None:
        def stop() -> None:
            with _bedrock_errors():
                self._client.stop_model_invocation_job(jobIdentifier=batch_id)

        stop_unless_ended(stop, lambda: self.status(batch_id))

    def find(self, metadata: Mapping[str, str]) -> list[str]:
        found: list[str] = []
        token: str | None = None
        for _ in range(MAX_FIND_PAGES):
            with _bedrock_errors():
                page = self._client.list_model_invocation_jobs(
                    nameContains=_name_part(metadata),
                    sortBy="CreationTime",
                    sortOrder="Descending",
                    maxResults=PAGE_SIZE,
                    **({"nextToken": token} if token else {}),
                )
            found += [str(job["jobArn"]) for job in page.get("invocationJobSummaries") or [] if "jobArn" in job]
            token = page.get("nextToken")
            if not token:
                break
        return found

    def _job(self, batch_id: str) -> Mapping[str, Any]:
        with _bedrock_errors():
            return self._client.get_model_invocation_job(jobIdentifier=batch_id)


def _status(batch_id: str, job: Mapping[str, Any]) -> BatchStatus:
    detail = str(job.get("status") or "")
    # A status this adapter does not know is taken as not ended yet: it is polled again.
    state = _STATES.get(detail, BatchState.PENDING)
    return BatchStatus(
        batch_id, state, detail, _count(job.get("successRecordCount")), _count(job.get("errorRecordCount"))
    )


def _record(line: BatchLine) -> bytes:
    request = line.request
    system = [{"text": system_with_schema(request.system, request.output_schema)}]
    return jsonl_line({"recordId": line.custom_id, "modelInput": converse_input(request, system, base64_text)})


def _name_part(metadata: Mapping[str, str]) -> str:
    """What the names of the jobs made with `metadata` start with: the prefix and a digest of it."""
    canonical = json.dumps(dict(metadata), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return JOB_NAME_PREFIX + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _output_prefix(job: Mapping[str, Any], bucket: str) -> str:
    """The key prefix of a job's results in `bucket`, from the output location it was created with."""
    uri = str(job.get("outputDataConfig", {}).get("s3OutputDataConfig", {}).get("s3Uri") or "")
    location = f"s3://{bucket}/"
    if not uri.startswith(location):
        raise ProviderUnavailableError("the batch inference job writes its results outside the payload bucket")
    return uri[len(location) :]


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _answer(value: object, model: str) -> BatchAnswer | None:
    """The answer a result line holds; None for a line that names no record."""
    if isinstance(value, UnreadableLine):
        return unreadable_answer(value, "recordId", MAX_LINE_BYTES)
    if not isinstance(value, dict) or not isinstance(value.get("recordId"), str):
        return None
    record_id: str = value["recordId"]
    output = value.get("modelOutput")
    if isinstance(output, dict):
        try:
            return BatchAnswer(record_id, completion=converse_completion(model, output, latency_ms=0))
        except JobError as exc:
            return BatchAnswer(record_id, error=exc)
    error = value.get("error")
    code = error.get("errorCode") if isinstance(error, dict) else None
    status = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
    # The error's message is not kept: it may quote the record.
    return BatchAnswer(record_id, error=error_for_status(status, "Bedrock", f"batch record error {code}"))


@contextmanager
def _bedrock_errors() -> Iterator[None]:
    """The engine's errors for a failed call to Bedrock or S3: by error code, else by status."""
    try:
        yield
    except ClientError as exc:
        raise classified_error(exc) from exc
    except ParamValidationError as exc:
        # botocore checked the request against the service model before sending it.
        raise ProviderRejectedError("the client refused the batch request (ParamValidationError)") from exc
    except BotoCoreError as exc:
        raise ProviderUnavailableError(f"Bedrock batch call failed: {type(exc).__name__}") from exc
