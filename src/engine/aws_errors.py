"""Which failures of an AWS call are worth trying again as they are: throttling, outages, the network.

Anything else an unexpected exception can be (a bug, a request AWS refuses) fails the same way on
every try, so the runner and the dead-letter function bound how often they retry it.
"""

from __future__ import annotations

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

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


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` (from an AWS SDK call) may pass by itself: throttled, unavailable, disconnected."""
    if isinstance(exc, ConnectionError | HTTPClientError | ReadTimeoutError):
        return True
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return error.get("Code") in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
    return False
