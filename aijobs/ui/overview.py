"""The overview page's figures: the jobs of a window counted by state and failed ones by error code, and
the same jobs over time as a chart of stacked bars (numbers for SVG attributes, drawn on the server).

The jobs are counted from their outlines (engine.store.listing.JobOutlines): the newest of the window,
up to the listing's bound; what was not read is said, never guessed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from aijobs.ui.present import CHART_HEIGHT, CHART_WIDTH, count
from engine.core import ErrorCode, JobStatus
from engine.store.listing import JobOutlines

MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
# A bar of the chart covers this much of each window (a window is split into 12 to 30 of them), and its
# label says the time it starts at in this format.
BUCKETS = {
    "1h": (5 * MINUTE_MS, "%H:%M"),
    "24h": (HOUR_MS, "%H:%M"),
    "7d": (6 * HOUR_MS, "%m-%d %H:%M"),
    "30d": (DAY_MS, "%m-%d"),
    "90d": (3 * DAY_MS, "%m-%d"),
}
# The states a bar stacks, bottom up (each a colour of app.css).
STACKED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.RUNNING, JobStatus.QUEUED)
# Room under the bars for the time labels, and above them for the scale.
_LABELS, _SCALE = 20, 18
_LABELLED_BARS = 8


@dataclass(frozen=True, slots=True)
class Segment:
    """A rectangle of the chart: jobs of one state in one bar (`status` the state's name), or a bar not
    counted (`uncounted`); `status` is its class in app.css."""

    x: float
    y: float
    width: float
    height: float
    status: str
    title: str


@dataclass(frozen=True, slots=True)
class Tick:
    """A time under the bars: under the middle of its bar, or for the first and the last bar (at the
    chart's edges) from its left edge and to its right edge."""

    x: float
    label: str
    anchor: str


@dataclass(frozen=True, slots=True)
class Overview:
    counted: int
    # Entries of the window read, back to `oldest_ms`; `complete` when they are all the window holds.
    read: int
    oldest_ms: int | None
    complete: bool
    # Every state, in JobStatus order, with its jobs (0 included); failed jobs by error code, most first.
    by_status: list[tuple[JobStatus, int]]
    by_error: list[tuple[ErrorCode, int]]
    segments: list[Segment]
    ticks: list[Tick]
    # Jobs in the fullest bar, and how much of the window a bar covers ("5 min").
    highest: int
    bar_span: str


def overview(outlines: JobOutlines, since_ms: int, until_ms: int, window: str) -> Overview:
    span_ms, label_format = BUCKETS[window]
    start = since_ms - since_ms % span_ms
    bars = max(1, -(-(until_ms - start) // span_ms))
    stacks = [Counter[JobStatus]() for _ in range(bars)]
    for job in outlines.jobs:
        stacks[min(max((job.created_at - start) // span_ms, 0), bars - 1)][job.status] += 1
    statuses = Counter(job.status for job in outlines.jobs)
    errors = Counter(job.error_code for job in outlines.jobs if job.status is JobStatus.FAILED and job.error_code)
    highest = max((sum(stack.values()) for stack in stacks), default=0)
    slot = CHART_WIDTH / bars
    room = CHART_HEIGHT - _LABELS - _SCALE
    # Bars wholly older than the oldest job read were not counted (the window holds more than was read).
    counted_from = start if outlines.complete or outlines.oldest_ms is None else outlines.oldest_ms
    segments: list[Segment] = []
    ticks: list[Tick] = []
    for number, stack in enumerate(stacks):
        begins = start + number * span_ms
        x, width = round(number * slot + slot * 0.1, 2), round(slot * 0.8, 2)
        when = _utc(begins, "%Y-%m-%d %H:%M")
        if begins + span_ms <= counted_from:
            segments.append(Segment(x, _SCALE, width, room, "uncounted", f"{when} UTC: not counted"))
        bottom = float(CHART_HEIGHT - _LABELS)
        for status in STACKED:
            if stack[status]:
                height = round(stack[status] / highest * room, 2)
                bottom -= height
                title = f"{when} UTC: {count(stack[status])} {status.value}"
                segments.append(Segment(x, round(bottom, 2), width, height, status.value, title))
        if number % max(1, bars // _LABELLED_BARS) == 0:
            label = _utc(begins, label_format)
            if number == 0:
                ticks.append(Tick(x, label, "start"))
            elif number == bars - 1:
                ticks.append(Tick(round(x + width, 2), label, "end"))
            else:
                ticks.append(Tick(round(x + width / 2, 2), label, "middle"))
    return Overview(
        counted=len(outlines.jobs),
        read=outlines.read,
        oldest_ms=outlines.oldest_ms,
        complete=outlines.complete,
        by_status=[(status, statuses[status]) for status in JobStatus],
        by_error=sorted(errors.items(), key=lambda pair: (-pair[1], pair[0].value)),
        segments=segments,
        ticks=ticks,
        highest=highest,
        bar_span=_span(span_ms),
    )


def _utc(epoch_ms: int, text_format: str) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime(text_format)


def _span(span_ms: int) -> str:
    if span_ms < HOUR_MS:
        return f"{span_ms // MINUTE_MS} min"
    if span_ms < DAY_MS:
        return f"{span_ms // HOUR_MS} h"
    return f"{span_ms // DAY_MS} d"
