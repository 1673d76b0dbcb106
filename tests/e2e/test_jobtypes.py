"""Your own job types on the embedded stack: the example in src/jobtypes runs as the deployed worker
would run it, with no setting naming it, through the local provider over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aijobs.client import AiJobsClient
from aijobs.local.devstack import DevStack, DevStackOptions
from engine.core import JobStatus

# Every wait in this module is bounded by this many seconds.
BOUND = 60.0


@pytest.fixture(scope="module")
def dev_stack() -> Iterator[DevStack]:
    stack = DevStack(DevStackOptions(aws_port=0, provider_port=0, provider_latency_seconds=0, quiet=True))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_the_example_job_type_of_your_own_runs_on_the_embedded_stack(dev_stack: DevStack) -> None:
    # Given the stack's client, which knows the jobtypes package as the worker does
    client = AiJobsClient.from_settings(dev_stack.settings, dev_stack.session)
    text = "Ada Lovelace, Analytical Engines Ltd. Reach me at ada@example.org or +44 20 7946 0958."

    # When an extract_contact job is submitted
    submitted = client.submit("extract_contact", "ada", {"text": text}, job_id="contact-1")
    view = client.wait(submitted.job_id, timeout_seconds=BOUND, poll_seconds=0.2)

    # Then it succeeds on its first attempt, with the contacts the text gives, checked by its own rule
    assert (view.status, view.attempt_count, view.error) == (JobStatus.SUCCEEDED, 1, None)
    assert view.output is not None
    assert (view.output["email"], view.output["phone"]) == ("ada@example.org", "+442079460958")
    assert view.usage.input_tokens > 0
