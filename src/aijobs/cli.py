"""The `aijobs` command. Every command takes --json; errors are one line on stderr and exit 1."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from aijobs.client import AiJobsClient
from engine.errors import AiJobsError
from engine.models import JobStatus, JobView

app = typer.Typer(help="Run AI jobs reliably on SQS, Lambda and DynamoDB.", no_args_is_help=True, add_completion=False)
out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
F = TypeVar("F", bound=Callable[..., Any])

STATUS_STYLES = {
    JobStatus.QUEUED: "cyan",
    JobStatus.RUNNING: "yellow",
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.CANCELLED: "magenta",
}


def one_line_errors(command: F) -> F:
    """Turn the engine's errors (and bad arguments) into one line on stderr and exit status 1."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (AiJobsError, TimeoutError, ValueError, OSError) as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from exc

    return wrapper  # type: ignore[return-value]


def read_input(value: str) -> dict[str, Any]:
    """--input is JSON text, or @FILE holding it."""
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--input is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"--input must be a JSON object, not {type(parsed).__name__}")
    return parsed


def print_json(data: Any) -> None:
    # Plain print: rich would wrap long lines, and scripts parse this.
    print(json.dumps(data, ensure_ascii=False))


def job_table(view: JobView) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    status_style = STATUS_STYLES.get(view.status, "")
    rows: list[tuple[str, str]] = [
        ("job", view.job_id),
        ("type", view.job_type or "-"),
        ("user", view.user_id or "-"),
        ("status", f"[{status_style}]{view.status.value}[/]"),
        ("attempts", f"{view.attempt_count} of {view.max_attempts}"),
        ("created", view.created_at or "-"),
        ("started", view.started_at or "-"),
        ("finished", view.finished_at or "-"),
        ("tokens", f"{view.usage.input_tokens} in / {view.usage.output_tokens} out ({view.usage.attempts} calls)"),
        ("cost", f"${view.usage.cost_usd:.6f}"),
    ]
    if view.error:
        rows.append(("error", f"[red]{view.error.code.value}[/]: {view.error.message}"))
    if view.output is not None:
        rows.append(("output", json.dumps(view.output, ensure_ascii=False)))
    for name, value in rows:
        table.add_row(name, value)
    return table


@app.command()
@one_line_errors
def submit(
    job_type: Annotated[str, typer.Option("--type", help="The job type, e.g. classify.")],
    user: Annotated[str, typer.Option("--user", help="The user the job runs for.")],
    job_input: Annotated[str, typer.Option("--input", help="The input as JSON, or @FILE.")],
    job_id: Annotated[str | None, typer.Option("--job-id", help="Your id for the job (idempotent).")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", help="1-10.")] = None,
    deadline_seconds: Annotated[int | None, typer.Option("--deadline-seconds", help="60-604800.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends and print it.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits at most.")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Create a job and enqueue it; prints the job id."""
    client = AiJobsClient.from_settings()
    result = client.submit(
        job_type,
        user,
        read_input(job_input),
        job_id=job_id,
        max_attempts=max_attempts,
        deadline_seconds=deadline_seconds,
    )
    if wait:
        view = client.wait(result.job_id, timeout_seconds=timeout)
        print_view(view, as_json)
        if view.status is not JobStatus.SUCCEEDED:
            raise typer.Exit(1)
        return
    if as_json:
        print_json({"job_id": result.job_id, "created": result.created, "status": result.status.value})
    else:
        out.print(result.job_id, markup=False, highlight=False)


@app.command()
@one_line_errors
def status(job_id: Annotated[str, typer.Argument(help="The job id.")], as_json: JsonFlag = False) -> None:
    """Show one job."""
    print_view(AiJobsClient.from_settings().get(job_id), as_json)


def print_view(view: JobView, as_json: bool) -> None:
    if as_json:
        print_json(view.model_dump(mode="json"))
    else:
        out.print(job_table(view))


def main() -> None:
    app()
