"""The whole stack over HTTP: a moto server on 127.0.0.1 with the template's resources."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from aijobs.stack import StackResources, create_stack_resources


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
