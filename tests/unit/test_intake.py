"""intake.parse_message: an SQS body becomes a JobRequest, or a BadMessageError with one clear line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.core import ErrorCode
from engine.definitions import MAX_INPUT_BYTES, JobRegistry
from engine.intake import BadMessageError, JobRequest, parse_message, request_hash
from engine.messages import MAX_DEADLINE_SECONDS, MIN_DEADLINE_SECONDS
from engine.text import MAX_JSON_DEPTH, MAX_REASON_CHARS
from tests.support.events import job_message

MESSAGE_ID = "0c5e7f0e-5b4a-4f0b-9d6e-1f2a3b4c5d6e"


def parse(body: Any, registry: JobRegistry, message_id: str = MESSAGE_ID) -> JobRequest:
    return parse_message(body if isinstance(body, str) else json.dumps(body), message_id, registry)


def rejected(body: Any, registry: JobRegistry) -> BadMessageError:
    with pytest.raises(BadMessageError) as caught:
        parse(body, registry)
    error = caught.value
    # Every reason is one clear line (docs/messages.md), and the wrapped JobError says the same.
    assert "\n" not in str(error)
    assert "\r" not in str(error)
    assert error.error.message == str(error)
    assert error.error.retryable is False
    return error


# --- bodies that name no job: dead letters ------------------------------------------------------


@pytest.mark.parametrize("body", ["", "not json", "{", '{"job_id": "a",}', "{'job_id': 'a'}"])
def test_a_body_that_is_not_json_names_no_job(body: str, registry: JobRegistry) -> None:
    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id is None
    assert "not JSON" in str(error)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ("[]", "list"),
        ('[{"job_id": "a"}]', "list"),
        ('"job-1"', "str"),
        ("42", "int"),
        ("4.5", "float"),
        ("null", "NoneType"),
        ("true", "bool"),
    ],
)
def test_a_body_that_is_not_an_object_names_no_job(body: str, kind: str, registry: JobRegistry) -> None:
    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id is None
    assert str(error) == f"message body is a JSON {kind}, not an object"


@pytest.mark.parametrize(
    "job_id",
    [
        42,
        True,
        None,
        ["a"],
        {"id": "a"},
        "",
        "has space",
        "slash/id",
        "user@host",  # '@' is allowed in user ids, not in job ids
        "ünïcode",
        "a" * 129,
        "line\nbreak",
    ],
)
def test_an_unusable_job_id_names_no_job(job_id: Any, registry: JobRegistry) -> None:
    # Given a complete, otherwise valid message whose job_id cannot name a job
    body = {**job_message("classify"), "job_id": job_id}

    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id is None
    assert str(error).startswith("message.job_id: ")


@pytest.mark.parametrize("job_id", ["a", "A-z_0.9:x", "a" * 128, "job:2026-12-02T10:00:00.000"])
def test_job_ids_within_the_spec_are_kept(job_id: str, registry: JobRegistry) -> None:
    request = parse(job_message("classify", job_id=job_id), registry)

    assert request.job_id == job_id


# --- job ids and references -------------------------------------------------------------------


def test_a_message_without_job_id_takes_the_sqs_message_id(registry: JobRegistry) -> None:
    request = parse(job_message("classify"), registry, message_id="msg-123")

    assert request.job_id == "msg-123"
    assert request.new_job is not None


def test_a_message_of_only_a_job_id_refers_to_an_existing_job(registry: JobRegistry) -> None:
    request = parse({"job_id": "x"}, registry)

    assert request == JobRequest(job_id="x")
    assert request.new_job is None
    assert request.definition is None
    assert request.job_input is None
    assert request.raw_input is None


def test_an_empty_object_is_not_a_reference_and_fails_under_the_message_id(registry: JobRegistry) -> None:
    error = rejected({}, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == MESSAGE_ID
    assert "job_type, user_id, input" in str(error)


@pytest.mark.parametrize("missing", ["job_type", "user_id", "input"])
def test_a_message_missing_a_required_field_fails_its_job(missing: str, registry: JobRegistry) -> None:
    body = job_message("classify", job_id="job-1")
    del body[missing]

    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert missing in str(error)


def test_a_null_required_field_counts_as_missing(registry: JobRegistry) -> None:
    error = rejected(job_message("classify", job_id="job-1", user_id=None), registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert "user_id" in str(error)


# --- wrong field types and unknown fields keep the job id ---------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", "3"),
        ("max_attempts", True),
        ("max_attempts", 3.0),
        ("deadline_seconds", "3600"),
        ("deadline_seconds", False),
        ("schema_version", "1"),
        ("schema_version", True),
        ("job_type", 7),
        ("job_type", "Not-A-Name"),
        ("user_id", 12),
        ("user_id", "has space"),
        ("user_id", "u" * 129),
        ("user_id", ""),
        ("input", "text"),
        ("input", ["text"]),
        ("priority", "high"),  # unknown field
    ],
)
def test_a_malformed_field_fails_the_job_and_keeps_its_id(field: str, value: Any, registry: JobRegistry) -> None:
    body = {**job_message("classify", job_id="job-1"), field: value}

    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert str(error).startswith(f"message.{field}")


def test_the_fields_of_a_bad_message_are_kept_for_the_failed_job(registry: JobRegistry) -> None:
    body = job_message("classify", job_id="job-1", max_attempts="3")

    error = rejected(body, registry)

    assert error.known("user_id") == "user-1"
    assert error.known("job_type") == "classify"
    assert error.known("max_attempts") is None  # "3" is not an int
    assert error.known("schema_version") is None


def test_a_bool_is_not_kept_as_an_int(registry: JobRegistry) -> None:
    error = rejected(job_message("classify", job_id="job-1", max_attempts=True), registry)

    assert error.known("max_attempts") is None


@pytest.mark.parametrize(
    "field",
    [
        {"max_attempts": 12345678901234567890123456789012345678901},
        {"max_attempts": 10**200},
        {"max_attempts": 0},
        {"job_type": "x" * 600_000},
        {"job_type": "a\ud800b"},
        {"user_id": "u" * 129},
        {"user_id": "user 1"},
    ],
)
def test_a_field_that_breaks_its_own_rule_is_not_kept(field: dict[str, Any], registry: JobRegistry) -> None:
    # A value no DynamoDB number or bounded string can hold must not reach the failed job's write.
    # (json.dumps writes a lone surrogate as its \\u escape, as a JavaScript producer would.)
    name, value = next(iter(field.items()))
    body = job_message("classify", job_id="job-1") | {name: value}

    with pytest.raises(BadMessageError) as caught:
        parse(body, registry)

    assert caught.value.job_id == "job-1"
    assert caught.value.known(name) is None
    assert len(caught.value.error.message) <= MAX_REASON_CHARS


@pytest.mark.parametrize(
    "overrides",
    [
        {"input": {"text": "a\ud800b", "labels": ["a", "b"]}},
        {"input": {"text": "ok", "labels": ["a", "\udfffb"]}},
        {"input": {"\ud83d": "x", "text": "t", "labels": ["a", "b"]}},
        {"job_type": "classi\ud800fy"},
        {"user_id": "u\udc00"},
    ],
)
def test_a_lone_surrogate_anywhere_is_a_clear_input_error_of_its_job(
    overrides: dict[str, Any], registry: JobRegistry
) -> None:
    # Given what a JavaScript producer emits for a string cut inside an emoji (json.dumps writes
    # a lone surrogate as its \\u escape too)
    body = json.dumps(job_message("classify", job_id="s1") | overrides)
    assert "\\ud" in body

    with pytest.raises(BadMessageError) as caught:
        parse_message(body, "message-1", registry)

    # Then the job named by the message fails with a reason that names the place, not the text
    assert caught.value.job_id == "s1"
    assert caught.value.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert "lone UTF-16 surrogate" in caught.value.error.message
    assert caught.value.error.message.encode()  # the reason itself is valid UTF-8


def test_a_surrogate_pair_written_as_two_escapes_is_valid_text(registry: JobRegistry) -> None:
    body = '{"job_type":"classify","user_id":"u1","input":{"text":"smile \\ud83d\\ude00","labels":["a","b"]}}'

    request = parse_message(body, "message-1", registry)

    assert request.raw_input == {"text": "smile \U0001f600", "labels": ["a", "b"]}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_refused(constant: str, registry: JobRegistry) -> None:
    body = '{"job_id":"j1","job_type":"summarize","user_id":"u1","input":{"text":"t","max_words":' + constant + "}}"

    with pytest.raises(BadMessageError) as caught:
        parse_message(body, "message-1", registry)

    assert "not a JSON number" in caught.value.error.message


@pytest.mark.parametrize(
    ("field", "literal"),
    [("input.max_words", "9" * 5_000), ("input.extra", "-" + "1" * 4_301), ("max_attempts", "7" * 10_000)],
)
def test_an_integer_too_long_to_convert_fails_its_job_with_its_place(
    field: str, literal: str, registry: JobRegistry
) -> None:
    # Given valid JSON holding, at `field`, an integer of more digits than Python converts (4300)
    values = {"input.max_words": "50", "input.extra": "0", "max_attempts": "3"} | {field: literal}
    body = (
        '{"job_id":"j1","job_type":"summarize","user_id":"u1","input":{"text":"t","max_words":MW,"extra":EX},'
        '"max_attempts":MA}'
    )
    for placeholder, name in (("MW", "input.max_words"), ("EX", "input.extra"), ("MA", "max_attempts")):
        body = body.replace(placeholder, values[name])

    # When it is parsed
    with pytest.raises(BadMessageError) as caught:
        parse_message(body, "message-1", registry)

    # Then the job it names fails (no dead letter), with a reason naming the place and the length
    assert caught.value.job_id == "j1"
    assert caught.value.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    digits = len(literal.lstrip("-"))
    assert caught.value.error.message == f"message.{field}: an integer of {digits} digits, too long to hold"
    assert caught.value.known("max_attempts") == (None if field == "max_attempts" else 3)


def test_json_nested_deeper_than_the_bound_is_refused_with_its_job(registry: JobRegistry) -> None:
    deep = "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5)
    body = '{"job_id":"j1","job_type":"summarize","user_id":"u1","input":{"text":"t","extra":' + deep + "}}"

    with pytest.raises(BadMessageError) as caught:
        parse_message(body, "message-1", registry)

    assert caught.value.job_id == "j1"
    assert "nested deeper" in caught.value.error.message


def test_a_huge_key_is_named_by_its_length_not_quoted(registry: JobRegistry) -> None:
    key = "k" * 200_000
    body = job_message("classify", job_id="job-1")
    body["input"][key] = 1

    error = rejected(body, registry)

    assert key not in error.error.message
    assert "<key of 200000 characters>" in error.error.message


@pytest.mark.parametrize("where", ["message", "input"])
def test_a_field_name_with_a_newline_still_gives_a_one_line_reason(where: str, registry: JobRegistry) -> None:
    body = job_message("classify", job_id="job-1")
    target = body if where == "message" else body["input"]
    target["bad\nkey"] = 1

    with pytest.raises(BadMessageError) as caught:
        parse(body, registry)

    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("body", ["[" * 100_000, '{"job_id": "job-1", "input": ' + '{"a": ' * 100_000])
def test_a_deeply_nested_body_is_a_bad_message(body: str, registry: JobRegistry) -> None:
    with pytest.raises(BadMessageError) as caught:
        parse(body, registry)

    assert caught.value.error.code is ErrorCode.INPUT_VALIDATION_FAILED


# --- job type, schema version, input ----------------------------------------------------------


def test_an_unregistered_job_type_fails_as_unknown_job_type(registry: JobRegistry) -> None:
    error = rejected({**job_message("classify", job_id="job-1"), "job_type": "translate"}, registry)

    assert error.error.code is ErrorCode.UNKNOWN_JOB_TYPE
    assert error.job_id == "job-1"
    assert "'translate'" in str(error)


def test_a_schema_version_other_than_the_job_types_fails_as_a_mismatch(registry: JobRegistry) -> None:
    error = rejected(job_message("classify", job_id="job-1", schema_version=2), registry)

    assert error.error.code is ErrorCode.SCHEMA_VERSION_MISMATCH
    assert error.job_id == "job-1"
    assert str(error) == "message schema_version 2 != classify schema version 1"


def test_the_current_schema_version_is_accepted(registry: JobRegistry) -> None:
    request = parse(job_message("classify", schema_version=1), registry)

    assert request.new_job is not None
    assert request.new_job.schema_version == 1


def test_input_that_fails_the_input_model_fails_the_job(registry: JobRegistry) -> None:
    body = job_message("classify", job_id="job-1", input={"text": "t", "labels": ["only-one"]})

    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert str(error).startswith("input.labels: ")


def test_input_larger_than_the_limit_fails_the_job(registry: JobRegistry) -> None:
    body = job_message("summarize", job_id="job-1", input={"text": "x" * (MAX_INPUT_BYTES + 1)})

    error = rejected(body, registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert f"the limit is {MAX_INPUT_BYTES}" in str(error)


def test_input_size_counts_utf8_bytes_not_characters(registry: JobRegistry) -> None:
    # Given a text well under the byte limit in characters but over it in UTF-8 bytes
    text = "é" * (MAX_INPUT_BYTES // 2 + 1)

    error = rejected(job_message("summarize", job_id="job-1", input={"text": text}), registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert "bytes" in str(error)


# --- limits and defaults ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", 11),
        ("max_attempts", -1),
        ("deadline_seconds", MIN_DEADLINE_SECONDS - 1),
        ("deadline_seconds", MAX_DEADLINE_SECONDS + 1),
        ("deadline_seconds", 0),
        ("schema_version", 0),
    ],
)
def test_limits_outside_the_spec_fail_the_job(field: str, value: int, registry: JobRegistry) -> None:
    error = rejected(job_message("classify", job_id="job-1", **{field: value}), registry)

    assert error.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert error.job_id == "job-1"
    assert str(error).startswith(f"message.{field}: ")


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_attempts", 1), ("max_attempts", 10), ("deadline_seconds", 60), ("deadline_seconds", 604_800)],
)
def test_limits_at_the_bounds_are_kept(field: str, value: int, registry: JobRegistry) -> None:
    request = parse(job_message("classify", **{field: value}), registry)

    assert request.new_job is not None
    assert getattr(request.new_job, field) == value


def test_a_new_job_takes_its_defaults_from_the_definition(registry: JobRegistry) -> None:
    definition = registry.get("summarize")

    request = parse(job_message("summarize", job_id="job-1"), registry)

    assert request.new_job is not None
    assert request.new_job.job_type == "summarize"
    assert request.new_job.user_id == "user-1"
    assert request.new_job.schema_version == definition.schema_version == 1
    assert request.new_job.max_attempts == definition.max_attempts == 3
    assert request.new_job.deadline_seconds == definition.deadline_seconds == 86_400
    assert request.definition is definition
    assert request.raw_input == job_message("summarize")["input"]
    assert request.job_input == definition.input_model.model_validate(request.raw_input)


def test_a_new_job_carries_the_request_hash_of_its_type_user_and_input(registry: JobRegistry) -> None:
    body = job_message("classify")

    request = parse(body, registry)

    assert request.new_job is not None
    assert request.new_job.request_hash == request_hash("classify", "user-1", body["input"])


# --- request_hash -----------------------------------------------------------------------------


def test_request_hash_is_stable_across_key_order() -> None:
    first = request_hash("classify", "u", {"text": "t", "labels": ["a", "b"], "nested": {"x": 1, "y": 2}})
    second = request_hash("classify", "u", {"nested": {"y": 2, "x": 1}, "labels": ["a", "b"], "text": "t"})

    assert first == second
    assert len(first) == 64
    assert int(first, 16) >= 0


@pytest.mark.parametrize(
    ("job_type", "user_id", "job_input"),
    [
        ("summarize", "u", {"text": "t", "labels": ["a", "b"]}),
        ("classify", "v", {"text": "t", "labels": ["a", "b"]}),
        ("classify", "u", {"text": "T", "labels": ["a", "b"]}),
        ("classify", "u", {"text": "t", "labels": ["b", "a"]}),
        ("classify", "u", {"text": "t", "labels": ["a", "b"], "extra": None}),
    ],
)
def test_request_hash_differs_for_a_different_type_user_or_input(
    job_type: str, user_id: str, job_input: dict[str, Any]
) -> None:
    reference = request_hash("classify", "u", {"text": "t", "labels": ["a", "b"]})

    assert request_hash(job_type, user_id, job_input) != reference
