"""The `aijobs` command. Every command takes --json; errors are one line on stderr and exit 1 (2 for
a flag missing, unknown or of the wrong type); a reader that stops reading (`| head`) ends it quietly."""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import typer
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from typer.core import TyperGroup

from aijobs.arguments import InvalidArgumentError
from aijobs.client import AiJobsClient, check_user_id
from aijobs.render import (
    COMPACT,
    attachments_table,
    batches_table,
    budget_json,
    budgets_table,
    dead_letters_table,
    head_json,
    inspection_group,
    job_table,
    job_type_group,
    job_type_stats_table,
    job_types_table,
    jobs_table,
    json_line,
    listing_json,
    redrive_json,
    redrive_line,
    routes_table,
    stats_json,
    usage_json,
    usage_table,
    version_json,
)
from engine.config import REQUIRED_SETTINGS, Settings, is_local_host, load_settings
from engine.core import ErrorCode, JobStatus, Lane
from engine.core.errors import (
    AiJobsError,
    ConfigurationError,
    JobTypeFileError,
    MissingSettingsError,
    UnknownJobTypeError,
)
from engine.core.job_types import DEFAULT_GUARD_MAX_REGRESSION, DEFAULT_GUARD_MIN_JOBS, Guard
from engine.store.batches import ENDED_RETENTION_DAYS
from engine.views import JobInspection, JobView
from handlers.worker import FUNCTION_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from aijobs.ui.server import DashboardServer

# The exit status of a command whose reader closed its output, as a shell reports one ended by SIGPIPE.
CLOSED_PIPE_STATUS = 141


class OneLineErrors(TyperGroup):
    """The command's group: a flag missing, unknown or of the wrong type is one line on stderr, as every
    other error (not a usage box); a reader that closes the output early (`aijobs list --json | head -1`)
    ends the command with status 141 and nothing more on stderr, whether a command's own write met the
    closed pipe (one_line_errors) or the last flush of what it printed did (here)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        unwrap_help(self)
        try:
            status = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
            sys.stdout.flush()
        except typer.TyperException as exc:
            # A usage error carries the context of its command, whose help it points to.
            ctx: typer.Context | None = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            err.print(f"error: {exc.format_message()}{hint}", markup=False, highlight=False, soft_wrap=True)
            status = exc.exit_code
        except typer.Abort:
            err.print("error: aborted", markup=False, highlight=False)
            status = 1
        except BrokenPipeError:
            status = closed_pipe()
        status = status if isinstance(status, int) else 0
        if not standalone_mode:
            return status
        sys.exit(status)


class Helped(Protocol):
    help: str | None


def unwrap_help(command: Helped) -> None:
    """Each paragraph of a command's help (its docstring) as one line that the terminal wraps, not the
    source's line breaks (which Typer's help keeps), for the command and those under it."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(paragraph.split("\n")) for paragraph in paragraphs)
    for child in getattr(command, "commands", {}).values():
        unwrap_help(child)


def closed_pipe() -> int:
    """Whatever is still buffered for a closed stdout goes nowhere, so that nothing is printed about it
    at exit ("Exception ignored ... BrokenPipeError"); the status to end with."""
    # Not a file descriptor (a test's captured output): nothing is flushed to it at exit.
    with suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return CLOSED_PIPE_STATUS


app = typer.Typer(cls=OneLineErrors, help="Run AI jobs reliably on SQS, Lambda and DynamoDB.", add_completion=False)


def help_without_a_command(ctx: typer.Context) -> None:
    """A group given no command answers with its help (rather than a usage error)."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


app.callback(invoke_without_command=True)(help_without_a_command)


class Output(Console):
    """rich's Console for stdout, whose closed pipe ends the command as any other write's does
    (one_line_errors), rather than by rich's own exit with status 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


# Piped output is not cut to 80 columns: tables stay readable in logs and CI.
out = Output(width=None if sys.stdout.isatty() else 160)
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
    """Turn the engine's errors, AWS's and bad arguments into one line on stderr and exit status 1."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError as exc:
            raise typer.Exit(closed_pipe()) from exc  # the reader stopped reading: nothing to say
        except (AiJobsError, TimeoutError, ValueError, OSError) as exc:
            fail(str(exc), exc)
        except (BotoCoreError, ClientError) as exc:
            fail(aws_problem(exc), exc)

    return wrapper  # type: ignore[return-value]


def fail(line: str, cause: BaseException) -> None:
    err.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1) from cause


def aws_problem(exc: BotoCoreError | ClientError) -> str:
    """An AWS error as one line; an endpoint on this machine that does not answer is the embedded stack
    stopped (or never started), and says so."""
    line = " ".join(str(exc).split())
    if isinstance(exc, EndpointConnectionError):
        host = urlsplit(exc.kwargs.get("endpoint_url", "")).hostname or ""
        if is_local_host(host):
            return f"{line}: is `aijobs dev` running? (start it, then use the exports it prints)"
    return line


def read_input(value: str, flag: str = "--input") -> dict[str, Any]:
    """--input (or `flag`) is JSON text, or @FILE holding it."""
    if value.startswith("@"):
        path = value[1:]
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ValueError(f"{flag}: cannot read @{path}: no such file") from exc
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(f"{flag}: cannot read @{path}: {reason.lower()}") from exc
    else:
        text = value
    try:
        parsed = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise ValueError(f"{flag}: not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{flag}: must be a JSON object, not {type(parsed).__name__}")
    return parsed


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# The flags of `submit` by the argument of AiJobsClient.submit they give.
SUBMIT_FLAGS = {
    "job_type": "--type",
    "user_id": "--user",
    "input": "--input",
    "job_id": "--job-id",
    "max_attempts": "--max-attempts",
    "deadline_seconds": "--deadline-seconds",
    "lane": "--lane",
    "attachments": "--attach",
    "job_type_version": "--version",
}
BUDGET_FLAGS = {"user_id": "--user", "daily_usd": "--daily-usd"}


@contextmanager
def naming_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """A client call's refusal of an argument, as the flag the user wrote: "--user: 'a b' is not a user id ...",
    and of one value of a repeated flag, naming that value: "--attach invoice.docx: not a PDF, ..."."""
    try:
        yield
    except InvalidArgumentError as exc:
        if exc.argument not in flags:
            raise
        flag = flags[exc.argument] if exc.item is None else f"{flags[exc.argument]} {exc.item}"
        raise ValueError(f"{flag}: {exc.detail}") from exc
    except UnknownJobTypeError as exc:
        if "job_type" not in flags:
            raise
        raise ValueError(f"{flags['job_type']}: {exc}") from exc


def checked_user(user: str | None) -> str | None:
    """--user of a listing: a user id, or one line saying what one is."""
    if user is not None:
        with naming_flags({"user_id": "--user"}):
            check_user_id(user)
    return user


def parse_duration(value: str) -> int:
    """`30m`, `12h`, `7d`, `2w` as seconds."""
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"--since {value!r} is not a duration like 30m, 12h, 7d or 2w")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def print_json(data: Any) -> None:
    # Plain print: rich would wrap long lines, and scripts parse this.
    print(json_line(data))


def print_view(inspection: JobInspection, jobs: AiJobsClient, as_json: bool) -> None:
    """A job's view as `aijobs inspect` has it (how its latest attempt ran included), and its calls."""
    view = inspection.job
    if as_json:
        print_json(view.model_dump(mode="json"))
    else:
        out.print(job_table(view, inspection.attempts))
        if view.attachments:
            out.print(attachments_table(view.attachments))
    unknown_to_the_stack([view], jobs)


def unknown_to_the_stack(views: Sequence[JobView], jobs: AiJobsClient) -> None:
    """A job that failed `unknown_job_type` although this command knows its type ran on a stack whose
    workers loaded their job types before it was added (jobtypes/, AIJOBS_JOB_MODULES): one line
    saying how to have them load it."""
    known = set(jobs.job_types())
    embedded = jobs.target is not None and jobs.target.embedded
    for job_type in sorted(
        {
            view.job_type
            for view in views
            if view.error is not None and view.error.code is ErrorCode.UNKNOWN_JOB_TYPE and view.job_type in known
        }
    ):
        fix = (
            "restart aijobs dev (it loads job types once, when it starts)"
            if embedded
            else "deploy it again (sam build, then sam deploy)"
        )
        err.print(
            f"note: job type {job_type} is not known to the running stack; {fix}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


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
    attach: Annotated[
        list[str] | None,
        typer.Option(
            "--attach",
            help="A document or image: a local file (uploaded to the payload bucket) or s3://BUCKET/KEY. Repeatable.",
        ),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", help="Run this version of a data job type (a pin).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends; exit 1 unless it succeeded.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits at most.")] = 300.0,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Create a job and enqueue it; prints the job id."""
    jobs = client(stack)
    with naming_flags(SUBMIT_FLAGS):
        result = jobs.submit(
            job_type,
            user,
            read_input(job_input),
            job_id=job_id,
            max_attempts=max_attempts,
            deadline_seconds=deadline_seconds,
            lane=lane,
            attachments=attach or [],
            job_type_version=version,
        )
    if wait:
        jobs.wait(result.job_id, timeout_seconds=timeout)
        inspection = jobs.inspect(result.job_id)
        print_view(inspection, jobs, as_json)
        if inspection.job.status is not JobStatus.SUCCEEDED:
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
    """Show one job: its view (how its latest attempt ran included: its attempts are read with it)."""
    jobs = client(stack)
    print_view(jobs.inspect(job_id), jobs, as_json)


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
                open_ones = ", ".join(
                    f"{view.job_id} {view.status.value}" for view in views if not view.status.is_terminal
                )
                raise TimeoutError(f"jobs not ended after {timeout:g}s: {open_ones}")
            time.sleep(interval)
            views = poll()
            live.update(jobs_table(views), refresh=True)
    unknown_to_the_stack(views, jobs)
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
    """Cancel a job: a queued one (or a waiting pipeline) ends at once, a running one at its next fence."""
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
def review(
    job_id: Annotated[str, typer.Argument(help="The pipeline's job id.")],
    approve: Annotated[bool, typer.Option("--approve", help="Approve the proposed output.")] = False,
    reject: Annotated[bool, typer.Option("--reject", help="Reject it (the job ends review_rejected).")] = False,
    output: Annotated[
        str | None, typer.Option("--output", help="With --approve: the output to keep instead, as JSON or @FILE.")
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="With --reject: why (required).")] = None,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Decide a pipeline's review: approve its output (or an edited one), or reject it with a reason."""
    if approve == reject:
        raise typer.BadParameter("give one of --approve and --reject")
    if output is not None and not approve:
        raise typer.BadParameter("--output goes with --approve")
    if reason is not None and not reject:
        raise typer.BadParameter("--reason goes with --reject")
    edited = read_input(output, "--output") if output is not None else None
    view = client(stack).review(job_id, approve=approve, output=edited, reason=reason)
    if as_json:
        print_json(view.model_dump(mode="json"))
    elif view.status is JobStatus.SUCCEEDED:
        out.print(f"job {view.job_id} approved: succeeded", markup=False, highlight=False)
    else:
        out.print(f"job {view.job_id} rejected: {view.status.value}", markup=False, highlight=False)


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
    jobs = client(stack)
    inspection = jobs.inspect(job_id)
    if as_json:
        print_json(inspection.model_dump(mode="json"))
    else:
        out.print(inspection_group(inspection))
    unknown_to_the_stack([inspection.job], jobs)


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
    views = client(stack).list_jobs(user_id=checked_user(user), status=job_status, limit=limit, lane=lane)
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
    """Tokens and cost by user, job type, model and lane; then cost by route beside what the same calls
    would have cost in real time at the standard tier, and the saving (--json: the rows, by route too)."""
    rows = client(stack).usage(parse_duration(since), user_id=checked_user(user))
    if as_json:
        print_json([usage_json(row) for row in rows])
    else:
        out.print(usage_table(rows, title=f"usage over the last {since}"))
        out.print(routes_table(rows))


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


types_app = typer.Typer(help="Job types as data: push a file, promote, canary, roll back, compare, test.")
types_app.callback(invoke_without_command=True)(help_without_a_command)
app.add_typer(types_app, name="types")
NameArgument = Annotated[str, typer.Argument(help="The job type's name.")]
FileArgument = Annotated[Path, typer.Argument(help="A job type file, YAML or JSON.")]


def pusher() -> str | None:
    """Who pushes or moves labels, as the label history records it: this machine's user, when known."""
    return os.environ.get("USER") or os.environ.get("USERNAME") or None


@types_app.command("push")
@one_line_errors
def types_push(file: FileArgument, as_json: JsonFlag = False, stack: StackOption = None) -> None:
    """Check a job type file whole and store it as its name's next version (the first is production
    at once); the same content again makes no new version. A file refused is one line naming why."""
    result = client(stack).push_job_type(file, by=pusher())
    if as_json:
        print_json({"name": result.name, "version": result.version, "created": result.created})
    elif result.created:
        out.print(f"{result.name} v{result.version} pushed", markup=False, highlight=False)
    else:
        out.print(f"{result.name} v{result.version} has this content already: no new version", markup=False)


@types_app.command("promote")
@one_line_errors
def types_promote(
    name: NameArgument,
    version: Annotated[int, typer.Argument(help="The version to promote.")],
    canary: Annotated[
        int | None, typer.Option("--canary", min=1, max=99, help="Serve it to this % of users instead (sticky).")
    ] = None,
    guard: Annotated[
        bool, typer.Option("--guard", help="End the canary by itself if it fails validation more than production.")
    ] = False,
    min_jobs: Annotated[
        int | None,
        typer.Option(
            "--min-jobs",
            min=1,
            help=f"The guard judges after this many canary jobs [default: {DEFAULT_GUARD_MIN_JOBS}].",
        ),
    ] = None,
    max_regression: Annotated[
        float | None,
        typer.Option(
            "--max-regression",
            min=0,
            max=100,
            help=f"Points of validation failures worse it tolerates [default: {DEFAULT_GUARD_MAX_REGRESSION:g}].",
        ),
    ] = None,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """Make version N production, or with --canary P serve it to P% of users (the rest keep production)."""
    if guard and canary is None:
        raise ValueError("--guard: a guard watches a canary: give --canary P too")
    # A guard's setting without --guard would start an unguarded canary the user believes watched.
    for flag, given in (("--min-jobs", min_jobs), ("--max-regression", max_regression)):
        if given is not None and not guard:
            raise ValueError(f"{flag}: sets the guard: give --guard too")
    guarded = (
        Guard(
            DEFAULT_GUARD_MIN_JOBS if min_jobs is None else min_jobs,
            DEFAULT_GUARD_MAX_REGRESSION if max_regression is None else max_regression,
        )
        if guard
        else None
    )
    with naming_flags({"canary_percent": "--canary", "guard": "--guard"}):
        head = client(stack).promote_job_type(name, version, canary_percent=canary, guard=guarded, by=pusher())
    if as_json:
        print_json(head_json(head))
    elif canary is None:
        out.print(f"{name} v{version} is production", markup=False, highlight=False)
    else:
        out.print(f"{name} v{version} serves {canary}% of users; v{head.production} the rest", markup=False)


@types_app.command("rollback")
@one_line_errors
def types_rollback(
    name: NameArgument,
    reason: Annotated[str | None, typer.Option("--reason", help="Why, as the history records it.")] = None,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """End the canary; without one, move production back to the version it replaced."""
    head = client(stack).rollback_job_type(name, reason=reason, by=pusher())
    if as_json:
        print_json(head_json(head))
    else:
        out.print(f"{name}: production is v{head.production}, no canary", markup=False, highlight=False)


@types_app.command("list")
@one_line_errors
def types_list(as_json: JsonFlag = False, stack: StackOption = None) -> None:
    """Every job type: the code ones (`code`) and the data ones with production and any canary."""
    listings = client(stack).job_types_listed()
    if as_json:
        print_json([listing_json(listing) for listing in listings])
    else:
        out.print(job_types_table(listings))


@types_app.command("show")
@one_line_errors
def types_show(
    name: NameArgument,
    version: Annotated[
        int | None, typer.Option("--version", help="Print this version's file: prompt, schemas, rules.")
    ] = None,
    as_json: JsonFlag = False,
    stack: StackOption = None,
) -> None:
    """A data job type's labels, versions and history (guard rollbacks: when and why); with --version, its file."""
    from aijobs.job_types import document_yaml

    jobs = client(stack)
    if version is not None:
        stored = jobs.job_type_version(name, version)
        if as_json:
            print_json(version_json(stored, with_document=True))
        else:
            out.print(f"# {name} v{version} ({stored.sha256[:12]})", markup=False, highlight=False)
            out.print(document_yaml(stored.document), markup=False, highlight=False, end="")
        return
    head, versions = jobs.job_type(name)
    if as_json:
        print_json(head_json(head) | {"versions": [version_json(stored) for stored in versions]})
    else:
        out.print(job_type_group(head, versions))


@types_app.command("diff")
@one_line_errors
def types_diff(
    name: NameArgument,
    old: Annotated[int, typer.Argument(help="A version.")],
    new: Annotated[int, typer.Argument(help="Another version.")],
    stack: StackOption = None,
) -> None:
    """A unified diff of two versions' files, as YAML."""
    diff = client(stack).job_type_diff(name, old, new)
    out.print(diff or f"{name} v{old} and v{new} are the same", markup=False, highlight=False, end="" if diff else "\n")


@types_app.command("stats")
@one_line_errors
def types_stats(name: NameArgument, as_json: JsonFlag = False, stack: StackOption = None) -> None:
    """Per version: jobs, succeeded, validation failures, re-asks, cost per job, p50 and p95 duration."""
    stats = client(stack).job_type_stats(name)
    if as_json:
        print_json([stats_json(row) for row in stats])
    else:
        out.print(job_type_stats_table(name, stats))


@types_app.command("test")
@one_line_errors
def types_test(file: FileArgument, as_json: JsonFlag = False) -> None:
    """On this machine, no stack: check the file as push does, then run each example's input through the
    gateway against a local provider answering with the file's example outputs, validating each answer.
    One line per example; exit 1 unless all pass."""
    from aijobs.job_types import read_job_type, run_examples

    name, runs = run_examples(read_job_type(file))
    if as_json:
        print_json([{"example": run.number, "passed": run.passed, "detail": run.detail} for run in runs])
    else:
        for run in runs:
            mark = "ok  " if run.passed else "FAIL"
            out.print(f"{mark} {name} example {run.number}: {run.detail}", markup=False, highlight=False)
    if not all(run.passed for run in runs):
        raise typer.Exit(1)


budget_app = typer.Typer(help="Daily spending caps per user (UTC days).")
budget_app.callback(invoke_without_command=True)(help_without_a_command)
app.add_typer(budget_app, name="budget")


def parse_usd(value: str) -> Decimal:
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise ValueError(f"--daily-usd: {value!r} is not an amount in US dollars") from exc
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
    with naming_flags(BUDGET_FLAGS):
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
    user = checked_user(user)
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
    """Completion events (Job Succeeded / Failed / Cancelled; Job Reviewed; a guard's Job Type Rolled Back):
    print them, or POST them to a webhook."""
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
                    try:
                        answer = httpx.post(webhook, json=event, timeout=10.0)
                        problem = None if answer.is_success else f"answered {answer.status_code}"
                    except httpx.HTTPError as exc:
                        problem = f"did not answer ({type(exc).__name__}: {exc})"
                    if problem is not None:
                        refused += 1
                        line = f"error: {webhook} {problem}; the event stays queued"
                        err.print(line, markup=False, highlight=False, soft_wrap=True)
                        continue
                elif as_json:
                    print(json_line(event, COMPACT), flush=True)
                else:
                    # One line per event, however long, and its text never read as markup.
                    out.print(event_line(event), markup=False, highlight=False, soft_wrap=True)
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
    batch_api: Annotated[
        str | None,
        typer.Option(
            "--batch-api",
            metavar="on|off",
            help="Background jobs with time to spare through the provider's batch API (AIJOBS_BATCH_API).",
        ),
    ] = None,
    batch_window_seconds: Annotated[
        int | None,
        typer.Option(
            "--batch-window-seconds", help="How long background jobs gather for a batch (AIJOBS_BATCH_WINDOW_SECONDS)."
        ),
    ] = None,
    batch_poll_seconds: Annotated[
        int | None,
        typer.Option(
            "--batch-poll-seconds", help="How often batches in flight are checked (AIJOBS_BATCH_POLL_SECONDS)."
        ),
    ] = None,
    batch_rescue_seconds: Annotated[
        int | None,
        typer.Option(
            "--batch-rescue-seconds",
            help="A batched job this near its deadline goes back to real time (AIJOBS_BATCH_RESCUE_SECONDS).",
        ),
    ] = None,
    flex: Annotated[
        str | None,
        typer.Option(
            "--flex",
            metavar="on|off",
            help="Background jobs not in a batch at the provider's flex tier (AIJOBS_FLEX).",
        ),
    ] = None,
    flex_latency: Annotated[
        float | None,
        typer.Option("--flex-latency", min=0, max=3_600, help="Seconds the local provider takes to answer at flex."),
    ] = None,
    flex_refusal_rate: Annotated[
        float,
        typer.Option(
            "--flex-refusal-rate", min=0, max=1, help="Share of flex requests the local provider refuses (429)."
        ),
    ] = 0.0,
    answers: Annotated[
        list[Path] | None,
        typer.Option(
            "--answers",
            help="YAML or JSON {job_type: [{input, output}, ...]}, or a job type file (its own examples): the "
            "local provider answers those job types with the example whose input the prompt holds. Repeatable.",
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            help="The functions' logs and metric documents (EMF) to a file, named on a line `logs PATH`, "
            "not to this terminal.",
        ),
    ] = False,
) -> None:
    """The embedded stack: local AWS endpoint, local provider (unless AI_BASE_URL is set) and the worker.

    Its state (jobs, queues, usage, budgets, dead letters) is in memory only: it is gone when it
    stops, and a new start begins empty. Job types are loaded once, at start: restart it after
    adding one. The functions get every AI_* and AIJOBS_* variable of this environment, as the
    template would set them; the options above win over the variables they name."""
    import shlex

    with local_extra("dev"):
        from aijobs.local.devstack import DevStack, DevStackOptions, function_output_to, function_variables

    settings_flags = setting_flags(
        {
            "AIJOBS_BATCH_API": ("--batch-api", batch_api),
            "AIJOBS_BATCH_WINDOW_SECONDS": ("--batch-window-seconds", batch_window_seconds),
            "AIJOBS_BATCH_POLL_SECONDS": ("--batch-poll-seconds", batch_poll_seconds),
            "AIJOBS_BATCH_RESCUE_SECONDS": ("--batch-rescue-seconds", batch_rescue_seconds),
            "AIJOBS_FLEX": ("--flex", flex),
        }
    )
    flags = {
        "AI_BASE_URL": ai_base_url,
        "AIJOBS_PROVIDER_LIMITS": provider_limits,
        "AIJOBS_DEFAULT_DAILY_BUDGET_USD": default_budget,
    }
    options = DevStackOptions(
        aws_port=port,
        provider_port=provider_port,
        function_environment=function_variables(os.environ)
        | {name: value for name, value in flags.items() if value}
        | settings_flags,
        concurrency=concurrency,
        background_concurrency=background_concurrency,
        fault_rate=fault_rate,
        provider_rpm=rpm,
        provider_tpm=tpm,
        provider_reasoning_tokens=reasoning_tokens,
        provider_flex_refusal_rate=flex_refusal_rate,
    )
    if batch_delay is not None:
        options = replace(options, provider_batch_delay_seconds=batch_delay)
    if flex_latency is not None:
        options = replace(options, provider_flex_latency_seconds=flex_latency)
    if answers:
        given: dict[str, list[dict[str, Any]]] = {}
        for path in answers:
            given |= read_answers(path)
        options = replace(options, provider_answers=given)
    with ExitStack() as serving:
        terminal, log_path = sys.stdout, None
        if quiet:
            log_path = new_log_file()
            terminal = serving.enter_context(function_output_to(log_path))
        stack = serving.enter_context(DevStack(options))
        for name, value in sorted(stack.environment.items()):
            print(f"export {name}={shlex.quote(value)}", file=terminal)
        if log_path is not None:
            print(f"logs {log_path}", file=terminal)
        if with_ui:
            jobs = AiJobsClient.from_settings(stack.settings, stack.session)
            board = dashboard_server()(jobs, port=ui_port, allow_actions=ui_allow_actions)
            serving.enter_context(board)
            print(f"ui {board.url}", file=terminal)
        else:
            err.print("the dashboard: `aijobs ui` in a shell with these exports, or `aijobs dev --ui`", highlight=False)
        print("ready", file=terminal, flush=True)
        _wait_for_interrupt()


def read_answers(path: Path) -> dict[str, list[dict[str, Any]]]:
    """`--answers FILE`: the examples the local provider answers each job type with, or one line. A job
    type file (it has `name` and `input_schema`) gives its own examples."""
    from aijobs.job_types import read_job_type
    from aijobs.local.answers import check_answers

    try:
        document = read_job_type(path)
        if isinstance(document, Mapping) and "name" in document and "input_schema" in document:
            document = {document["name"]: document.get("examples") or []}
        return check_answers(document, f"--answers {path}")
    except JobTypeFileError as exc:
        raise ValueError(f"--answers: {exc}") from exc


def setting_flags(flags: Mapping[str, tuple[str, object | None]]) -> dict[str, str]:
    """Flags that stand for the functions' settings ({variable: (flag, value)}), as those variables: the
    ones given, each checked as the setting checks the variable (engine.config.Settings), and a value it
    refuses is one line naming the flag."""
    given = {variable: (flag, str(value)) for variable, (flag, value) in flags.items() if value is not None}
    try:
        Settings.model_validate({variable.lower(): value for variable, (_, value) in given.items()})
    except ValidationError as exc:
        for error in exc.errors():
            variable = str(error["loc"][0]).upper() if error["loc"] else ""
            if variable in given:
                raise ValueError(f"{given[variable][0]}: {error['msg']}") from exc
    return {variable: value for variable, (_, value) in given.items()}


def new_log_file() -> Path:
    """A file of its own for the functions' output of one `aijobs dev --quiet`; kept after it stops."""
    handle, name = tempfile.mkstemp(prefix="aijobs-dev-", suffix=".log")
    os.close(handle)
    return Path(name)


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
    """Block until Ctrl-C (SIGINT) or SIGTERM. Both are handled here, not left to Python's default: a
    command a script starts in the background inherits SIGINT ignored, and Ctrl-C must stop it still."""
    import signal
    import threading

    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main() -> None:
    app()
