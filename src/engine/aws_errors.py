"""Which failures of an AWS call are worth trying again as they are: throttling, outages, the network,
transactions cancelled by a conflict.

Anything else an unexpected exception can be (a bug, a request AWS refuses) fails the same way on
every try, so the runner and the dead-letter function bound how often they retry it.
"""

from __future__ import annotations

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

from engine.core.errors import UnreadKeysError

_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "TransactionConflictException",
        "InternalServerError",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
    }
)
# Why DynamoDB cancels a transaction that may go through when sent again: another request was writing
# one of its items, or a table was throttled. A cancelled transaction wrote nothing.
TRANSIENT_CANCELLATIONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
CONDITION_FAILED = "ConditionalCheckFailed"


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` (from an AWS SDK call or the store) may pass by itself: throttled, unavailable,
    disconnected, a transaction that met another write."""
    if isinstance(exc, ConnectionError | HTTPClientError | ReadTimeoutError | UnreadKeysError):
        return True
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        transient_code = error.get("Code") in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
        return transient_code or is_transient_cancellation(exc)
    return False


def cancellation_codes(exc: BaseException) -> list[str]:
    """Why DynamoDB cancelled a TransactWriteItems: one code per item, in order (`None` for an item
    not at fault); [] for any other error."""
    if not isinstance(exc, ClientError) or exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return []
    reasons: list[dict[str, object]] = exc.response.get("CancellationReasons") or []  # type: ignore[assignment]
    return [str(reason.get("Code", "None")) for reason in reasons]


def is_transient_cancellation(exc: BaseException) -> bool:
    """A transaction cancelled by a conflict or throttling, with no condition of its own refused."""
    codes = cancellation_codes(exc)
    return CONDITION_FAILED not in codes and not TRANSIENT_CANCELLATIONS.isdisjoint(codes)
