"""The dashboard's pages: server-rendered HTML over the client the CLI uses, one read of the table per page.

Routes (docs/ui.md): `/jobs` (filters in the query string, a job-id lookup, cursor pages),
`/overview` (the same window counted), `/jobs/{id}` and its `input.json` / `output.json` and
`attachments/{n}` (each a download, never shown),
`/batches`, `/dead-letters` and one of them with its `body`, `/usage`, and with `allow_actions` the
POSTs `/jobs/{id}/cancel`, `/jobs/{id}/retry`, `/dead-letters/{message_id}/redrive` and the bulk
retry's `/jobs/retry-failed` (which asks) and `/jobs/retry-failed/confirm` (which retries). Every
page carries the health strip, which its script fills from `/health`: a page's own time is its own
read.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from botocore.exceptions import BotoCoreError, ClientError
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from aijobs.client import AiJobsClient, Health, RedriveOutcome
from aijobs.job_types import document_yaml
from aijobs.ui import present
from aijobs.ui.bulk import BULK_LIMIT, RetryOutcome, retry_each, retry_ids
from aijobs.ui.guard import LOOPBACK_NAMES, Guard
from aijobs.ui.overview import STACKED, overview
from aijobs.ui.queries import LANES, WINDOWS, BatchesQuery, JobsQuery, user, window
from engine.core import DeadLetter, JobStatus
from engine.core.errors import AiJobsError, AttachmentInvalidError, JobNotFoundError, JobTypeLabelError
from engine.store import by_route, summed
from engine.store.batches import ENDED_RETENTION_DAYS
from engine.views import JobView, ReviewView, iso_timestamp

# Seconds between refreshes of a visible page.
REFRESH_SECONDS = 5
DEAD_LETTERS_SHOWN = 100
# What a page says after an action (`?done=...`).
NOTICES = {
    "cancel-cancelled": "Cancelled.",
    "cancel-ended": "The job had already ended: nothing to cancel.",
    "cancel-asked": "Cancel asked: the running job ends cancelled at its next fence.",
    "retried": "Queued again, with a fresh attempt budget and deadline.",
    "redriven": "The dead letter's job is queued again.",
    "approved": "Approved: the pipeline succeeded with that output.",
    "rejected": "Rejected: the pipeline ended review_rejected.",
}
_STATIC = {"app.css": "text/css; charset=utf-8", "refresh.js": "text/javascript; charset=utf-8"}
Page = Callable[[Request], Response]
# A form's fields, each with every value it was sent with.
Form = dict[str, list[str]]
FormPage = Callable[[Request, Form], Response]
# A bulk retry's form names at most 100 jobs of at most 128 characters.
MAX_FORM_BYTES = 64 * 1024


class NotFoundError(Exception):
    """What the address names is not there: a page of 404."""


class Dashboard:
    def __init__(
        self, client: AiJobsClient, *, allow_actions: bool = False, refresh_seconds: float = REFRESH_SECONDS
    ) -> None:
        self.client = client
        self.allow_actions = allow_actions
        self.refresh_seconds = refresh_seconds
        self.templates = Environment(
            loader=PackageLoader("aijobs.ui", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.globals.update(
            money=present.money,
            count=present.count,
            duration=present.duration,
            when=present.when,
            iso_timestamp=iso_timestamp,
            took=present.took,
            rescue=present.rescue,
            now_utc=lambda: datetime.now(UTC).strftime("%H:%M:%S"),
            notices=NOTICES,
            job_types=client.job_types(),
            job_url=present.job_url,
            batches_url=present.batches_url,
            batch_name=present.batch_name,
            dead_letter_url=present.dead_letter_url,
            job_type_url=present.job_type_url,
            lanes=LANES,
            windows=list(WINDOWS),
            statuses=list(JobStatus),
        )
        self._static = {name: (resources.files("aijobs.ui") / "static" / name).read_bytes() for name in _STATIC}

    # --- pages -------------------------------------------------------------------------------

    def jobs(self, request: Request) -> Response:
        query = JobsQuery.parse(request.query_params)
        if query.job_id is not None:
            try:
                found = self.client.get(query.job_id)  # one GetItem
            except JobNotFoundError:
                return self.render(request, "jobs.html", 404, query=query, page=None, missing=query.job_id)
            return RedirectResponse(present.job_url(found.job_id), 303)
        page = self.client.list_page(query.where, query.since_seconds, query.until_ms, query.limit, query.cursor)
        return self.render(request, "jobs.html", query=query, page=page, missing=None)

    def overview(self, request: Request) -> Response:
        """The window's jobs counted by state and error code, and over time (not refreshed: a count of up
        to MAX_OUTLINED jobs is a read of each, docs/ui.md)."""
        query = JobsQuery.parse(request.query_params).showing(None)
        until_ms = query.until_ms or int(datetime.now(UTC).timestamp() * 1000)
        outlines = self.client.outline(query.where, query.since_seconds, until_ms)
        figures = overview(outlines, until_ms - query.since_seconds * 1000, until_ms, query.since)
        chart = (present.CHART_WIDTH, present.CHART_HEIGHT)
        return self.render(request, "overview.html", query=query, figures=figures, chart=chart, stacked=STACKED)

    def job(self, request: Request) -> Response:
        details = self.client.details(request.path_params["job_id"])
        output = None if details.job.output is None else present.clip(present.pretty_json(details.job.output))
        job_input = None if details.input_json is None else present.clip(present.pretty_json(details.input_json))
        return self.render(
            request,
            "job.html",
            details=details,
            view=details.job,
            output=output,
            job_input=job_input,
            proposed=present.pretty_json(review.output) if (review := _review(details.job)) else None,
            notice=request.query_params.get("done"),
        )

    def download(self, request: Request, part: str) -> Response:
        """The whole input or output of a job, as a JSON file to save (never shown as a page)."""
        job_id = request.path_params["job_id"]
        details = self.client.details(job_id)
        output = details.job.output
        text = details.input_json if part == "input" else None if output is None else json.dumps(output)
        if text is None:
            return self.render(request, "error.html", 404, message=f"job {job_id} has no stored {part}")
        return attachment(text.encode(), f"{job_id}-{part}.json", "application/json")

    def attachment(self, request: Request) -> Response:
        """An attachment the job names, streamed from its bucket as bytes to save: never shown, whatever
        its content or name says it is (an SVG, HTML named .png)."""
        job_id, number = request.path_params["job_id"], request.path_params["number"]
        try:
            found = self.client.attachment(job_id, number)  # a GetItem, then a GetObject
        except AttachmentInvalidError as exc:
            raise NotFoundError(str(exc)) from exc
        if found is None:
            raise NotFoundError(f"job {job_id} names no attachment #{number}")
        headers = download_headers(found.attachment.name) | {"content-length": str(found.content.size)}
        return StreamingResponse(found.content.chunks, media_type="application/octet-stream", headers=headers)

    def batches(self, request: Request) -> Response:
        query = BatchesQuery.parse(request.query_params)
        listed = self.client.batches(in_flight_only=not (query.include_ended or query.selects))
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        return self.render(
            request,
            "batches.html",
            query=query,
            batches=[batch for batch in listed if query.shows(batch)],
            now_ms=now_ms,
            kept_days=ENDED_RETENTION_DAYS,
        )

    def job_types(self, request: Request) -> Response:
        """Every job type: code ones, and data ones with their labels (one Query)."""
        return self.render(request, "job_types.html", listings=self.client.job_types_listed())

    def job_type(self, request: Request) -> Response:
        """A data job type: labels, canary, stats by version, history, and one version's file as text
        (`?version=N`, production's by default): user content, escaped as any."""
        name = request.path_params["name"]
        try:
            head, versions = self.client.job_type(name)
        except JobTypeLabelError as exc:
            raise NotFoundError(str(exc)) from exc
        shown = version_param(request.query_params.get("version"), head.production)
        chosen = next((stored for stored in versions if stored.version == shown), None)
        if chosen is None:
            raise NotFoundError(f"{name} has no version {shown} (v1-v{head.latest})")
        return self.render(
            request,
            "job_type.html",
            head=head,
            versions=versions,
            stats=self.client.job_type_stats(name),
            shown=chosen,
            document=document_yaml(chosen.document),
        )

    def dead_letters(self, request: Request) -> Response:
        since = window(request.query_params, "7d", ("24h", "7d", "30d"))
        letters = self.client.dead_letters(WINDOWS[since], DEAD_LETTERS_SHOWN)
        return self.render(request, "dead_letters.html", since=since, letters=letters, shown=DEAD_LETTERS_SHOWN)

    def dead_letter(self, request: Request) -> Response:
        letter = self._letter(request)
        body = None if letter.body is None else present.clip(letter.body)
        return self.render(request, "dead_letter.html", letter=letter, body=body)

    def dead_letter_body(self, request: Request) -> Response:
        """A dead letter's body as it came, as a file to save: never shown as a page, whatever it holds."""
        letter = self._letter(request)
        if letter.body is None:
            raise NotFoundError(f"dead letter {letter.message_id} has no body kept")
        return attachment(letter.body.encode(), f"{letter.message_id}.body", "application/octet-stream")

    def _letter(self, request: Request) -> DeadLetter:
        message_id = request.path_params["message_id"]
        letter = self.client.dead_letter(message_id)  # one GetItem
        if letter is None:
            raise NotFoundError(f"no dead letter of message {message_id}")
        return letter

    def usage(self, request: Request) -> Response:
        since = window(request.query_params, "7d", ("24h", "7d", "30d", "90d"))
        who = user(request.query_params)
        report = self.client.usage_report(WINDOWS[since], who)
        return self.render(
            request,
            "usage.html",
            since=since,
            who=who,
            report=report,
            total=summed(row for _, row in report.days),
            bars=present.day_chart(report.days),
            highest=max((row.cost_usd for _, row in report.days), default=0),
            chart=(present.CHART_WIDTH, present.CHART_HEIGHT),
            by_user=present.totals_by(report.rows, "user_id"),
            by_type=present.totals_by(report.rows, "job_type"),
            by_model=present.totals_by(report.rows, "model"),
            by_lane=present.totals_by(report.rows, "lane"),
            by_route=by_route(report.rows),
            budgets=self.client.budgets() if who is None else [day for day in [self.client.budget(who)] if day],
        )

    # --- actions (POST, same origin only: see guard.py) --------------------------------------

    def cancel(self, request: Request) -> Response:
        view = self.client.cancel(self._acting(request))
        done = "cancelled" if view.status is JobStatus.CANCELLED else "ended" if view.status.is_terminal else "asked"
        return RedirectResponse(present.job_url(view.job_id, f"?done=cancel-{done}"), 303)

    def retry(self, request: Request) -> Response:
        view = self.client.retry(self._acting(request))
        return RedirectResponse(present.job_url(view.job_id, "?done=retried"), 303)

    def review(self, request: Request, form: Form) -> Response:
        """A pipeline's review decided (docs/pipelines.md): `decision` approve or reject; with approve, an
        `output` (JSON) edited from the one proposed; with reject, its `reason`. Who decided is not known
        to the dashboard: the decision records `dashboard`."""
        job_id = self._acting(request)
        fields = {name: values[-1] for name, values in form.items() if values}
        decision = fields.get("decision")
        if decision not in ("approve", "reject"):
            raise ValueError("a review is decided with approve or reject")
        output = None
        if decision == "approve" and fields.get("output", "").strip():
            try:
                output = json.loads(fields["output"])
            except ValueError as exc:
                raise ValueError(f"output: not valid JSON: {exc}") from exc
            if not isinstance(output, dict):
                raise ValueError("output: must be a JSON object")
        # The dashboard decides as itself, run by whoever started it (its client's caller).
        caller = self.client.caller()
        by = f"dashboard ({caller})" if caller else "dashboard"
        view = self.client.review(
            job_id, approve=decision == "approve", output=output, reason=fields.get("reason"), by=by
        )
        done = "approved" if view.status is JobStatus.SUCCEEDED else "rejected"
        return RedirectResponse(present.job_url(view.job_id, f"?done={done}"), 303)

    def redrive(self, request: Request) -> Response:
        (result,) = self.client.redrive([self._acting(request, "message_id")])
        if result.outcome is RedriveOutcome.REQUEUED and result.job_id:
            return RedirectResponse(present.job_url(result.job_id, "?done=redriven"), 303)
        return self.render(request, "error.html", 409, message=f"redrive of {result.message_id}: {result.detail}")

    def ask_retry_failed(self, request: Request, form: Form) -> Response:
        """The first POST of a bulk retry, from a jobs page: which of the jobs its filters show now are
        failed, in a form that retries those (the second POST). Reads what the page reads."""
        self._acting(request, None)
        query = JobsQuery.parse(_fields(form))
        page = self.client.list_page(query.where, query.since_seconds, query.until_ms, query.limit, query.cursor)
        failed = [job for job in page.jobs if job.status is JobStatus.FAILED]
        return self.render(request, "retry_failed.html", query=query, failed=failed, limit=BULK_LIMIT)

    def retry_failed(self, request: Request, form: Form) -> Response:
        """The second POST: retry the jobs the confirmation named, each through the client's retry."""
        self._acting(request, None)
        query = JobsQuery.parse(_fields(form))
        results = retry_each(self.client, retry_ids(form.get("job_id", [])))
        return self.render(request, "retried.html", query=query, results=results, queued=RetryOutcome.QUEUED)

    def _acting(self, request: Request, name: str | None = "job_id") -> str:
        """The path parameter `name` of an action (none for a bulk one); PermissionError when read-only."""
        if not self.allow_actions:
            raise PermissionError("this dashboard is read-only: start it with `aijobs ui --allow-actions`")
        value: str = request.path_params[name] if name else ""
        return value

    # --- the parts of every page -------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        page = self.templates.get_template(template).render(
            path=request.url.path,
            stack=self.client.target,
            allow_actions=self.allow_actions,
            refresh_ms=int(self.refresh_seconds * 1000),
            **context,
        )
        return HTMLResponse(page, status)

    def health(self, request: Request) -> Response:
        """The health strip alone (every page fetches it): queue depths and the last day's dead letters,
        or that the stack does not answer."""
        try:
            health: Health | None = self.client.health()
        except (ClientError, BotoCoreError):
            health = None
        page = self.templates.get_template("health.html").render(health=health, stack=self.client.target)
        return HTMLResponse(page)

    def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found\n", 404, media_type="text/plain")
        return Response(self._static[name], media_type=_STATIC[name], headers={"cache-control": "max-age=300"})

    def with_form(self, page: FormPage) -> Callable[[Request], Awaitable[Response]]:
        """An action that reads its form (URL-encoded, at most MAX_FORM_BYTES): the body is read here, then
        the page runs in a thread as the others do."""

        async def answer(request: Request) -> Response:
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_FORM_BYTES:
                    return self.render(
                        request, "error.html", 413, message=f"a form holds at most {MAX_FORM_BYTES} bytes"
                    )
            form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
            return await run_in_threadpool(self.answering(lambda request: page(request, form)), request)

        return answer

    def answering(self, page: Page) -> Page:
        """A page whose refusals are pages too: 404 for a missing job, 400 for a bad address, 403 for an
        action on a read-only dashboard, 409 for one the job's state refuses, 502 when AWS fails."""

        def answer(request: Request) -> Response:
            try:
                return page(request)
            except (JobNotFoundError, NotFoundError) as exc:
                return self.render(request, "error.html", 404, message=str(exc))
            except ValueError as exc:
                return self.render(request, "error.html", 400, message=str(exc))
            except PermissionError as exc:
                return self.render(request, "error.html", 403, message=str(exc))
            except AiJobsError as exc:
                return self.render(request, "error.html", 409, message=str(exc))
            except (ClientError, BotoCoreError) as exc:
                return self.render(request, "error.html", 502, message=f"the stack did not answer: {exc}")

        return answer


def _review(view: JobView) -> ReviewView | None:
    """The review a pipeline waits for, if any."""
    return view.pipeline.review if view.pipeline is not None else None


def _fields(form: Form) -> dict[str, str]:
    """The jobs page's filters a form carries (each its last value), without the job ids it names."""
    return {name: values[-1] for name, values in form.items() if values and name != "job_id"}


def attachment(content: bytes, name: str, media_type: str) -> Response:
    """`content` as a file the browser saves, under a name of safe characters."""
    return Response(content, media_type=media_type, headers=download_headers(name))


def version_param(raw: str | None, default: int) -> int:
    """`?version=N` of the job type page: a version number, else ValueError (a page of 400)."""
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise ValueError(f"version must be a version number, not {raw[:40]!r}")
    return int(raw)


def download_headers(name: str) -> dict[str, str]:
    """What makes an answer a file the browser saves (Content-Disposition: attachment), never a page it
    renders, under `name` in characters that cannot break the header or name a path (ASCII letters,
    digits, - _ .)."""
    filename = "".join(char if char.isascii() and (char.isalnum() or char in "-_.") else "_" for char in name)
    return {"content-disposition": f'attachment; filename="{filename}"', "x-content-type-options": "nosniff"}


def create_app(
    client: AiJobsClient,
    *,
    allow_actions: bool = False,
    hosts: frozenset[str] = LOOPBACK_NAMES,
    refresh_seconds: float = REFRESH_SECONDS,
) -> Starlette:
    """The dashboard as an ASGI app, answering to `hosts` (their names in the Host header) only."""
    board = Dashboard(client, allow_actions=allow_actions, refresh_seconds=refresh_seconds)
    pages: list[tuple[str, Page, list[str]]] = [
        ("/", lambda request: RedirectResponse("/jobs", 303), ["GET"]),
        ("/jobs", board.jobs, ["GET"]),
        ("/overview", board.overview, ["GET"]),
        ("/jobs/{job_id}", board.job, ["GET"]),
        ("/jobs/{job_id}/input.json", lambda request: board.download(request, "input"), ["GET"]),
        ("/jobs/{job_id}/output.json", lambda request: board.download(request, "output"), ["GET"]),
        ("/jobs/{job_id}/attachments/{number:int}", board.attachment, ["GET"]),
        ("/jobs/{job_id}/cancel", board.cancel, ["POST"]),
        ("/jobs/{job_id}/retry", board.retry, ["POST"]),
        ("/batches", board.batches, ["GET"]),
        ("/dead-letters", board.dead_letters, ["GET"]),
        ("/dead-letters/{message_id}", board.dead_letter, ["GET"]),
        ("/dead-letters/{message_id}/body", board.dead_letter_body, ["GET"]),
        ("/dead-letters/{message_id}/redrive", board.redrive, ["POST"]),
        ("/usage", board.usage, ["GET"]),
        ("/types", board.job_types, ["GET"]),
        ("/types/{name}", board.job_type, ["GET"]),
        ("/health", board.health, ["GET"]),
        ("/static/{name}", board.static, ["GET"]),
    ]
    routes = [Route(path, board.answering(page), methods=methods) for path, page, methods in pages]
    # The bulk retry's two POSTs (a GET of /jobs/retry-failed is the page of a job of that id).
    routes += [
        Route("/jobs/retry-failed", board.with_form(board.ask_retry_failed), methods=["POST"]),
        Route("/jobs/retry-failed/confirm", board.with_form(board.retry_failed), methods=["POST"]),
        Route("/jobs/{job_id}/review", board.with_form(board.review), methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, hosts=hosts)])
