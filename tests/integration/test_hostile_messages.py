"""Messages an attacker or a broken producer sends: each ends recorded, once, and nothing loops.

Lone surrogates, numbers DynamoDB cannot hold, bodies past an item's size, fields that break their
own rule, and messages that keep failing in unexpected ways.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from engine.core import ErrorCode, JobStatus
from engine.definitions import JobDefinition, JobRegistry, Prompt
from engine.definitions.classify import ClassifyInput, ClassifyOutput
from engine.runner import GIVE_UP_RECEIVES
from engine.store.payloads import INLINE_BYTES
from engine.text import MAX_REASON_CHARS
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import TableReader, WorkerFactory
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider

Enqueue = Callable[[Any], dict[str, Any]]
ACKNOWLEDGED: dict[str, Any] = {"batchItemFailures": []}


def handled(worker: WorkerHandler, record: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = worker.handle(sqs_event(record), InvocationContext())
    return response


# --- lone surrogates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "job_type_kept"),
    [
        ({"input": {"text": "a\ud800b", "labels": ["a", "b"]}}, True),
        ({"job_type": "classi\ud800fy"}, False),
        ({"user_id": "u\udc00"}, True),
    ],
)
def test_a_lone_surrogate_fails_its_job_once_with_one_write(
    overrides: dict[str, Any],
    job_type_kept: bool,
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a `\ud800` escape in the message, as a JavaScript producer writes a cut emoji
    body = json.dumps(job_message("classify", "s1", user_id="u1") | overrides)
    assert "\\ud" in body

    # When the worker handles it
    response = handled(worker, enqueue(body))

    # Then it is acknowledged (not retried), and its job is failed in one write, with no provider call
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"PutItem": 1}
    assert provider.calls == 0
    job = table.job("s1")
    assert job.error is not None
    assert (job.status, job.error.code) == (JobStatus.FAILED, ErrorCode.INPUT_VALIDATION_FAILED)
    assert "surrogate" in job.error.message
    # And what was kept of the message is valid: the broken field is not stored
    assert (job.job_type == "classify") is job_type_kept
    assert job.user_id in (None, "u1")


def test_a_lone_surrogate_in_the_models_answer_is_re_asked_and_its_usage_kept(
    worker: WorkerHandler,
    provider: FakeProvider,
    dynamodb_requests: RequestCounter,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a model whose first answer holds a lone surrogate (the provider's JSON had `\ud800`)
    answers = iter(['{"label": "sp\ud800am", "confidence": 0.9}', '{"label": "spam", "confidence": 0.9}'])
    provider.script = lambda _: next(answers)

    # When the worker handles a job
    response = handled(worker, enqueue(job_message("classify", "s2")))

    # Then the answer is rejected and re-asked (the rejected answer sent back as valid text), and
    # the job succeeds with both calls' tokens in two requests
    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"UpdateItem": 1, "TransactWriteItems": 1}
    assert provider.calls == 2
    repaired = provider.requests[1].conversation[0].content
    assert repaired.encode()
    job = table.job("s2")
    assert (job.status, job.usage.input_tokens, job.usage.output_tokens) == (JobStatus.SUCCEEDED, 200, 40)


# --- numbers DynamoDB cannot hold ---------------------------------------------------------------


@pytest.mark.parametrize("max_attempts", [12345678901234567890123456789012345678901, 10**200])
def test_a_number_dynamodb_cannot_hold_fails_its_job_without_storing_it(
    max_attempts: int, worker: WorkerHandler, dynamodb_requests: RequestCounter, table: TableReader, enqueue: Enqueue
) -> None:
    response = handled(worker, enqueue(job_message("classify", "n1", max_attempts=max_attempts)))

    assert response == ACKNOWLEDGED
    assert dict(dynamodb_requests.operations) == {"PutItem": 1}
    job = table.job("n1")
    assert job.error is not None
    assert (job.status, job.error.code, job.max_attempts) == (JobStatus.FAILED, ErrorCode.INPUT_VALIDATION_FAILED, 0)


# --- bodies past an item's size -----------------------------------------------------------------


def test_a_600_kb_body_that_is_not_json_is_kept_whole_in_the_payload_bucket(
    worker: WorkerHandler, table: TableReader, enqueue: Enqueue, payloads: Any
) -> None:
    body = "x" * 600_000
    record = enqueue(body)

    response = handled(worker, record)

    # The dead letter's item references the body kept in S3, with its size and hash
    assert response == ACKNOWLEDGED
    item = table.dead_letter(record["messageId"])
    assert item is not None
    assert "body" not in item
    assert item["body_bytes"] == 600_000
    assert payloads.get(item["body_key"]).decode() == body


def test_a_body_within_the_inline_bound_stays_on_the_item(
    worker: WorkerHandler, table: TableReader, enqueue: Enqueue
) -> None:
    body = "y" * (INLINE_BYTES - 10)
    record = enqueue(body)

    assert handled(worker, record) == ACKNOWLEDGED
    item = table.dead_letter(record["messageId"])
    assert item is not None
    assert (item["body"], "body_key" in item) == (body, False)


def test_a_600_kb_job_type_fails_its_job_with_a_bounded_reason(
    worker: WorkerHandler, table: TableReader, enqueue: Enqueue
) -> None:
    response = handled(worker, enqueue(job_message("classify", "big-type") | {"job_type": "t" * 600_000}))

    assert response == ACKNOWLEDGED
    job = table.job("big-type")
    assert job.error is not None
    assert (job.status, job.job_type) == (JobStatus.FAILED, None)
    assert len(job.error.message) <= MAX_REASON_CHARS


def test_a_200_kb_input_key_is_not_stored_in_the_reason(
    worker: WorkerHandler, table: TableReader, enqueue: Enqueue
) -> None:
    message = job_message("classify", "big-key")
    message["input"]["k" * 200_000] = 1

    assert handled(worker, enqueue(message)) == ACKNOWLEDGED
    job = table.job("big-key")
    assert job.error is not None
    assert "<key of 200000 characters>" in job.error.message
    assert len(job.error.message) <= MAX_REASON_CHARS


# --- logs quote no input ------------------------------------------------------------------------

CANARY = "canary-7f3a9"


@pytest.fixture
def captured_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(job_message("classify", "log-1") | {CANARY: 1}),
        json.dumps(job_message("classify", "log-2", input={"text": "t", "labels": ["a", "b"], CANARY: 1})),
        json.dumps(job_message("classify", "log-3", input={"text": CANARY, "labels": [CANARY]})),
        json.dumps({"job_id": "log 4", CANARY: CANARY}),
        json.dumps({"job_id": "log-5", "job_type": CANARY, "user_id": "u", "input": {}}),
        CANARY + " not json",
    ],
)
def test_no_log_line_quotes_the_message(
    body: str, worker: WorkerHandler, enqueue: Enqueue, captured_logs: pytest.LogCaptureFixture, capsys: Any
) -> None:
    assert handled(worker, enqueue(body)) == ACKNOWLEDGED

    # The engine's own log lines (the aijobs logger), as captured and as printed (JSON on stdout)
    printed = capsys.readouterr()
    ours = [record for record in captured_logs.records if record.name.startswith("aijobs")]
    assert ours
    logged = "\n".join(record.getMessage() + str(record.__dict__) for record in ours)
    assert CANARY not in logged + printed.out + printed.err


# --- messages that keep failing in unexpected ways ----------------------------------------------


class ExplodingInput(ClassifyInput):
    """An input model whose validator has a bug: it raises what pydantic does not turn into an error."""

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise ZeroDivisionError("a bug in a job type's input model")


EXPLODING = JobDefinition(
    name="exploding",
    input_model=ExplodingInput,
    output_model=ClassifyOutput,
    prompt=Prompt(key="exploding", version="1", system="s", user="{text}"),
)


def test_a_message_that_fails_unexpectedly_is_given_up_on_at_its_third_receive(
    make_worker: WorkerFactory,
    registry: JobRegistry,
    provider: FakeProvider,
    table: TableReader,
    enqueue: Enqueue,
) -> None:
    # Given a job type with a bug that makes every parse of its messages raise
    registry.register(EXPLODING)
    worker = make_worker()
    record = enqueue(job_message("classify", "boom-1") | {"job_type": "exploding"})

    # When the message is received again and again
    outcomes = [
        handled(worker, record | {"attributes": record["attributes"] | {"ApproximateReceiveCount": str(count)}})
        for count in range(1, GIVE_UP_RECEIVES + 1)
    ]

    # Then it is retried below the bound, and on the third receive kept as a dead letter and acknowledged
    failed = {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    assert outcomes == [failed] * (GIVE_UP_RECEIVES - 1) + [ACKNOWLEDGED]
    item = table.dead_letter(record["messageId"])
    assert item is not None
    assert item["reason"] == f"internal error (ZeroDivisionError) on receive {GIVE_UP_RECEIVES}; given up"
    assert provider.calls == 0


# DynamoDB throttling the claim; a finishing transaction cancelled, on every try, for a conflict with
# another write of the job (a cancel request, a duplicate's claim): transient, not a refused condition.
THROTTLED = ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "UpdateItem")
CONFLICTED = ClientError(
    {
        "Error": {"Code": "TransactionCanceledException"},
        "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
    },
    "TransactWriteItems",
)


@pytest.mark.parametrize(
    ("step", "error"), [("claim_job", THROTTLED), ("finish_job", CONFLICTED)], ids=["throttled", "conflicted"]
)
def test_a_transient_aws_error_is_retried_whatever_the_receive_count(
    make_worker: WorkerFactory,
    table: TableReader,
    enqueue: Enqueue,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    error: ClientError,
) -> None:
    # Given a store step that fails transiently
    def failing(*_: Any, **__: Any) -> Any:
        raise error

    worker = make_worker()
    monkeypatch.setattr(worker._worker._runner._store, step, failing)
    record = enqueue(job_message("classify", f"{step}-1"))

    # When it is received for the tenth time
    response = handled(worker, record | {"attributes": record["attributes"] | {"ApproximateReceiveCount": "10"}})

    # Then it is retried, not given up on
    assert response == {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    assert table.dead_letter(record["messageId"]) is None


def test_a_job_type_that_raises_after_the_claim_spends_its_attempts_and_ends(
    make_worker: WorkerFactory, registry: JobRegistry, provider: FakeProvider, table: TableReader
) -> None:
    # Given a job type whose prompt rendering has a bug (it raises after the job is claimed)
    def broken_fields(_: Any) -> dict[str, Any]:
        raise TypeError("a bug in a job type's prompt fields")

    registry.register(
        JobDefinition(
            name="broken_prompt",
            input_model=ClassifyInput,
            output_model=ClassifyOutput,
            prompt=Prompt(key="broken", version="1", system="s", user="{text}"),
            prompt_fields=broken_fields,
        )
    )
    worker = make_worker()
    message = json.dumps(job_message("classify", "broken-1") | {"job_type": "broken_prompt"})

    # When its message comes back after each failure
    outcomes = [handled(worker, sqs_record(message, receive_count=count)) for count in (1, 2, 3)]

    # Then each attempt hands the job back with internal_error, and the third one ends it
    assert [bool(outcome["batchItemFailures"]) for outcome in outcomes] == [True, True, False]
    job = table.job("broken-1")
    assert job.error is not None
    assert (job.status, job.error.code, job.attempt_count) == (JobStatus.FAILED, ErrorCode.MAX_ATTEMPTS_EXCEEDED, 3)
    assert "internal_error" in job.error.message
    assert provider.calls == 0
