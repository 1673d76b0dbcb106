"""What fit_moto's cheaper paths still refuse and accept (aijobs.local.moto_patches): update expressions
checked once on the whole expression, SQS deletes that find their message in one pass."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from aijobs.stack import StackResources

KEY = {"pk": {"S": "JOB#checked"}, "sk": {"S": "JOB"}}


def update(dynamodb: Any, table: str, expression: str, values: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = dynamodb.update_item(
        TableName=table,
        Key=KEY,
        UpdateExpression=expression,
        ExpressionAttributeValues=values,
        ReturnValues="ALL_NEW",
    )
    return response["Attributes"]


@pytest.mark.parametrize(
    "expression",
    [
        "SET a = :one REMOVE b SET c = :one",  # two SET clauses
        "SET a = :one, b = :one, a = :two",  # the same path twice, far apart
        "SET m.a = :one, b = :one, m = :two",  # overlapping paths
        "SET a = :one ADD n :one ADD k :one",  # two ADD clauses, after others
    ],
)
def test_an_update_expression_refused_anywhere_in_it_is_refused(
    stack: StackResources, dynamodb: Any, expression: str
) -> None:
    with pytest.raises(ClientError) as refused:
        update(dynamodb, stack.table_name, expression, {":one": {"N": "1"}, ":two": {"N": "2"}})

    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "Item" not in dynamodb.get_item(TableName=stack.table_name, Key=KEY)


def test_an_update_of_many_actions_applies_them_all(stack: StackResources, dynamodb: Any) -> None:
    names = [f"a{n}" for n in range(20)]
    sets = ", ".join(f"{name} = if_not_exists({name}, :v{n})" for n, name in enumerate(names))
    values = {f":v{n}": {"N": str(n)} for n in range(len(names))} | {":one": {"N": "1"}}

    item = update(dynamodb, stack.table_name, f"SET {sets} ADD claims :one REMOVE gone", values)
    again = update(dynamodb, stack.table_name, f"SET {sets} ADD claims :one REMOVE gone", values)

    assert {name: item[name]["N"] for name in names} == {name: str(n) for n, name in enumerate(names)}
    assert (item["claims"]["N"], again["claims"]["N"]) == ("1", "2")


def test_a_message_is_deleted_by_its_latest_or_an_older_receipt_and_only_once(stack: StackResources, sqs: Any) -> None:
    url = stack.queue_url
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"m{n}"} for n in range(3)])
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    older = {message["Body"]: message["ReceiptHandle"] for message in first}
    latest = {message["Body"]: message["ReceiptHandle"] for message in again}

    sqs.delete_message(QueueUrl=url, ReceiptHandle=latest["m0"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=older["m1"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=older["m0"])  # already deleted: accepted again
    with pytest.raises(ClientError) as unknown:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=latest["m2"][::-1])

    assert unknown.value.response["Error"]["Code"] == "ReceiptHandleIsInvalid"
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [message["Body"] for message in left] == ["m2"]
