"""The local event source mapping against a moto server: Lambda's event shape and its delete semantics.

Handlers run on the poller threads, so they only record what they saw; the test thread asserts.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from aijobs.local.poller import BatchResponseError, EventSourceMapping, failed_message_ids
from aijobs.stack import StackResources
from tests.support.events import InvocationContext, load_event
from tests.support.waiting import eventually

# Short waits keep every test to a few seconds.
FAST = {"wait_seconds": 1, "batching_window_seconds": 0.2}


class Recorder:
    """A handler that records each invocation and answers with `respond(event)`."""

    def __init__(self, respond: Callable[[dict[str, Any]], object] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.contexts: list[LambdaContext] = []
        self.remaining_ms: list[int] = []
        self._respond = respond or (lambda _event: {"batchItemFailures": []})
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: LambdaContext) -> object:
        with self._lock:
            self.events.append(event)
            self.contexts.append(context)
            self.remaining_ms.append(context.get_remaining_time_in_millis())
        return self._respond(event)

    @property
    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [record for event in self.events for record in event["Records"]]


@pytest.fixture
def sqs(endpoint_env: StackResources) -> Any:
    return boto3.client("sqs", region_name="us-east-1")


@pytest.fixture
def queue_url(endpoint_env: StackResources) -> str:
    return endpoint_env.queue_url


def send(sqs: Any, queue_url: str, *bodies: str, **kwargs: Any) -> list[str]:
    return [sqs.send_message(QueueUrl=queue_url, MessageBody=body, **kwargs)["MessageId"] for body in bodies]


def queue_counts(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages on the queue."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return int(attributes[names[0]]), int(attributes[names[1]])


def test_the_event_has_the_shape_lambda_sends(sqs: Any, queue_url: str) -> None:
    # Given a plain message and one with message attributes of every kind
    (plain,) = send(sqs, queue_url, '{"job_id": "shape-1"}')
    attributes = {
        "tenant": {"DataType": "String", "StringValue": "acme"},
        "priority": {"DataType": "Number", "StringValue": "3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    (with_attributes,) = send(sqs, queue_url, '{"job_id": "shape-2"}', MessageAttributes=attributes)
    handler = Recorder()
    mapping = EventSourceMapping(queue_url, handler, function_timeout_seconds=30, **FAST)

    # When the mapping delivers them
    assert mapping.run_until(lambda: len(handler.records) >= 2, timeout=10)

    # Then each record has exactly the fields of Lambda's SQS record (events/classify.json)
    expected = load_event("classify")["Records"][0]
    records = {record["messageId"]: record for record in handler.records}
    record = records[plain]
    assert record.keys() == expected.keys()
    assert set(expected["attributes"]) <= set(record["attributes"])
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert record["body"] == '{"job_id": "shape-1"}'
    assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()
    assert record["messageAttributes"] == {}
    assert record["eventSource"] == "aws:sqs"
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert (record["eventSourceARN"], record["awsRegion"]) == (queue_arn, "us-east-1")
    # And message attributes come in Lambda's camelCase shape, binaries base64-encoded
    attributed = records[with_attributes]
    assert attributed.keys() == expected.keys() | {"md5OfMessageAttributes"}
    assert attributed["messageAttributes"] == {
        "tenant": {"stringValue": "acme", "stringListValues": [], "binaryListValues": [], "dataType": "String"},
        "priority": {"stringValue": "3", "stringListValues": [], "binaryListValues": [], "dataType": "Number"},
        "blob": {"binaryValue": "AAE=", "stringListValues": [], "binaryListValues": [], "dataType": "Binary"},
    }
    # And the context is Lambda's, its remaining time counting down from the function's timeout
    context = handler.contexts[0]
    assert context.function_name == "aijobs-worker"
    assert context.memory_limit_in_mb == 512
    assert context.invoked_function_arn.endswith(":function:aijobs-worker")
    assert len({context.aws_request_id for context in handler.contexts}) == len(handler.contexts)
    assert all(25_000 < remaining <= 30_000 for remaining in handler.remaining_ms)


def test_successful_records_are_deleted(sqs: Any, queue_url: str) -> None:
    # Given three messages and a handler that reports no failures
    send(sqs, queue_url, "a", "b", "c")
    handler = Recorder()
    mapping = EventSourceMapping(queue_url, handler, **FAST)

    # When the mapping has delivered them
    assert mapping.run_until(lambda: mapping.stats.deleted == 3, timeout=10)

    # Then they are gone from the queue
    assert sorted(record["body"] for record in handler.records) == ["a", "b", "c"]
    assert queue_counts(sqs, queue_url) == (0, 0)
    stats = mapping.stats
    assert (stats.records, stats.deleted, stats.failed, stats.batch_errors) == (3, 3, 0, 0)


def test_records_in_batch_item_failures_stay_and_come_back_after_their_visibility(sqs: Any, queue_url: str) -> None:
    # Given a handler that, like the engine, hides one record for a second and reports it as failed once
    retry_id, other_id = send(sqs, queue_url, "retry-me", "fine")
    seen: set[str] = set()

    def respond(event: dict[str, Any]) -> object:
        failures = []
        for record in event["Records"]:
            if record["messageId"] == retry_id and retry_id not in seen:
                seen.add(retry_id)
                sqs.change_message_visibility(
                    QueueUrl=queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=1
                )
                failures.append({"itemIdentifier": retry_id})
        return {"batchItemFailures": failures}

    handler = Recorder(respond)
    mapping = EventSourceMapping(queue_url, handler, **FAST)

    # When the mapping runs until both are deleted
    assert mapping.run_until(lambda: mapping.stats.deleted == 2, timeout=15)

    # Then the failed record was delivered again, with its receive count raised; the other once
    deliveries = [(record["messageId"], record["attributes"]["ApproximateReceiveCount"]) for record in handler.records]
    assert deliveries.count((other_id, "1")) == 1
    assert [count for message_id, count in deliveries if message_id == retry_id] == ["1", "2"]
    assert queue_counts(sqs, queue_url) == (0, 0)
    assert (mapping.stats.failed, mapping.stats.deleted) == (1, 2)


@pytest.mark.parametrize(
    "respond",
    [
        pytest.param("raise", id="handler-raises"),
        pytest.param({"batchItemFailures": [{"itemIdentifier": "not-in-this-batch"}]}, id="unknown-identifier"),
        pytest.param({"batchItemFailures": [{"id": "x"}]}, id="bad-key-name"),
        pytest.param("not an object", id="not-an-object"),
    ],
)
def test_a_failed_invocation_deletes_nothing(sqs: Any, queue_url: str, respond: object) -> None:
    # Given a handler that raises, or answers with a malformed partial batch response
    send(sqs, queue_url, "one", "two")

    def answer(_event: dict[str, Any]) -> object:
        if respond == "raise":
            raise RuntimeError("the function crashed")
        return respond

    handler = Recorder(answer)
    mapping = EventSourceMapping(queue_url, handler, **FAST)

    # When the mapping has delivered the messages
    assert mapping.run_until(lambda: mapping.stats.records == 2, timeout=10)

    # Then the whole batch failed: both messages are still on the queue, in flight
    assert mapping.stats.deleted == 0
    assert mapping.stats.batch_errors == len(handler.events)
    assert queue_counts(sqs, queue_url) == (0, 2)


def test_an_invocation_that_outlives_the_function_timeout_deletes_nothing(sqs: Any, queue_url: str) -> None:
    # Given a handler that answers only once its invocation has passed the function timeout
    send(sqs, queue_url, "slow")

    def outliving(_event: dict[str, Any], context: InvocationContext) -> object:
        eventually(lambda: context.timed_out, interval=0.01, what="the invocation's timeout")
        return {"batchItemFailures": []}

    mapping = EventSourceMapping(queue_url, outliving, function_timeout_seconds=0.1, **FAST)  # type: ignore[arg-type]

    # When the mapping delivers the message
    assert mapping.run_until(lambda: mapping.stats.records == 1, timeout=10)

    # Then the response counts for nothing, as in Lambda: the message stays
    assert (mapping.stats.deleted, mapping.stats.batch_errors) == (0, 1)
    assert queue_counts(sqs, queue_url) == (0, 1)


def test_several_messages_arrive_in_one_invocation(sqs: Any, queue_url: str) -> None:
    # Given seven messages waiting, and a batch size of 10
    sqs.send_message_batch(
        QueueUrl=queue_url, Entries=[{"Id": str(number), "MessageBody": f"m{number}"} for number in range(7)]
    )
    handler = Recorder()
    mapping = EventSourceMapping(queue_url, handler, batch_size=10, wait_seconds=1, batching_window_seconds=0.5)

    # When the mapping delivers them
    assert mapping.run_until(lambda: mapping.stats.deleted == 7, timeout=10)

    # Then they came in one invocation
    assert [len(event["Records"]) for event in handler.events] == [7]


def test_batches_hold_at_most_batch_size_records(sqs: Any, queue_url: str) -> None:
    # Given five messages and a batch size of 2
    send(sqs, queue_url, *(f"m{number}" for number in range(5)))
    handler = Recorder()
    mapping = EventSourceMapping(queue_url, handler, batch_size=2, **FAST)

    # When the mapping delivers them
    assert mapping.run_until(lambda: mapping.stats.deleted == 5, timeout=10)

    # Then no invocation held more than two
    sizes = [len(event["Records"]) for event in handler.events]
    assert sum(sizes) == 5
    assert max(sizes) <= 2


def test_the_batching_window_gathers_messages_sent_after_the_first(sqs: Any, queue_url: str) -> None:
    # Given a mapping with a batching window longer than the test waits, and one message sent
    # before, two while it gathers
    send(sqs, queue_url, "first")
    handler = Recorder()
    mapping = EventSourceMapping(queue_url, handler, batch_size=3, wait_seconds=1, batching_window_seconds=120)
    mapping.start()
    try:
        # The first receive takes it; then two more arrive inside the window.
        eventually(lambda: queue_counts(sqs, queue_url)[1] == 1, interval=0.02, what="the first message's receive")
        send(sqs, queue_url, "second", "third")

        # When the batch is full
        eventually(lambda: mapping.stats.deleted == 3, interval=0.05, what="the full batch's deletion")
    finally:
        assert mapping.stop(timeout=30)

    # Then the three came in one invocation, before the window ran out
    assert [sorted(record["body"] for record in event["Records"]) for event in handler.events] == [
        ["first", "second", "third"]
    ]


def test_stop_ends_every_poller(sqs: Any, queue_url: str) -> None:
    # Given three pollers long-polling an empty queue
    mapping = EventSourceMapping(queue_url, Recorder(), concurrency=3, **FAST).start()
    assert len([thread for thread in threading.enumerate() if thread.name.startswith("aijobs-poller-")]) >= 3

    # When the mapping is stopped
    stopped = mapping.stop(timeout=30)

    # Then every thread has ended: the long polls noticed
    assert stopped
    assert not mapping.running
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("aijobs-poller-")]


def test_stop_lets_the_current_batch_finish(sqs: Any, queue_url: str) -> None:
    # Given a handler in the middle of a batch when stop is called
    send(sqs, queue_url, "in-flight")
    entered, release = threading.Event(), threading.Event()

    def blocking(_event: dict[str, Any]) -> object:
        entered.set()
        release.wait(30)
        return {"batchItemFailures": []}

    mapping = EventSourceMapping(queue_url, Recorder(blocking), **FAST).start()
    assert entered.wait(30)
    stopper = threading.Thread(target=mapping.stop, kwargs={"timeout": 30})
    stopper.start()

    # When the batch then finishes, the stop asked
    eventually(lambda: mapping.stopping, interval=0.01, what="the stop request")
    release.set()
    stopper.join(30)

    # Then its message was deleted before the poller exited
    assert not mapping.running
    assert mapping.stats.deleted == 1
    assert queue_counts(sqs, queue_url) == (0, 0)


# --- the partial batch response rules, without a queue ---------------------------------------------


@pytest.mark.parametrize(
    ("response", "failed"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": None}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "b"}]}, {"b"}),
        ({"batchItemFailures": [{"itemIdentifier": "a"}, {"itemIdentifier": "b"}]}, {"a", "b"}),
    ],
)
def test_valid_responses_name_the_failed_records(response: object, failed: set[str]) -> None:
    assert failed_message_ids(response, ["a", "b"]) == failed


@pytest.mark.parametrize(
    "response",
    [
        "ok",
        ["a"],
        {"batchItemFailures": "a"},
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"itemidentifier": "a"}]},
        {"batchItemFailures": [{"itemIdentifier": "z"}]},
        {"batchItemFailures": [], "x": object()},
    ],
)
def test_malformed_responses_fail_the_whole_batch(response: object) -> None:
    with pytest.raises(BatchResponseError):
        failed_message_ids(response, ["a", "b"])
