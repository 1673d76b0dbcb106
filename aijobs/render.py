"""How the `aijobs` command shows jobs and usage to people (rich) and to scripts (JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from rich.table import Table

from engine.core import JobStatus
from engine.fleet.budgets import BudgetDay
from engine.models import JobView
from engine.store import UsageRow

STATUS_STYLES = {
    JobStatus.QUEUED: "cyan",
    JobStatus.RUNNING: "yellow",
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.CANCELLED: "magenta",
}


def json_line(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)


def status_text(status: JobStatus) -> str:
    return f"[{STATUS_STYLES.get(status, '')}]{status.value}[/]"


def job_table(view: JobView) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("job", view.job_id),
        ("type", view.job_type or "-"),
        ("user", view.user_id or "-"),
        ("status", status_text(view.status) + (" (cancel requested)" if view.cancel_requested else "")),
        ("attempts", f"{view.attempt_count} of {view.max_attempts}"),
        ("created", view.created_at or "-"),
        ("started", view.started_at or "-"),
        ("finished", view.finished_at or "-"),
        ("tokens", tokens_text(view) + f" ({view.usage.attempts} attempts)"),
        ("cost", f"${view.usage.cost_usd:.6f}"),
    ]
    if view.error:
        rows.append(("error", f"[red]{view.error.code.value}[/]: {view.error.message}"))
    if view.output is not None:
        rows.append(("output", json.dumps(view.output, ensure_ascii=False)))
    for name, value in rows:
        table.add_row(name, value, end_section=False)
    return table


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


def jobs_table(views: Sequence[JobView], title: str | None = None) -> Table:
    table = Table(title=title)
    for column in ("job", "type", "user", "status", "attempts", "tokens", "cost", "created", "error"):
        table.add_column(column, no_wrap=column in {"job", "status"})
    for view in views:
        table.add_row(
            view.job_id,
            view.job_type or "-",
            view.user_id or "-",
            status_text(view.status),
            f"{view.attempt_count}/{view.max_attempts}",
            f"{view.usage.input_tokens + view.usage.output_tokens}",
            f"${view.usage.cost_usd:.6f}",
            view.created_at or "-",
            view.error.code.value if view.error else "",
        )
    return table


# The columns of `aijobs usage`: (title, UsageRow attribute); the numbers are summed in a total row.
USAGE_COLUMNS = (
    ("attempts", "attempts"),
    ("input tokens", "input_tokens"),
    ("cached", "cached_input_tokens"),
    ("cache write", "cache_write_input_tokens"),
    ("output tokens", "output_tokens"),
    ("reasoning", "reasoning_tokens"),
    ("cost", "cost_usd"),
    ("cache saved", "cache_savings_usd"),
)


def usage_table(rows: Sequence[UsageRow], title: str) -> Table:
    table = Table(title=title)
    for column in ("user", "job type", "model"):
        table.add_column(column)
    for column, _ in USAGE_COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row.user_id or "-", row.job_type or "-", row.model or "-", *_usage_cells(row))
    total = UsageRow(None, None, None)
    for row in rows:
        total = replace(total, **{name: getattr(total, name) + getattr(row, name) for _, name in USAGE_COLUMNS})
    table.add_section()
    table.add_row("total", "", "", *_usage_cells(total))
    return table


def _usage_cells(row: UsageRow) -> list[str]:
    values = (getattr(row, name) for _, name in USAGE_COLUMNS)
    return [f"${value:.6f}" if isinstance(value, Decimal) else str(value) for value in values]


def usage_json(row: UsageRow) -> dict[str, Any]:
    return {
        "user_id": row.user_id,
        "job_type": row.job_type,
        "model": row.model,
        **{
            name: float(value) if isinstance(value := getattr(row, name), Decimal) else value
            for _, name in USAGE_COLUMNS
        },
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
        table.add_row(day.user_id, *(f"${amount:.6f}" for amount in amounts))
    return table
