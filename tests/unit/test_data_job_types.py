"""Data job types as a worker serves them (docs/jobtypes.md): the catalog (engine.definitions.catalog) over the
in-memory store, the registry that serves code and data job types under one name space, and the
runner recording the version a job's first claim resolved and keeping it on a retry.

Labels: the first push is production, a promote moves it, a canary serves P% of users (sticky), a pin
runs its version, a rollback ends a canary or moves production back. Reads: the heads are read once
per refresh period (never once per job), each version once for good.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from engine.core import Ack, AttemptOutcome, Delivery, ErrorCode, Fate, Job, JobStatus, NewJob, Retry
from engine.core.errors import InputValidationError, JobTypeLabelError, ProviderUnavailableError, UnknownJobTypeError
from engine.core.job_type_labels import MAX_REASON_CHARS
from engine.core.job_types import Guard, JobTypeHead, StoredVersion
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.definitions.catalog import DEFAULT_REFRESH_SECONDS, UNKNOWN_REFRESH_SECONDS, DataJobTypes
from engine.definitions.classify import CLASSIFY
from engine.definitions.data import check_job_type, compile_job_type
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.intake import request_hash
from engine.runner import JobRunner
from engine.testing import InMemoryJobStore, InMemoryJobTypes
from tests.support.clock import Clock
from tests.support.providers import FakeProvider

NAME = "triage_ticket"
TICKET = {"text": "I was charged twice", "labels": ["billing", "bug"]}


def triage(version: int, name: str = NAME) -> dict[str, Any]:
    """The file of docs/jobtypes.md, its system prompt naming `version` (so each push is new content)."""
    return {
        "name": name,
        "description": "Route a support ticket.",
        "input_schema": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 20000},
                "labels": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            },
            "required": ["text", "labels"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "properties": {"label": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["label", "confidence"],
            "additionalProperties": False,
        },
        "prompt": {
            "system": f"You route support tickets (prompt v{version}).",
            "user": "Ticket: {text}\nLabels: {labels}",
        },
        "rules": [{"check": "output.label in input.labels", "message": "label is not one of the labels offered"}],
        "max_tokens": 256,
    }


class CountingTypes:
    """The in-memory store behind a wrapper that counts the catalog's reads of it."""

    def __init__(self, types: InMemoryJobTypes) -> None:
        self.types = types
        self.heads_reads = 0
        self.version_reads = 0

    def heads(self) -> list[JobTypeHead]:
        self.heads_reads += 1
        return self.types.heads()

    def version(self, name: str, version: int) -> StoredVersion | None:
        self.version_reads += 1
        return self.types.version(name, version)


def push(types: InMemoryJobTypes, clock: Clock, count: int = 1, name: str = NAME) -> None:
    """`count` more versions of `name`, each checked as `aijobs types push` checks it."""
    first = types.heads_by_name[name].latest + 1 if name in types.heads_by_name else 1
    for version in range(first, first + count):
        file = check_job_type(triage(version, name))
        assert types.push(name, file.document(), file.sha256, clock.now_ms, by="ana") == (version, True)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def types() -> InMemoryJobTypes:
    return InMemoryJobTypes()


@pytest.fixture
def reads(types: InMemoryJobTypes) -> CountingTypes:
    return CountingTypes(types)


@pytest.fixture
def catalog(reads: CountingTypes, clock: Clock) -> DataJobTypes:
    return DataJobTypes(reads, compile_job_type, clock=clock)


def served(catalog: DataJobTypes, user_id: str = "user-1", pinned: int | None = None) -> int | None:
    return catalog.resolve(NAME, user_id, pinned).job_type_version


def users(count: int) -> list[str]:
    return [f"user-{n}" for n in range(count)]


# --- labels: production, promote, canary, pin, rollback ------------------------------------------


def test_the_first_push_is_production_and_its_definition_is_the_file_s(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock)

    definition = catalog.resolve(NAME, "user-1")

    assert definition.job_type_version == 1
    assert (definition.name, definition.prompt.key, definition.prompt.version) == (NAME, NAME, "v1")
    assert definition.prompt.system == "You route support tickets (prompt v1)."
    assert definition.max_tokens == 256
    assert catalog.names() == [NAME]


def test_a_second_push_stays_off_production_until_promoted(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    assert {served(catalog, user) for user in users(50)} == {1}

    types.promote(NAME, 2, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)

    assert {served(catalog, user) for user in users(50)} == {2}


@pytest.mark.parametrize("percent", [10, 30, 50])
def test_a_canary_serves_about_its_share_of_users_and_each_user_stays_on_one_side(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock, percent: int
) -> None:
    push(types, clock, 2)
    types.promote(NAME, 2, clock.now_ms, canary_percent=percent)
    crowd = users(400)

    first = {user: served(catalog, user) for user in crowd}
    # Again, and again after the heads were read anew: every user on the side they were on
    again = {user: served(catalog, user) for user in crowd}
    clock.advance(DEFAULT_REFRESH_SECONDS)
    later = {user: served(catalog, user) for user in crowd}

    assert first == again == later
    assert set(first.values()) == {1, 2}
    share = 100 * sum(version == 2 for version in first.values()) / len(crowd)
    assert percent - 15 <= share <= percent + 15


def test_a_job_without_a_user_runs_production_during_a_canary(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    types.promote(NAME, 2, clock.now_ms, canary_percent=99)

    assert served(catalog, "") == 1


def test_a_pinned_version_runs_though_another_is_production(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 3)
    types.promote(NAME, 3, clock.now_ms, canary_percent=50)

    assert {served(catalog, user, pinned=2) for user in users(40)} == {2}
    assert {served(catalog, user, pinned=1) for user in users(40)} == {1}


@pytest.mark.parametrize("pinned", [0, 3, 99])
def test_a_pin_of_a_version_that_does_not_exist_is_refused_as_an_unknown_job_type(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock, pinned: int
) -> None:
    push(types, clock, 2)

    with pytest.raises(UnknownJobTypeError) as refused:
        catalog.resolve(NAME, "user-1", pinned)

    assert refused.value.code is ErrorCode.UNKNOWN_JOB_TYPE
    assert str(refused.value) == f"{NAME} has no version {pinned} (latest v2)"


def test_a_version_pushed_since_the_heads_were_read_can_be_pinned_at_once(
    types: InMemoryJobTypes, catalog: DataJobTypes, reads: CountingTypes, clock: Clock
) -> None:
    push(types, clock)
    assert served(catalog) == 1
    push(types, clock)
    clock.advance(UNKNOWN_REFRESH_SECONDS)

    assert served(catalog, pinned=2) == 2
    assert served(catalog) == 1  # production did not move
    assert reads.heads_reads == 2


def test_rollback_ends_a_canary_and_every_user_runs_production_again(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    types.promote(NAME, 2, clock.now_ms, canary_percent=50)
    assert {served(catalog, user) for user in users(100)} == {1, 2}

    head = types.rollback(NAME, clock.now_ms, by="bo")
    clock.advance(DEFAULT_REFRESH_SECONDS)

    assert (head.production, head.canary) == (1, None)
    assert {served(catalog, user) for user in users(100)} == {1}


def test_rollback_without_a_canary_moves_production_to_the_version_before(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 3)
    types.promote(NAME, 2, clock.now_ms)
    types.promote(NAME, 3, clock.now_ms)
    assert served(catalog) == 3

    types.rollback(NAME, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)
    assert served(catalog) == 2

    types.rollback(NAME, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)
    assert served(catalog) == 1


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("r" * (MAX_REASON_CHARS + 1), f"(this one has {MAX_REASON_CHARS + 1})"),
        ("two\nlines", "(this one has 9, with a line break or a control character)"),
        ("bell\x07", "(this one has 5, with a line break or a control character)"),
    ],
    ids=["too-long", "two-lines", "control-character"],
)
def test_a_rollback_whose_reason_is_not_one_bounded_line_is_refused_and_moves_nothing(
    types: InMemoryJobTypes, clock: Clock, reason: str, expected: str
) -> None:
    # Given a canary running
    push(types, clock, 2)
    before = types.promote(NAME, 2, clock.now_ms, canary_percent=50)

    # When it is rolled back with a reason past its bound, or of more than one line
    with pytest.raises(JobTypeLabelError) as refused:
        types.rollback(NAME, clock.now_ms, reason=reason)

    # Then it is refused in one line, and the head (its canary, its history) is as it was
    assert str(refused.value) == (
        f"{NAME}: a rollback's reason is one line of at most {MAX_REASON_CHARS} printable characters {expected}"
    )
    assert types.heads_by_name[NAME] == before
    assert types.rollback(NAME, clock.now_ms, reason="r" * MAX_REASON_CHARS).canary is None


# --- reads: once per refresh period, never once per job -------------------------------------------


def test_a_promote_is_seen_only_once_the_refresh_period_is_over(
    types: InMemoryJobTypes, catalog: DataJobTypes, reads: CountingTypes, clock: Clock
) -> None:
    # Given a worker that read the heads at T0, and a promote a second later
    push(types, clock, 2)
    assert served(catalog) == 1
    clock.advance(1)
    types.promote(NAME, 2, clock.now_ms)

    # Then the worker serves what it read until the period ends, and the promote from then on
    clock.advance(DEFAULT_REFRESH_SECONDS - 1.001)
    assert served(catalog) == 1
    assert reads.heads_reads == 1
    clock.advance(0.001)
    assert served(catalog) == 2
    assert reads.heads_reads == 2


def test_a_thousand_resolves_in_one_period_read_the_heads_once_and_each_version_once(
    types: InMemoryJobTypes, catalog: DataJobTypes, reads: CountingTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    types.promote(NAME, 2, clock.now_ms, canary_percent=20)

    versions = set()
    for n in range(1000):
        versions.add(served(catalog, f"user-{n}"))
        clock.advance((DEFAULT_REFRESH_SECONDS - 1) / 1000)

    assert versions == {1, 2}
    assert (reads.heads_reads, reads.version_reads) == (1, 2)

    # The next period: one more read of the heads, none of the versions (they never change)
    clock.advance(1)
    for n in range(1000):
        served(catalog, f"user-{n}")
    assert (reads.heads_reads, reads.version_reads) == (2, 2)


def test_a_name_pushed_a_moment_ago_runs_but_junk_names_cannot_flood_the_store(
    types: InMemoryJobTypes, catalog: DataJobTypes, reads: CountingTypes, clock: Clock
) -> None:
    push(types, clock)
    assert served(catalog) == 1

    # A thousand messages naming junk in the same instant: no read beyond the first
    for n in range(1000):
        with pytest.raises(UnknownJobTypeError):
            catalog.resolve(f"junk_{n}", "user-1")
    assert reads.heads_reads == 1

    # A name pushed since the heads were read is served once the heads may be read again
    push(types, clock, name="route_mail")
    clock.advance(UNKNOWN_REFRESH_SECONDS)
    assert catalog.resolve("route_mail", "user-1").job_type_version == 1
    assert reads.heads_reads == 2


def test_a_failed_read_of_the_heads_keeps_the_ones_read_before(
    types: InMemoryJobTypes, catalog: DataJobTypes, reads: CountingTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    assert served(catalog) == 1
    types.promote(NAME, 2, clock.now_ms)

    def unavailable() -> list[JobTypeHead]:
        raise ConnectionError("the table is unreachable")

    reads.heads = unavailable  # type: ignore[method-assign]
    clock.advance(DEFAULT_REFRESH_SECONDS)

    assert served(catalog) == 1


# --- the registry: code and data job types in one name space -------------------------------------


def test_the_registry_serves_code_and_data_job_types_by_name(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)
    registry = JobRegistry(data=catalog)

    assert registry.resolve("classify", "user-1") is CLASSIFY
    assert registry.resolve(NAME, "user-1").job_type_version == 1
    assert registry.definition(NAME, 2).job_type_version == 2  # a job that recorded v2
    assert registry.definition("classify", None) is CLASSIFY
    assert (registry.is_data(NAME), registry.is_data("classify"), registry.is_data("nothing")) == (True, False, False)
    assert registry.names == sorted(
        ["answer_with_citations", "classify", "extract", "extract_reviewed", "summarize", "summarize_long", NAME]
    )


def test_a_name_both_kinds_hold_is_served_by_its_code_job_type(
    types: InMemoryJobTypes, catalog: DataJobTypes, clock: Clock
) -> None:
    # Given a data job type named as a code one (a code type deployed after the push)
    push(types, clock, name="classify")
    registry = JobRegistry(data=catalog)

    assert registry.resolve("classify", "user-1") is CLASSIFY
    assert registry.get("classify") is CLASSIFY
    assert registry.is_data("classify") is False
    assert registry.names.count("classify") == 1


def test_a_pin_of_a_code_job_type_is_an_invalid_input_and_an_unknown_name_an_unknown_type(
    catalog: DataJobTypes,
) -> None:
    registry = JobRegistry(data=catalog)

    with pytest.raises(InputValidationError, match="classify is a code job type: it has no versions to pin"):
        registry.resolve("classify", "user-1", 1)
    with pytest.raises(UnknownJobTypeError, match="no job type 'nothing' is registered") as unknown:
        registry.resolve("nothing", "user-1")
    assert unknown.value.code is ErrorCode.UNKNOWN_JOB_TYPE


# --- the runner: the version a job's first claim resolved, kept by its retries -------------------


def answer_by_version(request: CompletionRequest) -> dict[str, Any]:
    """A valid answer; which version asked shows in the request's system prompt."""
    return {"label": "billing", "confidence": 0.9}


def prompt_versions(provider: FakeProvider) -> list[str]:
    return [request.system.rsplit("v", 1)[-1].rstrip(").") for request in provider.requests]


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(answer_by_version)


@pytest.fixture
def store() -> InMemoryJobStore:
    return InMemoryJobStore()


@pytest.fixture
def runner(store: InMemoryJobStore, provider: FakeProvider, catalog: DataJobTypes, clock: Clock) -> JobRunner:
    registry = JobRegistry(data=catalog)
    gateway = ModelGateway(provider, ModelTiers("gpt-4o-mini"))
    recorder = DeadLetterRecorder(store, registry, clock=clock)
    return JobRunner(store, gateway, registry, recorder, clock=clock, rng=random.Random(7))


def message(job_id: str, user_id: str = "user-1", **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "job_type": NAME, "user_id": user_id, "input": TICKET, **fields}


def delivery(body: dict[str, Any], receive_count: int = 1) -> Delivery:
    return Delivery(f"m-{receive_count}", json.dumps(body), receive_count, {})


def job_of(store: InMemoryJobStore, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None, f"job {job_id} does not exist"
    return job


def failing_once(provider: FakeProvider) -> None:
    answers: list[Any] = [ProviderUnavailableError("provider unavailable (HTTP 503)")]
    provider.script = lambda request: answers.pop() if answers else answer_by_version(request)


def moved_to_v2(types: InMemoryJobTypes, clock: Clock) -> None:
    """Production moved to v2, and the worker's heads read since."""
    types.promote(NAME, 2, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)


def test_a_data_job_records_the_version_its_first_claim_resolved(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)

    assert runner.process(delivery(message("dt-1"))) == Ack(Fate.SUCCEEDED)

    job = job_of(store, "dt-1")
    assert (job.status, job.output, job.job_type_version) == (
        JobStatus.SUCCEEDED,
        {"label": "billing", "confidence": 0.9},
        1,
    )
    assert [attempt.job_type_version for attempt in store.attempts("dt-1")] == [1]
    assert prompt_versions(provider) == ["1"]


def test_a_retry_runs_the_version_of_the_first_claim_after_production_moved(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    # Given a job whose first attempt (v1, production then) was put back after a 503
    push(types, clock, 2)
    failing_once(provider)
    assert isinstance(runner.process(delivery(message("dt-retry"))), Retry)
    assert job_of(store, "dt-retry").job_type_version == 1

    # When production moves to v2 and the same message comes back
    moved_to_v2(types, clock)
    disposition = runner.process(delivery(message("dt-retry"), receive_count=2))

    # Then the retry ran v1, and the job and both attempts say so
    assert disposition == Ack(Fate.SUCCEEDED)
    assert prompt_versions(provider) == ["1", "1"]
    job = job_of(store, "dt-retry")
    assert (job.status, job.attempt_count, job.job_type_version) == (JobStatus.SUCCEEDED, 2, 1)
    attempts = store.attempts("dt-retry")
    assert [(a.outcome, a.job_type_version) for a in attempts] == [
        (AttemptOutcome.RETRYABLE, 1),
        (AttemptOutcome.SUCCEEDED, 1),
    ]
    # And a new job of the name runs v2 (the move was seen)
    assert runner.process(delivery(message("dt-new"))) == Ack(Fate.SUCCEEDED)
    assert job_of(store, "dt-new").job_type_version == 2


def submitted(store: InMemoryJobStore, job_id: str, clock: Clock, user_id: str = "user-1") -> None:
    """A job created by a submission that left its version to the first claim (its input stored)."""
    new_job = NewJob(
        job_type=NAME,
        user_id=user_id,
        schema_version=1,
        max_attempts=3,
        deadline_seconds=86_400,
        request_hash=request_hash(NAME, user_id, TICKET),
    )
    store.create_job(job_id, new_job, TICKET, clock.now_ms)


def test_a_job_created_without_a_version_records_the_one_its_first_claim_ran_and_keeps_it(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    # Given a submitted job with no version, whose first claim (v1) was put back after a 503
    push(types, clock, 2)
    submitted(store, "dt-sub", clock)
    assert job_of(store, "dt-sub").job_type_version is None
    failing_once(provider)
    assert isinstance(runner.process(delivery({"job_id": "dt-sub"})), Retry)
    assert job_of(store, "dt-sub").job_type_version == 1

    # When production moves to v2 and its message of only its id comes back
    moved_to_v2(types, clock)
    assert runner.process(delivery({"job_id": "dt-sub"}, receive_count=2)) == Ack(Fate.SUCCEEDED)

    # Then the retry ran v1
    assert prompt_versions(provider) == ["1", "1"]
    assert job_of(store, "dt-sub").job_type_version == 1
    assert [attempt.job_type_version for attempt in store.attempts("dt-sub")] == [1, 1]


def test_a_pinned_job_runs_and_records_its_pin(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)

    assert runner.process(delivery(message("dt-pin", job_type_version=2))) == Ack(Fate.SUCCEEDED)

    assert job_of(store, "dt-pin").job_type_version == 2
    assert prompt_versions(provider) == ["2"]


def test_a_pin_of_a_version_that_does_not_exist_fails_the_job_as_an_unknown_job_type(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    push(types, clock, 2)

    assert runner.process(delivery(message("dt-bad-pin", job_type_version=9))) == Ack(Fate.FAILED)

    job = job_of(store, "dt-bad-pin")
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.message, job.error.retryable) == (
        ErrorCode.UNKNOWN_JOB_TYPE,
        f"{NAME} has no version 9 (latest v2)",
        False,
    )
    assert provider.calls == 0


def test_a_canary_user_s_job_records_the_canary_and_its_retry_keeps_it_after_the_rollback(
    runner: JobRunner, store: InMemoryJobStore, provider: FakeProvider, types: InMemoryJobTypes, clock: Clock
) -> None:
    # Given a canary of v2 and a user it serves
    push(types, clock, 2)
    types.promote(NAME, 2, clock.now_ms, canary_percent=50, guard=Guard(min_jobs=10))
    canary_user = next(user for user in users(100) if types.heads_by_name[NAME].serves(user) == 2)
    failing_once(provider)
    assert isinstance(runner.process(delivery(message("dt-canary", canary_user))), Retry)

    # When the canary is rolled back and the job's message comes back
    types.rollback(NAME, clock.now_ms)
    clock.advance(DEFAULT_REFRESH_SECONDS)
    assert runner.process(delivery(message("dt-canary", canary_user), receive_count=2)) == Ack(Fate.SUCCEEDED)

    # Then it ran the canary's version both times
    assert prompt_versions(provider) == ["2", "2"]
    assert job_of(store, "dt-canary").job_type_version == 2
