"""Wiring: each function's parts, built once from one Settings object and one boto3 session.

A Lambda handler (src/handlers) is `entry_point(build)`: on its first invocation it reads the
settings and builds its parts, then keeps them for every warm invocation (with SnapStart, before
the snapshot: see `EntryPoint.prepare`). Tests and the embedded stack call the same `build_*`
functions with Settings and a session of their own, give the parts to the same handlers, and wrap
those with `lambda_function`; nothing reads or rewrites os.environ to reconfigure the engine.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import boto3
from botocore.config import Config

from engine.attachments.limits import limits_for
from engine.attachments.loader import AttachmentLoader
from engine.attachments.pages import PageRanges
from engine.aws_errors import is_transient
from engine.batching.files import BatchFiles
from engine.batching.intake import BatchIntake, BatchTiming
from engine.config import Settings, load_settings
from engine.core import Lane
from engine.core.errors import ConfigurationError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobDefinition, JobRegistry
from engine.definitions.catalog import DataJobTypes
from engine.definitions.pipelines import MAX_PARTS
from engine.fleet.admission import Admission
from engine.fleet.budgets import Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import ModelLimit
from engine.gateway import ModelGateway, api_key_source, build_gateway
from engine.observability import Event, Handle, lambda_function
from engine.pipelines import ChildEnds, Pipelines
from engine.queue import JobQueue, JobQueues
from engine.runner import JobRunner
from engine.store import DynamoJobStore, PayloadStore
from engine.store.attachments import S3Attachments
from engine.store.budgets import BudgetTable
from engine.store.limits import LimitTable
from engine.worker import Worker

# What only the batcher, the events function and the reconciler use is imported where they are built:
# a worker's cold start loads none of it.
if TYPE_CHECKING:
    from engine.batching.batcher import Batcher
    from engine.events import CompletionEvents
    from engine.gateway.batches import BatchProvider
    from engine.job_type_tally import JobTypeTally
    from engine.reconciler import Reconciler

# Enough pooled connections for a whole batch of records running concurrently.
POOL_CONNECTIONS = 32


class Aws:
    """boto3 clients on one session, pointed at the settings' endpoint when there is one (a local stack)."""

    def __init__(self, settings: Settings, session: boto3.Session | None = None) -> None:
        self._session = session or boto3.Session()
        self._endpoint_url = settings.aws_endpoint_url

    def client(self, service: str) -> Any:
        config = Config(max_pool_connections=POOL_CONNECTIONS, retries={"mode": "standard"})
        return self._session.client(service, endpoint_url=self._endpoint_url, config=config)  # type: ignore[call-overload]


def build_payloads(settings: Settings, aws: Aws) -> PayloadStore:
    # The S3 client is made on first use: most jobs never touch the payload bucket.
    return PayloadStore(settings.jobs_payload_bucket, lambda: aws.client("s3"))


def build_store(settings: Settings, aws: Aws) -> DynamoJobStore:
    payloads = build_payloads(settings, aws)
    return DynamoJobStore(
        settings.jobs_table_name,
        client=aws.client("dynamodb"),
        retention_days=settings.aijobs_retention_days,
        payloads=payloads,
    )


def data_job_types(settings: Settings, aws: Aws) -> DataJobTypes:
    """The data job types as the table keeps them (docs/jobtypes.md): their labels read once a refresh
    period, each version compiled once. Their store is imported here, where it is built."""
    from engine.store.job_types import JobTypeTable

    return DataJobTypes(
        JobTypeTable(settings.jobs_table_name, aws.client("dynamodb")),
        compile=compile_data_job_type,
        refresh_seconds=settings.aijobs_job_types_refresh_seconds,
    )


def compile_data_job_type(document: Mapping[str, Any], version: int) -> JobDefinition:
    """engine.definitions.data.compile_job_type, imported on a first data job: its JSON Schema and CEL
    libraries are a cold start's cost only where a data job type is served (docs/performance.md)."""
    from engine.definitions.data import compile_job_type

    return compile_job_type(document, version)


def build_registry(settings: Settings, aws: Aws) -> JobRegistry:
    """Every job type a function serves: the code job types the settings name, and the data job types."""
    return JobRegistry.from_settings(settings, data=data_job_types(settings, aws))


class WorkerParts(NamedTuple):
    """The worker function's parts: the engine's worker, and the queues its records come from (where
    handlers.worker hides the messages that come back later)."""

    worker: Worker
    queues: JobQueues


def build_worker(
    settings: Settings,
    session: boto3.Session | None = None,
    *,
    registry: JobRegistry | None = None,
    queue: JobQueue | JobQueues | None = None,
) -> WorkerParts:
    """The worker the settings describe; `registry` and `queue` replace the ones they would give."""
    aws = Aws(settings, session)
    store = build_store(settings, aws)
    gateway = build_gateway(settings)
    queues = JobQueues.of(queue or build_queues(settings, aws))
    runner = build_runner(settings, store, gateway, registry or build_registry(settings, aws), aws, queues)
    if settings.budgets_enabled and (unpriced := gateway.unpriced_models()):
        raise ConfigurationError(
            f"AIJOBS_PRICES: model {unpriced[0]!r} has no price, so no budget can hold what it costs; "
            "give it one in AIJOBS_PRICES (the template's Prices)"
        )
    batching = None
    if settings.aijobs_batch_api:
        files = BatchFiles(build_payloads(settings, aws))
        batching = BatchIntake(files, gateway.plan, batch_timing(settings))
    worker = Worker(
        runner,
        admission=build_admission(settings, aws),
        planner=gateway.plan,
        batching=batching,
        rng=random.SystemRandom(),
    )
    return WorkerParts(worker, queues)


def build_page_ranges(settings: Settings, aws: Aws) -> PageRanges:
    """What cuts a pipeline's PDF into its children's page ranges: read as attachments are (the same
    buckets, at most the provider's file size), written to the payload bucket (docs/pipelines.md)."""
    buckets = {settings.jobs_payload_bucket, *settings.aijobs_attachment_buckets}
    limits = limits_for(settings.ai_provider, settings.aijobs_attachment_limits)
    return PageRanges(
        S3Attachments(lambda: aws.client("s3")),
        build_payloads(settings, aws),
        buckets,
        max_bytes=limits.max_file_bytes,
        max_parts=MAX_PARTS,
        max_part_pages=limits.max_pdf_pages,
    )


def build_attachments(settings: Settings, aws: Aws) -> AttachmentLoader:
    """The attachments' loader: the payload bucket and AIJOBS_ATTACHMENT_BUCKETS, read with the S3 client
    made on first use, checked against the configured provider's limits (docs/attachments.md)."""
    buckets = {settings.jobs_payload_bucket, *settings.aijobs_attachment_buckets}
    limits = limits_for(settings.ai_provider, settings.aijobs_attachment_limits)
    return AttachmentLoader(S3Attachments(lambda: aws.client("s3")), buckets, limits)


def build_runner(
    settings: Settings,
    store: DynamoJobStore,
    gateway: ModelGateway,
    registry: JobRegistry,
    aws: Aws,
    queues: JobQueues | None = None,
) -> JobRunner:
    """The runner; with `queues`, it runs pipelines too (their children's messages go there)."""
    return JobRunner(
        store,
        gateway,
        registry,
        DeadLetterRecorder(store, registry),
        default_lease_ms=settings.aijobs_default_lease_seconds * 1000,
        # No state to copy into a snapshot: environments restored from one SnapStart snapshot must
        # not share a jitter sequence.
        rng=random.SystemRandom(),
        is_transient=is_transient,
        max_receives=settings.aijobs_max_receive_count,
        attachments=build_attachments(settings, aws),
        pipelines=Pipelines(store, queues, registry, documents=build_page_ranges(settings, aws))
        if queues is not None
        else None,
        flex=settings.aijobs_flex,
    )


def batch_timing(settings: Settings) -> BatchTiming:
    return BatchTiming(
        window_ms=settings.aijobs_batch_window_seconds * 1000,
        poll_ms=settings.aijobs_batch_poll_seconds * 1000,
        rescue_ms=settings.aijobs_batch_rescue_seconds * 1000,
    )


def build_batch_provider(settings: Settings, aws: Aws) -> BatchProvider:
    """The configured provider's batch API: OpenAI-compatible Files and Batches, Anthropic's Message
    Batches, or Bedrock's batch inference jobs (their files in the payload bucket, read and written by
    the template's service role)."""
    if settings.ai_provider == "bedrock":
        from engine.gateway.bedrock_batch import BedrockBatchProvider

        if settings.aijobs_batch_role_arn is None:
            raise ConfigurationError(
                "AIJOBS_BATCH_ROLE_ARN: not set; Bedrock's batch inference jobs need the service role the "
                "template makes (BatchApi=on)"
            )
        return BedrockBatchProvider(
            build_payloads(settings, aws), settings.aijobs_batch_role_arn, client=aws.client("bedrock")
        )
    if settings.ai_provider == "anthropic":
        from engine.gateway.anthropic_batch import AnthropicBatchProvider

        return AnthropicBatchProvider(
            settings.ai_base_url, api_key_source(settings), json_output_models=settings.ai_json_output_models
        )
    from engine.gateway.openai_batch import OpenAIBatchProvider

    return OpenAIBatchProvider(
        settings.ai_base_url, api_key_source(settings), structured_output=settings.ai_structured_output
    )


def build_batcher(settings: Settings, session: boto3.Session | None = None) -> Batcher:
    """The scheduled batcher (docs/batches.md)."""
    from engine.batching.batcher import Batcher
    from engine.store.batches import BatchTable

    aws = Aws(settings, session)
    store = build_store(settings, aws)
    gateway = build_gateway(settings)
    registry = build_registry(settings, aws)
    return Batcher(
        BatchTable(settings.jobs_table_name, aws.client("dynamodb")),
        BatchFiles(build_payloads(settings, aws)),
        build_batch_provider(settings, aws),
        gateway,
        registry,
        build_runner(settings, store, gateway, registry, aws),
        store,
        build_queues(settings, aws),
        batch_timing(settings),
    )


def build_queues(settings: Settings, aws: Aws) -> JobQueues:
    """Each lane's queue; background jobs share the interactive queue when it has none of its own."""
    sqs = aws.client("sqs")
    queues = {Lane.INTERACTIVE: JobQueue(settings.jobs_queue_url, sqs)}
    if settings.jobs_background_queue_url:
        queues[Lane.BACKGROUND] = JobQueue(settings.jobs_background_queue_url, sqs)
    return JobQueues(queues)


def build_admission(settings: Settings, aws: Aws) -> Admission:
    """Shared rate limits and budgets (engine.fleet). Caps someone set with `aijobs budget set` hold
    whether or not a default cap is configured; with neither caps nor limits, the batch's only cost
    is a read a minute of whether anyone has a cap."""
    limits = {
        model: ModelLimit(limit.rpm, limit.tpm, limit.shards)
        for model, limit in settings.aijobs_provider_limits.items()
    }
    client = aws.client("dynamodb")
    limiter = (
        RateLimiter(LimitTable(settings.jobs_table_name, client), limits, random.SystemRandom()) if limits else None
    )
    table = BudgetTable(settings.jobs_table_name, client, settings.aijobs_retention_days)
    keep = settings.aijobs_background_budget_reserve_percent / 100
    return Admission(limiter, Budgets(table, settings.default_daily_budget_usd), background_keep=keep)


def build_recorder(settings: Settings, session: boto3.Session | None = None) -> DeadLetterRecorder:
    aws = Aws(settings, session)
    return DeadLetterRecorder(build_store(settings, aws), build_registry(settings, aws), is_transient=is_transient)


class EventsParts(NamedTuple):
    """The events function's parts: completion events, then the data job types' stats and guards,
    both on one bus client, and the pipelines moved on by their children's ends."""

    events: CompletionEvents
    tally: JobTypeTally
    pipelines: ChildEnds


def build_events(settings: Settings, session: boto3.Session | None = None) -> EventsParts:
    from engine.events import CompletionEvents, EventPublisher
    from engine.job_type_tally import JobTypeTally
    from engine.store.job_types import JobTypeTable

    aws = Aws(settings, session)
    publisher = EventPublisher(aws.client("events"), settings.aijobs_event_bus)
    tally = JobTypeTally(JobTypeTable(settings.jobs_table_name, aws.client("dynamodb")), publisher)
    pipelines = ChildEnds(build_store(settings, aws), build_queues(settings, aws), build_registry(settings, aws))
    return EventsParts(CompletionEvents(publisher), tally, pipelines)


def build_reconciler(settings: Settings, session: boto3.Session | None = None) -> Reconciler:
    from engine.reconciler import Reconciler

    aws = Aws(settings, session)
    store, queues = build_store(settings, aws), build_queues(settings, aws)
    return Reconciler(store, queues, pipelines=ChildEnds(store, queues, build_registry(settings, aws)))


def build_every_function(settings: Settings) -> None:
    """Every function's parts, built as each handler builds them on its first invocation (the batcher's
    when the settings turn batches on: the stack has BatchFunction only then); what the settings check
    runs at deployment (engine.settings_check). One session for every build: its clients share the
    service models it loads."""
    session = boto3.Session()
    build_worker(settings, session)
    build_recorder(settings, session)
    build_events(settings, session)
    build_reconciler(settings, session)
    if settings.aijobs_batch_api:
        build_batcher(settings, session)


class EntryPoint:
    """A Lambda handler whose parts are built once, from the settings read once.

    They are built on the first invocation, or by `prepare` before then: the handler modules call it
    from SnapStart's before-snapshot hook, so that a restored environment starts with them built.
    """

    def __init__(self, build: Callable[[Settings], Handle]) -> None:
        self._build = build
        self._built: Handle | None = None
        self._lock = threading.Lock()

    def prepare(self) -> Handle:
        with self._lock:
            if self._built is None:
                settings = load_settings()
                self._built = lambda_function(self._build(settings), tracing=settings.tracing_enabled)
            return self._built

    def __call__(self, event: Event, context: Any) -> Any:
        return self.prepare()(event, context)


def entry_point(build: Callable[[Settings], Handle]) -> EntryPoint:
    """The Lambda handler of a function whose parts `build` makes from its settings."""
    handler = EntryPoint(build)
    _before_snapshot(handler.prepare)
    return handler


def _before_snapshot(prepare: Callable[[], object]) -> None:
    """With SnapStart, build the function's parts during the snapshot's initialization.

    snapshot_restore_py is the runtime's hook library (Python 3.12+ managed runtimes); elsewhere
    (locally, in tests) it is absent and the parts are built on the first invocation.
    """
    try:
        from snapshot_restore_py import register_before_snapshot  # type: ignore[import-not-found]
    except ImportError:
        return
    register_before_snapshot(prepare)
