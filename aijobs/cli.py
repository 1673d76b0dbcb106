"""The `aijobs` command. Every command takes --json; errors are one line on stderr and exit 1."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.live import Live

from aijobs.client import AiJobsClient
from aijobs.render import (
    batches_table,
    budget_json,
    budgets_table,
    dead_letters_table,
    inspection_group,
    job_table,
    jobs_table,
    json_line,
    redrive_json,
    redrive_line,
    usage_json,
    usage_table,
)
from engine.config import REQUIRED_SETTINGS, load_settings
from engine.core import JobStatus, Lane
from engine.core.errors import AiJobsError, ConfigurationError, MissingSettingsError
from engine.store.batches import ENDED_RETENTION_DAYS
from engine.views import JobView
from engine.worker import FUNCTION_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from aijobs.ui.server import DashboardServer

app = typer.Typer(help="Run AI jobs reliably on SQS, Lambda and DynamoDB.", no_args_is_help=True, add_completion=False)
# Piped output is not cut to 80 columns: tables stay readable in logs and CI.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
StackOption = Annotated[
    str | None,
    typer.Option(
        "--stack",
        envvar="AIJOBS_STACK",
        help="A stack deployed with `sam deploy`: its outputs name the table, queue and bucket.",
    ),
]
F = TypeVar("F", bound=Callable[..., Any])
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
# The dashboard's port unless asked (aijobs.ui.server.DEFAULT_PORT; the `ui` extra may be missing).
DASHBOARD_PORT = 8765


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


def parse_duration(value: str) -> int:
    """`30m`, `12h`, `7d`, `2w` as seconds."""
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"--since {value!r} is not a duration like 30m, 12h, 7d or 2w")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def print_json(data: Any) -> None:
    # Plain print: rich would wrap long lines, and scripts parse this.
    print(json_line(data))


def print_view(view: JobView, as_json: bool) -> None:
    if as_json:
        print_json(view.model_dump(mode="json"))
    else:
        out.print(job_table(view))


def client(stack: str | None) -> AiJobsClient:
    """The client of the deployed stack named, or of the environment's JOBS_* variables without one."""
    if stack:
        return AiJobsClient.from_stack(stack)
    try:
        settings = load_settings()
    except MissingSettingsError as exc:
        if set(exc.variables) == set(REQUIRED_SETTINGS):  # nothing names a stack
            *first, last = REQUIRED_SETTINGS
            raise ConfigurationError(
                f"no stack configured: pass --stack NAME (or set AIJOBS_STACK), or set {', '.join(first)} and {last}"
            ) from exc
        raise
    return AiJobsClient.from_settings(settings)


@app.command()
@one_line_errors
def submit(
    job_type: Annotated[str, typer.Option("--type", help="The job type, e.g. classify.")],
    user: Annotated[str, typer.Option("--user", help="The user the job runs for.")],
    job_input: Annotated[str, typer.Option("--input", help="The input as JSON, or @FILE.")],
    job_id: Annotated[str | None, typer.Option("--job-id", help="Your id for the job (idempotent).")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", help="1-10.")] = None,
    deadline_seconds: Annotated[int | None, typer.Option("--deadline-seconds", help="60-604800.")] = None,
    lane: Annotated[
        Lane, typer.Option("--lane", help="interactive (someone waits for it) or background (cheap, by its deadline).")
    ] = Lane.INTERACTIVE,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends; exit 1 unless it succeeded.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits at most.")] = 300.0,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Create a job and enqueue it; prints the job id."""
    jobs = client(stack)
    result = jobs.submit(
        job_type,
        user,
        read_input(job_input),
        job_id=job_id,
        max_attempts=max_attempts,
        deadline_seconds=deadline_seconds,
        lane=lane,
    )
    if wait:
        view = jobs.wait(result.job_id, timeout_seconds=timeout)
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
def status(
    job_id: Annotated[str, typer.Argument(help="The job id.")], as_json: JsonFlag = False, stack: StackOption = None
) -> None:
    """Show one job."""
    print_view(client(stack).get(job_id), as_json)


@app.command()
@one_line_errors
def watch(
    job_ids: Annotated[list[str], typer.Argument(help="The job ids.")],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 1.0,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to watch at most.")] = 3600.0,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Live progress until every job is terminal; exit 1 unless all succeeded.

    With --json, one line per job each time its status changes.
    """
    jobs = client(stack)
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}

    def poll() -> list[JobView]:
        views = [jobs.get(job_id) for job_id in job_ids]
        if as_json:
            for view in views:
                if seen.get(view.job_id) != view.status.value:
                    seen[view.job_id] = view.status.value
                    print_json(view.model_dump(mode="json"))
        return views

    views = poll()
    with Live(jobs_table(views), console=out, auto_refresh=False, transient=False) if not as_json else _Quiet() as live:
        while not all(view.status.is_terminal for view in views):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"jobs still running after {timeout:g}s")
            time.sleep(interval)
            views = poll()
            live.update(jobs_table(views), refresh=True)
    if not all(view.status is JobStatus.SUCCEEDED for view in views):
        raise typer.Exit(1)


class _Quiet:
    """Stands in for rich's Live when the output is JSON lines."""

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, *_: object, **__: object) -> None:
        return None


@app.command()
@one_line_errors
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job id.")], as_json: JsonFlag = False, stack: StackOption = None
) -> None:
    """Cancel a job: a queued one ends at once, a running one at its next fence."""
    view = client(stack).cancel(job_id)
    if as_json:
        print_json(view.model_dump(mode="json"))
    elif view.status is JobStatus.CANCELLED:
        out.print(f"job {view.job_id} cancelled", markup=False, highlight=False)
    elif view.status.is_terminal:
        out.print(f"job {view.job_id} had already ended {view.status.value}", markup=False, highlight=False)
    else:
        out.print(f"job {view.job_id} is running; it ends cancelled at its next fence", markup=False, highlight=False)


@app.command()
@one_line_errors
def retry(
    job_id: Annotated[str, typer.Argument(help="The job id.")], as_json: JsonFlag = False, stack: StackOption = None
) -> None:
    """Put a failed job back in the queue with a fresh attempt budget."""
    view = client(stack).retry(job_id)
    if as_json:
        print_json(view.model_dump(mode="json"))
    else:
        out.print(f"job {view.job_id} queued again", markup=False, highlight=False)


@app.command(name="inspect")
@one_line_errors
def inspect_job(
    job_id: Annotated[str, typer.Argument(help="The job id.")], as_json: JsonFlag = False, stack: StackOption = None
) -> None:
    """What happened to a job and what it cost: its view, every attempt, its dead letters, its lease."""
    inspection = client(stack).inspect(job_id)
    if as_json:
        print_json(inspection.model_dump(mode="json"))
    else:
        out.print(inspection_group(inspection))


@app.command(name="list")
@one_line_errors
def list_jobs(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's jobs.")] = None,
    job_status: Annotated[JobStatus | None, typer.Option("--status", help="Only jobs in this status.")] = None,
    lane: Annotated[Lane | None, typer.Option("--lane", help="Only jobs of this lane.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 50,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Jobs, newest first (everyone's of the last 30 days, or one user's)."""
    views = client(stack).list_jobs(user_id=user, status=job_status, limit=limit, lane=lane)
    if as_json:
        print_json([view.model_dump(mode="json") for view in views])
    else:
        out.print(jobs_table(views))


@app.command()
@one_line_errors
def usage(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's usage.")] = None,
    since: Annotated[str, typer.Option("--since", help="How far back: 30m, 12h, 7d, 2w.")] = "7d",
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Tokens and cost by user, job type, model and lane."""
    rows = client(stack).usage(parse_duration(since), user_id=user)
    if as_json:
        print_json([usage_json(row) for row in rows])
    else:
        out.print(usage_table(rows, title=f"usage over the last {since}"))


@app.command()
@one_line_errors
def batches(
    show_all: Annotated[
        bool, typer.Option("--all", help=f"Also the batches that ended (kept {ENDED_RETENTION_DAYS} days after).")
    ] = False,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Background jobs' batches at the provider, oldest first: in flight, or with --all those ended too."""
    views = client(stack).batches(in_flight_only=not show_all)
    if as_json:
        print_json([view.model_dump(mode="json") for view in views])
    else:
        title = "batches in flight and ended" if show_all else "batches in flight"
        out.print(batches_table(views, int(time.time() * 1000), title=title))


budget_app = typer.Typer(help="Daily spending caps per user (UTC days).", no_args_is_help=True)
app.add_typer(budget_app, name="budget")


def parse_usd(value: str) -> Decimal:
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise ValueError(f"--daily-usd {value!r} is not an amount in US dollars") from exc
    return amount


@budget_app.command("set")
@one_line_errors
def budget_set(
    user: Annotated[str, typer.Option("--user", help="The user.")],
    daily_usd: Annotated[str, typer.Option("--daily-usd", help="Their daily cap in US dollars, e.g. 5 or 2.50.")],
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Give a user a daily cap of their own; it applies from now on, today included."""
    day = client(stack).set_budget(user, parse_usd(daily_usd))
    if as_json:
        print_json(budget_json(day))
    else:
        out.print(budgets_table([day]))


@budget_app.command("show")
@one_line_errors
def budget_show(
    user: Annotated[str | None, typer.Option("--user", help="Only this user.")] = None,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Today's budgets: cap, spent, reserved by attempts in flight, left (users with a cap)."""
    jobs = client(stack)
    if user is not None:
        day = jobs.budget(user)
        if day is None:
            raise ValueError(f"user {user} has no daily budget (none of their own, and no default)")
        days = [day]
    else:
        days = jobs.budgets()
    if as_json:
        print_json(budget_json(days[0]) if user is not None else [budget_json(day) for day in days])
    else:
        out.print(budgets_table(days))


dead_letters_app = typer.Typer(help="Messages the engine gave up on: list them, redrive the jobs they name.")
app.add_typer(dead_letters_app, name="dead-letters")

SinceOption = Annotated[str, typer.Option("--since", help="How far back: 30m, 12h, 7d, 2w.")]
LimitOption = Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")]


@dead_letters_app.callback(invoke_without_command=True)
@one_line_errors
def dead_letters_default(
    ctx: typer.Context,
    since: SinceOption = "7d",
    limit: LimitOption = 50,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Without a command: list, as `aijobs dead-letters list`."""
    if ctx.invoked_subcommand is None:
        dead_letters_list(since, limit, as_json, stack)


@dead_letters_app.command("list")
@one_line_errors
def dead_letters_list(
    since: SinceOption = "7d", limit: LimitOption = 50, as_json: JsonFlag = False, stack: StackOption = None
) -> None:
    """Dead letters, newest first: message id, when recorded, the job it names, receives, reason."""
    letters = client(stack).dead_letters(parse_duration(since), limit)
    if as_json:
        print_json([letter.model_dump(mode="json") for letter in letters])
    else:
        out.print(dead_letters_table(letters, title=f"dead letters of the last {since}"))


@dead_letters_app.command("redrive")
@one_line_errors
def dead_letters_redrive(
    message_ids: Annotated[list[str] | None, typer.Argument(help="Message ids of dead letters.")] = None,
    redrive_all: Annotated[bool, typer.Option("--all", help="Every dead letter of --since.")] = False,
    since: SinceOption = "7d",
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Retry the job each dead letter names, as `aijobs retry` does; a body that names no job is never re-sent.

    A job that is not failed is skipped. Exit 1 when a dead letter could not be redriven (it names
    no job, or its job is missing or cannot run again), with one line each on stderr.
    """
    if redrive_all == bool(message_ids):
        raise ValueError("give the message ids of dead letters, or --all")
    jobs = client(stack)
    results = jobs.redrive_all(parse_duration(since)) if redrive_all else jobs.redrive(message_ids or [])
    if as_json:
        print_json([redrive_json(result) for result in results])
    elif not results:
        out.print(f"no dead letters in the last {since}", markup=False, highlight=False)
    for result in results:
        if not result.redriven:
            err.print(f"error: {redrive_line(result)}", markup=False, highlight=False, soft_wrap=True)
        elif not as_json:
            out.print(redrive_line(result), markup=False, highlight=False, soft_wrap=True)
    if not all(result.redriven for result in results):
        raise typer.Exit(1)


@app.command()
@one_line_errors
def events(
    queue_url: Annotated[
        str,
        typer.Option(
            "--queue-url",
            envvar="JOBS_EVENTS_QUEUE_URL",
            help="The queue a rule on the bus copies completion events to (`aijobs dev` prints it).",
        ),
    ],
    follow: Annotated[bool, typer.Option("--follow", help="Keep reading until Ctrl-C.")] = False,
    webhook: Annotated[
        str | None, typer.Option("--webhook", help="POST each event to this URL (JSON body) instead of printing it.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Completion events (Job Succeeded / Failed / Cancelled): print them, or POST them to a webhook."""
    import boto3
    import httpx

    from aijobs.events import MAX_WAIT_SECONDS, EventsTap, event_line

    tap = EventsTap(boto3.client("sqs"), queue_url)
    refused = 0
    try:
        while True:
            batch = tap.receive(MAX_WAIT_SECONDS if follow else 1)
            if not batch and not follow:
                break
            for event, receipt_handle in batch:
                if webhook:
                    answer = httpx.post(webhook, json=event, timeout=10.0)
                    if not answer.is_success:
                        refused += 1
                        status = answer.status_code
                        err.print(f"error: {webhook} answered {status}; the event stays queued", markup=False)
                        continue
                elif as_json:
                    print(json.dumps(event, separators=(",", ":")), flush=True)
                else:
                    out.print(event_line(event), highlight=False)
                tap.done(receipt_handle)
    except KeyboardInterrupt:
        pass
    if refused:
        raise typer.Exit(1)


@app.command()
@one_line_errors
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=64, help="Concurrent pollers.")] = 2,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, max=10, help="Records per batch.")] = 10,
    window: Annotated[float, typer.Option("--window", min=0, max=300, help="Batching window, seconds.")] = 1.0,
    wait_seconds: Annotated[
        int, typer.Option("--wait-seconds", min=0, max=20, help="Long-poll wait; Ctrl-C waits one out.")
    ] = 20,
    function_timeout: Annotated[
        int, typer.Option("--function-timeout", min=1, max=900, help="The handler's time, as Lambda's Timeout.")
    ] = FUNCTION_TIMEOUT_SECONDS,
) -> None:
    """A local event source mapping: long-polls the jobs queue and runs the worker handler on batches."""
    from aijobs.local.poller import EventSourceMapping
    from handlers.worker import lambda_handler

    settings = load_settings()
    mapping = EventSourceMapping(
        settings.jobs_queue_url,
        lambda_handler,
        batch_size=batch_size,
        batching_window_seconds=window,
        wait_seconds=wait_seconds,
        function_timeout_seconds=function_timeout,
        concurrency=concurrency,
    )
    err.print(f"polling {settings.jobs_queue_url} with {concurrency} pollers; Ctrl-C stops", highlight=False)
    with mapping:
        _wait_for_interrupt()
    stats = mapping.stats
    err.print(f"stopped after {stats.batches} batches, {stats.records} records", highlight=False)


@app.command()
@one_line_errors
def dev(
    port: Annotated[int, typer.Option("--port", help="Port of the local AWS endpoint (0: any free one).")] = 5000,
    provider_port: Annotated[
        int, typer.Option("--provider-port", help="Port of the local provider (0: any free one).")
    ] = 8700,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=64, help="Pollers of the interactive queue.")
    ] = 2,
    background_concurrency: Annotated[
        int, typer.Option("--background-concurrency", min=1, max=64, help="Pollers of the background queue.")
    ] = 2,
    fault_rate: Annotated[float, typer.Option("--fault-rate", min=0, max=1, help="Share of provider faults.")] = 0.0,
    ai_base_url: Annotated[
        str | None,
        typer.Option("--ai-base-url", envvar="AI_BASE_URL", help="A provider to use instead of the local one."),
    ] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=1, help="The local provider's own requests/minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=1, help="The local provider's own tokens/minute.")] = None,
    reasoning_tokens: Annotated[
        int, typer.Option("--reasoning-tokens", min=0, max=100_000, help="Reasoning tokens the local provider bills.")
    ] = 0,
    batch_delay: Annotated[
        float | None,
        typer.Option("--batch-delay", min=0, max=86_400, help="Seconds the local provider takes to answer a batch."),
    ] = None,
    provider_limits: Annotated[
        str,
        typer.Option(
            "--provider-limits",
            envvar="AIJOBS_PROVIDER_LIMITS",
            help='Shared limits the workers keep, JSON: {"gpt-4o-mini": {"rpm": 500}}.',
        ),
    ] = "",
    default_budget: Annotated[
        str,
        typer.Option(
            "--default-daily-budget-usd",
            envvar="AIJOBS_DEFAULT_DAILY_BUDGET_USD",
            help="Daily cap (USD) of users without their own; 'unlimited': own caps only.",
        ),
    ] = "",
    with_ui: Annotated[bool, typer.Option("--ui", help="Serve the web dashboard too, in process.")] = False,
    ui_port: Annotated[
        int, typer.Option("--ui-port", min=0, max=65535, help="The dashboard's port (0: any free one).")
    ] = DASHBOARD_PORT,
    ui_allow_actions: Annotated[
        bool, typer.Option("--ui-allow-actions", help="Let the dashboard cancel, retry and redrive.")
    ] = False,
) -> None:
    """The embedded stack: local AWS endpoint, local provider (unless AI_BASE_URL is set) and the worker.

    The functions get every AI_* and AIJOBS_* variable of this environment, as the template would
    set them; the options above win over the variables they name."""
    import os
    import shlex

    with local_extra("dev"):
        from aijobs.local.devstack import DevStack, DevStackOptions, function_variables

    flags = {
        "AI_BASE_URL": ai_base_url,
        "AIJOBS_PROVIDER_LIMITS": provider_limits,
        "AIJOBS_DEFAULT_DAILY_BUDGET_USD": default_budget,
    }
    options = DevStackOptions(
        aws_port=port,
        provider_port=provider_port,
        function_environment=function_variables(os.environ) | {name: value for name, value in flags.items() if value},
        concurrency=concurrency,
        background_concurrency=background_concurrency,
        fault_rate=fault_rate,
        provider_rpm=rpm,
        provider_tpm=tpm,
        provider_reasoning_tokens=reasoning_tokens,
    )
    if batch_delay is not None:
        options = replace(options, provider_batch_delay_seconds=batch_delay)
    with DevStack(options) as stack, ExitStack() as serving:
        for name, value in sorted(stack.environment.items()):
            print(f"export {name}={shlex.quote(value)}")
        if with_ui:
            jobs = AiJobsClient.from_settings(stack.settings, stack.session)
            board = dashboard_server()(jobs, port=ui_port, allow_actions=ui_allow_actions)
            serving.enter_context(board)
            print(f"ui {board.url}")
        else:
            err.print("the dashboard: `aijobs ui` in a shell with these exports, or `aijobs dev --ui`", highlight=False)
        print("ready", flush=True)
        _wait_for_interrupt()


@app.command()
@one_line_errors
def ui(
    host: Annotated[
        str, typer.Option("--host", help="The address to listen on; 127.0.0.1 keeps it to this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="The port (0: any free one).")] = DASHBOARD_PORT,
    allow_actions: Annotated[
        bool,
        typer.Option("--allow-actions", help="Add cancel, retry and redrive (POSTs from the dashboard's own pages)."),
    ] = False,
    stack: StackOption = None,
) -> None:
    """The web dashboard: jobs, attempts, cost and dead letters. Prints its address; serves until Ctrl-C."""
    server = dashboard_server()
    jobs = client(stack)
    target = jobs.target.name if jobs.target else "the stack"
    mode = "cancel, retry and redrive on" if allow_actions else "read-only"
    with server(jobs, host=host, port=port, allow_actions=allow_actions) as board:
        print(board.url, flush=True)
        err.print(f"the dashboard of {target} ({mode}); Ctrl-C stops", highlight=False, markup=False)
        if host not in {"127.0.0.1", "localhost", "::1"}:
            err.print(
                f"warning: listening on {host}: whoever reaches it reads every job", highlight=False, markup=False
            )
        _wait_for_interrupt()


def dashboard_server() -> type[DashboardServer]:
    """The dashboard's server class, or one line saying how to install what it needs."""
    try:
        from aijobs.ui.server import DashboardServer
    except ImportError as exc:
        missing = (exc.name or "its extra").split(".")[0]
        err.print(f"error: the dashboard needs {missing}: pip install 'aijobs[ui]'", highlight=False, markup=False)
        raise typer.Exit(1) from exc
    return DashboardServer


@app.command()
@one_line_errors
def demo() -> None:
    """The embedded stack plus sample jobs of every type (some made to fail), live until all end."""
    with local_extra("demo"):
        from aijobs.demo import run_demo

    succeeded = run_demo(out)
    out.print("To look at jobs like these in a browser: `aijobs dev --ui`, then open the address it prints.")
    if not succeeded:
        err.print("error: some jobs did not end as they were meant to", highlight=False)
        raise typer.Exit(1)


@contextmanager
def local_extra(command: str) -> Iterator[None]:
    """Around the imports of the embedded stack: without `aijobs[local]` (moto, PyYAML), one line
    saying what to install instead of a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"aijobs {command} runs the embedded stack, which needs {exc.name} (not installed): "
            "pip install 'aijobs[local]'"
        ) from exc


def _wait_for_interrupt() -> None:
    """Block until Ctrl-C or SIGTERM."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


def main() -> None:
    app()
