"""What DynamoDB asks to be sent again (engine.store.retries), against client stubs: BatchGetItem's
unprocessed keys and transactions cancelled by a conflict are sent again a bounded number of times,
after a backoff, then fail with an error that is transient and says what is left."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError

from engine.aws_errors import is_transient
from engine.core.errors import UnreadKeysError
from engine.store.budgets import BudgetTable, cap_key
from engine.store.retries import Backoff, batch_get, batch_get_jobs, transact

TABLE = "jobs"


class Pauses:
    """A backoff's sleep: remembered, never slept."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


@pytest.fixture
def pauses() -> Pauses:
    return Pauses()


@pytest.fixture
def backoff(pauses: Pauses) -> Backoff:
    return Backoff(sleep=pauses, rng=random.Random(3))


def key(n: int) -> dict[str, Any]:
    return {"pk": {"S": f"JOB#j-{n}"}, "sk": {"S": "JOB"}}


def key_of(item: dict[str, Any]) -> tuple[str, str]:
    return item["pk"]["S"], item["sk"]["S"]


class Unprocessing:
    """A BatchGetItem over `items` that leaves all but the first of the keys it is sent unprocessed,
    `times` times."""

    def __init__(self, items: list[dict[str, Any]], times: int) -> None:
        self.requests: list[dict[str, Any]] = []
        self._items = {key_of(item): item for item in items}
        self._times = times

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(RequestItems)
        if len(self.requests) > 50:
            raise AssertionError("unprocessed keys were sent again 50 times")
        ((table, request),) = RequestItems.items()
        keys = request["Keys"]
        answered = keys if len(self.requests) > self._times else keys[:1]
        left = keys[len(answered) :]
        found = [self._items[key_of(k)] for k in answered if key_of(k) in self._items]
        response: dict[str, Any] = {"Responses": {table: found}}
        if left:
            response["UnprocessedKeys"] = {table: {**request, "Keys": left}}
        return response


def job_item(n: int) -> dict[str, Any]:
    return key(n) | {
        "job_id": {"S": f"j-{n}"},
        "status": {"S": "queued"},
        "created_at": {"N": "1800000000000"},
    }


def test_unprocessed_keys_are_sent_again_after_a_growing_backoff(pauses: Pauses, backoff: Backoff) -> None:
    # Given a BatchGetItem that leaves keys unprocessed twice (one key read each time)
    client = Unprocessing([job_item(n) for n in range(4)], times=2)

    # When four jobs are read, one of them gone
    jobs = batch_get_jobs(client, TABLE, [key(n) for n in range(5)], True, backoff)  # type: ignore[arg-type]

    # Then every job is read, in the keys' order, in three requests, the later ones with only the
    # keys left and the read's consistency, after two pauses within 50 ms then 100 ms
    assert [job.job_id if job else None for job in jobs] == ["j-0", "j-1", "j-2", "j-3", None]
    assert [[k["pk"]["S"] for k in request[TABLE]["Keys"]] for request in client.requests] == [
        [f"JOB#j-{n}" for n in range(5)],
        [f"JOB#j-{n}" for n in range(1, 5)],
        [f"JOB#j-{n}" for n in range(2, 5)],
    ]
    assert all(request[TABLE]["ConsistentRead"] for request in client.requests)
    assert len(pauses.seconds) == 2
    assert 0 <= pauses.seconds[0] <= 0.05
    assert 0 <= pauses.seconds[1] <= 0.1


def test_keys_left_unprocessed_on_every_try_fail_with_what_was_left_unread(pauses: Pauses, backoff: Backoff) -> None:
    # Given a BatchGetItem that never reads more than one key of a request
    client = Unprocessing([], times=1_000)

    # When eight keys are read
    with pytest.raises(UnreadKeysError) as raised:
        batch_get(client, TABLE, [key(n) for n in range(8)], False, backoff)  # type: ignore[arg-type]

    # Then it gives up after its tries, naming the keys still unread, as a transient error
    assert len(client.requests) == backoff.tries
    assert len(pauses.seconds) == backoff.tries - 1
    assert all(pause <= backoff.cap_seconds for pause in pauses.seconds)
    error = raised.value
    assert error.keys == ["JOB#j-6/JOB", "JOB#j-7/JOB"]
    assert str(error) == "2 keys of table jobs left unread after 6 tries: JOB#j-6/JOB, JOB#j-7/JOB"
    assert is_transient(error)


def test_a_users_caps_are_read_through_unprocessed_keys(pauses: Pauses, backoff: Backoff) -> None:
    # Given the caps of three users, and a BatchGetItem that leaves keys unprocessed twice
    items = [
        cap_key(user) | {"user_id": {"S": user}, "daily_usd": {"N": cap}}
        for user, cap in (("ann", "1.5"), ("bob", "2"), ("cyd", "0.25"))
    ]
    client = Unprocessing(items, times=2)

    caps = BudgetTable(TABLE, client, backoff=backoff).caps(["ann", "bob", "cyd"])  # type: ignore[arg-type]

    assert caps == {"ann": Decimal("1.5"), "bob": Decimal("2"), "cyd": Decimal("0.25")}
    assert (len(client.requests), len(pauses.seconds)) == (3, 2)


def cancelled(*codes: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
            "CancellationReasons": [{"Code": code} for code in codes],
        },
        "TransactWriteItems",
    )


class Transactions:
    """A TransactWriteItems that raises each of `failures` in turn, then succeeds."""

    def __init__(self, *failures: ClientError) -> None:
        self.requests: list[dict[str, Any]] = []
        self._failures = list(failures)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        self.requests.append(params)
        if self._failures:
            raise self._failures.pop(0)
        return {}


def test_a_transaction_cancelled_by_a_conflict_is_sent_again_after_a_backoff(pauses: Pauses, backoff: Backoff) -> None:
    client = Transactions(cancelled("None", "TransactionConflict"), cancelled("ThrottlingError", "None"))

    transact(client, [{"Put": {}}, {"Put": {}}], backoff, token=True)  # type: ignore[arg-type]

    assert len(client.requests) == 3
    assert len(pauses.seconds) == 2
    # A cancelled try wrote nothing: each try carries its own token
    assert len({request["ClientRequestToken"] for request in client.requests}) == 3


def test_a_transaction_that_conflicts_on_every_try_raises_a_transient_cancellation(backoff: Backoff) -> None:
    client = Transactions(*[cancelled("TransactionConflict")] * 10)

    with pytest.raises(ClientError) as raised:
        transact(client, [{"Put": {}}], backoff)  # type: ignore[arg-type]

    assert len(client.requests) == backoff.tries
    assert is_transient(raised.value)


def test_a_refused_condition_is_an_answer_raised_at_once(pauses: Pauses, backoff: Backoff) -> None:
    client = Transactions(cancelled("ConditionalCheckFailed", "TransactionConflict"))

    with pytest.raises(ClientError) as raised:
        transact(client, [{"Put": {}}, {"Put": {}}], backoff)  # type: ignore[arg-type]

    assert (len(client.requests), pauses.seconds) == (1, [])
    assert not is_transient(raised.value)


@pytest.mark.parametrize(
    ("codes", "transient"),
    [
        (("None", "TransactionConflict"), True),
        (("TransactionConflict",), True),
        (("ProvisionedThroughputExceeded", "None"), True),
        (("ThrottlingError",), True),
        (("ConditionalCheckFailed",), False),
        (("ConditionalCheckFailed", "TransactionConflict"), False),
        (("ValidationError", "None"), False),
        (("ItemCollectionSizeLimitExceeded",), False),
    ],
)
def test_a_cancellation_is_transient_when_its_reasons_pass_by_themselves(
    codes: tuple[str, ...], transient: bool
) -> None:
    assert is_transient(cancelled(*codes)) is transient
