"""What `aijobs dev`'s provider answers a pushed data job type with (aijobs.local.pushed_examples): the
examples of its versions, newest first, whose output meets the schema asked for; read again at most
every REFRESH_SECONDS."""

from __future__ import annotations

from typing import Any

from aijobs.local.pushed_examples import REFRESH_SECONDS, PushedExamples
from engine.core.job_types import StoredVersion

LABEL = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
TOPIC = {"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]}


def version(number: int, *examples: dict[str, Any]) -> StoredVersion:
    return StoredVersion("triage", number, {"name": "triage", "examples": list(examples)}, f"sha-{number}", 0)


def example(text: str, output: dict[str, Any]) -> dict[str, Any]:
    return {"input": {"text": text}, "output": output}


class Versions:
    """A table's versions of each name, counting the reads."""

    def __init__(self, **versions: list[StoredVersion]) -> None:
        self.versions = versions
        self.reads = 0

    def __call__(self, name: str) -> list[StoredVersion]:
        self.reads += 1
        return self.versions.get(name, [])


def test_the_examples_of_every_version_newest_first_that_meet_the_schema_asked_for() -> None:
    versions = Versions(triage=[version(1, example("a", {"label": "old"})), version(2, example("b", {"topic": "new"}))])
    pushed = PushedExamples(versions)

    assert pushed("triage", TOPIC) == [example("b", {"topic": "new"})]
    assert pushed("triage", LABEL) == [example("a", {"label": "old"})]
    assert pushed("triage", None) == [example("b", {"topic": "new"}), example("a", {"label": "old"})]


def test_a_name_no_file_holds_has_none_and_an_unreadable_table_none_either() -> None:
    def unreadable(name: str) -> list[StoredVersion]:
        raise ConnectionError("the endpoint is gone")

    assert PushedExamples(Versions())("classify", LABEL) == []
    assert PushedExamples(unreadable)("triage", LABEL) == []


def test_examples_that_are_not_input_output_pairs_and_schemas_no_validator_takes_are_left_out() -> None:
    versions = Versions(
        triage=[version(1, {"input": "text", "output": {}}, {"input": {}}, example("a", {"label": "x"}))]
    )
    pushed = PushedExamples(versions)

    assert pushed("triage", LABEL) == [example("a", {"label": "x"})]
    assert pushed("triage", {"type": "object", "properties": {"label": {"$ref": "#/$defs/missing"}}}) == []


def test_a_name_is_read_again_only_once_its_refresh_period_is_over() -> None:
    now = [100.0]
    versions = Versions(triage=[version(1, example("a", {"label": "x"}))])
    pushed = PushedExamples(versions, clock=lambda: now[0])

    pushed("triage", LABEL)
    pushed("triage", LABEL)
    versions.versions["triage"].append(version(2, example("b", {"label": "y"})))
    before = pushed("triage", LABEL)
    now[0] += REFRESH_SECONDS
    after = pushed("triage", LABEL)

    assert versions.reads == 2
    assert before == [example("a", {"label": "x"})]
    assert after == [example("b", {"label": "y"}), example("a", {"label": "x"})]
