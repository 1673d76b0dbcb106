"""What a page's address asks for: filters, time windows and cursors, parsed from the query string.

Everything a page shows is chosen in its URL, so that a view can be bookmarked, shared and
reloaded. Bad values are refused with one line (ValueError), never guessed at; an empty value (what
a form sends for "any") means unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from pydantic import TypeAdapter, ValidationError

from engine.core import JobStatus, Lane
from engine.messages import JobId, JobTypeName, UserId
from engine.store.listing import MAX_PAGE_SIZE, JobFilter
from engine.views import BatchView, iso_timestamp

# Time windows a page looks back over, by the names its URL uses.
WINDOWS = {"1h": 3_600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400, "90d": 90 * 86_400}
# The jobs page looks back a day unless asked: every UTC day it reads is a round of queries.
DEFAULT_WINDOW = "24h"
# Lanes a job may be in (docs/lanes.md).
LANES = tuple(lane.value for lane in Lane)
# Providers' batch ids are short (OpenAI's batch_..., Anthropic's msgbatch_..., a Bedrock job's ARN).
MAX_BATCH_ID_CHARS = 256

_JOB_ID: TypeAdapter[str] = TypeAdapter(JobId)
_USER_ID: TypeAdapter[str] = TypeAdapter(UserId)
_JOB_TYPE: TypeAdapter[str] = TypeAdapter(JobTypeName)


def window(params: Mapping[str, str], default: str, allowed: tuple[str, ...] = tuple(WINDOWS)) -> str:
    """The `since` window the query string names (its default when absent)."""
    value = params.get("since") or default
    if value not in allowed:
        raise ValueError(f"since: {value!r} is not one of {', '.join(allowed)}")
    return value


def include_ended(params: Mapping[str, str]) -> bool:
    """`all=1`: the batches page lists the ended batches too."""
    value = params.get("all") or ""
    if value not in {"", "1"}:
        raise ValueError(f"all: {value[:20]!r} is not 1 (or empty)")
    return value == "1"


@dataclass(frozen=True, slots=True)
class BatchesQuery:
    """The batches page's query string: in flight only or all; or the batches of one window (`window`, a
    job waiting in a batch links there), or the one of a provider's batch id (`batch_id`, a job its batch
    answered links there), in flight or ended."""

    include_ended: bool = False
    window: str | None = None
    batch_id: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> BatchesQuery:
        window = params.get("window") or None
        if window is not None and not (len(window) == 13 and window.isdigit()):
            raise ValueError(
                f"window: {window[:40]!r} is not a batch window (its start in epoch milliseconds, 13 digits)"
            )
        batch_id = params.get("batch_id") or None
        if batch_id is not None and not (len(batch_id) <= MAX_BATCH_ID_CHARS and batch_id.isprintable()):
            raise ValueError(f"batch_id: {batch_id[:40]!r} is not a provider's batch id")
        if window is not None and batch_id is not None:
            raise ValueError("window and batch_id: ask for one or the other")
        return cls(include_ended(params), window, batch_id)

    @property
    def window_at(self) -> str | None:
        """When the window asked for opened, as the views write times."""
        return None if self.window is None else iso_timestamp(int(self.window))

    @property
    def selects(self) -> bool:
        """Whether it asks for some batches, in flight or ended, rather than a list."""
        return self.window is not None or self.batch_id is not None

    def shows(self, batch: BatchView) -> bool:
        if self.window is not None:
            return batch.key.startswith(f"{self.window}.")
        if self.batch_id is not None:
            return batch.batch_id == self.batch_id
        return self.include_ended or batch.in_flight


def user(params: Mapping[str, str]) -> str | None:
    return _checked(params, "user", _USER_ID, "a user id")


def job_id(value: str) -> str:
    """A job id as the engine accepts one; ValueError for anything else."""
    try:
        return _JOB_ID.validate_python(value.strip())
    except ValidationError as exc:
        raise ValueError(f"{value.strip()[:200]!r} is not a job id (1-128 characters of A-Z a-z 0-9 . _ : -)") from exc


@dataclass(frozen=True, slots=True)
class JobsQuery:
    """The jobs page's query string."""

    where: JobFilter = field(default_factory=JobFilter)
    since: str = DEFAULT_WINDOW
    until: datetime | None = None
    limit: int = MAX_PAGE_SIZE
    cursor: str | None = None
    job_id: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobsQuery:
        status = params.get("status") or None
        if status is not None and status not in set(JobStatus):
            raise ValueError(f"status: {status!r} is not one of {', '.join(JobStatus)}")
        lane = params.get("lane") or None
        if lane is not None and lane not in LANES:
            raise ValueError(f"lane: {lane!r} is not one of {', '.join(LANES)}")
        limit = params.get("limit") or str(MAX_PAGE_SIZE)
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_PAGE_SIZE:
            raise ValueError(f"limit: {limit[:20]!r} is not a number from 1 to {MAX_PAGE_SIZE}")
        wanted_id = params.get("job_id", "").strip()
        return cls(
            where=JobFilter(
                user_id=user(params),
                status=JobStatus(status) if status else None,
                job_type=_checked(params, "type", _JOB_TYPE, "a job type name"),
                lane=Lane(lane) if lane else None,
            ),
            since=window(params, DEFAULT_WINDOW),
            until=_instant(params.get("until") or None),
            limit=int(limit),
            cursor=params.get("cursor") or None,
            job_id=job_id(wanted_id) if wanted_id else None,
        )

    @property
    def since_seconds(self) -> int:
        return WINDOWS[self.since]

    @property
    def until_ms(self) -> int | None:
        return None if self.until is None else int(self.until.timestamp() * 1000)

    @property
    def window_text(self) -> str:
        """The time window in words: "the last 24h", or "the 1h before 2026-12-02 10:00 UTC"."""
        if self.until is None:
            return f"the last {self.since}"
        return f"the {self.since} before {self.until.strftime('%Y-%m-%d %H:%M')} UTC"

    def params(self) -> dict[str, str]:
        """The query string's values that differ from the defaults, as the URL carries them."""
        values: dict[str, Any] = {
            "status": self.where.status.value if self.where.status else None,
            "user": self.where.user_id,
            "type": self.where.job_type,
            "lane": self.where.lane.value if self.where.lane else None,
            "since": None if self.since == DEFAULT_WINDOW else self.since,
            "until": self.until.strftime("%Y-%m-%dT%H:%M") if self.until else None,
            "limit": None if self.limit == MAX_PAGE_SIZE else str(self.limit),
            "cursor": self.cursor,
        }
        return {name: value for name, value in values.items() if value is not None}

    def url(self, path: str = "/jobs", **changes: Any) -> str:
        """The jobs page (or the overview, `path`) with this query, changed as asked (e.g. `cursor=...`
        for the next page)."""
        query = urlencode(replace(self, **changes).params())
        return path + (f"?{query}" if query else "")

    def showing(self, status: JobStatus | None) -> JobsQuery:
        """The same window and filters, of one status (or any), from the top."""
        return replace(self, where=replace(self.where, status=status), cursor=None)


def _checked(params: Mapping[str, str], name: str, adapter: TypeAdapter[str], what: str) -> str | None:
    value = (params.get(name) or "").strip()
    if not value:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise ValueError(f"{name}: {value[:200]!r} is not {what}") from exc


def _instant(value: str | None) -> datetime | None:
    """`until`: a UTC date and time as an HTML datetime-local field sends it (2026-12-02T10:00)."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"until: {value[:40]!r} is not a date and time like 2026-12-02T10:00 (UTC)") from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
