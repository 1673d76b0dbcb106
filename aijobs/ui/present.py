"""How the pages write numbers, times, texts and charts: plain functions the templates call.

Nothing here makes markup: every value goes into a template as text or a number, and Jinja
escapes it (the chart is numbers for SVG attributes, its labels text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from aijobs.amounts import usd
from engine.store import UsageRow
from engine.views import BatchView, JobView, iso_timestamp

# Inputs and outputs longer than this are shown cut, with a link to the whole as a download.
CLIP_CHARS = 10_000
CHART_WIDTH, CHART_HEIGHT = 720, 180
# Room under the bars for the day labels, and above them for the scale.
_LABELS, _SCALE = 20, 18


def money(value: float | Decimal) -> str:
    """Dollars as the CLI writes them (aijobs.amounts.usd: never rounded to nothing, never in E
    notation); with thousands separated from a dollar up."""
    amount = Decimal(str(value))
    return f"${amount:,.2f}" if amount >= 1 else usd(amount)


def count(value: int) -> str:
    return f"{value:,}"


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def when(iso: str | None) -> str:
    """`2026-12-02T10:00:03Z` as `2026-12-02 10:00:03` (the pages say UTC once)."""
    return iso.replace("T", " ").removesuffix("Z") if iso else "-"


def took(view: JobView) -> str:
    """How long a job took from its creation to its end ("-" while it runs)."""
    return duration(view.took_ms)


def rescue(batch: BatchView, now_ms: int) -> str:
    """When a batch in flight is cancelled and its jobs taken back: "in 23 min 4 s", or "passed"."""
    left = batch.rescue_in_ms(now_ms)
    if left is None:
        return "-"
    return f"in {duration(left)}" if left > 0 else "passed"


def job_url(job_id: str, suffix: str = "") -> str:
    return f"/jobs/{quote(job_id, safe='')}{suffix}"


def batches_url(*, window: str | None = None, batch_id: str | None = None) -> str:
    """The batches page showing the batches of one window, or the one batch of a provider's id."""
    return "/batches?" + urlencode({"window": window} if window is not None else {"batch_id": batch_id or ""})


@dataclass(frozen=True, slots=True)
class BatchName:
    """A batch's key as a person reads it: when its window opened (UTC), its model, and a short id of its
    own (the first part it was made of); `key` stays whole for a title."""

    key: str
    window_at: str | None
    model: str
    short_id: str

    def __str__(self) -> str:
        if self.window_at is None:
            return self.key
        return f"window {self.window_at} UTC · {self.model} · #{self.short_id}"


def batch_name(batch: BatchView) -> BatchName:
    """The key `<window ms, 13 digits>.<model hash>.<first part: written ms>-<random hex>` (docs/batches.md)
    as its window's start, the batch's model and the first 6 digits of the random hex."""
    window, _, rest = batch.key.partition(".")
    _, _, first_part = rest.partition(".")
    _, _, random_hex = first_part.partition("-")
    if not (len(window) == 13 and window.isdigit() and random_hex):
        return BatchName(batch.key, None, batch.model, "")
    return BatchName(batch.key, when(iso_timestamp(int(window))), batch.model, random_hex[:6])


def job_type_url(name: str, version: int | None = None) -> str:
    """A data job type's page, showing one version's file when given."""
    return f"/types/{quote(name, safe='')}" + (f"?version={version}" if version is not None else "")


def dead_letter_url(message_id: str, part: str = "") -> str:
    """A dead letter's page, or a part of it (`body`, `redrive`)."""
    return f"/dead-letters/{quote(message_id, safe='')}" + (f"/{part}" if part else "")


@dataclass(frozen=True, slots=True)
class Clipped:
    """A text as a page shows it: at most CLIP_CHARS of it, and how long the whole is."""

    shown: str
    total_chars: int

    @property
    def cut(self) -> bool:
        return self.total_chars > len(self.shown)


def clip(text: str, limit: int = CLIP_CHARS) -> Clipped:
    return Clipped(text[:limit], len(text))


def pretty_json(value: Any) -> str:
    """A JSON value, or JSON text, indented for reading; text that is not JSON as it is."""
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return text
    return json.dumps(value, indent=2, ensure_ascii=False)


def totals_by(rows: Iterable[UsageRow], field: str) -> list[tuple[str, UsageRow]]:
    """Usage rows summed by one of user_id, job_type, model or lane; costliest first."""
    grouped: dict[str, UsageRow] = {}
    for row in rows:
        key = getattr(row, field) or "-"
        grouped[key] = grouped[key].merged(row) if key in grouped else row
    return sorted(grouped.items(), key=lambda pair: (-pair[1].cost_usd, pair[0]))


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    title: str


def day_chart(days: list[tuple[str, UsageRow]]) -> list[Bar]:
    """Cost by day as bars in a CHART_WIDTH x CHART_HEIGHT box, oldest first; a label every few days."""
    if not days:
        return []
    highest = max((row.cost_usd for _, row in days), default=Decimal(0)) or Decimal(1)
    slot = CHART_WIDTH / len(days)
    every = max(1, len(days) // 10)
    bars = []
    for number, (day, row) in enumerate(days):
        height = float(row.cost_usd / highest) * (CHART_HEIGHT - _LABELS - _SCALE)
        bars.append(
            Bar(
                x=round(number * slot + slot * 0.1, 2),
                y=round(CHART_HEIGHT - _LABELS - height, 2),
                width=round(slot * 0.8, 2),
                height=round(height, 2),
                label=day[5:] if number % every == 0 else "",
                title=f"{day}: {money(row.cost_usd)}, {row.attempts} attempts, "
                f"{row.input_tokens + row.output_tokens} tokens",
            )
        )
    return bars
