"""Job listings, newest first, a page at a time: the JobsByDay index, then the page's jobs with BatchGetItem.

A day's entries are spread over LIST_DAY_SHARDS keys (docs/scale.md), so a page queries every
shard of its day side by side, each with the page's size as its limit, merges them by creation
time and takes the newest. Its cursor keeps, for each shard, the last entry taken: the next page
starts exactly there, with no state kept anywhere but in the cursor. A page that empties its day
goes on to the day before, until it is full or the time range is read.

The index projects `user_id` (it never changes), so a user filter drops entries before their jobs
are read; status, job type and lane are read on the jobs themselves, which the page fetches
anyway. Either way a page goes through `size` entries of the index: a filter narrows what it
shows, not what it reads.

An outline reads a range the same way, up to MAX_OUTLINED jobs, and of each job only what counting
it by state and error needs (the dashboard's overview, docs/ui.md).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from engine.core import ErrorCode, Job, JobStatus, Lane
from engine.core.days import DAY_MS, bounded_utc_days
from engine.store.expressions import index_query
from engine.store.items import JOB_SK, LIST_DAY_SHARDS, from_item, job_key, list_day_partition
from engine.store.retries import BATCH_GET_KEYS, Backoff, batch_get, batch_get_jobs
from engine.store.table import default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BY_DAY_INDEX = "JobsByDay"
# A page's jobs are read with one BatchGetItem, which takes at most 100 keys.
MAX_PAGE_SIZE = BATCH_GET_KEYS
# The most jobs an outline reads (docs/ui.md, Overview): 20 BatchGetItems, read 8 at a time.
MAX_OUTLINED = 2_000
# A listing reads one round of queries a day; a longer range is refused (as a usage range is).
MAX_LISTING_DAYS = 400
# As engine.messages.JobId allows.
MAX_JOB_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing shows; None matches any."""

    user_id: str | None = None
    status: JobStatus | None = None
    job_type: str | None = None
    lane: Lane | None = None

    @property
    def narrows(self) -> bool:
        return self != JobFilter()

    def matches(self, job: Job | JobOutline) -> bool:
        return (
            (self.user_id is None or job.user_id == self.user_id)
            and (self.status is None or job.status is self.status)
            and (self.job_type is None or job.job_type == self.job_type)
            and (self.lane is None or job.lane is self.lane)
        )


@dataclass(frozen=True, slots=True)
class ListingCursor:
    """Where a listing's next page starts: a UTC day, and in each of its shards the last entry taken
    (creation time, job id); a shard absent from `after` starts at the top of the range."""

    day: str
    after: dict[int, tuple[int, str]]

    def token(self) -> str:
        """The cursor as an opaque URL-safe string."""
        data = {"d": self.day, "a": {str(shard): list(entry) for shard, entry in sorted(self.after.items())}}
        return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")

    @classmethod
    def from_token(cls, token: str) -> ListingCursor:
        """The cursor `token` stands for; ValueError for anything `token()` did not make."""
        try:
            data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            day, after = data["d"], data["a"]
            cursor = cls(day, {int(shard): (int(created), str(job_id)) for shard, (created, job_id) in after.items()})
        except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError("not a listing cursor") from exc
        shards_known = set(cursor.after) <= set(range(LIST_DAY_SHARDS))
        ids_bounded = all(len(job_id) <= MAX_JOB_ID_CHARS for _, job_id in cursor.after.values())
        if not isinstance(day, str) or not shards_known or not ids_bounded:
            raise ValueError("not a listing cursor")
        return cursor


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of a listing: its jobs that match the filter, newest first, and where the next page starts."""

    jobs: list[Job]
    # Index entries the page went through, and the creation times of the first and last of them.
    read: int
    newest_ms: int | None
    oldest_ms: int | None
    next: ListingCursor | None


@dataclass(frozen=True, slots=True)
class JobOutline:
    """What counting jobs by state and error needs of one: who, what, when it was created and ended, how
    it stands; the error's code only (a queued job's is what it waits for, a failed job's why it failed)."""

    job_id: str
    user_id: str | None
    job_type: str | None
    lane: Lane
    status: JobStatus
    created_at: int
    finished_at: int | None
    error_code: ErrorCode | None


@dataclass(frozen=True, slots=True)
class JobOutlines:
    """The newest jobs of a range in outline, newest first: of the `read` entries of the range's index
    (the newest, back to `oldest_ms`), those that match; `complete` when they were all the range holds."""

    jobs: list[JobOutline]
    read: int
    oldest_ms: int | None
    complete: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    created_at: int
    job_id: str
    user_id: str | None
    shard: int


class JobListing:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None, backoff: Backoff | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._backoff = backoff or Backoff()

    def page(
        self,
        where: JobFilter,
        since_ms: int,
        until_ms: int,
        size: int = MAX_PAGE_SIZE,
        cursor: ListingCursor | None = None,
    ) -> JobPage:
        """The next `size` jobs created in [since, until], newest first, from `cursor` on (the top without one).

        Per day read: one Query per shard, side by side; then one BatchGetItem of the page's jobs.
        """
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise ValueError(f"a page holds 1 to {MAX_PAGE_SIZE} jobs, not {size}")
        days = _days_newest_first(since_ms, until_ms)
        after: dict[int, tuple[int, str]] = {}
        if cursor is not None:
            if cursor.day not in days:
                raise ValueError("the cursor is outside the listing's time range")
            days, after = days[days.index(cursor.day) :], cursor.after
        with _shard_readers() as pool:
            entries, following = self._gather(pool, days, since_ms, until_ms, after, size)
        wanted = [job_key(entry.job_id) for entry in entries if where.user_id in (None, entry.user_id)]
        jobs = batch_get_jobs(self._client, self.table_name, wanted, False, self._backoff) if wanted else []
        return JobPage(
            jobs=[job for job in jobs if job is not None and where.matches(job)],
            read=len(entries),
            newest_ms=entries[0].created_at if entries else None,
            oldest_ms=entries[-1].created_at if entries else None,
            next=following,
        )

    def outlines(self, where: JobFilter, since_ms: int, until_ms: int, limit: int = MAX_OUTLINED) -> JobOutlines:
        """The newest `limit` jobs created in [since, until] that match `where`, in outline (what counting
        them needs), newest first, and whether that is all of the range's.

        As a page reads (one Query per shard of each day, side by side), then one BatchGetItem per 100
        jobs, 8 at a time, of the outline's attributes only.
        """
        if not 1 <= limit <= MAX_OUTLINED:
            raise ValueError(f"an outline holds 1 to {MAX_OUTLINED} jobs, not {limit}")
        days = _days_newest_first(since_ms, until_ms)
        with _shard_readers() as pool:
            entries, following = self._gather(pool, days, since_ms, until_ms, {}, limit)
            wanted = [job_key(entry.job_id) for entry in entries if where.user_id in (None, entry.user_id)]
            chunks = [wanted[start : start + BATCH_GET_KEYS] for start in range(0, len(wanted), BATCH_GET_KEYS)]
            read = pool.map(
                lambda keys: batch_get(self._client, self.table_name, keys, False, self._backoff, _OUTLINE), chunks
            )
            items = [item for chunk in read for item in chunk]
        jobs = sorted((_outline(item) for item in items), key=lambda job: (job.created_at, job.job_id), reverse=True)
        return JobOutlines(
            jobs=[job for job in jobs if where.matches(job)],
            read=len(entries),
            oldest_ms=entries[-1].created_at if entries else None,
            complete=following is None,
        )

    def list_jobs(
        self,
        *,
        user_id: str | None = None,
        status: JobStatus | None = None,
        lane: Lane | None = None,
        limit: int = 50,
        days: int = 30,
        now_ms: int,
    ) -> list[Job]:
        """Up to `limit` jobs created in the last `days` UTC days, newest first; one user's, or everyone's;
        of one status, or one lane."""
        where = JobFilter(user_id=user_id, status=status, lane=lane)
        since_ms = now_ms - now_ms % DAY_MS - (days - 1) * DAY_MS
        jobs: list[Job] = []
        cursor: ListingCursor | None = None
        while len(jobs) < limit:
            # Unfiltered, read just what is missing; filtered, full pages until enough match.
            size = MAX_PAGE_SIZE if where.narrows else min(MAX_PAGE_SIZE, limit - len(jobs))
            page = self.page(where, since_ms, now_ms, size, cursor)
            jobs.extend(page.jobs)
            if page.next is None:
                break
            cursor = page.next
        return jobs[:limit]

    def _gather(
        self,
        pool: ThreadPoolExecutor,
        days: list[str],
        since_ms: int,
        until_ms: int,
        after: dict[int, tuple[int, str]],
        size: int,
    ) -> tuple[list[_Entry], ListingCursor | None]:
        """The newest `size` entries of `days` (newest first) past `after` in the first of them, and where
        the entries after them start (None once the range is read)."""
        entries: list[_Entry] = []
        for number, day in enumerate(days):
            taken, positions, more = self._take(pool, day, since_ms, until_ms, after, size - len(entries))
            entries.extend(taken)
            after = {}
            if more:
                return entries, ListingCursor(day, positions)
            if len(entries) == size:
                return entries, ListingCursor(days[number + 1], {}) if number + 1 < len(days) else None
        return entries, None

    def _take(
        self,
        pool: ThreadPoolExecutor,
        day: str,
        since_ms: int,
        until_ms: int,
        after: dict[int, tuple[int, str]],
        wanted: int,
    ) -> tuple[list[_Entry], dict[int, tuple[int, str]], bool]:
        """The newest `wanted` entries of a day past `after`, the shards' positions after them, and
        whether the day holds more."""
        shards = list(
            pool.map(
                lambda shard: self._read_shard(day, shard, since_ms, until_ms, after.get(shard), wanted),
                range(LIST_DAY_SHARDS),
            )
        )
        merged = heapq.merge(*(read for read, _ in shards), key=lambda entry: entry.created_at, reverse=True)
        taken = list(islice(merged, wanted))
        positions = dict(after)
        used = dict.fromkeys(range(LIST_DAY_SHARDS), 0)
        for entry in taken:
            positions[entry.shard] = (entry.created_at, entry.job_id)
            used[entry.shard] += 1
        more = any(not ended or used[shard] < len(read) for shard, (read, ended) in enumerate(shards))
        return taken, positions, more

    def _read_shard(
        self, day: str, shard: int, since_ms: int, until_ms: int, start: tuple[int, str] | None, wanted: int
    ) -> tuple[list[_Entry], bool]:
        """Up to `wanted` entries of one shard of a day, newest first, after `start`; and whether it ended."""
        partition = list_day_partition(day, shard)
        params = index_query(
            self.table_name,
            BY_DAY_INDEX,
            "#day = :day AND #at BETWEEN :since AND :until",
            {"#day": "list_day", "#at": "created_at"},
            {":day": {"S": partition}, ":since": {"N": str(since_ms)}, ":until": {"N": str(until_ms)}},
            ScanIndexForward=False,
        )
        if start is not None:
            created_at, job_id = start
            params["ExclusiveStartKey"] = job_key(job_id, JOB_SK) | {
                "list_day": {"S": partition},
                "created_at": {"N": str(created_at)},
            }
        entries: list[_Entry] = []
        while True:
            page: dict[str, Any] = self._client.query(**params, Limit=wanted - len(entries))  # type: ignore[assignment]
            entries.extend(
                _Entry(int(item["created_at"]["N"]), item["pk"]["S"].removeprefix("JOB#"), _user(item), shard)
                for item in page.get("Items", [])
            )
            if "LastEvaluatedKey" not in page:
                return entries, True
            if len(entries) >= wanted:
                return entries, False
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _days_newest_first(since_ms: int, until_ms: int) -> list[str]:
    """The UTC days of a listing's range, newest first; ValueError for a range that ends before it starts
    or spans more than MAX_LISTING_DAYS."""
    if until_ms < since_ms:
        raise ValueError("the listing's range ends before it starts")
    return bounded_utc_days(since_ms, until_ms, MAX_LISTING_DAYS, "a listing")[::-1]


def _shard_readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=LIST_DAY_SHARDS, thread_name_prefix="aijobs-list")


# What an outline reads of each job.
_OUTLINE = ("job_id", "user_id", "job_type", "lane", "status", "created_at", "finished_at", "error")


def _outline(item: dict[str, Any]) -> JobOutline:
    data = from_item(item)
    error = data.get("error")
    return JobOutline(
        job_id=data["job_id"],
        user_id=data.get("user_id"),
        job_type=data.get("job_type"),
        # Jobs created before lanes were all interactive.
        lane=Lane(data.get("lane", Lane.INTERACTIVE)),
        status=JobStatus(data["status"]),
        created_at=int(data["created_at"]),
        finished_at=None if data.get("finished_at") is None else int(data["finished_at"]),
        error_code=ErrorCode(error["code"]) if error else None,
    )


def _user(item: dict[str, Any]) -> str | None:
    user = item.get("user_id")
    return str(user["S"]) if user else None
