"""The stack the in-process figures run on: the template's resources on moto (fitted), in this process."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from moto import mock_aws

from aijobs.local.devstack import LOCAL_CREDENTIALS
from aijobs.local.moto_patches import fit_moto
from aijobs.stack import StackResources, create_stack_resources


@contextmanager
def moto_stack() -> Iterator[StackResources]:
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    fit_moto()
    with mock_aws():
        yield create_stack_resources(f"bench-{uuid.uuid4().hex[:6]}")
