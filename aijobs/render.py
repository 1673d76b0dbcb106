"""How the `aijobs` command shows jobs and usage to people (rich) and to scripts (JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from rich.table import Table

from engine.core import JobStatus
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
        ("tokens", f"{view.usage.input_tokens} in / {view.usage.output_tokens} out ({view.usage.attempts} attempts)"),
        ("cost", f"${view.usage.cost_usd:.6f}"),
    ]
    if view.error:
        rows.append(("error", f"[red]{view.error.code.value}[/]: {view.error.message}"))
    if view.output is not None:
        rows.append(("output", json.dumps(view.output, ensure_ascii=False)))
    for name, value in rows:
        table.add_row(name, value, end_section=False)
    return table


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


def usage_table(rows: Sequence[UsageRow], title: str) -> Table:
    table = Table(title=title)
    for column in ("user", "job type", "model", "attempts", "input tokens", "output tokens", "cost"):
        table.add_column(
            column, justify="right" if column in {"attempts", "input tokens", "output tokens", "cost"} else "left"
        )
    for row in rows:
        table.add_row(
            row.user_id or "-",
            row.job_type or "-",
            row.model or "-",
            str(row.attempts),
            str(row.input_tokens),
            str(row.output_tokens),
            f"${row.cost_usd:.6f}",
        )
    total_cost = sum((row.cost_usd for row in rows), Decimal(0))
    table.add_section()
    table.add_row(
        "total",
        "",
        "",
        str(sum(row.attempts for row in rows)),
        str(sum(row.input_tokens for row in rows)),
        str(sum(row.output_tokens for row in rows)),
        f"${total_cost:.6f}",
    )
    return table


def usage_json(row: UsageRow) -> dict[str, Any]:
    return {
        "user_id": row.user_id,
        "job_type": row.job_type,
        "model": row.model,
        "attempts": row.attempts,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "cost_usd": float(row.cost_usd),
    }
