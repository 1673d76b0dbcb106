"""Two lanes on the embedded stack: interactive jobs never wait behind a background backlog.

The local provider keeps a limit of its own and the workers share the same limit
(AIJOBS_PROVIDER_LIMITS), as a real provider and the deployed fleet would. A background backlog is
sent at once; interactive jobs submitted while it drains are answered before most of it. What is
asserted is order (which calls the provider saw first), never elapsed time.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from aijobs import AiJobsClient
from aijobs.local.devstack import LOCAL_MODEL, DevStack, DevStackOptions
from engine.core import JobStatus, Lane
from engine.wiring import Aws, build_store
from tests.support.waiting import eventually

RPM = 240  # four calls a second
BACKLOG = 80
INTERACTIVE = 2


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    options = DevStackOptions(
        aws_port=0,
        provider_port=0,
        provider_latency_seconds=0.05,
        provider_rpm=RPM,
        concurrency=2,
        background_concurrency=2,
        quiet=True,
        stack_name=f"lanes-{uuid.uuid4().hex[:6]}",
        function_environment={"AIJOBS_PROVIDER_LIMITS": json.dumps({LOCAL_MODEL: {"rpm": RPM}})},
    )
    with DevStack(options) as started:
        yield started


def classify(job_id: str) -> dict[str, object]:
    return {"text": f"Invoice {job_id} is wrong", "labels": ["billing", "other"]}


def test_interactive_jobs_submitted_during_a_background_backlog_are_answered_before_most_of_it(
    stack: DevStack,
) -> None:
    client = AiJobsClient.from_settings(stack.settings, stack.session)
    run = uuid.uuid4().hex[:6]
    backlog = [f"bg-{run}-{n}" for n in range(BACKLOG)]
    for job_id in backlog:
        client.submit("classify", "backfill", classify(job_id), job_id=job_id, lane=Lane.BACKGROUND)
    provider = stack.provider
    assert provider is not None
    # Once the backlog is draining, interactive jobs arrive one after the other
    eventually(lambda: len(provider.log) >= 4, what="the backlog started draining", timeout=60)
    interactive = []
    for n in range(INTERACTIVE):
        job_id = f"it-{run}-{n}"
        client.submit("classify", "person", classify(job_id), job_id=job_id)
        interactive.append(job_id)
        eventually(lambda job_id=job_id: client.get(job_id).status.is_terminal, what=f"{job_id} ended", timeout=60)

    def drained() -> bool:
        return all(client.get(job_id).status.is_terminal for job_id in backlog)

    eventually(drained, what="the backlog drained", timeout=120)
    store = build_store(stack.settings, Aws(stack.settings, stack.session))
    jobs = {job_id: store.get_job(job_id) for job_id in backlog + interactive}
    assert {job.status for job in jobs.values() if job} == {JobStatus.SUCCEEDED}
    assert {job.lane for job_id, job in jobs.items() if job and job_id in backlog} == {Lane.BACKGROUND}
    assert {job.lane for job_id, job in jobs.items() if job and job_id in interactive} == {Lane.INTERACTIVE}
    # Every interactive job was answered before most of the background jobs waiting when it arrived
    finished = {job_id: job.finished_at or 0 for job_id, job in jobs.items() if job}
    for job_id in interactive:
        arrived = jobs[job_id].created_at  # type: ignore[union-attr]
        waiting = [other for other in backlog if finished[other] > arrived]
        overtaken = [other for other in waiting if finished[other] > finished[job_id]]
        assert len(waiting) >= BACKLOG // 2
        assert len(overtaken) >= len(waiting) // 2, (job_id, len(waiting), len(overtaken))
    # And the shared limit held: the provider's own limit refused next to no call (without it, the
    # backlog meets dozens of refusals). On a loaded machine, calls that left late may reach the
    # provider together past its second of burst: such a refusal is waited out, as above.
    assert len([entry for entry in provider.log if entry.limited]) <= BACKLOG // 40
