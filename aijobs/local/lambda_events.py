"""Lambda's side of an SQS event source, built here once: the event records and the invocation context.

The local event source mapping builds its events from received messages with these; the tests and
the bench build theirs from bodies. Standard library only at run time (a measured worker process
imports this and the handler, nothing else).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.typing import LambdaContext

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueOutputTypeDef, MessageTypeDef

DEFAULT_QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:aijobs-jobs"


def sqs_record(
    body: Any,
    *,
    message_id: str | None = None,
    receipt_handle: str | None = None,
    receive_count: int = 1,
    first_received_ms: int | None = None,
    queue_arn: str = DEFAULT_QUEUE_ARN,
) -> dict[str, Any]:
    """One record of an SQS event, as Lambda sends it, for a message with `body` (text, or JSON of a value)."""
    body = body if isinstance(body, str) else json.dumps(body)
    message_id = message_id or str(uuid.uuid4())
    now = str(int(time.time() * 1000))
    return {
        "messageId": message_id,
        "receiptHandle": receipt_handle or f"handle-{message_id}",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": now,
            "SenderId": "AIDAEXAMPLE",
            "ApproximateFirstReceiveTimestamp": str(first_received_ms) if first_received_ms else now,
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": queue_arn.split(":")[3],
    }


def received_record(message: MessageTypeDef, queue_arn: str) -> dict[str, Any]:
    """The record of a message received from SQS: its own id, receipt, attributes and message attributes."""
    record = sqs_record(
        message["Body"],
        message_id=message["MessageId"],
        receipt_handle=message["ReceiptHandle"],
        queue_arn=queue_arn,
    )
    record["attributes"] = dict(message.get("Attributes", {}))
    record["messageAttributes"] = {
        name: _message_attribute(value) for name, value in message.get("MessageAttributes", {}).items()
    }
    record["md5OfBody"] = message["MD5OfBody"]
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def sqs_event(*records: dict[str, Any]) -> dict[str, Any]:
    return {"Records": list(records)}


def _message_attribute(value: MessageAttributeValueOutputTypeDef) -> dict[str, Any]:
    """One message attribute in the shape Lambda puts in the event (camelCase, binaries base64)."""
    attribute: dict[str, Any] = {}
    if "StringValue" in value:
        attribute["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        attribute["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
    attribute["stringListValues"] = list(value.get("StringListValues", []))
    attribute["binaryListValues"] = [base64.b64encode(item).decode() for item in value.get("BinaryListValues", [])]
    attribute["dataType"] = value["DataType"]
    return attribute


class InvocationContext(LambdaContext):
    """The Lambda context of one invocation; the remaining time counts down from the function's timeout,
    on `clock` (seconds: the machine's monotonic clock, or a test's own)."""

    def __init__(
        self,
        function_name: str = "aijobs-worker",
        timeout_seconds: float = 300.0,
        memory_limit_in_mb: int = 512,
        region: str = "us-east-1",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._function_name = function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:{function_name}"
        self._memory_limit_in_mb = memory_limit_in_mb
        self._aws_request_id = str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{function_name}"
        self._log_stream_name = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"
        self._clock = clock
        self._deadline = clock() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]  # an instance's own clock
        return max(0, round((self._deadline - self._clock()) * 1000))

    @property
    def timed_out(self) -> bool:
        return self._clock() >= self._deadline
