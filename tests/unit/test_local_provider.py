"""The local OpenAI-compatible provider: its answers pass the engine's validation; its faults, over HTTP.

It answers from a request's structure alone: the output schema the engine sends for the job's input,
and the job type header; never from the prompts' wording.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import date
from typing import Annotated, Any, Literal

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field

from aijobs.local.answers import answer_for
from aijobs.local.faults import FaultKind, FaultMarker, find_fault_marker
from aijobs.local.protocol import estimate_tokens
from aijobs.local.provider import LocalProvider
from engine.core import ErrorCode
from engine.core.errors import BusinessValidationError, ReferenceValidationError, SchemaValidationError
from engine.definitions import JobDefinition, JobRegistry, Prompt
from engine.definitions.base import narrowed_schema
from engine.definitions.classify import CLASSIFY
from engine.gateway import ChatTurn, CompletionRequest, ModelGateway, ModelTiers
from engine.gateway.openai import (
    JOB_TYPE_HEADER,
    OpenAICompatibleProvider,
    StructuredOutput,
    chat_completion_body,
    request_headers,
    static_api_key,
)
from engine.gateway.schema import SCHEMA_PREAMBLE, strict_json_schema
from tests.support.waiting import eventually

REGISTRY = JobRegistry()
MODES: list[StructuredOutput] = ["json_schema", "json_object"]
INPUTS: dict[str, list[dict[str, Any]]] = {
    "classify": [
        {"text": "Win a free cruise now!", "labels": ["spam", "ham"]},
        {"text": "The invoice is attached.", "labels": ["billing", "support", "sales", "other"]},
    ],
    "summarize": [
        {"text": "SQS stores messages redundantly and delivers them at least once.", "max_words": 10},
        {"text": " ".join(f"word{i}" for i in range(500)), "max_words": 25},
    ],
    "answer_with_citations": [
        {
            "question": "How long does SQS keep messages?",
            "documents": [{"id": "d1", "text": "Up to 14 days."}, {"id": "d2", "text": "1 MiB per message."}],
        },
        {
            "question": "What is [odd]?",
            "documents": [{"id": "doc-7", "text": "[not-an-id] is\n\nexplained here."}, {"id": "x", "text": "y"}],
        },
    ],
}
CASES = [
    pytest.param(job_type, raw, id=f"{job_type}-{i}") for job_type, raws in INPUTS.items() for i, raw in enumerate(raws)
]


# A job type the provider has never heard of: nested objects, an enum narrowed to the input, bounds.
class TriageInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ticket: Annotated[str, Field(min_length=1)]
    teams: Annotated[list[str], Field(min_length=2)]


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subject: Annotated[str, Field(min_length=1, max_length=80)]
    body: str


class TriageOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: str
    priority: Annotated[int, Field(ge=1, le=5)]
    severity: Literal["low", "high"]
    urgent: bool
    score: Annotated[float, Field(gt=0, lt=10)]
    tags: Annotated[list[str], Field(min_length=2, max_length=4)]
    reply: Reply
    due: date | None = None


def team_is_offered(job_input: TriageInput, output: TriageOutput) -> str | None:
    return None if output.team in job_input.teams else f"team {output.team!r} is not offered"


TRIAGE = JobDefinition(
    name="triage",
    input_model=TriageInput,
    output_model=TriageOutput,
    prompt=Prompt(key="triage", version="1", system="Route support tickets.", user="{ticket} -> {teams}"),
    output_schema_for=lambda job_input: narrowed_schema(
        TriageOutput.model_json_schema(), ("properties", "team"), {"type": "string", "enum": job_input.teams}
    ),
    business_rule=team_is_offered,
)
TRIAGE_INPUT = {"ticket": "The app crashes on upload", "teams": ["mobile", "web", "billing"]}
# The soak's own type: classify's models and prompt under another name.
QUICK_CLASSIFY = replace(CLASSIFY, name="soak_quick_classify", timeout_seconds=1.0)


def completion_request(
    definition: JobDefinition, raw_input: dict[str, Any], conversation: tuple[str, ...] = ()
) -> CompletionRequest:
    """The request the gateway builds for a job; `conversation` is a re-ask's turns."""
    job_input = definition.parse_input(raw_input)
    prompt = definition.render_prompt(job_input)
    roles = ("assistant", "user")
    return CompletionRequest(
        model="local-model",
        system=prompt.system,
        user=prompt.user,
        schema_name=definition.name,
        output_schema=definition.output_schema(job_input),
        max_tokens=definition.max_tokens,
        timeout_seconds=2.0,
        conversation=tuple(ChatTurn(roles[i % 2], turn) for i, turn in enumerate(conversation)),
    )


def chat_body(
    job_type: str,
    raw_input: dict[str, Any],
    *,
    mode: StructuredOutput = "json_schema",
    conversation: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The body the engine's OpenAICompatibleProvider sends for a job of a registered type."""
    return chat_completion_body(completion_request(REGISTRY.get(job_type), raw_input, conversation), mode)


def content_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def validate(job_type: str | JobDefinition, raw_input: dict[str, Any], content: str) -> dict[str, Any]:
    definition = REGISTRY.get(job_type) if isinstance(job_type, str) else job_type
    output: dict[str, Any] = definition.validate_output(definition.parse_input(raw_input), content).model_dump()
    return output


def gateway_to(server: LocalProvider, mode: StructuredOutput, http: httpx.Client) -> ModelGateway:
    """The engine's gateway, calling `server` through the real OpenAI-compatible adapter."""
    provider = OpenAICompatibleProvider(server.url, static_api_key(None), structured_output=mode, client=http)
    return ModelGateway(provider, ModelTiers("local-model"))


@pytest.fixture
def server() -> Iterator[LocalProvider]:
    with LocalProvider(latency_seconds=0, hang_seconds=1, retry_after_seconds=3) as provider:
        yield provider


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        yield client


def post(http: httpx.Client, server: LocalProvider, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return http.post(f"{server.url}/chat/completions", json=body, **kwargs)


# --- answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("job_type", "raw_input"), CASES)
def test_the_answer_to_a_jobs_schema_passes_the_job_types_validation(job_type: str, raw_input: dict[str, Any]) -> None:
    definition = REGISTRY.get(job_type)
    job_input = definition.parse_input(raw_input)
    schema = strict_json_schema(definition.output_schema(job_input))
    user = definition.render_prompt(job_input).user

    answer = answer_for(schema, user)

    validate(job_type, raw_input, json.dumps(answer))
    assert answer == answer_for(schema, user)  # deterministic
    assert answer == answer_for(definition.output_schema(job_input), user)  # the json_object mode's schema


@pytest.mark.parametrize(("job_type", "raw_input"), CASES)
@pytest.mark.parametrize("mode", MODES)
def test_the_server_answers_each_built_in_job_type_in_both_structured_output_modes(
    job_type: str, raw_input: dict[str, Any], mode: StructuredOutput, server: LocalProvider, http: httpx.Client
) -> None:
    request = completion_request(REGISTRY.get(job_type), raw_input)

    response = post(http, server, chat_completion_body(request, mode), headers=request_headers(request))

    validate(job_type, raw_input, content_of(response))
    (entry,) = server.log
    assert (entry.schema_name, entry.job_type, entry.fault, entry.status) == (job_type, job_type, None, 200)


def test_the_job_type_header_is_logged_whatever_the_schemas_name(server: LocalProvider, http: httpx.Client) -> None:
    body = chat_body("classify", INPUTS["classify"][0])
    body["response_format"]["json_schema"]["name"] = "renamed"

    content_of(post(http, server, body, headers={JOB_TYPE_HEADER: "classify"}))
    content_of(post(http, server, chat_body("classify", INPUTS["classify"][0], mode="json_object")))

    assert [(entry.schema_name, entry.job_type) for entry in server.log] == [("renamed", "classify"), (None, None)]


def test_classify_spreads_texts_over_the_labels() -> None:
    labels = ["a", "b", "c"]
    chosen = set()
    for i in range(30):
        job_input = CLASSIFY.parse_input({"text": f"text {i}", "labels": labels})
        chosen.add(answer_for(CLASSIFY.output_schema(job_input), CLASSIFY.render_prompt(job_input).user)["label"])
    assert chosen == set(labels)


def test_a_summary_is_the_texts_first_ten_words() -> None:
    definition = REGISTRY.get("summarize")
    job_input = definition.parse_input(INPUTS["summarize"][1])

    summary = answer_for(definition.output_schema(job_input), definition.render_prompt(job_input).user)["summary"]

    assert summary.split() == [f"word{i}" for i in range(10)]


def test_an_answer_cites_a_document_it_was_given() -> None:
    definition = REGISTRY.get("answer_with_citations")
    for raw in INPUTS["answer_with_citations"]:
        job_input = definition.parse_input(raw)
        answer = answer_for(definition.output_schema(job_input), definition.render_prompt(job_input).user)
        (citation,) = answer["citations"]
        assert citation in {document["id"] for document in raw["documents"]}


def test_a_request_without_a_schema_gets_an_empty_object(server: LocalProvider, http: httpx.Client) -> None:
    body = chat_body("classify", INPUTS["classify"][0])
    body["response_format"] = {"type": "json_object"}

    assert content_of(post(http, server, body)) == "{}"


def test_in_json_object_mode_the_schema_is_read_from_the_system_message(
    server: LocalProvider, http: httpx.Client
) -> None:
    schema = {"type": "object", "properties": {"colour": {"enum": ["teal"]}, "n": {"type": "integer", "minimum": 7}}}
    schema["required"] = ["colour", "n"]
    body = {
        "model": "local-model",
        "messages": [
            {"role": "system", "content": f"Whatever the wording.\n\n{SCHEMA_PREAMBLE}\n{json.dumps(schema)}"},
            {"role": "user", "content": "Anything at all."},
        ],
        "response_format": {"type": "json_object"},
    }

    answer = json.loads(content_of(post(http, server, body)))

    assert answer["colour"] == "teal"
    assert answer["n"] >= 7


def test_a_schema_of_every_kind_of_value_is_answered_validly() -> None:
    schema = TRIAGE.output_schema(TRIAGE.parse_input(TRIAGE_INPUT))

    for answer in (answer_for(schema, "one"), answer_for(strict_json_schema(schema), "two")):
        output = validate(TRIAGE, TRIAGE_INPUT, json.dumps(answer))
        assert output["team"] in TRIAGE_INPUT["teams"]
        assert len(output["reply"]["subject"]) <= 80
        assert all(len(text.split()) <= 10 for text in (output["reply"]["subject"], output["reply"]["body"]))


@pytest.mark.parametrize("definition", [TRIAGE, QUICK_CLASSIFY], ids=lambda definition: definition.name)
@pytest.mark.parametrize("mode", MODES)
def test_a_job_type_it_never_heard_of_is_answered_from_its_schema_alone(
    definition: JobDefinition, mode: StructuredOutput, server: LocalProvider, http: httpx.Client
) -> None:
    # Given a job type of the application's own (the provider knows no job type by name)
    raw = TRIAGE_INPUT if definition is TRIAGE else INPUTS["classify"][1]
    gateway = gateway_to(server, mode, http)

    # When the engine runs a job of it, and one whose input asks for an answer that breaks its rule
    execution = gateway.execute(definition, definition.parse_input(raw))
    field_ = "ticket" if definition is TRIAGE else "text"
    faulty = {**raw, field_: f"{raw[field_]} fault:business_invalid"}
    rejected = gateway.execute(definition, definition.parse_input(faulty))

    # Then the first answer is valid at the first call, and the second is refused by the business rule
    assert execution.error is None
    assert execution.calls == 1
    assert rejected.error is not None
    assert rejected.error.code is ErrorCode.BUSINESS_VALIDATION_FAILED
    assert {entry.job_type for entry in server.log} == {definition.name}


def reworded(definition: JobDefinition) -> JobDefinition:
    """The job type with prompts of other wording: none of the built-in templates' labels remain."""
    names = definition.prompt_fields(definition.parse_input(INPUTS[definition.name][0])).keys()
    user = "Please do the task with these values.\n" + "\n~~\n".join(f"<{{{name}}}>" for name in names)
    prompt = Prompt(key=definition.prompt.key, version="99", system="A system prompt never seen before.", user=user)
    return replace(definition, prompt=prompt)


@pytest.mark.parametrize(
    ("job_type", "fault", "code"),
    [
        ("classify", "", None),
        ("summarize", "", None),
        ("answer_with_citations", "", None),
        ("classify", "fault:business_invalid", ErrorCode.BUSINESS_VALIDATION_FAILED),
        ("summarize", "fault:business_invalid", ErrorCode.BUSINESS_VALIDATION_FAILED),
        ("answer_with_citations", "fault:reference_invalid", ErrorCode.REFERENCE_VALIDATION_FAILED),
        ("answer_with_citations", "fault:wrong_shape", ErrorCode.SCHEMA_VALIDATION_FAILED),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_rewording_a_built_in_prompt_changes_nothing_in_the_answers(
    job_type: str,
    fault: str,
    code: ErrorCode | None,
    mode: StructuredOutput,
    server: LocalProvider,
    http: httpx.Client,
) -> None:
    # Given a built-in job type whose prompts say the same in other words
    definition = reworded(REGISTRY.get(job_type))
    raw = with_marker(INPUTS[job_type][0], fault) if fault else INPUTS[job_type][0]
    assert "Text:" not in definition.render_prompt(definition.parse_input(raw)).user

    # When the engine runs a job of it against the local provider
    execution = gateway_to(server, mode, http).execute(definition, definition.parse_input(raw))

    # Then the answer is as valid (or as invalid, for the right reason) as with the built-in wording
    assert (execution.error.code if execution.error else None) is code
    if code is None:
        assert execution.calls == 1


def test_usage_is_about_a_token_per_four_characters_and_the_log_bills_it(
    server: LocalProvider, http: httpx.Client
) -> None:
    body = chat_body("summarize", INPUTS["summarize"][1], mode="json_object")

    response = post(http, server, body)

    usage = response.json()["usage"]
    prompt_chars = sum(len(message["content"]) for message in body["messages"])
    assert usage["prompt_tokens"] == estimate_tokens("x" * prompt_chars) == pytest.approx(prompt_chars / 4, abs=1)
    assert usage["completion_tokens"] == estimate_tokens(content_of(response))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert server.billed_tokens() == (usage["prompt_tokens"], usage["completion_tokens"])
    assert response.json()["model"] == "local-model"


def test_a_system_message_answered_before_is_reported_as_cached_prompt_tokens(
    server: LocalProvider, http: httpx.Client
) -> None:
    # Given two requests of the same job type (one system message), with other texts
    first = chat_body("classify", INPUTS["classify"][0])
    second = chat_body("classify", INPUTS["classify"][1])
    assert first["messages"][0] == second["messages"][0]

    usages = [post(http, server, body).json()["usage"] for body in (first, second)]

    # Then the second reads the system message from the prompt cache: part of its prompt tokens
    system_tokens = estimate_tokens(first["messages"][0]["content"])
    assert [usage["prompt_tokens_details"]["cached_tokens"] for usage in usages] == [0, system_tokens]
    assert usages[1]["prompt_tokens"] > system_tokens
    assert server.billed_token_parts() == (system_tokens, 0)


def test_without_the_prompt_cache_and_with_reasoning_every_answer_reports_them_so(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, prompt_cache=False, reasoning_tokens=64) as server:
        body = chat_body("classify", INPUTS["classify"][0])
        responses = [post(http, server, body) for _ in range(2)]

    for response in responses:
        usage = response.json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        assert usage["completion_tokens_details"] == {"reasoning_tokens": 64}
        assert usage["completion_tokens"] == estimate_tokens(content_of(response)) + 64
    assert server.billed_token_parts() == (0, 128)


class WaitRecorder(LocalProvider):
    """A provider that records the waits its answers make (their latency) instead of waiting."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.waits: list[float] = []

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)


def test_latency_delays_every_answer() -> None:
    with WaitRecorder(latency_seconds=0.2) as server, httpx.Client(trust_env=False) as http:
        for text in ("first", "second"):
            content_of(post(http, server, chat_body("classify", {"text": text, "labels": ["a", "b"]})))

    assert server.waits == [0.2, 0.2]


# --- markers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "marker"),
    [
        ("fault:hang", FaultMarker(FaultKind.HANG)),
        ("please fault:unavailable*2 now", FaultMarker(FaultKind.UNAVAILABLE, 2)),
        ("fault:rate_limited*10.", FaultMarker(FaultKind.RATE_LIMITED, 10)),
        ("fault:dropped", None),
        ("fault:nonsense", None),
        ("no marker", None),
    ],
)
def test_a_fault_marker_names_a_kind_and_optionally_a_count(text: str, marker: FaultMarker | None) -> None:
    assert find_fault_marker(text) == marker


# --- faults over HTTP -----------------------------------------------------------------------------


def with_marker(raw_input: dict[str, Any], marker: str) -> dict[str, Any]:
    """The input with `marker` added to its free text (the question of answer_with_citations)."""
    field = "question" if "question" in raw_input else "text"
    return {**raw_input, field: f"{raw_input[field]} {marker}"}


def classify_with(marker: str) -> dict[str, Any]:
    return {"text": f"Win a free cruise now! {marker}", "labels": ["spam", "ham"]}


@pytest.mark.parametrize(
    ("kind", "status"),
    [("rate_limited", 429), ("server_error", 500), ("unavailable", 503)],
)
def test_an_error_fault_answers_its_status_and_bills_nothing(
    kind: str, status: int, server: LocalProvider, http: httpx.Client
) -> None:
    response = post(http, server, chat_body("classify", classify_with(f"fault:{kind}")))

    assert response.status_code == status
    assert "message" in response.json()["error"]
    if kind == "rate_limited":
        assert response.headers["retry-after"] == "3"
    (entry,) = server.log
    assert (entry.fault, entry.status, entry.prompt_tokens, entry.completion_tokens) == (FaultKind(kind), status, 0, 0)


def test_a_dropped_connection_gets_no_response(server: LocalProvider, http: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        post(http, server, chat_body("classify", classify_with("fault:drop")))

    (entry,) = server.log
    assert (entry.fault, entry.status, entry.prompt_tokens, entry.completion_tokens) == (FaultKind.DROP, None, 0, 0)
    # And the next request gets through on a fresh connection
    content_of(post(http, server, chat_body("classify", INPUTS["classify"][0])))


def test_a_hang_outlasts_the_clients_timeout(http: httpx.Client) -> None:
    # A hang far longer than the client waits: stopping the server (leaving the block) ends it
    with LocalProvider(latency_seconds=0, hang_seconds=300) as server, pytest.raises(httpx.ReadTimeout):
        post(http, server, chat_body("classify", classify_with("fault:hang")), timeout=0.3)

    (entry,) = server.log
    assert (entry.fault, entry.status, entry.prompt_tokens, entry.completion_tokens) == (FaultKind.HANG, None, 0, 0)


def test_stopping_the_server_ends_a_hang() -> None:
    # A hang, and a client's timeout, far longer than the test waits for the client to end
    server = LocalProvider(latency_seconds=0, hang_seconds=300).start()
    errors: list[Exception] = []

    def ask() -> None:
        try:
            with httpx.Client(timeout=300, trust_env=False) as http:
                post(http, server, chat_body("classify", classify_with("fault:hang")))
        except httpx.HTTPError as exc:
            errors.append(exc)

    client = threading.Thread(target=ask)
    client.start()
    eventually(lambda: server.log, interval=0.01, what="the hanging request")
    server.stop()
    client.join(timeout=30)

    assert not client.is_alive()
    assert len(errors) == 1


@pytest.mark.parametrize(
    ("kind", "job_type", "raw_input", "error"),
    [
        ("non_json", "classify", INPUTS["classify"][0], SchemaValidationError),
        ("wrong_shape", "classify", INPUTS["classify"][0], SchemaValidationError),
        ("wrong_shape", "answer_with_citations", INPUTS["answer_with_citations"][0], SchemaValidationError),
        ("business_invalid", "classify", INPUTS["classify"][1], BusinessValidationError),
        ("business_invalid", "summarize", INPUTS["summarize"][0], BusinessValidationError),
        ("reference_invalid", "answer_with_citations", INPUTS["answer_with_citations"][1], ReferenceValidationError),
        ("repairable", "summarize", INPUTS["summarize"][1], SchemaValidationError),
    ],
)
def test_a_content_fault_answers_200_with_an_answer_the_engine_rejects(
    kind: str,
    job_type: str,
    raw_input: dict[str, Any],
    error: type[Exception],
    server: LocalProvider,
    http: httpx.Client,
) -> None:
    raw = with_marker(raw_input, f"fault:{kind}")

    response = post(http, server, chat_body(job_type, raw))

    with pytest.raises(error):
        validate(job_type, raw, content_of(response))
    (entry,) = server.log
    usage = response.json()["usage"]
    assert (entry.fault, entry.status) == (FaultKind(kind), 200)
    assert (entry.prompt_tokens, entry.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])


@pytest.mark.parametrize("text", ["Short text.", "Unicode wörds ünd " * 3000, "x" * 100_000])
def test_a_summary_that_breaks_the_budget_is_over_any_budget_yet_within_max_tokens(
    text: str, server: LocalProvider, http: httpx.Client
) -> None:
    raw = {"text": f"{text} fault:business_invalid", "max_words": 1000}

    content = content_of(post(http, server, chat_body("summarize", raw)))

    assert len(json.loads(content)["summary"].split()) > 1.2 * 1000
    assert len(content) <= REGISTRY.get("summarize").max_answer_chars
    with pytest.raises(BusinessValidationError):
        validate("summarize", raw, content)


def test_a_repairable_answer_is_mended_by_the_re_ask(server: LocalProvider, http: httpx.Client) -> None:
    raw = classify_with("fault:repairable")
    first = content_of(post(http, server, chat_body("classify", raw)))
    with pytest.raises(SchemaValidationError):
        validate("classify", raw, first)

    again = chat_body("classify", raw, conversation=(first, "Your answer was not accepted: ... Answer again."))
    second = content_of(post(http, server, again))

    validate("classify", raw, second)
    assert [(entry.fault, entry.repair) for entry in server.log] == [(FaultKind.REPAIRABLE, False), (None, True)]


def test_a_fault_without_a_count_is_served_to_re_asks_too(server: LocalProvider, http: httpx.Client) -> None:
    raw = classify_with("fault:business_invalid")
    first = content_of(post(http, server, chat_body("classify", raw)))

    second = content_of(post(http, server, chat_body("classify", raw, conversation=(first, "Not accepted."))))

    with pytest.raises(BusinessValidationError):
        validate("classify", raw, second)


def test_a_counted_fault_is_served_that_many_times_per_prompt(server: LocalProvider, http: httpx.Client) -> None:
    body = chat_body("classify", classify_with("fault:unavailable*2"))
    other = chat_body("classify", classify_with("fault:unavailable*2 (another prompt)"))

    statuses = [post(http, server, body).status_code for _ in range(2)]
    statuses.append(post(http, server, other).status_code)
    statuses += [post(http, server, body).status_code for _ in range(2)]

    assert statuses == [503, 503, 503, 200, 200]
    assert [entry.fault for entry in server.log] == [FaultKind.UNAVAILABLE] * 3 + [None, None]
    # And reset() forgets the counts
    server.reset()
    assert post(http, server, body).status_code == 503


def test_random_faults_follow_the_seed() -> None:
    def statuses(seed: int) -> list[int]:
        kinds = ["server_error", "rate_limited"]
        with (
            LocalProvider(latency_seconds=0, fault_rate=0.5, random_faults=kinds, seed=seed) as server,
            httpx.Client(trust_env=False) as http,
        ):
            return [post(http, server, chat_body("classify", INPUTS["classify"][0])).status_code for _ in range(12)]

    first = statuses(seed=3)
    assert first == statuses(seed=3)
    assert {200, 429, 500} <= set(first)


def test_a_marker_wins_over_the_random_rate() -> None:
    with (
        LocalProvider(latency_seconds=0, fault_rate=1.0, random_faults=["server_error"]) as server,
        httpx.Client(trust_env=False) as http,
    ):
        assert post(http, server, chat_body("classify", classify_with("fault:unavailable"))).status_code == 503
        assert post(http, server, chat_body("classify", INPUTS["classify"][0])).status_code == 500


# --- the rest of the HTTP surface ---------------------------------------------------------------------


def test_a_key_is_required_when_the_server_has_one(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, api_key="sk-local") as server:
        body = chat_body("classify", INPUTS["classify"][0])
        missing = post(http, server, body)
        wrong = post(http, server, body, headers={"Authorization": "Bearer sk-other"})
        right = post(http, server, body, headers={"Authorization": "Bearer sk-local"})
        models = http.get(f"{server.url}/models")

        assert (missing.status_code, wrong.status_code, right.status_code, models.status_code) == (401, 401, 200, 401)
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert [(entry.status, entry.prompt_tokens > 0) for entry in server.log] == [
            (401, False),
            (401, False),
            (200, True),
        ]


def test_models_are_listed_and_others_are_not_found(http: httpx.Client) -> None:
    with LocalProvider(latency_seconds=0, models=["primary-model", "fallback-model"]) as server:
        listed = http.get(f"{server.url}/models").json()
        unknown = post(http, server, chat_body("classify", INPUTS["classify"][0]))

    assert [model["id"] for model in listed["data"]] == ["primary-model", "fallback-model"]
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


def test_a_malformed_request_is_a_400_and_an_unknown_path_a_404(server: LocalProvider, http: httpx.Client) -> None:
    not_json = http.post(f"{server.url}/chat/completions", content=b"{not json")
    no_messages = post(http, server, {"model": "m", "messages": []})
    elsewhere = http.post(f"{server.url}/embeddings", json={})

    assert (not_json.status_code, no_messages.status_code, elsewhere.status_code) == (400, 400, 404)
    assert [entry.status for entry in server.log] == [400, 400]


def test_the_url_names_the_running_servers_port() -> None:
    server = LocalProvider(latency_seconds=0)
    with pytest.raises(RuntimeError):
        _ = server.url
    with server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.url.endswith("/v1")
        assert int(server.url.rsplit(":", 1)[1].split("/")[0]) > 0
    with pytest.raises(RuntimeError):
        _ = server.url
