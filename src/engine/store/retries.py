"""What DynamoDB asks to be sent again, sent again: a bounded number of tries, with exponential backoff
and full jitter between them. One place for every module of the store.

- BatchGetItem answers with the keys it did not read (`UnprocessedKeys`: throttled, or past 16 MB
  of answer); `batch_get` (and `batch_get_jobs`, its jobs in order) sends those again and raises
  UnreadKeysError, naming the keys still unread, after the last try.
- A TransactWriteItems that met another write on one of its items (or throttling) is cancelled and
  writes nothing; `transact` sends it again and, after the last try, raises the cancellation, which
  engine.aws_errors.is_transient knows as transient (a refused condition is raised at once).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from engine.aws_errors import is_transient_cancellation
from engine.core import Job
from engine.core.errors import UnreadKeysError
from engine.store.items import Item, job_from_item

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# BatchGetItem reads at most this many keys a request.
BATCH_GET_KEYS = 100


@dataclass(frozen=True, slots=True)
class Backoff:
    """`tries` requests at most; before each one after the first, a pause drawn uniformly from
    [0, min(cap, base * 2^n)] for the n-th retry (full jitter: tries of many workers spread out)."""

    tries: int = 6
    base_seconds: float = 0.05
    cap_seconds: float = 1.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.SystemRandom)

    def pause(self, retry: int) -> None:
        self.sleep(self.rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2**retry)))


def batch_get(
    client: DynamoDBClient,
    table_name: str,
    keys: list[Item],
    consistent: bool,
    backoff: Backoff,
    attributes: Sequence[str] = (),
) -> list[Item]:
    """The items of up to 100 `keys` of one table (in no particular order; none for a key absent); only
    their `attributes` when some are named (DynamoDB bills the whole item still, but sends less)."""
    items: list[Item] = []
    request: Any = {table_name: {"Keys": keys, "ConsistentRead": consistent}}
    if attributes:
        names = {f"#a{number}": name for number, name in enumerate(attributes)}
        request[table_name] |= {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}
    for retry in range(backoff.tries):
        if retry:
            backoff.pause(retry - 1)
        response = client.batch_get_item(RequestItems=request)
        items += response.get("Responses", {}).get(table_name, [])
        request = response.get("UnprocessedKeys") or {}
        if not request.get(table_name, {}).get("Keys"):
            return items
    left = [key_text(key) for key in request[table_name]["Keys"]]
    raise UnreadKeysError(table_name, left, backoff.tries)


def batch_get_jobs(
    client: DynamoDBClient, table_name: str, keys: list[Item], consistent: bool, backoff: Backoff
) -> list[Job | None]:
    """The jobs of up to 100 `keys`, in their order (None where a job is gone)."""
    found = {item["pk"]["S"]: job_from_item(item) for item in batch_get(client, table_name, keys, consistent, backoff)}
    return [found.get(key["pk"]["S"]) for key in keys]


def transact(client: DynamoDBClient, items: list[dict[str, Any]], backoff: Backoff, token: bool = False) -> None:
    """One TransactWriteItems, sent again while it is cancelled by a conflict or throttling.

    With `token`, each try carries a fresh ClientRequestToken, so that an SDK retry of a try that
    landed (its answer lost) is a no-op; a cancelled try wrote nothing, so the next may write.
    """
    for retry in range(backoff.tries):
        if retry:
            backoff.pause(retry - 1)
        params: Any = {"TransactItems": items}
        if token:
            params["ClientRequestToken"] = uuid.uuid4().hex
        try:
            client.transact_write_items(**params)
            return
        except ClientError as exc:
            if not is_transient_cancellation(exc) or retry == backoff.tries - 1:
                raise


def key_text(key: Item) -> str:
    """A key as `pk/sk`."""
    return "/".join(str(next(iter(value.values()))) for value in key.values())
