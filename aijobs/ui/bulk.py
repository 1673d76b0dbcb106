"""Retrying the failed jobs a jobs page shows, all at once (with --allow-actions): each one through the
client's own retry, as `aijobs retry` does, at most BULK_LIMIT a request.

The page that asks (a first POST, carrying the page's filters) lists the failed jobs the filters
show now; its form names those jobs, and only a second POST of that form retries them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from aijobs.client import AiJobsClient
from aijobs.ui.queries import job_id
from engine.core.errors import AiJobsError, JobNotFailedError, JobNotFoundError
from engine.store.listing import MAX_PAGE_SIZE

# A jobs page shows at most this many jobs, so one confirmation names at most this many.
BULK_LIMIT = MAX_PAGE_SIZE


class RetryOutcome(StrEnum):
    QUEUED = "queued"  # failed, and now queued again with a fresh attempt budget
    NOT_FAILED = "not_failed"  # it is not failed (any more): nothing done
    MISSING = "missing"  # no such job
    REFUSED = "refused"  # the engine refused it (e.g. a job with no stored input)


@dataclass(frozen=True, slots=True)
class RetryResult:
    job_id: str
    outcome: RetryOutcome
    detail: str


def retry_ids(values: Sequence[str]) -> list[str]:
    """The job ids a confirmation names, each once, in its order; ValueError past BULK_LIMIT or for an id
    that is not one."""
    ids = list(dict.fromkeys(job_id(value) for value in values))
    if not ids:
        raise ValueError("job_id: name at least one job to retry")
    if len(ids) > BULK_LIMIT:
        raise ValueError(f"job_id: at most {BULK_LIMIT} jobs are retried a request, not {len(ids)}")
    return ids


def retry_each(client: AiJobsClient, ids: Sequence[str]) -> list[RetryResult]:
    """`client.retry` of each job, one after the other; what each came to."""
    results = []
    for each in ids:
        try:
            client.retry(each)
        except JobNotFailedError as exc:
            results.append(RetryResult(each, RetryOutcome.NOT_FAILED, str(exc)))
        except JobNotFoundError as exc:
            results.append(RetryResult(each, RetryOutcome.MISSING, str(exc)))
        except AiJobsError as exc:
            results.append(RetryResult(each, RetryOutcome.REFUSED, str(exc)))
        else:
            results.append(RetryResult(each, RetryOutcome.QUEUED, "queued again"))
    return results
