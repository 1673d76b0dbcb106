"""Property-based: whatever the body of a message, the worker and the dead-letter function end it.

Arbitrary bodies (random JSON, random Unicode with lone surrogates, huge numbers, deep nesting,
sizes up to 1 MiB, and job messages with any of their fields broken) go through the worker's and
the dead-letter function's handlers on moto. For every body: no exception escapes, the record is
acknowledged or returned at most once, and afterwards its job is terminal or a dead-letter record
exists.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from aijobs.stack import StackResources, create_stack_resources
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.queue import JobQueue
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.items import dead_letter_key, job_key
from engine.store.payloads import PayloadStore
from engine.worker import Worker
from handlers.dead_letter import dead_letter_handler
from handlers.worker import WorkerHandler
from tests.support.events import InvocationContext, sqs_event, sqs_record
from tests.support.providers import FakeProvider, valid_answer
from tests.support.strategies import any_text

ONE_MIB = 1024 * 1024
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# --- bodies -------------------------------------------------------------------------------------

ANY_TEXT = any_text()
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=10**30, max_value=10**300),
    st.integers(max_value=-(10**30)),
    st.floats(allow_nan=False, allow_infinity=False),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
    max_leaves=20,
)
JOB_IDS = st.one_of(
    st.sampled_from(["fuzz-1", "fuzz-2", "fuzz-3"]),
    st.builds(lambda: f"fuzz-{uuid.uuid4().hex[:12]}"),
    ANY_TEXT,
    NUMBERS,
    st.just("x" * 200),
)
VALID_INPUTS = st.sampled_from(
    [
        ("classify", {"text": "Win a cruise", "labels": ["spam", "ham"]}),
        ("summarize", {"text": "SQS delivers messages at least once.", "max_words": 10}),
        ("answer_with_citations", {"question": "How long?", "documents": [{"id": "d1", "text": "14 days"}]}),
    ]
)


@st.composite
def job_messages(draw: st.DrawFn) -> str:
    """A job message, valid or with any of its fields replaced by something hostile."""
    job_type, job_input = draw(VALID_INPUTS)
    if draw(st.booleans()):  # valid but for its text, which may hold lone surrogates
        text_field = "question" if job_type == "answer_with_citations" else "text"
        job_input = job_input | {text_field: draw(ANY_TEXT.filter(bool))}
    message: dict[str, Any] = {"job_id": draw(JOB_IDS), "job_type": job_type, "user_id": "u1", "input": job_input}
    for field in draw(st.sets(st.sampled_from([*message, "max_attempts", "deadline_seconds", "schema_version"]))):
        message[field] = draw(JSON_VALUES)
    if draw(st.booleans()):
        message = {key: value for key, value in message.items() if draw(st.booleans())}
    return json.dumps(message)  # a lone surrogate becomes its \ud800 escape, as JavaScript writes it


@st.composite
def large_bodies(draw: st.DrawFn) -> str:
    chunk = draw(st.text(min_size=1, max_size=8))
    size = draw(st.integers(min_value=100_000, max_value=ONE_MIB - 200))
    body = (chunk * (size // len(chunk) + 1))[:size]
    if draw(st.booleans()):  # a job whose input is large
        return json.dumps({"job_id": draw(JOB_IDS), "job_type": "summarize", "user_id": "u", "input": {"text": body}})
    return body


def deep(depth: int) -> str:
    return '{"job_id": "deep-1", "job_type": "classify", "user_id": "u", "input": ' + "[" * depth + "]" * depth + "}"


BODIES = st.one_of(
    job_messages(),
    JSON_VALUES.map(json.dumps),
    ANY_TEXT,
    st.integers(min_value=1, max_value=5_000).map(deep),
    large_bodies(),
)


def sent_over_http(request: CompletionRequest) -> dict[str, Any]:
    """A valid answer, once the request was encoded as an HTTP provider's body would be (UTF-8 JSON)."""
    body = {"system": request.system, "user": request.user, "turns": [turn.content for turn in request.conversation]}
    json.dumps(body, ensure_ascii=False).encode()
    return valid_answer(request)


# --- the stack, once for the module -------------------------------------------------------------


@dataclass
class FuzzStack:
    resources: StackResources
    worker: WorkerHandler
    recorder_handler: Any
    dynamodb: Any


@pytest.fixture(scope="module")
def fuzz_stack() -> Iterator[FuzzStack]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            patch.setenv(name, value)
        patch.delenv("AWS_ENDPOINT_URL", raising=False)
        with mock_aws():
            resources = create_stack_resources()
            dynamodb = boto3.client("dynamodb")
            s3 = boto3.client("s3")
            payloads = PayloadStore(resources.payload_bucket, lambda: s3)
            store = DynamoJobStore(resources.table_name, client=dynamodb, payloads=payloads)
            registry = JobRegistry()
            recorder = DeadLetterRecorder(store, registry)
            gateway = ModelGateway(FakeProvider(sent_over_http), ModelTiers("gpt-4o-mini"))
            runner = JobRunner(store, gateway, registry, recorder, rng=random.Random(7))
            worker = WorkerHandler(Worker(runner), JobQueue(resources.queue_url))

            handle_dead_letters = dead_letter_handler(recorder)

            def recorder_handler(event: dict[str, Any]) -> dict[str, Any]:
                return dict(handle_dead_letters(event, None))

            yield FuzzStack(resources, worker, recorder_handler, dynamodb)


def item(stack: FuzzStack, key: dict[str, Any]) -> dict[str, Any] | None:
    found: dict[str, Any] | None = stack.dynamodb.get_item(
        TableName=stack.resources.table_name, Key=key, ConsistentRead=True
    ).get("Item")
    return found


def named_job_id(body: str) -> str | None:
    """The job id a body names, when it names a usable one."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    job_id = parsed.get("job_id") if isinstance(parsed, dict) else None
    return job_id if isinstance(job_id, str) else None


def assert_ended(stack: FuzzStack, body: str, message_id: str) -> None:
    """The job the body names is terminal, or the message is kept as a dead letter."""
    if item(stack, dead_letter_key(message_id)) is not None:
        return
    job_id = named_job_id(body) or message_id
    job = item(stack, job_key(job_id))
    assert job is not None, f"neither a dead letter nor a job for {body[:200]!r}"
    assert job["status"]["S"] in {"succeeded", "failed", "cancelled"}, job["status"]


@FUZZ
@given(body=BODIES)
def test_the_worker_ends_every_body_and_returns_it_at_most_once(fuzz_stack: FuzzStack, body: str) -> None:
    message_id = str(uuid.uuid4())
    responses = []
    for receive in (1, 2):
        event = sqs_event(sqs_record(body, message_id=message_id, receive_count=receive))
        response = fuzz_stack.worker.handle(event, InvocationContext())
        responses.append(response)
        if not response["batchItemFailures"]:
            break
    assert not responses[-1]["batchItemFailures"], f"returned twice: {body[:200]!r}"
    assert_ended(fuzz_stack, body, message_id)


@FUZZ
@given(body=BODIES)
def test_the_dead_letter_function_keeps_every_body(fuzz_stack: FuzzStack, body: str) -> None:
    message_id = str(uuid.uuid4())

    response = fuzz_stack.recorder_handler(sqs_event(sqs_record(body, message_id=message_id, receive_count=101)))

    assert response == {"batchItemFailures": []}
    assert item(fuzz_stack, dead_letter_key(message_id)) is not None
