"""Wiring: each function's parts, built once from one Settings object and one boto3 session.

A Lambda handler is `entry_point(build)`: on its first invocation it reads the settings and builds
its parts, then keeps them for every warm invocation. Tests and the embedded stack call the same
`build_*` functions with Settings and a session of their own, and wrap the result with
`lambda_function`; nothing reads or rewrites os.environ to reconfigure the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from engine.aws_errors import is_transient
from engine.config import Settings, load_settings
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import build_gateway
from engine.observability import Event, Handle, lambda_function
from engine.queue import JobQueue
from engine.reconciler import Reconciler
from engine.runner import JobRunner
from engine.store import DynamoJobStore, PayloadStore
from engine.worker import Worker

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


def build_store(settings: Settings, aws: Aws) -> DynamoJobStore:
    # The S3 client is made on first use: most jobs never touch the payload bucket.
    payloads = PayloadStore(settings.jobs_payload_bucket, lambda: aws.client("s3"))
    return DynamoJobStore(
        settings.jobs_table_name,
        client=aws.client("dynamodb"),
        retention_days=settings.aijobs_retention_days,
        payloads=payloads,
    )


def build_worker(settings: Settings, session: boto3.Session | None = None) -> Worker:
    aws = Aws(settings, session)
    store = build_store(settings, aws)
    registry = JobRegistry.from_settings(settings)
    runner = JobRunner(
        store,
        build_gateway(settings),
        registry,
        DeadLetterRecorder(store, registry),
        default_lease_ms=settings.aijobs_default_lease_seconds * 1000,
        is_transient=is_transient,
    )
    return Worker(runner, JobQueue(settings.jobs_queue_url, aws.client("sqs")))


def build_recorder(settings: Settings, session: boto3.Session | None = None) -> DeadLetterRecorder:
    return DeadLetterRecorder(build_store(settings, Aws(settings, session)), JobRegistry.from_settings(settings))


def build_reconciler(settings: Settings, session: boto3.Session | None = None) -> Reconciler:
    aws = Aws(settings, session)
    return Reconciler(build_store(settings, aws), JobQueue(settings.jobs_queue_url, aws.client("sqs")))


def entry_point(build: Callable[[Settings], Handle]) -> Handle:
    """A Lambda handler whose parts are built on its first invocation, from the settings read once."""
    built: Handle | None = None
    lock = threading.Lock()

    def lambda_handler(event: Event, context: Any) -> Any:
        nonlocal built
        with lock:
            if built is None:
                settings = load_settings()
                built = lambda_function(build(settings), tracing=settings.tracing_enabled)
        return built(event, context)

    return lambda_handler
