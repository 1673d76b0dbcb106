"""The embedded stack of `aijobs dev` and `aijobs demo`: everything `sam deploy` makes, on one machine.

- a local AWS endpoint (moto) with the queues, table (and its stream), bucket and event bus
  created from template.yaml's own properties, and a queue that every completion event is copied
  to (`aijobs events` reads it);
- a local provider over real HTTP, OpenAI-compatible or, with `AI_PROVIDER=anthropic`, through its
  Anthropic Messages API (or the provider `AI_BASE_URL` names);
- the worker and dead-letter functions, built with the engine's own wiring from Settings that
  point at the local endpoint, and run by local event source mappings with Lambda's batch shape,
  partial batch responses and the template's timeouts; the events function, fed by the table's
  stream (aijobs.local.streams); with AIJOBS_BATCH_API=on, the batcher every few seconds
  (aijobs.local.schedule).

Nothing here reads or changes os.environ: the functions' own settings (`AI_*`, `AIJOBS_*`) come in
as `DevStackOptions.function_environment`, as the template would set them; `environment` holds the
variables another process needs to use the stack (printed by `aijobs dev`), and
`settings`/`session` serve this one. Everything is in memory: a stack that stops keeps nothing.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext

from aijobs.local.aws import LocalAws
from aijobs.local.batches import DEFAULT_BATCH_DELAY_SECONDS
from aijobs.local.poller import EventSourceMapping, MappingStats
from aijobs.local.provider import DEFAULT_FLEX_LATENCY_SECONDS, LocalProvider
from aijobs.local.pushed_examples import PushedExamples
from aijobs.local.schedule import Schedule
from aijobs.local.streams import TableStream
from aijobs.stack import (
    DEFAULT_TEMPLATE,
    StackResources,
    batching_window,
    create_stack_resources,
    function_timeout,
    load_template,
)
from engine.config import Settings, load_settings
from engine.definitions import JobRegistry
from engine.gateway import build_gateway
from engine.observability import Event, Handle, lambda_function
from engine.observability import logger as engine_logger
from engine.store.job_types import JobTypeTable
from engine.wiring import build_batcher, build_events, build_recorder, build_worker
from handlers.dead_letter import dead_letter_handler
from handlers.events import events_handler
from handlers.invocation import scheduled
from handlers.worker import WorkerHandler

# The model id the local provider answers as; priced like the real one, so the demo shows costs.
LOCAL_MODEL = "gpt-4o-mini"
LOCAL_ANTHROPIC_MODEL = "claude-haiku-4-5"
LOCAL_API_KEY = "local-key"
LOCAL_WAIT_SECONDS = 1
# How often the batcher runs locally (every minute in AWS): its polls of the provider still come
# every AIJOBS_BATCH_POLL_SECONDS.
LOCAL_BATCHER_SECONDS = 1.0
# The settings a function reads from the environment the template gives it: `aijobs dev` passes on
# every variable of its own environment with these prefixes.
FUNCTION_VARIABLE_PREFIXES = ("AI_", "AIJOBS_")
# Except the command's own: a deployed stack to talk to is no setting of the functions, and another
# shell told to export it would talk to that stack instead of this one.
COMMAND_VARIABLES = ("AIJOBS_STACK",)
# What the local provider fixes when it serves the jobs: its address and its key.
LOCAL_PROVIDER_VARIABLES = ("AI_BASE_URL", "AI_API_KEY", "AI_API_KEY_SECRET_ARN", "AI_PROVIDER")
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True, slots=True)
class DevStackOptions:
    aws_port: int = 5000
    provider_port: int = 8700
    # The functions' settings (AI_*, AIJOBS_*: the provider, models, prices, job modules, limits,
    # budgets, ...), as the template sets them. With AI_BASE_URL, jobs go to that provider instead of
    # the local one, with this AI_API_KEY and these models.
    function_environment: Mapping[str, str] = field(default_factory=dict)
    provider_latency_seconds: float = 0.3
    fault_rate: float = 0.0
    # The local provider's own rate limit (429 with Retry-After beyond it), per minute.
    provider_rpm: int | None = None
    provider_tpm: int | None = None
    # Reasoning tokens the local provider bills per answer (as a reasoning model would).
    provider_reasoning_tokens: int = 0
    # How long the local provider's batches take to be answered (aijobs.local.batches).
    provider_batch_delay_seconds: float = DEFAULT_BATCH_DELAY_SECONDS
    # How long the local provider takes to answer a request for its flex tier, and the share of those it
    # refuses with 429 "Resource Unavailable" (docs/cost.md).
    provider_flex_latency_seconds: float = DEFAULT_FLEX_LATENCY_SECONDS
    provider_flex_refusal_rate: float = 0.0
    # Job types the local provider answers from examples (`aijobs dev --answers FILE`): {name: [{input, output}]}.
    provider_answers: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    # Pollers of the interactive and the background queues (each lane's MaximumConcurrency).
    concurrency: int = 2
    background_concurrency: int = 2
    stack_name: str = "aijobs"
    # The functions' metrics (EMF on stdout) dropped: a live terminal would be torn by them.
    quiet: bool = False


def function_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that are the functions' settings (AI_*, AIJOBS_*)."""
    return {
        name: value
        for name, value in environ.items()
        if name.upper().startswith(FUNCTION_VARIABLE_PREFIXES) and name.upper() not in COMMAND_VARIABLES
    }


# The loggers of the local event source mappings and schedules (what Lambda's own service would log),
# and of the functions' warnings (Powertools warns of an invocation with no metrics, say).
FUNCTION_LOGGERS = ("aijobs.local", "py.warnings")


@contextmanager
def function_output_to(path: Path) -> Iterator[TextIO]:
    """The functions' output to `path` instead of this process's stdout, as Lambda sends it to
    CloudWatch Logs: the engine's log lines, its metric documents (EMF, which Powertools prints), its
    warnings, and what the local event source mappings log about invocations. Yields the stdout it had,
    for the lines the command itself prints there."""
    terminal = sys.stdout
    handler = engine_logger.registered_handler
    lines = handler if isinstance(handler, logging.StreamHandler) else None
    loggers = [logging.getLogger(name) for name in FUNCTION_LOGGERS]
    with path.open("a", encoding="utf-8", buffering=1) as log, redirect_stdout(log):
        previous = lines.setStream(log) if lines is not None else None
        to_log = logging.StreamHandler(log)
        for logger in loggers:
            logger.addHandler(to_log)
            logger.propagate = False
        logging.captureWarnings(True)
        try:
            yield terminal
        finally:
            logging.captureWarnings(False)
            for logger in loggers:
                logger.propagate = True
                logger.removeHandler(to_log)
            if lines is not None and previous is not None:
                lines.setStream(previous)


def local_session() -> boto3.Session:
    """A boto3 session with the local stack's throwaway credentials."""
    return boto3.Session(
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
    )


class DevStack:
    def __init__(self, options: DevStackOptions | None = None) -> None:
        self.options = options or DevStackOptions()
        # AWS in a process of its own, as it is no part of the functions' own.
        self._aws = LocalAws(port=self.options.aws_port, separate_process=True)
        self.provider: LocalProvider | None = None
        self._mappings: list[EventSourceMapping] = []
        self._schedules: list[Schedule] = []
        self._stream: TableStream | None = None
        self.session = local_session()
        self.environment: dict[str, str] = {}
        self._settings: Settings | None = None
        self._resources: StackResources | None = None

    @property
    def settings(self) -> Settings:
        """The engine's settings for this stack (what `environment` says, parsed)."""
        if self._settings is None:
            raise RuntimeError("the stack is not started")
        return self._settings

    def worst_case_usd(self, job_type: str, job_input: dict[str, Any]) -> Decimal:
        """What an attempt of this job reserves against its user's budget, as this stack's worker
        computes it (ModelGateway.plan: every call it can make, at max tokens and price)."""
        definition = JobRegistry.from_settings(self.settings).get(job_type)
        return build_gateway(self.settings).plan(definition, definition.parse_input(job_input)).worst_case_usd

    @property
    def resources(self) -> StackResources:
        if self._resources is None:
            raise RuntimeError("the stack is not started")
        return self._resources

    def start(self) -> DevStack:
        options = self.options
        self._aws.start()
        endpoint = self._aws.endpoint_url
        self._resources = create_stack_resources(options.stack_name, session=self.session, endpoint_url=endpoint)
        functions = dict(options.function_environment)
        if not functions.get("AI_BASE_URL"):
            self.provider = LocalProvider(
                port=options.provider_port,
                api_key=LOCAL_API_KEY,
                latency_seconds=options.provider_latency_seconds,
                fault_rate=options.fault_rate,
                rpm=options.provider_rpm,
                tpm=options.provider_tpm,
                reasoning_tokens=options.provider_reasoning_tokens,
                batch_delay_seconds=options.provider_batch_delay_seconds,
                answers=options.provider_answers,
                pushed=PushedExamples(self._job_types().versions),
                flex_latency_seconds=options.provider_flex_latency_seconds,
                flex_refusal_rate=options.provider_flex_refusal_rate,
            ).start()
            # The local provider answers any model id: the one asked for, else one priced like the real one.
            # With AI_PROVIDER=anthropic, through its Anthropic Messages API; else its OpenAI-compatible one.
            if functions.get("AI_PROVIDER") == "anthropic":
                local = {"AI_PROVIDER": "anthropic", "AI_BASE_URL": self.provider.anthropic_url}
                model = LOCAL_ANTHROPIC_MODEL
            else:
                local = {"AI_PROVIDER": "openai", "AI_BASE_URL": self.provider.url}
                model = LOCAL_MODEL
            local["AI_API_KEY"] = LOCAL_API_KEY
            functions = (
                {"AI_MODEL_PRIMARY": model}
                | {name: value for name, value in functions.items() if name not in LOCAL_PROVIDER_VARIABLES}
                | local
            )
        elif functions.get("AI_PROVIDER") == "anthropic" and not functions.get("AI_MODEL_PRIMARY"):
            # An Anthropic-compatible provider of your own answers Claude's model ids, as the local one does:
            # not the default model, an OpenAI one (which the settings refuse with AI_PROVIDER=anthropic).
            functions = functions | {"AI_MODEL_PRIMARY": LOCAL_ANTHROPIC_MODEL}
        self.environment = (
            {"AWS_ENDPOINT_URL": endpoint, **LOCAL_CREDENTIALS} | self._resources.environment() | functions
        )
        self._settings = load_settings(self.environment)
        self._start_functions()
        return self

    def _job_types(self) -> JobTypeTable:
        """The data job types pushed to this stack's table (its local provider answers from their examples)."""
        client = self.session.client("dynamodb", endpoint_url=self._aws.endpoint_url)
        return JobTypeTable(self.resources.table_name, client)

    def _start_functions(self) -> None:
        template = load_template(DEFAULT_TEMPLATE)

        def worker_environment() -> Handle:
            return WorkerHandler(*build_worker(self.settings, self.session)).handle

        # Built here, so that bad settings fail the start: the first poller's environment.
        worker = worker_environment()
        recorder = dead_letter_handler(build_recorder(self.settings, self.session))
        events = events_handler(*build_events(self.settings, self.session))
        # The table's stream feeds the events function, as its DynamoDB event source mapping does.
        self._stream = TableStream(
            self.resources.table_name,
            lambda_function(events, emit_metrics=not self.options.quiet),
            self.session,
            self.settings.aws_endpoint_url,
            function_timeout_seconds=function_timeout(template, "EventsFunction"),
        ).start()
        resources = self.resources
        sqs = self.session.client("sqs", endpoint_url=self.settings.aws_endpoint_url)
        # Short long polls: a local endpoint costs nothing per receive, and stop() waits one out.
        # One worker function with an event source mapping per lane, as the template has them.
        worker_function = lambda_function(
            _environments(worker, worker_environment),
            emit_metrics=not self.options.quiet,
        )
        lanes = [
            (resources.queue_url, "JobsQueue", self.options.concurrency),
            (resources.background_queue_url, "BackgroundJobsQueue", self.options.background_concurrency),
        ]
        self._mappings = [
            EventSourceMapping(
                queue_url,
                worker_function,
                batching_window_seconds=batching_window(template, "WorkerFunction", queue),
                function_timeout_seconds=function_timeout(template, "WorkerFunction"),
                concurrency=concurrency,
                function_name="aijobs-worker",
                wait_seconds=LOCAL_WAIT_SECONDS,
                sqs_client=sqs,
            ).start()
            for queue_url, queue, concurrency in lanes
        ]
        self._mappings.append(
            EventSourceMapping(
                resources.dlq_url,
                lambda_function(recorder, emit_metrics=not self.options.quiet),
                function_timeout_seconds=function_timeout(template, "DeadLetterFunction"),
                function_name="aijobs-dead-letters",
                wait_seconds=LOCAL_WAIT_SECONDS,
                sqs_client=sqs,
            ).start()
        )

        if self.settings.aijobs_batch_api:
            batcher = scheduled(build_batcher(self.settings, self.session).run, "Batches")
            self._schedules.append(
                Schedule(
                    lambda_function(batcher, emit_metrics=not self.options.quiet),
                    LOCAL_BATCHER_SECONDS,
                    function_timeout(template, "BatchFunction"),
                    "aijobs-batches",
                ).start()
            )

    def mapping_stats(self, queue_url: str) -> MappingStats:
        """What the event source mapping of a queue did so far (batches, records delivered, ...)."""
        (mapping,) = (mapping for mapping in self._mappings if mapping.queue_url == queue_url)
        return mapping.stats

    def stop(self) -> None:
        for schedule in self._schedules:
            schedule.stop()
        for mapping in self._mappings:
            mapping.stop()
        if self._stream is not None:
            self._stream.stop()
        if self.provider is not None:
            self.provider.stop()
        self._aws.stop()

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _environments(first: Handle, build: Callable[[], Handle]) -> Handle:
    """A handler that gives each poller thread (of every lane's mapping) parts of its own (`first`, then
    built on a thread's first batch): as Lambda runs concurrent invocations in execution environments
    of their own, a worker's limiter state and caches are never shared by invocations running at once."""
    local = threading.local()
    spare = [first]
    lock = threading.Lock()

    def handle(event: Event, context: LambdaContext) -> Any:
        if not hasattr(local, "handle"):
            with lock:
                local.handle = spare.pop() if spare else None
            local.handle = local.handle or build()
        return local.handle(event, context)

    return handle
