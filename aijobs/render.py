"""How the `aijobs` command shows jobs, usage and dead letters to people (rich) and to scripts (JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from aijobs.amounts import usd
from aijobs.client import JobTypeListing, RedriveOutcome, RedriveResult
from engine.core import JobStatus, Via
from engine.core.job_types import Canary, JobTypeHead, LabelAction, StoredVersion, VersionStats
from engine.fleet.budgets import BudgetDay
from engine.store import UsageRow, by_route, summed
from engine.views import (
    AttachmentView,
    AttemptView,
    BatchView,
    DeadLetterView,
    JobInspection,
    JobView,
    LeaseView,
    iso_timestamp,
)

STATUS_STYLES = {
    JobStatus.QUEUED: "cyan",
    JobStatus.RUNNING: "yellow",
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.CANCELLED: "magenta",
    JobStatus.WAITING: "blue",
}


# json_line's separators as json.dumps has them by default, and compact ones (one event a line).
SPACED = (", ", ": ")
COMPACT = (",", ":")


def json_line(data: Any, separators: tuple[str, str] = SPACED) -> str:
    """JSON as the command prints it: as json.dumps writes it, but every number in plain notation
    (a cost of 1.74e-05 is written 0.0000174; a Decimal, which is written as a string, as "0.0000001")."""
    items, keys = separators
    if isinstance(data, dict):
        pairs = (f"{json_line(str(key))}{keys}{json_line(value, separators)}" for key, value in data.items())
        return "{" + items.join(pairs) + "}"
    if isinstance(data, list | tuple):
        return "[" + items.join(json_line(value, separators) for value in data) + "]"
    if isinstance(data, float) and math.isfinite(data) and "e" in repr(data):
        plain = format(Decimal(repr(data)), "f")
        return plain if "." in plain else f"{plain}.0"
    if isinstance(data, Decimal) and data.is_finite():
        return json.dumps(format(data, "f"))
    return json.dumps(data, ensure_ascii=False, default=str)


def status_text(status: JobStatus) -> str:
    return f"[{STATUS_STYLES.get(status, '')}]{status.value}[/]"


def job_table(view: JobView, attempts: Sequence[AttemptView] | None = None) -> Table:
    """One job: its view, and with its attempt records the calls they made to the provider.

    "attempts" are those counted against its budget (`attempt_count` of `max_attempts`); "calls" are
    every request to the provider, re-asks and rate-limited ones included (docs/messages.md)."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    status = Text.from_markup(status_text(view.status) + (" (cancel requested)" if view.cancel_requested else ""))
    rows: list[tuple[str, str | Text]] = [
        ("job", view.job_id),
        ("type", type_text(view)),
        ("user", view.user_id or "-"),
        ("status", status),
        ("lane", view.lane.value),
        *pipeline_rows(view),
        ("attempts", f"{view.attempt_count} of {view.max_attempts}"),
        *([("calls", str(sum(attempt.calls for attempt in attempts)))] if attempts is not None else []),
        ("via", via_text(view)),
        ("created", view.created_at or "-"),
        ("started", view.started_at or "-"),
        ("finished", view.finished_at or "-"),
        ("tokens", tokens_text(view)),
        ("cost", usd(view.usage.cost_usd)),
    ]
    if view.error:
        rows.append(("error", Text.assemble((view.error.code.value, "red"), f": {view.error.message}")))
    if view.output is not None:
        rows.append(("output", json.dumps(view.output, ensure_ascii=False)))
    for name, value in rows:
        # Text, not markup: messages, outputs and batch ids come from outside.
        table.add_row(name, value if isinstance(value, Text) else Text(value), end_section=False)
    return table


def type_text(view: JobView) -> str:
    """The job type, and for a data job type the version the job runs (`triage_ticket v2`), once known."""
    if view.job_type_version is None:
        return view.job_type or "-"
    return f"{view.job_type} v{view.job_type_version}"


def pipeline_rows(view: JobView) -> list[tuple[str, str | Text]]:
    """Where a pipeline stands, or which pipeline a child runs for (docs/pipelines.md): what `status`
    shows too, so that a waiting pipeline says what it waits for, and a review how to give it."""
    if view.parent_id is not None:
        return [("pipeline", f"a child of {view.parent_id}, for its step {view.step}")]
    pipeline = view.pipeline
    if pipeline is None:
        return []
    review = pipeline.review
    if review is not None and pipeline.children == 0:
        if review.decision is None:
            text = (
                f"{pipeline.step + 1}, a review: waiting for a person until {review.expires_at} "
                f"(aijobs review {view.job_id} --approve | --reject --reason TEXT)"
            )
        else:
            edited = ", output edited" if review.changed else ""
            reason = f": {review.reason}" if review.reason else ""
            text = (
                f"{pipeline.step + 1}, a review: {review.decision} by {review.by or '-'} at {review.at}{edited}{reason}"
            )
        return [("step", text)]
    failed = f", {pipeline.failed} failed" if pipeline.failed else ""
    return [("step", f"{pipeline.step + 1}: {pipeline.ended} of {pipeline.children} children ended{failed}")]


def attachments_table(attachments: Sequence[AttachmentView]) -> Table:
    """Each attachment a job names: its name, and what its latest attempt read of it (its type from its
    content, bytes, pages or pixel size), over its reference and its SHA-256."""
    table = Table(title="attachments", caption=None if attachments else "none")
    table.add_column("#", justify="right")
    table.add_column("name")
    table.add_column("type", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("pages / size", justify="right", no_wrap=True)
    table.add_column("reference / sha256", overflow="fold")
    for number, attachment in enumerate(attachments, 1):
        # Text, not markup: names and keys come from outside.
        table.add_row(
            str(number),
            Text(attachment.name),
            attachment.media_type.value if attachment.media_type else "not read yet",
            f"{attachment.bytes:,}" if attachment.bytes is not None else "-",
            attachment.extent or "-",
            Text(f"{attachment.s3}\n{attachment.sha256 or '-'}"),
            end_section=True,
        )
    return table


def via_text(view: JobView) -> str:
    """How the job runs or ran: "realtime", "batch batch_abc", "batch: waiting for its batch (...)",
    "reuse of job-1" (an answer already paid for), or "-"."""
    if view.via is None:
        return "-"
    if view.in_batch:
        return f"batch: waiting for its batch (window of {view.batch_window_at})"
    if view.reused_from is not None:
        return f"{view.via.value} of {view.reused_from}: its answer, no call made"
    return f"{view.via.value} {view.batch}" if view.batch else view.via.value


def tokens_text(view: JobView) -> str:
    """ "812 in (512 cached) / 40 out (16 reasoning)": the kinds shown only when there are some."""
    usage = view.usage
    cached = usage.cached_input_tokens + usage.cache_write_input_tokens
    parts_in = [f"{usage.cached_input_tokens} cached"] if usage.cached_input_tokens else []
    if usage.cache_write_input_tokens:
        parts_in.append(f"{usage.cache_write_input_tokens} cache write")
    text = f"{usage.input_tokens} in" + (f" ({', '.join(parts_in)})" if cached else "")
    text += f" / {usage.output_tokens} out"
    return text + (f" ({usage.reasoning_tokens} reasoning)" if usage.reasoning_tokens else "")


def inspection_group(inspection: JobInspection) -> Group:
    """`aijobs inspect`: the job, what it is doing now, its attempts and the dead letters that name it."""
    view = inspection.job
    parts: list[Table | Text] = [job_table(view, inspection.attempts)]
    if view.attachments:
        parts.append(attachments_table(view.attachments))
    if now := _now_text(view, inspection.lease):
        parts.append(Text(now))
    parts.append(attempts_table(inspection.attempts, view.attempt_count))
    parts += refused_answers(inspection.attempts)
    parts += pipeline_parts(view, inspection.children)
    if inspection.dead_letters:
        parts.append(dead_letters_table(inspection.dead_letters, title="dead letters naming this job"))
    return Group(*parts)


def refused_answers(attempts: Sequence[AttemptView]) -> list[Text]:
    """What the model answered on each attempt whose answer validation refused: plain Text, never
    markup (it is the model's, and may hold anything)."""
    shown: list[Text] = []
    for attempt in attempts:
        if attempt.refused_answer is None:
            continue
        code = attempt.error_code.value if attempt.error_code else "refused"
        heading = (
            f"attempt #{attempt.attempt}: the answer refused ({code}), prompt {attempt.prompt_key} "
            f"v{attempt.prompt_version}, sha256 {(attempt.prompt_sha256 or '-')[:12]}"
        )
        shown += [Text(heading, style="bold"), Text(attempt.refused_answer)]
        if attempt.refused_answer_s3 is not None:
            shown.append(Text(f"the whole answer: {attempt.refused_answer_s3}", style="dim"))
    return shown


def pipeline_parts(view: JobView, children: Sequence[JobView]) -> list[Table | Text]:
    """A pipeline's review and its children, step by step (docs/pipelines.md); where it stands is a row
    of its job table. The proposed output is plain Text: it is the model's words."""
    pipeline = view.pipeline
    if pipeline is None:
        return []
    shown: list[Table | Text] = []
    review = pipeline.review
    if review is not None and review.decision is None:
        shown += [Text("the output proposed for review:", style="bold")]
        shown.append(Text(json.dumps(review.output, indent=2, ensure_ascii=False)))
    if children:
        shown.append(children_table(children))
    return shown


def children_table(children: Sequence[JobView]) -> Table:
    """A pipeline's children in the order of its steps, each named by its step (their user and lane
    are the pipeline's)."""
    table = Table(title="children, step by step")
    for column in ("step", "job", "type", "status", "attempts", "tokens", "cost", "finished", "error"):
        table.add_column(column, no_wrap=column in {"job", "status", "attempts", "cost", "error"})
    for child in children:
        table.add_row(
            Text(child.step or "-"),
            Text(child.job_id),
            Text(child.job_type or "-"),
            status_text(child.status),
            f"{child.attempt_count}/{child.max_attempts}",
            f"{child.usage.input_tokens + child.usage.output_tokens}",
            usd(child.usage.cost_usd),
            child.finished_at or "-",
            child.error.code.value if child.error else "",
        )
    return table


def _now_text(view: JobView, lease: LeaseView | None) -> str | None:
    """What a job that has not ended is doing: held by a worker, or waiting (and for what)."""
    if lease is not None:
        if view.in_batch and not lease.expired:
            return (
                f"in a provider's batch (window of {view.batch_window_at}), held for it until "
                f"{lease.expires_at}: `aijobs batches` lists the batches in flight"
            )
        if lease.expired:
            return f"lease of {lease.owner} expired at {lease.expires_at}: its next delivery takes the job over"
        return f"running: lease held by {lease.owner} until {lease.expires_at}"
    if view.status is not JobStatus.QUEUED:
        return None
    if view.error is None:
        return "queued: waiting for a worker"
    if view.error.message.startswith("waiting:"):
        return f"queued, {view.error.message} ({view.error.code.value})"
    return f"queued: retrying after {view.error.code.value}: {view.error.message}"


def attempts_table(attempts: Sequence[AttemptView], counted: int) -> Table:
    """Each attempt record a row: one each time a worker took the job to the provider. `counted`: the
    attempts counted against the budget, which leave out the rate-limited ones (and those before an
    `aijobs retry`); the caption says so when they differ, and names the batches (their ids are long)."""
    notes = [f"#{attempt.attempt} ran in batch {attempt.batch_id}" for attempt in attempts if attempt.batch_id]
    notes += [
        f"#{attempt.attempt} took the answer job {attempt.reused_from} paid for"
        for attempt in attempts
        if attempt.reused_from
    ]
    if attempts and len(attempts) != counted:
        why = (
            "rate-limited calls, and attempts before a retry, are not counted"
            if len(attempts) > counted
            else "an attempt that made no call is not recorded"
        )
        records = f"{len(attempts)} record" if len(attempts) == 1 else f"{len(attempts)} records"
        notes.insert(0, f"{records}, {counted} counted as attempts: {why}")
    caption = "; ".join(notes) if notes else None
    table = Table(title="attempt records", caption=caption if attempts else "no attempt recorded")
    # Cache writes (Anthropic's, Claude's on Bedrock) cost more than input: a column of their own when some
    # attempt wrote the prompt cache, as in `aijobs usage`.
    written = any(attempt.cache_write_input_tokens for attempt in attempts)
    columns = ("input", "cached", *(("cache write",) if written else ()), "output", "reasoning")
    # A batch or the flex tier paid less than real time: what the same calls would have cost at the
    # standard tier, beside the cost, as `aijobs usage` shows it by route (docs/cost.md).
    discounted = any(attempt.standard_cost_usd != attempt.cost_usd for attempt in attempts)
    # The model wraps first when the terminal is narrow: times, codes and figures stay whole.
    for column in ("#", "started", "duration", "model", "via", "calls", *columns):
        left = column in {"started", "model", "via"}
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "model")
    table.add_column("cost", justify="right", no_wrap=True)
    if discounted:
        table.add_column("in real time", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("error", no_wrap=True)
    for attempt in attempts:
        model = attempt.model or "-"
        table.add_row(
            str(attempt.attempt),
            attempt.started_at or "-",
            f"{attempt.duration_ms} ms" if attempt.duration_ms < 1000 else f"{attempt.duration_ms / 1000:.1f} s",
            Text(f"{model} ({attempt.tier})" if attempt.tier else model),
            via_cell(attempt),
            str(attempt.calls),
            str(attempt.input_tokens),
            str(attempt.cached_input_tokens),
            *((str(attempt.cache_write_input_tokens),) if written else ()),
            str(attempt.output_tokens),
            str(attempt.reasoning_tokens),
            usd(attempt.cost_usd),
            *((usd(attempt.standard_cost_usd),) if discounted else ()),
            attempt.outcome.value,
            attempt.error_code.value if attempt.error_code else "",
        )
    return table


def via_cell(attempt: AttemptView) -> str:
    """How an attempt's first call was made; at the flex tier, with the tier the provider said served it
    ("flex (default)": asked at flex, served at the standard tier)."""
    if attempt.via is Via.FLEX and attempt.service_tier:
        return f"{attempt.via.value} ({attempt.service_tier})"
    return attempt.via.value


def dead_letters_table(letters: Sequence[DeadLetterView], title: str = "dead letters") -> Table:
    table = Table(title=title, caption=None if letters else "none")
    table.add_column("message", no_wrap=True)
    table.add_column("recorded")
    table.add_column("job")
    table.add_column("receives", justify="right")
    table.add_column("reason")
    for letter in letters:
        # Text, not markup: ids and reasons come from messages.
        table.add_row(
            Text(letter.message_id),
            letter.recorded_at or "-",
            Text(letter.job_id or "-"),
            str(letter.receive_count),
            Text(letter.reason),
        )
    return table


def batches_table(batches: Sequence[BatchView], now_ms: int, title: str) -> Table:
    """`aijobs batches`: each batch's key over its provider id, model, lines, phase over the provider's
    state, age, rescue time, and its lines answered / failed and its jobs finished / returned so far."""
    table = Table(title=title, caption=None if batches else "none")
    table.add_column("batch / provider id", overflow="fold")
    table.add_column("model")
    table.add_column("lines", justify="right")
    table.add_column("phase / provider")
    table.add_column("age", justify="right")
    table.add_column("rescue")
    table.add_column("answered/failed", justify="right")
    table.add_column("finished/returned", justify="right")
    for batch in batches:
        rescue = batch.rescue_in_ms(now_ms)
        table.add_row(
            # Text, not markup: ids and the provider's words come from outside.
            Text(f"{batch.key}\n{batch.batch_id or 'not created yet'}"),
            Text(batch.model),
            str(batch.lines),
            Text(f"{batch.phase.value}\n{batch.provider_status}"),
            span(batch.age_ms(now_ms)),
            "-" if rescue is None else f"in {span(rescue)}" if rescue > 0 else "passed",
            f"{batch.answered} / {batch.failed}",
            f"{batch.finished} / {batch.returned}",
            end_section=True,
        )
    return table


def span(ms: int) -> str:
    """A stretch of time, to the unit that matters: 250ms, 45s, 23m, 2h 5m, 3d 4h."""
    if 0 < ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 24:
        return f"{hours}h {minutes % 60}m"
    return f"{hours // 24}d {hours % 24}h"


def redrive_line(result: RedriveResult) -> str:
    """One line per dead letter of `aijobs dead-letters redrive`."""
    skipped = "skipped, " if result.outcome is RedriveOutcome.SKIPPED else ""
    return f"{result.message_id}: {skipped}{result.detail}"


def redrive_json(result: RedriveResult) -> dict[str, Any]:
    return {
        "message_id": result.message_id,
        "job_id": result.job_id,
        "outcome": result.outcome.value,
        "detail": result.detail,
    }


def jobs_table(views: Sequence[JobView], title: str | None = None) -> Table:
    table = Table(title=title)
    for column in ("job", "type", "user", "lane", "status", "attempts", "tokens", "cost", "created", "error"):
        # Ids, codes and figures stay whole: the names and times wrap first when the terminal is narrow.
        table.add_column(column, no_wrap=column in {"job", "status", "attempts", "cost", "error"})
    for view in views:
        table.add_row(
            view.job_id,
            view.job_type or "-",
            view.user_id or "-",
            view.lane.value,
            status_text(view.status),
            f"{view.attempt_count}/{view.max_attempts}",
            f"{view.usage.input_tokens + view.usage.output_tokens}",
            usd(view.usage.cost_usd),
            view.created_at or "-",
            view.error.code.value if view.error else "",
        )
    return table


# The columns of `aijobs usage`: (title, UsageRow attribute); the numbers are summed in a total row.
# "records": attempt records, one each time a worker took a job to the provider (rate-limited ones
# included, which do not count against a job's attempts).
USAGE_COLUMNS = (
    ("records", "attempts"),
    ("input", "input_tokens"),
    ("cached", "cached_input_tokens"),
    ("cache write", "cache_write_input_tokens"),
    ("output", "output_tokens"),
    ("reasoning", "reasoning_tokens"),
    ("cost", "cost_usd"),
    ("cache saved", "cache_savings_usd"),
    ("unpriced", "unpriced_attempts"),
    ("reused", "reused"),
)
UNPRICED_NOTE = (
    "unpriced: attempt records of a model with no price, whose cost is unknown and counted as 0 (AIJOBS_PRICES)"
)
REUSED_NOTE = "reused: jobs that took an answer already paid for, with no call (among the records, at no cost)"
# Columns shown only when some row has one, each with its note under the table.
USAGE_NOTES = {"unpriced_attempts": UNPRICED_NOTE, "reused": REUSED_NOTE}
ROUTES_NOTE = (
    "in real time: what the same calls would have cost in real time at the standard tier; saved: that, less "
    "their cost; prompt cache: what its reads and writes saved against uncached input (docs/cost.md)"
)


def usage_table(rows: Sequence[UsageRow], title: str) -> Table:
    """Rows by user, job type, model and lane (their routes together: `routes_table` splits them); then
    each lane's total (when there are two), and the total. The unpriced and reused columns show only
    when some attempt was unpriced, or reused an answer."""
    total = summed(rows)
    shown = [name for name in USAGE_NOTES if getattr(total, name)]
    columns = [(title, name) for title, name in USAGE_COLUMNS if name not in USAGE_NOTES or name in shown]
    table = Table(title=title, caption="; ".join(USAGE_NOTES[name] for name in shown) or None)
    for column in ("user", "job type", "model", "lane"):
        table.add_column(column)
    for column, _ in columns:
        table.add_column(column, justify="right")
    for row in _across_routes(rows):
        names = (row.user_id or "-", row.job_type or "-", row.model or "-", row.lane or "-")
        table.add_row(*names, *_usage_cells(row, columns))
    table.add_section()
    lanes = sorted({row.lane for row in rows if row.lane})
    if len(lanes) > 1:
        for lane in lanes:
            lane_total = summed(row for row in rows if row.lane == lane)
            table.add_row("total", "", "", lane, *_usage_cells(lane_total, columns))
    table.add_row("total", "", "", "", *_usage_cells(total, columns))
    return table


def _across_routes(rows: Sequence[UsageRow]) -> list[UsageRow]:
    """Rows of the same user, job type, model and lane summed over their routes, costliest first."""
    merged: dict[tuple[str | None, ...], UsageRow] = {}
    for row in rows:
        key = (row.user_id, row.job_type, row.model, row.lane)
        merged[key] = merged[key].merged(row) if key in merged else replace(row, via=None)
    return sorted(merged.values(), key=lambda row: -row.cost_usd)


def routes_table(rows: Sequence[UsageRow]) -> Table:
    """The same attempts by route (real time, batch, flex, reuse) and what the prompt cache saved: each
    route's cost beside what the same calls would have cost in real time at the standard tier, and the
    saving; then the total."""
    table = Table(title="cost by route", caption=ROUTES_NOTE)
    table.add_column("route")
    for column in ("records", "cost", "in real time", "saved"):
        table.add_column(column, justify="right")
    for route in by_route(rows):
        table.add_row(route.via or "-", str(route.attempts), *_amounts(route))
    total = summed(rows)
    cached = f"{total.cached_input_tokens} cached tokens"
    table.add_row("prompt cache", cached, "", "", usd(total.cache_savings_usd))
    table.add_section()
    saved = total.saved_usd + total.cache_savings_usd
    table.add_row("total", str(total.attempts), usd(total.cost_usd), usd(total.standard_cost_usd), usd(saved))
    return table


def _amounts(row: UsageRow) -> tuple[str, str, str]:
    return usd(row.cost_usd), usd(row.standard_cost_usd), usd(row.saved_usd)


def _usage_cells(row: UsageRow, columns: Sequence[tuple[str, str]]) -> list[str]:
    values = (getattr(row, name) for _, name in columns)
    return [usd(value) if isinstance(value, Decimal) else str(value) for value in values]


def usage_json(row: UsageRow) -> dict[str, Any]:
    """A row of `aijobs usage --json`: its sums, then its route, what the same calls would have cost in real
    time at the standard tier, and what the route saved (fields added later come last)."""
    return {
        "user_id": row.user_id,
        "job_type": row.job_type,
        "model": row.model,
        "lane": row.lane,
        **{
            name: float(value) if isinstance(value := getattr(row, name), Decimal) else value
            for _, name in USAGE_COLUMNS
        },
        "via": row.via,
        "standard_cost_usd": float(row.standard_cost_usd),
        "saved_usd": float(row.saved_usd),
    }


def budget_json(day: BudgetDay) -> dict[str, Any]:
    return {
        "user_id": day.user_id,
        "day": day.day,
        "cap_usd": float(day.cap_usd),
        "spent_usd": float(day.spent_usd),
        "reserved_usd": float(day.reserved_usd),
        "left_usd": float(day.left_usd),
    }


def budgets_table(days: Sequence[BudgetDay]) -> Table:
    table = Table(title=f"daily budgets, {days[0].day} (UTC)" if days else "daily budgets")
    table.add_column("user")
    for column in ("cap", "spent", "reserved", "left"):
        table.add_column(column, justify="right")
    for day in days:
        amounts = (day.cap_usd, day.spent_usd, day.reserved_usd, day.left_usd)
        table.add_row(day.user_id, *(usd(amount) for amount in amounts))
    return table


def canary_text(canary: Canary | None) -> str:
    """A canary in a word: `v3 to 10% (guarded: 200 jobs, 2 points)`, `-` without one."""
    if canary is None:
        return "-"
    guard = canary.guard
    guarded = f" (guarded: {guard.min_jobs} jobs, {guard.max_regression:g} points)" if guard else ""
    return f"v{canary.version} to {canary.percent}%{guarded}"


def job_types_table(listings: Sequence[JobTypeListing]) -> Table:
    """`aijobs types list`: every job type, code or data, with a data one's labels."""
    table = Table(title="job types", caption=None if listings else "none")
    for column in ("name", "kind", "production", "canary", "latest"):
        table.add_column(column, justify="right" if column == "latest" else "left")
    for listing in listings:
        production = "-" if listing.production is None else f"v{listing.production}"
        latest = "-" if listing.latest is None else f"v{listing.latest}"
        table.add_row(Text(listing.name), listing.kind, production, Text(canary_text(listing.canary)), latest)
    return table


def job_type_group(head: JobTypeHead, versions: Sequence[StoredVersion]) -> Group:
    """`aijobs types show NAME`: its labels, its versions, and how the labels moved (when and why)."""
    labels = Table(show_header=False, box=None, pad_edge=False)
    labels.add_column(style="bold")
    labels.add_column()
    canary = head.canary
    rows = [("job type", head.name), ("production", f"v{head.production}"), ("canary", canary_text(canary))]
    if canary is not None:
        rows.append(("canary so far", canary_counts(canary)))
    rows.append(("latest", f"v{head.latest}"))
    for label, value in rows:
        labels.add_row(label, Text(value))
    listed = Table(title="versions")
    for column in ("version", "sha256", "pushed at", "by"):
        listed.add_column(column)
    for stored in versions:
        marks = [
            mark
            for mark, on in (
                ("production", stored.version == head.production),
                ("canary", canary is not None and stored.version == canary.version),
            )
            if on
        ]
        version = f"v{stored.version}" + (f" ({', '.join(marks)})" if marks else "")
        pushed = iso_ms(stored.pushed_at)
        listed.add_row(version, stored.sha256[:12], pushed, Text(stored.pushed_by or "-"))
    history = Table(title="history", caption=None if head.history else "none")
    for column in ("at", "action", "version", "why", "by"):
        history.add_column(column, overflow="fold" if column == "why" else "ellipsis")
    for event in head.history:
        action = f"[red]{event.action.value}[/]" if event.action is LabelAction.GUARD_ROLLBACK else event.action.value
        history.add_row(
            iso_ms(event.at),
            Text.from_markup(action),
            f"v{event.version}",
            Text(event.reason or "-"),
            Text(event.by or "-"),
        )
    return Group(labels, listed, history)


def canary_counts(canary: Canary) -> str:
    """What a canary's jobs did beside production's since it started."""
    return (
        f"{canary.canary_invalid} of {canary.canary_jobs} jobs failed validation; production "
        f"{canary.production_invalid} of {canary.production_jobs}"
    )


def iso_ms(at_ms: int) -> str:
    return iso_timestamp(at_ms) or "-"


def job_type_stats_table(name: str, stats: Sequence[VersionStats]) -> Table:
    """`aijobs types stats NAME`: per version, its jobs and what they did, cost and durations."""
    table = Table(title=f"{name} by version", caption=None if stats else "no finished jobs yet")
    for column in ("version", "jobs", "succeeded", "validation failures", "re-asks", "cost/job", "p50", "p95"):
        table.add_column(column, justify="left" if column == "version" else "right")
    for row in stats:
        p50, p95 = row.percentile_ms(0.5), row.percentile_ms(0.95)
        table.add_row(
            f"v{row.version}",
            str(row.jobs),
            str(row.succeeded),
            str(row.validation_failures),
            str(row.reasks),
            usd(row.cost_per_job),
            "-" if p50 is None else f"≤{span(p50)}",
            "-" if p95 is None else f"≤{span(p95)}",
        )
    return table


def canary_json(canary: Canary | None) -> dict[str, Any] | None:
    if canary is None:
        return None
    guard = canary.guard
    return {
        "version": canary.version,
        "percent": canary.percent,
        "started_at": iso_ms(canary.started_at),
        "guard": None if guard is None else {"min_jobs": guard.min_jobs, "max_regression": guard.max_regression},
        "canary_jobs": canary.canary_jobs,
        "canary_invalid": canary.canary_invalid,
        "production_jobs": canary.production_jobs,
        "production_invalid": canary.production_invalid,
    }


def head_json(head: JobTypeHead) -> dict[str, Any]:
    """A data job type's labels and history, as `--json` prints them."""
    return {
        "name": head.name,
        "latest": head.latest,
        "production": head.production,
        "canary": canary_json(head.canary),
        "previous": list(head.previous),
        "history": [
            {"at": iso_ms(e.at), "action": e.action.value, "version": e.version, "reason": e.reason, "by": e.by}
            for e in head.history
        ],
    }


def version_json(stored: StoredVersion, with_document: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {
        "version": stored.version,
        "sha256": stored.sha256,
        "pushed_at": iso_ms(stored.pushed_at),
        "pushed_by": stored.pushed_by,
    }
    if with_document:
        row["document"] = stored.document
    return row


def listing_json(listing: JobTypeListing) -> dict[str, Any]:
    return {
        "name": listing.name,
        "kind": listing.kind,
        "latest": listing.latest,
        "production": listing.production,
        "canary": canary_json(listing.canary),
    }


def stats_json(row: VersionStats) -> dict[str, Any]:
    return {
        "version": row.version,
        "jobs": row.jobs,
        "succeeded": row.succeeded,
        "validation_failures": row.validation_failures,
        "reasks": row.reasks,
        "cost_usd": float(row.cost_usd),
        "cost_per_job_usd": float(row.cost_per_job),
        "p50_ms": row.percentile_ms(0.5),
        "p95_ms": row.percentile_ms(0.95),
    }
