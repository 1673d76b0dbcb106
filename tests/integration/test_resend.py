"""JobQueue.resend on moto's SQS: messages of jobs a batch hands back, sent again in as few
SendMessageBatch requests as SQS's limits allow (ten entries, 1 MiB together), and every message SQS
refuses given back to the caller, never only logged (docs/batches.md)."""

from __future__ import annotations

import json
from typing import Any

from aijobs.stack import StackResources
from engine.queue import REALTIME_ROUTE, ROUTE_ATTRIBUTE, SEND_BATCH_BYTES, JobQueue, Resend
from tests.conftest import RequestCounter


def body(job_id: str, size: int = 100) -> str:
    return json.dumps({"job_id": job_id, "job_type": "summarize", "user_id": "u", "input": {"text": "x" * size}})


def sent(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]).get(
        "Messages"
    ):
        messages += batch
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)]
        )
    return messages


def test_two_600_kb_bodies_go_in_two_requests_and_both_arrive_marked_for_real_time(
    sqs: Any, stack: StackResources
) -> None:
    counter = RequestCounter()
    sqs.meta.events.register("before-call.sqs.SendMessageBatch", counter)
    queue = JobQueue(stack.queue_url, sqs)

    refused = queue.resend([Resend(body("a", 600_000)), Resend(body("b", 600_000))])

    assert refused == []
    assert counter.total == 2
    messages = sent(sqs, stack.queue_url)
    assert sorted(json.loads(m["Body"])["job_id"] for m in messages) == ["a", "b"]
    assert {m["MessageAttributes"][ROUTE_ATTRIBUTE]["StringValue"] for m in messages} == {REALTIME_ROUTE}


def test_small_messages_go_ten_to_a_request(sqs: Any, stack: StackResources) -> None:
    counter = RequestCounter()
    sqs.meta.events.register("before-call.sqs.SendMessageBatch", counter)

    refused = JobQueue(stack.queue_url, sqs).resend([Resend(body(f"j{n}")) for n in range(23)])

    assert refused == []
    assert counter.total == 3
    assert len(sent(sqs, stack.queue_url)) == 23


def test_a_body_that_fills_a_message_alone_goes_without_its_route_attribute(sqs: Any, stack: StackResources) -> None:
    text = body("full")
    full = text[:-3] + "x" * (SEND_BATCH_BYTES - len(text.encode())) + text[-3:]
    assert len(full.encode()) == SEND_BATCH_BYTES

    refused = JobQueue(stack.queue_url, sqs).resend([Resend(full)])

    assert refused == []
    [message] = sent(sqs, stack.queue_url)
    assert "MessageAttributes" not in message


class Refusing:
    """An SQS client whose SendMessageBatch answers some entries `Failed`, or fails whole."""

    def __init__(self, failed_ids: set[str] | None = None, error: Exception | None = None) -> None:
        self.failed_ids = failed_ids or set()
        self.error = error
        self.calls: list[list[dict[str, Any]]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(Entries)
        if self.error is not None:
            raise self.error
        failed = [
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError"}
            for e in Entries
            if e["Id"] in self.failed_ids
        ]
        return {"Successful": [{"Id": e["Id"]} for e in Entries if e["Id"] not in self.failed_ids], "Failed": failed}


def test_entries_sqs_answers_failed_are_given_back_in_their_order() -> None:
    messages = [Resend(body(f"j{n}")) for n in range(4)]
    queue = JobQueue("https://sqs.local/q", Refusing({"1", "3"}))  # type: ignore[arg-type]

    assert queue.resend(messages) == [messages[1], messages[3]]


def test_a_request_that_fails_whole_gives_back_all_its_messages() -> None:
    messages = [Resend(body(f"j{n}")) for n in range(12)]
    client = Refusing(error=ConnectionError("throttled past the SDK's retries"))

    assert JobQueue("https://sqs.local/q", client).resend(messages) == messages  # type: ignore[arg-type]
    assert [len(call) for call in client.calls] == [10, 2]
