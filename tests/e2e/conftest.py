"""The whole stack over HTTP: a moto server on 127.0.0.1 with the template's resources, or the embedded
stack of a module's own `dev_stack` fixture."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from aijobs.client import AiJobsClient
from aijobs.local.devstack import DevStack
from aijobs.stack import StackResources, create_stack_resources
from engine.config import load_settings
from engine.store import DynamoJobStore
from engine.wiring import Aws, build_store
from tests.support.dev_process import DevProcess


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def endpoint_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> StackResources:
    """Point boto3 at the server, create a fresh stack on it, and export its settings."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    stack_name = f"e2e-{uuid.uuid4().hex[:8]}"
    resources = create_stack_resources(stack_name, session=boto3.Session(region_name="us-east-1"))
    for name, value in resources.environment().items():
        monkeypatch.setenv(name, value)
    return resources


@pytest.fixture
def dev_env(dev_stack: DevStack, aws_environment: None, monkeypatch: pytest.MonkeyPatch) -> DevStack:
    """Point this test (after the suite's own AWS environment) at the embedded stack its module's
    `dev_stack` fixture started, as `aijobs dev` prints it: the CLI in this process reads it so."""
    for name, value in dev_stack.environment.items():
        monkeypatch.setenv(name, value)
    return dev_stack


# The stack of a module's own `dev` fixture (an `aijobs dev` process, tests.support.dev_process), as
# the exports it printed name it.


@pytest.fixture(scope="module")
def session(dev: DevProcess) -> boto3.Session:
    return boto3.Session(
        aws_access_key_id=dev.exported["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=dev.exported["AWS_SECRET_ACCESS_KEY"],
        region_name=dev.exported["AWS_DEFAULT_REGION"],
    )


@pytest.fixture(scope="module")
def store(dev: DevProcess, session: boto3.Session) -> DynamoJobStore:
    settings = load_settings(dev.exported)
    return build_store(settings, Aws(settings, session))


@pytest.fixture(scope="module")
def client(dev: DevProcess, session: boto3.Session) -> AiJobsClient:
    return AiJobsClient.from_settings(load_settings(dev.exported), session)
