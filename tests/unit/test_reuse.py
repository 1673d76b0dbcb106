"""Answers already paid for (docs/reuse.md), through the runner on the in-memory store: a job whose request
was answered within its job type's reuse_seconds takes that answer with no provider call; anything else
(another request, a stale answer, a failed or cancelled original, an unreadable or no longer valid kept
answer) calls the model, as it would with reuse off.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.core import (
    Ack,
    AttemptOutcome,
    AttemptRecord,
    Fate,
    Job,
    JobStatus,
    PaidAnswer,
    Succeeded,
    Usage,
    Via,
)
from engine.core.attachments import AttachmentInfo, AttachmentRef, MediaType
from engine.core.errors import ProviderRejectedError, ProviderUnavailableError
from engine.core.reuse import MAX_REUSE_SECONDS
from engine.dead_letters import DeadLetterRecorder
from engine.decisions import decide_reused, output_hash
from engine.definitions import JobDefinition, JobRegistry, RenderedPrompt
from engine.definitions.classify import CLASSIFY
from engine.definitions.data import check_job_type, compile_job_type
from engine.definitions.pipelines import SUMMARIZE_LONG
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.reuse import Reused, request_key
from engine.runner import JobRunner
from engine.testing import InMemoryJobStore, MemoryAttachments
from engine.views import JobView
from tests.support.attachment_files import READ_FILES, pdf
from tests.support.batch_fleet import Fleet
from tests.support.clock import Clock
from tests.support.events import job_message
from tests.support.providers import FakeProvider, valid_answer
from tests.unit.test_runner_decisions import delivery

REUSE_SECONDS = 3_600
TEXT = {"text": "Win a free cruise now!", "labels": ["spam", "ham"]}
SPAM = {"label": "spam", "confidence": 0.93}
# The classify job type, reusing its answers for an hour.
REUSING = replace(CLASSIFY, reuse_seconds=REUSE_SECONDS)
FILES = "payloads"


@dataclass
class World:
    """Workers sharing one store, one provider (counting its calls) and one clock."""

    provider: FakeProvider = field(default_factory=FakeProvider)
    store: InMemoryJobStore = field(default_factory=InMemoryJobStore)
    clock: Clock = field(default_factory=Clock)
    objects: MemoryAttachments = field(default_factory=MemoryAttachments)
    sent: int = 0

    def worker(self, *definitions: JobDefinition, models: ModelTiers | None = None) -> JobRunner:
        registry = JobRegistry(definitions or (REUSING,))
        return JobRunner(
            self.store,
            ModelGateway(self.provider, models or ModelTiers("gpt-4o-mini", "gpt-4o")),
            registry,
            DeadLetterRecorder(self.store, registry, clock=self.clock),
            clock=self.clock,
            rng=random.Random(7),
            attachments=AttachmentLoader(self.objects, [FILES], OPENAI),
        )

    def run(
        self,
        worker: JobRunner | None = None,
        job_input: dict[str, Any] | None = None,
        *,
        job_type: str = "classify",
        user: str = "user-1",
        attachments: list[AttachmentRef] | None = None,
    ) -> Job:
        """Run a new job of `job_input` (TEXT by default) to its end; the job as the store has it."""
        self.sent += 1
        job_id = f"job-{self.sent}"
        body: dict[str, Any] = {
            "job_id": job_id,
            "job_type": job_type,
            "user_id": user,
            "input": job_input or TEXT,
        }
        if attachments:
            body["attachments"] = [{"s3": ref.uri} for ref in attachments]
        (worker or self.worker()).process(delivery(body, message_id=f"m-{job_id}"))
        job = self.store.get_job(job_id)
        assert job is not None
        return job


@pytest.fixture
def world() -> World:
    return World()


def only_attempt(store: InMemoryJobStore, job: Job) -> AttemptRecord:
    attempts = store.attempts(job.job_id)
    assert len(attempts) == 1, attempts
    return attempts[0]


# --- a hit --------------------------------------------------------------------------------------


def test_a_repeated_request_takes_the_paid_answer_with_no_call(world: World) -> None:
    # Given a job of a job type that reuses answers for an hour, answered by the model
    paid = world.run()
    world.clock.advance(REUSE_SECONDS - 1)

    # When the same request comes again, from another user, within the hour
    again = world.run(user="user-2")

    # Then the model was called once: the second job succeeded with the first one's answer
    assert world.provider.calls == 1
    assert (paid.status, again.status) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED)
    assert again.output == paid.output == SPAM
    assert again.output_hash == paid.output_hash
    assert (paid.reused_from, again.reused_from) == (None, paid.job_id)
    # at no cost, with one attempt that made no call, recorded as a reuse
    assert again.usage == Usage(attempts=1)
    attempt = only_attempt(world.store, again)
    assert (attempt.via, attempt.reused_from, attempt.calls, attempt.outcome) == (
        Via.REUSE,
        paid.job_id,
        0,
        AttemptOutcome.SUCCEEDED,
    )
    assert (attempt.input_tokens, attempt.output_tokens, attempt.cost_usd) == (0, 0, Decimal(0))
    assert (attempt.model, attempt.prompt_key) == ("gpt-4o-mini", "classify")
    assert only_attempt(world.store, paid).via is Via.REALTIME
    # and its view says so, as `aijobs status` and the completion event show it
    view = JobView.from_job(again)
    assert (view.via, view.reused_from) == (Via.REUSE, paid.job_id)


def test_every_repeat_within_the_time_takes_the_first_paid_answer(world: World) -> None:
    # Given a paid answer
    paid = world.run()

    # When the request comes three more times
    repeats = [world.run() for _ in range(3)]

    # Then none called the model, and each names the job that paid: a reuse never becomes a source
    assert world.provider.calls == 1
    assert [job.reused_from for job in repeats] == [paid.job_id] * 3


def test_a_job_type_without_reuse_seconds_calls_the_model_every_time(world: World) -> None:
    worker = world.worker(CLASSIFY)

    first, second = world.run(worker), world.run(worker)

    assert world.provider.calls == 2
    assert (first.reused_from, second.reused_from) == (None, None)
    assert world.store.paid_answer(request_key_of(CLASSIFY, TEXT)) is None


def request_key_of(definition: JobDefinition, job_input: dict[str, Any], model: str = "gpt-4o-mini") -> str:
    parsed = definition.parse_input(job_input)
    prompt = definition.render_prompt(parsed)
    return request_key(definition, prompt, "fake", model, definition.output_schema(parsed), ())


# --- stale answers ------------------------------------------------------------------------------


def test_an_answer_older_than_reuse_seconds_is_not_taken_and_the_new_one_is_kept(world: World) -> None:
    # Given a paid answer, and reuse_seconds passed since (the TTL may not have removed it yet)
    first = world.run()
    world.clock.advance(REUSE_SECONDS)

    # When the request comes again
    second = world.run()
    world.clock.advance(1)
    third = world.run()

    # Then it calls the model, and its own answer is the one later requests take
    assert world.provider.calls == 2
    assert (first.reused_from, second.reused_from, third.reused_from) == (None, None, second.job_id)


@given(elapsed_ms=st.integers(min_value=-60_000, max_value=2 * MAX_REUSE_SECONDS * 1000))
def test_an_answer_is_fresh_exactly_while_less_than_reuse_seconds_old(elapsed_ms: int) -> None:
    # (a negative age: the worker that kept it has a clock ahead of this one's)
    answered_at = 1_800_000_000_000
    answer = PaidAnswer("k", "job-1", "{}", answered_at, answered_at + REUSE_SECONDS * 1000)

    assert answer.fresh(answered_at + elapsed_ms, REUSE_SECONDS) is (elapsed_ms < REUSE_SECONDS * 1000)


def test_an_answer_past_its_own_end_is_stale_whatever_the_job_type_says(world: World) -> None:
    # Given an answer kept until a moment (the table's retention ends it before the job type's time)
    answered_at = world.clock.now_ms
    kept = PaidAnswer("k", "job-1", "{}", answered_at, answered_at + 60_000)

    assert kept.fresh(answered_at + 59_999, REUSE_SECONDS)
    assert not kept.fresh(answered_at + 60_000, REUSE_SECONDS)


# --- another request ----------------------------------------------------------------------------


def test_another_input_is_another_request(world: World) -> None:
    world.run()
    other = world.run(job_input=TEXT | {"text": "Meeting moved to 3 pm"})

    assert world.provider.calls == 2
    assert other.reused_from is None


def test_the_same_request_to_another_model_is_another_request(world: World) -> None:
    world.run(world.worker(models=ModelTiers("gpt-4o-mini")))
    other = world.run(world.worker(models=ModelTiers("gpt-4o")))

    assert world.provider.calls == 2
    assert [request.model for request in world.provider.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert other.reused_from is None


def test_a_fallback_model_s_answer_is_kept_for_the_fallback_model_only(world: World) -> None:
    # Given the primary model unavailable: the fallback answers the first job
    def primary_down(request: CompletionRequest) -> Any:
        if request.model == "gpt-4o-mini" and world.provider.calls == 1:
            return ProviderUnavailableError("503")
        return valid_answer(request)

    world.provider.script = primary_down
    first = world.run()

    # When the same request comes again, the primary model back
    second = world.run()

    # Then it asks the primary: a fallback's answer is not the one its request asks for
    assert [request.model for request in world.provider.requests] == ["gpt-4o-mini", "gpt-4o", "gpt-4o-mini"]
    assert (first.status, second.status, second.reused_from) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED, None)


def data_type(version: int, **changes: Any) -> JobDefinition:
    """A data job type's `version`, reusing answers for an hour."""
    document = {
        "name": "note_topic",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "output_schema": {
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
            "additionalProperties": False,
        },
        "prompt": {"system": "Name the note's topic.", "user": "Note: {text}"},
        "reuse_seconds": REUSE_SECONDS,
    }
    return compile_job_type(check_job_type(document | changes).document(), version)


def test_another_version_of_a_data_job_type_is_another_request(world: World) -> None:
    world.provider.script = lambda _: {"topic": "billing"}
    note = {"text": "The invoice is overdue."}

    first = world.run(world.worker(data_type(1)), note, job_type="note_topic")
    same = world.run(world.worker(data_type(1)), note, job_type="note_topic")
    second = world.run(world.worker(data_type(2)), note, job_type="note_topic")

    assert world.provider.calls == 2
    assert (same.reused_from, second.reused_from) == (first.job_id, None)
    assert (same.job_type_version, second.job_type_version) == (1, 2)
    assert only_attempt(world.store, same).job_type_version == 1


def test_other_attachments_are_another_request_and_the_same_bytes_the_same(world: World) -> None:
    # Given a job type that reads attachments and reuses its answers
    world.provider.script = lambda _: {"summary": "An invoice."}
    reading = world.worker(replace(READ_FILES, reuse_seconds=REUSE_SECONDS))
    question = {"question": "What is due?"}
    invoice = world.objects.put(FILES, "a/invoice.pdf", pdf(1, "Total 10 EUR"))
    copy = world.objects.put(FILES, "b/copy-of-invoice.pdf", pdf(1, "Total 10 EUR"))
    other = world.objects.put(FILES, "c/other.pdf", pdf(1, "Total 99 EUR"))

    # When it runs on a file, then on the same bytes under another name, then on other bytes
    first = world.run(reading, question, job_type="read_files", attachments=[invoice])
    same = world.run(reading, question, job_type="read_files", attachments=[copy])
    different = world.run(reading, question, job_type="read_files", attachments=[other])

    # Then the bytes decide: the copy takes the first answer, the other file is asked about
    assert world.provider.calls == 2
    assert (same.reused_from, different.reused_from) == (first.job_id, None)
    assert [info.ref for info in same.attachments_read] == [copy]
    assert same.attachments_read[0].sha256 == first.attachments_read[0].sha256


# --- originals that paid for no answer ----------------------------------------------------------------


def test_a_failed_original_is_not_reused(world: World) -> None:
    # Given a job the provider refused
    world.provider.script = lambda _: ProviderRejectedError("400 bad request", 400)
    failed = world.run()

    # When the same request comes again and the provider answers
    world.provider.script = valid_answer
    second = world.run()

    assert failed.status is JobStatus.FAILED
    assert (second.status, second.reused_from, world.provider.calls) == (JobStatus.SUCCEEDED, None, 2)


def test_an_answer_its_rules_refused_is_not_reused(world: World) -> None:
    # Given a job whose every answer names a label the input does not offer
    world.provider.script = lambda _: {"label": "phishing", "confidence": 0.5}
    refused = world.run()

    world.provider.script = valid_answer
    second = world.run()

    assert refused.status is JobStatus.FAILED
    assert second.reused_from is None
    assert world.provider.calls == 3  # the refused answer, its re-ask, then the second job's call


def test_a_job_cancelled_while_it_called_keeps_no_answer(world: World) -> None:
    # Given a job cancelled while the model answered it
    def cancel_meanwhile(request: CompletionRequest) -> Any:
        if world.provider.calls == 1:
            world.store.request_cancel("job-1", world.clock.now_ms)
        return valid_answer(request)

    world.provider.script = cancel_meanwhile
    cancelled = world.run()

    # When the same request comes again
    second = world.run()

    # Then the answer the cancelled job paid for was not kept: the second calls the model
    assert cancelled.status is JobStatus.CANCELLED
    assert (second.status, second.reused_from, world.provider.calls) == (JobStatus.SUCCEEDED, None, 2)


# --- whatever goes wrong is a miss --------------------------------------------------------------------


class UnreadableAnswers(InMemoryJobStore):
    """A store whose read of paid answers fails (throttled, say)."""

    def paid_answer(self, key: str) -> PaidAnswer | None:
        raise ConnectionError("the read of a paid answer failed")


def test_a_failed_read_of_the_paid_answer_is_a_miss_never_a_failure() -> None:
    world = World(store=UnreadableAnswers())

    first, second = world.run(), world.run()

    assert (first.status, second.status) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED)
    assert (second.reused_from, world.provider.calls) == (None, 2)
    assert only_attempt(world.store, second).via is Via.REALTIME


def test_a_kept_answer_that_the_job_s_rules_now_refuse_is_a_miss(world: World) -> None:
    # Given an answer paid for, then a deploy of the same job type whose rule refuses that answer
    world.run()

    def no_spam(_: Any, output: Any) -> str | None:
        return "spam is not a label any more" if output.label == "spam" else None

    stricter = world.worker(replace(REUSING, business_rule=no_spam))
    world.provider.script = lambda _: {"label": "ham", "confidence": 0.6}

    # When the same request comes to the new deploy
    second = world.run(stricter)

    # Then the kept answer is checked as a model's would be, refused, and the model is asked instead
    assert (second.status, second.output, second.reused_from) == (
        JobStatus.SUCCEEDED,
        {"label": "ham", "confidence": 0.6},
        None,
    )
    assert world.provider.calls == 2


def test_a_kept_answer_that_is_not_json_any_more_is_a_miss(world: World) -> None:
    # Given a kept answer that was tampered with in the table
    paid = world.run()
    key = request_key_of(REUSING, TEXT)
    kept = world.store.paid_answer(key)
    assert kept is not None
    world.store._answers[key] = replace(kept, answer='{"label": "spam", "conf')

    second = world.run()

    assert (second.status, second.reused_from, world.provider.calls) == (JobStatus.SUCCEEDED, None, 2)
    assert paid.status is JobStatus.SUCCEEDED


# --- the decision, pure -----------------------------------------------------------------------------


def test_a_reused_decision_is_a_success_naming_its_source_with_an_attempt_that_cost_nothing() -> None:
    job = Job("job-2", "classify", "user-2", JobStatus.RUNNING, 0, 0, max_attempts=3, attempt_count=1, claim_count=1)
    prompt = RenderedPrompt("classify", "1", "system", "user")
    paid = PaidAnswer("k", "job-1", json.dumps(SPAM), 10, 3_600_010)

    decision = decide_reused(job, Reused(paid, SPAM, prompt, "openai", "gpt-4o-mini"), 100, 105)

    assert decision.outcome == Succeeded(SPAM, output_hash(SPAM), reused_from="job-1")
    assert decision.then == Ack(Fate.SUCCEEDED)
    attempt = decision.attempt
    assert attempt is not None
    assert (attempt.attempt, attempt.via, attempt.reused_from, attempt.calls, attempt.cost_usd) == (
        1,
        Via.REUSE,
        "job-1",
        0,
        Decimal(0),
    )
    assert (attempt.provider, attempt.model, attempt.prompt_key, attempt.prompt_version) == (
        "openai",
        "gpt-4o-mini",
        "classify",
        "1",
    )
    assert (attempt.started_at, attempt.finished_at) == (100, 105)


def test_a_paid_answer_is_kept_under_its_request_s_key_for_the_job_type_s_time(world: World) -> None:
    paid = world.run()

    kept = world.store.paid_answer(request_key_of(REUSING, TEXT))

    assert kept is not None
    assert (kept.job_id, json.loads(kept.answer)) == (paid.job_id, SPAM)
    assert (kept.answered_at, kept.until) == (paid.finished_at, world.clock.now_ms + REUSE_SECONDS * 1000)


# --- the key -------------------------------------------------------------------------------------------

PROMPT = RenderedPrompt("classify", "1", "You classify texts.", 'Text: "a"')
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
INFO = AttachmentInfo(AttachmentRef(FILES, "a.pdf"), MediaType.PDF, 10, "a" * 64)


def test_the_key_ignores_the_schema_s_key_order_and_the_attachments_names() -> None:
    reordered = {"required": ["label"], "properties": {"label": {"type": "string"}}, "type": "object"}
    renamed = replace(INFO, ref=AttachmentRef("elsewhere", "b.pdf", "b"))

    assert request_key(CLASSIFY, PROMPT, "openai", "m", SCHEMA, [INFO]) == request_key(
        CLASSIFY, PROMPT, "openai", "m", reordered, [renamed]
    )


@given(
    part=st.sampled_from(["system", "user", "version", "provider", "model", "schema", "attachment", "type"]),
    text=st.text(min_size=1, max_size=40),
)
def test_any_part_of_the_request_changed_changes_the_key(part: str, text: str) -> None:
    # Given a request, and the same with one part changed to anything else
    parts: dict[str, Any] = {
        "definition": CLASSIFY,
        "prompt": PROMPT,
        "provider": "openai",
        "model": "m",
        "schema": SCHEMA,
        "attachments": [INFO],
    }
    changed = dict(parts)
    match part:
        case "system" | "user" | "version":
            changed["prompt"] = replace(PROMPT, **{part: getattr(PROMPT, part) + text})
        case "provider" | "model":
            changed[part] = parts[part] + text
        case "schema":
            changed["schema"] = SCHEMA | {"description": text}
        case "attachment":
            changed["attachments"] = [replace(INFO, sha256=INFO.sha256 + text)]
        case "type":
            changed["definition"] = replace(CLASSIFY, name=CLASSIFY.name + "x")

    def key(of: dict[str, Any]) -> str:
        return request_key(of["definition"], of["prompt"], of["provider"], of["model"], of["schema"], of["attachments"])

    assert key(changed) != key(parts)


# --- the worker's batch paths ------------------------------------------------------------------------


def reusing_fleet(cap: str | None = None) -> Fleet:
    """A background worker with batches (and a daily cap), its classify reusing answers for a day."""
    return Fleet(cap=cap, registry=JobRegistry([replace(CLASSIFY, reuse_seconds=86_400)]))


def test_a_batch_s_answer_is_kept_and_a_repeat_finishes_at_its_claim_joining_no_batch() -> None:
    # Given a background job its provider's batch answered
    fleet = reusing_fleet()
    [paid] = fleet.submit(1)
    fleet.gather()
    fleet.end_batch()

    # When the same request comes in the background lane
    disposition = fleet.deliver(job_message("classify", "repeat", lane="background"))

    # Then it ends at its claim with the batch's answer: no part written, no call of either kind
    assert disposition == Ack(Fate.SUCCEEDED)
    repeat = fleet.job("repeat")
    assert (repeat.status, repeat.reused_from, repeat.batch) == (JobStatus.SUCCEEDED, paid, None)
    assert repeat.output == fleet.job(paid).output
    assert fleet.files.parts() == []
    assert fleet.realtime.calls == 0
    assert only_attempt(fleet.store, repeat).via is Via.REUSE


def test_a_reused_answer_reserves_and_spends_nothing_of_its_user_s_budget() -> None:
    # Given a capped user whose batched job paid for an answer
    fleet = reusing_fleet(cap="1.00")
    fleet.submit(1)
    fleet.gather()
    fleet.end_batch()
    before = dict(fleet.budget_days.days)

    # When the user's next job is the same request
    disposition = fleet.deliver(job_message("classify", "repeat", lane="background"))

    # Then it succeeds with no reservation and no spend
    assert disposition == Ack(Fate.SUCCEEDED)
    assert fleet.budget_days.days == before
    assert fleet.job("repeat").usage == Usage(attempts=1)


# --- the setting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0, -1, MAX_REUSE_SECONDS + 1, True, 60.0])
def test_a_code_job_type_s_reuse_seconds_out_of_bounds_fails_its_definition_naming_it(seconds: Any) -> None:
    with pytest.raises(ValueError, match=r"^job type 'classify': reuse_seconds is a whole number from 1 to 2592000$"):
        replace(CLASSIFY, reuse_seconds=seconds)


def test_a_pipeline_cannot_reuse_answers_its_steps_job_types_do() -> None:
    with pytest.raises(ValueError, match="calls no model"):
        replace(SUMMARIZE_LONG, reuse_seconds=REUSE_SECONDS)
