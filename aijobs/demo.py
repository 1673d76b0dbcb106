"""`aijobs demo`: the whole pipeline on the embedded stack, with jobs of every type and chosen faults.

Each sample job says how it is meant to end; the demo exits 0 only when every job did.
Faults are asked of the local provider through a marker in the job's input text. Fleet control is
on: the local provider enforces DEMO_RPM requests a minute of its own and the workers share that
limit, so a burst of jobs is spaced to it; and one user has a daily budget of one job's worst
case, so that their later jobs wait for it and, their deadline short, end `budget_exceeded`. A
background backfill drains under the same limit while interactive jobs submitted during it are
answered at once (docs/lanes.md); the summary gives each lane's time from submission to end. Jobs
with a day to spare go through the provider's batch API (docs/batches.md): the summary prints what
they cost against the same calls in real time. Document jobs carry the package's sample files
(aijobs.local.samples), uploaded to the payload bucket: a PDF and a scanned form read in real time,
a PDF and a photo through a batch, and an image wider than the provider takes, refused before any
call (docs/attachments.md); they run for the job types that take attachments. Last, a data job type
is pushed and run, and a worse version of its prompt, canaried to half the users, is taken back by
its guard (aijobs.demo_canary, docs/jobtypes.md).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from aijobs.amounts import usd
from aijobs.client import AiJobsClient
from aijobs.demo_canary import canary_summary, run_canary
from aijobs.events import EventsTap
from aijobs.local.devstack import LOCAL_MODEL, DevStack, DevStackOptions
from aijobs.local.provider import ServedRequest
from aijobs.local.samples import INVOICE, PANORAMA, PRODUCT_PHOTO, SCANNED_FORM, sample
from aijobs.render import status_text
from engine.attachments.inspection import media_type_of
from engine.batching.intake import BatchTiming
from engine.core import AttemptRecord, ErrorCode, JobStatus, Lane, Via
from engine.core.attachments import AttachmentRef
from engine.core.errors import JobNotFoundError
from engine.definitions import JobRegistry
from engine.gateway import price_table
from engine.observability import logger as engine_logger
from engine.views import JobView
from engine.wiring import Aws, build_store

POLL_SECONDS = 1.0
# How long the demo waits for the completion events of the jobs that ended.
EVENTS_WAIT_SECONDS = 15.0
# How long its data job type's canary has to be taken back by its guard (aijobs.demo_canary).
CANARY_SECONDS = 60.0
# The local provider's own limit, and the shared limit the workers keep to it.
DEMO_RPM = 120
BURST_JOBS = 8
# A background backfill far larger than the limit's ten seconds, and interactive jobs sent during it.
BACKFILL_JOBS = 40
DURING_BACKFILL = 3
# The batch settings of the demo: a short window, a poll a second, a minute's rescue time; jobs
# whose deadline is at least BatchTiming.eligible_ms away go through a batch.
DEMO_BATCH_TIMING = BatchTiming(window_ms=5_000, poll_ms=1_000, rescue_ms=60_000)
DEMO_BATCHES = {
    "AIJOBS_BATCH_API": "on",
    "AIJOBS_BATCH_WINDOW_SECONDS": str(DEMO_BATCH_TIMING.window_ms // 1000),
    "AIJOBS_BATCH_POLL_SECONDS": str(DEMO_BATCH_TIMING.poll_ms // 1000),
    "AIJOBS_BATCH_RESCUE_SECONDS": str(DEMO_BATCH_TIMING.rescue_ms // 1000),
}
# The backfill's deadline: 30 s too near for a batch, so that it shows the lanes under the shared limit.
BACKFILL_DEADLINE_SECONDS = DEMO_BATCH_TIMING.eligible_ms // 1000 - 30
# Background jobs with the default deadline (a day): through a batch.
OVERNIGHT_JOBS = 12
DEMO_USER = "demo"
# The user with a daily budget of one job's worst case.
CAPPED_USER = "capped"


@dataclass(frozen=True, slots=True)
class SampleJob:
    job_id: str
    job_type: str
    job_input: dict[str, Any]
    expected: JobStatus
    expected_code: ErrorCode | None = None
    # Sent as a raw SQS message (docs/messages.md) instead of through the client.
    as_message: bool = False
    note: str = ""
    user_id: str = DEMO_USER
    # Submitted once this job (an id) has ended, rather than at the start.
    after: str | None = None
    deadline_seconds: int | None = None
    lane: Lane = Lane.INTERACTIVE
    # Sample files (aijobs.local.samples) it carries, uploaded to the payload bucket.
    attachments: tuple[str, ...] = ()


ARTICLE = (
    "Amazon SQS is a fully managed message queuing service that lets you decouple and scale "
    "microservices, distributed systems and serverless applications. Messages are stored "
    "redundantly and delivered at least once, so consumers must be idempotent."
)
DOCUMENTS = [
    {"id": "retention", "text": "SQS keeps messages 4 days by default and up to 14 days."},
    {"id": "size", "text": "An SQS message can be up to 1 MiB."},
    {"id": "visibility", "text": "A received message stays hidden for the visibility timeout."},
]
TICKETS = [
    "My invoice shows the wrong amount",
    "The app crashes when I upload a photo",
    "How do I change my password?",
    "Please cancel my subscription",
    "Win a free cruise, click now!!!",
]
LABELS = ["billing", "bug", "account", "spam"]
# The capped user's jobs all carry this input: each reserves the same worst case.
CAPPED_INPUT: dict[str, Any] = {"text": "Refund the second charge on my card", "labels": LABELS}
DOCUMENT_LABELS = ["invoice", "claim form", "receipt", "contract"]


def sample_jobs(run: str) -> list[SampleJob]:
    """About 30 jobs: most succeed, some meet transient faults and recover, some fail for good, a burst
    keeps to the provider's limit, and a capped user's later jobs wait for their budget."""
    ok, failed = JobStatus.SUCCEEDED, JobStatus.FAILED
    jobs = [
        SampleJob(f"{run}-classify-{n}", "classify", {"text": text, "labels": LABELS}, ok)
        for n, text in enumerate(TICKETS, 1)
    ]
    jobs += [
        SampleJob(f"{run}-summarize-{n}", "summarize", {"text": f"{ARTICLE} (copy {n})", "max_words": 20}, ok)
        for n in range(1, 5)
    ]
    jobs += [
        SampleJob(
            f"{run}-answer-{n}",
            "answer_with_citations",
            {"question": question, "documents": DOCUMENTS},
            ok,
            as_message=n == 1,
        )
        for n, question in enumerate(
            ["How long are messages kept?", "How big can a message be?", "What hides a message?"], 1
        )
    ]

    def faulty(
        name: str, job_type: str, fault: str, expected: JobStatus, code: ErrorCode | None, note: str
    ) -> SampleJob:
        job_id = f"{run}-{name}"
        marker = f"{job_id} fault:{fault}"
        if job_type == "classify":
            job_input: dict[str, Any] = {"text": f"{TICKETS[0]} {marker}", "labels": LABELS}
        elif job_type == "summarize":
            job_input = {"text": f"{ARTICLE} {marker}", "max_words": 20}
        else:
            job_input = {"question": f"How long are messages kept? {marker}", "documents": DOCUMENTS}
        return SampleJob(job_id, job_type, job_input, expected, code, note=note)

    jobs += [
        faulty("rate-limited", "classify", "rate_limited*1", ok, None, "429 + Retry-After, then OK"),
        faulty("unavailable", "summarize", "unavailable*1", ok, None, "503, backoff, then OK"),
        faulty("dropped", "answer_with_citations", "drop*1", ok, None, "connection dropped, then OK"),
        faulty("repairable", "classify", "repairable", ok, None, "invalid answer, repaired by a re-ask"),
        faulty(
            "off-label",
            "classify",
            "business_invalid",
            failed,
            ErrorCode.BUSINESS_VALIDATION_FAILED,
            "label not offered",
        ),
        faulty(
            "bad-citation",
            "answer_with_citations",
            "reference_invalid",
            failed,
            ErrorCode.REFERENCE_VALIDATION_FAILED,
            "cites an unknown document",
        ),
        faulty("not-json", "summarize", "non_json", failed, ErrorCode.SCHEMA_VALIDATION_FAILED, "never valid JSON"),
    ]
    jobs += [
        SampleJob(
            f"{run}-burst-{n}",
            "classify",
            {"text": f"{TICKETS[n % len(TICKETS)]} (burst {n})", "labels": LABELS},
            ok,
            note=f"a burst, spaced to the provider's {DEMO_RPM} rpm",
        )
        for n in range(1, BURST_JOBS + 1)
    ]
    jobs += [
        SampleJob(
            f"{run}-backfill-{n}",
            "classify",
            {"text": f"{TICKETS[n % len(TICKETS)]} (backfill {n})", "labels": LABELS},
            ok,
            note="a background backfill, under the same limit",
            user_id="backfill",
            lane=Lane.BACKGROUND,
            deadline_seconds=BACKFILL_DEADLINE_SECONDS,
        )
        for n in range(1, BACKFILL_JOBS + 1)
    ]
    jobs += [
        SampleJob(
            f"{run}-overnight-{n}",
            "classify",
            {"text": f"{TICKETS[n % len(TICKETS)]} (overnight {n})", "labels": LABELS},
            ok,
            note="background, a day to spare: through a batch, at half price",
            user_id="overnight",
            lane=Lane.BACKGROUND,
        )
        for n in range(1, OVERNIGHT_JOBS + 1)
    ]
    jobs += [
        SampleJob(
            f"{run}-meanwhile-{n}",
            "classify",
            {"text": f"{TICKETS[n % len(TICKETS)]} (while the backfill drains)", "labels": LABELS},
            ok,
            note="interactive, sent while the backfill drains: answered at once",
            after=f"{run}-backfill-{n * 4}",
        )
        for n in range(1, DURING_BACKFILL + 1)
    ]
    first = f"{run}-budget-1"
    jobs.append(SampleJob(first, "classify", CAPPED_INPUT, ok, user_id=CAPPED_USER, note="within its user's budget"))
    jobs += [
        SampleJob(
            f"{run}-budget-{n}",
            "classify",
            CAPPED_INPUT,
            failed,
            ErrorCode.BUDGET_EXCEEDED,
            user_id=CAPPED_USER,
            after=first,
            deadline_seconds=60,
            note="its user's budget is spent",
        )
        for n in (2, 3)
    ]
    jobs += document_jobs(run)
    jobs.append(
        SampleJob(
            f"{run}-bad-input",
            "classify",
            {"text": "one label is not a choice", "labels": ["only"]},
            failed,
            ErrorCode.INPUT_VALIDATION_FAILED,
            as_message=True,
            note="input rejected at the edge",
        )
    )
    return jobs


def document_jobs(run: str) -> list[SampleJob]:
    """Jobs that read the sample files: each only when its job type takes what it carries."""
    ok = JobStatus.SUCCEEDED
    jobs = [
        SampleJob(
            f"{run}-invoice",
            "summarize",
            {"text": "The invoice attached, for the accounts team.", "max_words": 30},
            ok,
            note="a 2-page PDF, read in real time",
            attachments=(INVOICE,),
        ),
        SampleJob(
            f"{run}-claim-form",
            "classify",
            {"text": "What kind of document is attached?", "labels": DOCUMENT_LABELS},
            ok,
            note="a scanned form (PNG), read in real time",
            attachments=(SCANNED_FORM,),
        ),
        SampleJob(
            f"{run}-overnight-documents",
            "classify",
            {"text": "What kind of documents are attached?", "labels": DOCUMENT_LABELS},
            ok,
            note="a PDF and a photo (JPEG), background with a day to spare: through a batch",
            user_id="overnight",
            lane=Lane.BACKGROUND,
            attachments=(INVOICE, PRODUCT_PHOTO),
        ),
        SampleJob(
            f"{run}-panorama",
            "summarize",
            {"text": "The photo attached.", "max_words": 20},
            JobStatus.FAILED,
            ErrorCode.ATTACHMENT_INVALID,
            note="an image 9,000 px wide, past the provider's 8,000: refused before any call",
            attachments=(PANORAMA,),
        ),
    ]
    registry = JobRegistry()
    return [job for job in jobs if takes_its_attachments(registry, job)]


def takes_its_attachments(registry: JobRegistry, job: SampleJob) -> bool:
    """Whether the job's type takes as many attachments as it carries, and of their media types."""
    policy = registry.get(job.job_type).attachments
    types = {media_type_of(sample(name)) for name in job.attachments}
    return policy.min_count <= len(job.attachments) <= policy.max_count and types <= policy.media_types


def upload_attachments(stack: DevStack, job: SampleJob) -> list[dict[str, str]]:
    """The job's sample files put in the payload bucket, under attachments/<job id>/ as the client puts
    a submission's files, and the message's references to them."""
    s3 = stack.session.client("s3", endpoint_url=stack.settings.aws_endpoint_url)
    bucket = stack.settings.jobs_payload_bucket
    refs = []
    for number, name in enumerate(job.attachments, 1):
        ref = AttachmentRef(bucket, f"attachments/{job.job_id}/{number}-{name}", name)
        s3.put_object(Bucket=bucket, Key=ref.key, Body=sample(name))
        refs.append(ref.document())
    return refs


def submit(client: AiJobsClient, stack: DevStack, jobs: list[SampleJob], submitted: dict[str, float]) -> None:
    """Submit `jobs`, noting when each was (monotonic seconds). A job with attachments is sent as a
    message that names them, once they are uploaded."""
    sqs = stack.session.client("sqs", endpoint_url=stack.settings.aws_endpoint_url)
    queues = {Lane.INTERACTIVE: stack.settings.jobs_queue_url, Lane.BACKGROUND: stack.resources.background_queue_url}
    for job in jobs:
        submitted[job.job_id] = time.monotonic()
        if job.as_message or job.attachments:
            body: dict[str, Any] = {
                "job_id": job.job_id,
                "job_type": job.job_type,
                "user_id": job.user_id,
                "input": job.job_input,
                "lane": job.lane.value,
            }
            if job.attachments:
                body["attachments"] = upload_attachments(stack, job)
            sqs.send_message(QueueUrl=str(queues[job.lane]), MessageBody=json.dumps(body), MessageGroupId=job.user_id)
        else:
            client.submit(
                job.job_type,
                job.user_id,
                job.job_input,
                job_id=job.job_id,
                deadline_seconds=job.deadline_seconds,
                lane=job.lane,
            )


def progress_table(jobs: list[SampleJob], views: dict[str, JobView | None]) -> Table:
    table = Table(title="aijobs demo: sample jobs on the embedded stack")
    # The note wraps when the terminal is narrow: the columns before it stay whole.
    for column in ("job", "type", "status", "error", "attempts", "tokens", "as meant", "what happens"):
        table.add_column(column, no_wrap=column != "what happens")
    for job in jobs:
        view = views.get(job.job_id)
        done = view is not None and view.status.is_terminal
        table.add_row(
            job.job_id.split("-", 1)[1],
            job.job_type,
            status_text(view.status) if view else "-",
            view.error.code.value if view and view.error else "",
            f"{view.attempt_count}/{view.max_attempts}" if view else "-",
            str(view.usage.input_tokens + view.usage.output_tokens) if view else "-",
            ("[green]yes[/]" if ended_as_meant(job, view) else "[red]no[/]") if done else "",
            job.note,
        )
    return table


# The failures that come before any provider call: a job that ends so was billed nothing.
BEFORE_ANY_CALL = frozenset(
    {ErrorCode.ATTACHMENT_INVALID, ErrorCode.INPUT_VALIDATION_FAILED, ErrorCode.BUDGET_EXCEEDED}
)


def ended_as_meant(job: SampleJob, view: JobView | None) -> bool:
    if view is None or view.status is not job.expected:
        return False
    if job.expected_code in BEFORE_ANY_CALL and (view.usage.input_tokens or view.usage.output_tokens):
        return False
    return job.expected_code is None or (view.error is not None and view.error.code is job.expected_code)


def demo_options() -> DevStackOptions:
    """The embedded stack with fleet control on: the provider's own limit, the same limit shared by
    the workers, and budgets read (users without a cap of their own are not capped); and batches."""
    return DevStackOptions(
        aws_port=0,
        provider_port=0,
        concurrency=2,
        quiet=True,
        provider_rpm=DEMO_RPM,
        function_environment={
            "AIJOBS_PROVIDER_LIMITS": json.dumps({LOCAL_MODEL: {"rpm": DEMO_RPM}}),
            "AIJOBS_DEFAULT_DAILY_BUDGET_USD": "unlimited",
            **DEMO_BATCHES,
        },
    )


def run_demo(console: Console, timeout_seconds: float = 120.0) -> bool:
    """Run the demo; True when every job ended as it was meant to."""
    # The live table is the demo's output: the functions' own logs and metrics would tear it.
    engine_logger.setLevel(logging.ERROR)
    with DevStack(demo_options()) as stack:
        client = AiJobsClient.from_settings(stack.settings, stack.session)
        prefix = f"demo{int(time.time())}"
        jobs = sample_jobs(prefix)
        # The capped user's cap: exactly one of their jobs' worst case, so one runs and the rest wait.
        cap = client.set_budget(CAPPED_USER, stack.worst_case_usd("classify", CAPPED_INPUT)).cap_usd
        started = time.monotonic()
        waiting = [job for job in jobs if job.after is not None]
        submitted: dict[str, float] = {}
        submit(client, stack, [job for job in jobs if job.after is None], submitted)
        views: dict[str, JobView | None] = {}
        ended_after: dict[str, float] = {}
        deadline = started + timeout_seconds
        with Live(progress_table(jobs, views), console=console, auto_refresh=False) as live:
            while time.monotonic() < deadline:
                ready = [job for job in waiting if job.after in ended_after]
                submit(client, stack, ready, submitted)
                waiting = [job for job in waiting if job not in ready]
                for job in jobs:
                    if job.job_id in ended_after or job in waiting:
                        continue
                    try:
                        view: JobView | None = client.get(job.job_id)
                    except JobNotFoundError:
                        view = None  # a raw message not yet claimed
                    views[job.job_id] = view
                    if view is not None and view.status.is_terminal:
                        ended_after[job.job_id] = time.monotonic() - submitted[job.job_id]
                live.update(progress_table(jobs, views), refresh=True)
                if len(ended_after) == len(jobs):
                    break
                time.sleep(POLL_SECONDS)
        events = completion_events(stack, {job.job_id for job in jobs if job.job_id in ended_after})
        console.print()
        console.print(
            summary(jobs, views, ended_after, time.monotonic() - started, stack.options.provider_latency_seconds)
        )
        assert stack.provider is not None
        console.print(fleet_summary(client, cap, stack.provider.log))
        store = build_store(stack.settings, Aws(stack.settings, stack.session))
        attempts = {job.job_id: store.attempts(job.job_id) for job in jobs}
        console.print(batch_summary(stack, jobs, attempts))
        if any(job.attachments for job in jobs):
            console.print(documents_summary(jobs, views, stack.provider.log))
        console.print(events_summary(jobs, events))
        canary = run_canary(client, prefix, CANARY_SECONDS)
        console.print(canary_summary(canary))
        as_meant = all(ended_as_meant(job, views.get(job.job_id)) for job in jobs)
        return as_meant and routed_as_meant(jobs, attempts) and one_event_each(jobs, events) and canary.as_meant


def completion_events(stack: DevStack, ended: set[str]) -> list[dict[str, Any]]:
    """The completion events the stack's bus delivered, read until every ended job has one (or
    EVENTS_WAIT_SECONDS have passed), and a moment more for any duplicate."""
    sqs = stack.session.client("sqs", endpoint_url=stack.settings.aws_endpoint_url)
    return EventsTap(sqs, stack.resources.events_queue_url).collect(ended, EVENTS_WAIT_SECONDS)


def one_event_each(jobs: list[SampleJob], events: list[dict[str, Any]]) -> bool:
    per_job = Counter(event["detail"]["job_id"] for event in events)
    return all(per_job[job.job_id] == 1 for job in jobs)


def events_summary(jobs: list[SampleJob], events: list[dict[str, Any]]) -> Table:
    per_job = Counter(event["detail"]["job_id"] for event in events)
    by_type = Counter(event["detail-type"] for event in events)
    table = Table(title="completion events", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("received", ", ".join(f"{kind} {count}" for kind, count in sorted(by_type.items())) or "none")
    missing = [job.job_id for job in jobs if per_job[job.job_id] == 0]
    twice = [job.job_id for job in jobs if per_job[job.job_id] > 1]
    table.add_row(
        "one per job",
        "yes: every job ended with exactly one event"
        if not missing and not twice
        else f"[red]no[/]: {len(missing)} without an event, {len(twice)} with more than one",
    )
    return table


def summary(
    jobs: list[SampleJob],
    views: dict[str, JobView | None],
    ended_after: dict[str, float],
    elapsed: float,
    provider_seconds: float,
) -> Table:
    """`ended_after`: each ended job's time from its submission to its end (seconds); `provider_seconds`:
    how long the local provider takes to answer a call."""
    present = [view for view in views.values() if view is not None]
    statuses = Counter(view.status.value for view in present)
    table = Table(title="summary", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("jobs", f"{len(jobs)} ({len(ended_after)} ended in {elapsed:.1f}s)")
    table.add_row("status", ", ".join(f"{status} {count}" for status, count in sorted(statuses.items())))
    table.add_row("as meant", f"{sum(ended_as_meant(job, views.get(job.job_id)) for job in jobs)} of {len(jobs)}")
    table.add_row(
        "tokens", f"{sum(v.usage.input_tokens for v in present)} in / {sum(v.usage.output_tokens for v in present)} out"
    )
    cost = sum((Decimal(repr(v.usage.cost_usd)) for v in present), Decimal(0))
    table.add_row("cost", f"{usd(cost)} (list prices of gpt-4o-mini)")
    for lane in Lane:
        latencies = sorted(ended_after[job.job_id] for job in jobs if job.lane is lane and job.job_id in ended_after)
        if latencies:
            p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
            table.add_row(
                f"{lane} latency",
                f"p50 {statistics.median(latencies):.2f}s, p95 {p95:.2f}s over {len(latencies)} jobs (submit to end)",
            )
    table.add_row("what they include", latency_note(jobs, provider_seconds))
    during = [
        f"{ended_after[job.job_id]:.2f}s" for job in jobs if "-meanwhile-" in job.job_id and job.job_id in ended_after
    ]
    if during:
        table.add_row("during the backfill", f"interactive jobs answered in {', '.join(during)} (submit to end)")
    return table


def latency_note(jobs: list[SampleJob], provider_seconds: float) -> str:
    """What the demo's latencies are made of: waits it asks for, not slowness."""
    at_once = sum(job.lane is Lane.INTERACTIVE and job.after is None for job in jobs)
    return (
        f"waits the demo makes on purpose: {at_once} interactive jobs sent at once share a limit of "
        f"{DEMO_RPM} requests/min ({DEMO_RPM / 60:g} a second), so the last of them waits its turn; jobs "
        "given a fault wait out a backoff (or the provider's Retry-After) before their next attempt; the "
        "capped user's wait for budget until their deadline; background jobs leave the shared limit to "
        f"interactive ones, or wait for their batch (a {DEMO_BATCH_TIMING.window_ms // 1000} s window, then "
        f"the batch). The local provider answers a call in {provider_seconds:g} s: the line below is an "
        "interactive job with nothing ahead of it"
    )


def meant_for_a_batch(job: SampleJob) -> bool:
    """Background, with a day to spare."""
    return "-overnight-" in job.job_id


def routed_as_meant(jobs: list[SampleJob], attempts: dict[str, list[AttemptRecord]]) -> bool:
    """Every job meant for a batch was answered through one; every other job in real time."""
    return all(
        {attempt.via for attempt in attempts[job.job_id]} <= {Via.BATCH if meant_for_a_batch(job) else Via.REALTIME}
        for job in jobs
    )


def batch_summary(stack: DevStack, jobs: list[SampleJob], attempts: dict[str, list[AttemptRecord]]) -> Table:
    """What the batched jobs cost, against the same calls (their tokens) at the real-time price,
    and which background jobs ran in real time (`attempts`: each job's)."""
    prices = price_table(stack.settings)
    meant = [job for job in jobs if meant_for_a_batch(job)]
    batched = [attempt for job in meant for attempt in attempts[job.job_id] if attempt.via is Via.BATCH]
    paid = sum((attempt.cost_usd for attempt in batched), Decimal(0))
    realtime = sum((prices.cost(attempt.model or LOCAL_MODEL, attempt).usd for attempt in batched), Decimal(0))
    table = Table(title="batches", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "through a batch",
        f"{len({attempt.job_id for attempt in batched})} of {len(meant)} background jobs with a day to spare, in "
        f"{len({attempt.batch_id for attempt in batched})} batch(es) of the local provider's batch API",
    )
    backfill = [job for job in jobs if job.lane is Lane.BACKGROUND and not meant_for_a_batch(job)]
    realtime_only = [job for job in backfill if all(attempt.via is Via.REALTIME for attempt in attempts[job.job_id])]
    table.add_row(
        "in real time",
        f"{len(realtime_only)} of {len(backfill)} backfill jobs, "
        f"their deadline ({BACKFILL_DEADLINE_SECONDS} s) too near for a batch",
    )
    if realtime:
        table.add_row(
            "cost",
            f"{usd(paid)} against {usd(realtime)} for the same tokens in real time ({paid / realtime:.2f} of it)",
        )
    return table


def documents_summary(jobs: list[SampleJob], views: dict[str, JobView | None], log: list[ServedRequest]) -> Table:
    """What the document jobs read, and what the provider billed for their pages and images."""
    carrying = [job for job in jobs if job.attachments]
    table = Table(title="documents", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for job in carrying:
        view = views.get(job.job_id)
        outcome = status_text(view.status) if view else "-"
        if view is not None and view.error is not None:
            outcome += f" {view.error.code.value}: {view.error.message}"
        table.add_row(job.job_id.split("-", 1)[1], f"{', '.join(job.attachments)}: {outcome}")
    billed = sum(entry.attachment_tokens for entry in log)
    answered = sum(entry.attachment_tokens > 0 for entry in log)
    table.add_row(
        "billed",
        f"{billed} input tokens for pages and images over {answered} answers (the provider's own count: an "
        "image by OpenAI's tile formula, a PDF page as an image at 150 DPI, plus its text)",
    )
    return table


def fleet_summary(client: AiJobsClient, cap: Decimal, log: list[ServedRequest]) -> Table:
    """What fleet control did: the calls against the provider's own limit, and the capped user's day."""
    # Calls in real time only: a batch's lines are answered under the batch API's own limits.
    answered = sorted(entry.at for entry in log if entry.status is not None and entry.batch_id is None)
    window = 10.0
    busiest = max((bisect_right(answered, at + window) - n for n, at in enumerate(answered)), default=0)
    refused = sum(entry.limited for entry in log)
    table = Table(title="fleet control", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "provider limit",
        f"{DEMO_RPM} requests/min at the provider, shared by the workers: {len(answered)} calls, at most "
        f"{busiest} in any {window:g} s (the limit: {DEMO_RPM * window / 60:g}), {refused} refused by its own limit "
        "(a repair re-ask is counted against the shared limit after it is made)",
    )
    day = client.budget(CAPPED_USER)
    if day is not None:
        table.add_row(
            "budget",
            f"user {CAPPED_USER}: a daily cap of {usd(cap)} (one classify job's worst case), "
            f"spent {usd(day.spent_usd)}, left {usd(day.left_usd)}; their later jobs found no budget left "
            "and, their deadline too near to wait for it, ended budget_exceeded",
        )
    return table
