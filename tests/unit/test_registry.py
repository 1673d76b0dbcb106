"""JobRegistry: built-ins, lookup, duplicates, your own job types (the jobtypes package) and user
modules named by AIJOBS_JOB_MODULES."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine.config import Settings
from engine.core import ErrorCode
from engine.core.errors import ConfigurationError, UnknownJobTypeError
from engine.definitions import BUILTIN_DEFINITIONS, JobDefinition, JobRegistry, Prompt
from engine.definitions import registry as registry_module
from jobtypes.extract_contact import EXTRACT_CONTACT


class EchoInput(BaseModel):
    text: str


class EchoOutput(BaseModel):
    text: str


def echo_definition(name: str = "echo") -> JobDefinition:
    return JobDefinition(
        name=name,
        input_model=EchoInput,
        output_model=EchoOutput,
        prompt=Prompt(key=name, version="1", system="Echo.", user="{text}"),
    )


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write_module(directory: Path, name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    # Whatever the test imports is forgotten afterwards.
    monkeypatch.delitem(sys.modules, name, raising=False)


def known_types(registry: JobRegistry) -> str:
    """The job types a registry knows, as its refusal of an unknown one names them."""
    with pytest.raises(UnknownJobTypeError) as caught:
        registry.get("no_such_type")
    return caught.value.message.split("(known: ", 1)[1].rstrip(")")


def test_the_default_registry_holds_the_built_ins_and_the_built_in_pipelines() -> None:
    registry = JobRegistry()

    assert (
        known_types(registry) == "answer_with_citations, classify, extract, extract_reviewed, summarize, summarize_long"
    )
    assert [registry.get(definition.name) for definition in BUILTIN_DEFINITIONS] == list(BUILTIN_DEFINITIONS)


def test_an_unknown_job_type_is_a_permanent_unknown_job_type_error() -> None:
    with pytest.raises(UnknownJobTypeError) as caught:
        JobRegistry().get("translate")

    assert caught.value.code is ErrorCode.UNKNOWN_JOB_TYPE
    assert caught.value.retryable is False
    assert caught.value.message == (
        "no job type 'translate' is registered (known: answer_with_citations, classify, extract, extract_reviewed, "
        "summarize, summarize_long)"
    )


def test_registering_a_name_twice_is_refused() -> None:
    registry = JobRegistry([echo_definition()])

    with pytest.raises(ValueError, match="'echo' is registered twice"):
        registry.register(echo_definition())


def test_a_registry_can_start_empty() -> None:
    registry = JobRegistry([])

    assert known_types(registry) == ""
    with pytest.raises(UnknownJobTypeError):
        registry.get("summarize")


def test_load_modules_registers_each_modules_job_definitions(module_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a user module with two job definitions
    write_module(
        module_dir,
        "aijobs_user_jobs",
        """
        from pydantic import BaseModel
        from engine.definitions import JobDefinition, Prompt

        class In(BaseModel):
            text: str

        class Out(BaseModel):
            text: str

        JOB_DEFINITIONS = [
            JobDefinition(name=name, input_model=In, output_model=Out, prompt=Prompt(name, "1", "s", "{text}"))
            for name in ("echo", "shout")
        ]
        """,
        monkeypatch,
    )
    registry = JobRegistry()

    # When it is loaded
    registry.load_modules(["aijobs_user_jobs"])

    # Then its types join the built-ins
    assert (
        known_types(registry)
        == "answer_with_citations, classify, echo, extract, extract_reviewed, shout, summarize, summarize_long"
    )
    assert registry.get("shout").input_model.__name__ == "In"


def test_load_modules_with_no_modules_changes_nothing() -> None:
    registry = JobRegistry()

    registry.load_modules([])

    assert (
        known_types(registry) == "answer_with_citations, classify, extract, extract_reviewed, summarize, summarize_long"
    )


def test_a_missing_module_is_a_configuration_error_naming_the_variable(module_dir: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        JobRegistry().load_modules(["aijobs_no_such_module"])

    assert str(caught.value).startswith("AIJOBS_JOB_MODULES: ")
    assert "'aijobs_no_such_module'" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_module_without_job_definitions_is_a_configuration_error(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(module_dir, "aijobs_empty_jobs", "VALUE = 1\n", monkeypatch)

    with pytest.raises(ConfigurationError) as caught:
        JobRegistry().load_modules(["aijobs_empty_jobs"])

    assert str(caught.value) == "AIJOBS_JOB_MODULES: 'aijobs_empty_jobs' has no JOB_DEFINITIONS"


def test_a_module_redefining_a_built_in_is_refused(module_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(
        module_dir,
        "aijobs_clash_jobs",
        """
        from engine.definitions.summarize import SUMMARIZE
        JOB_DEFINITIONS = [SUMMARIZE]
        """,
        monkeypatch,
    )

    with pytest.raises(ValueError, match="'summarize' is registered twice"):
        JobRegistry().load_modules(["aijobs_clash_jobs"])


# --- your own job types: the jobtypes package ----------------------------------------------------

SETTINGS = {"jobs_table_name": "jobs", "jobs_queue_url": "http://127.0.0.1:1/q", "jobs_payload_bucket": "payloads"}


def settings(**values: object) -> Settings:
    return Settings.model_validate(SETTINGS | values)


def test_the_jobtypes_package_is_registered_with_no_setting() -> None:
    registry = JobRegistry.from_settings(settings())

    assert (
        known_types(registry)
        == "answer_with_citations, classify, extract, extract_contact, extract_reviewed, summarize, summarize_long"
    )
    assert registry.get("extract_contact") is EXTRACT_CONTACT


def test_naming_the_jobtypes_package_as_well_registers_it_once(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "from tests.unit.test_registry import echo_definition\nJOB_DEFINITIONS = [echo_definition()]\n"
    write_module(module_dir, "aijobs_more_jobs", source, monkeypatch)

    registry = JobRegistry.from_settings(settings(aijobs_job_modules="jobtypes, aijobs_more_jobs"))

    assert (
        known_types(registry)
        == "answer_with_citations, classify, echo, extract, extract_contact, extract_reviewed, summarize, "
        "summarize_long"
    )


def test_without_a_jobtypes_package_the_built_ins_and_the_named_modules_are_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_module, "JOB_TYPES_PACKAGE", "aijobs_no_job_types_here")

    assert (
        known_types(JobRegistry.from_settings(settings()))
        == "answer_with_citations, classify, extract, extract_reviewed, summarize, summarize_long"
    )


def test_a_jobtypes_package_without_job_definitions_is_a_configuration_error_naming_it(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(module_dir, "aijobs_empty_types", "VALUE = 1\n", monkeypatch)
    monkeypatch.setattr(registry_module, "JOB_TYPES_PACKAGE", "aijobs_empty_types")

    with pytest.raises(ConfigurationError) as caught:
        JobRegistry.from_settings(settings())

    assert str(caught.value) == "jobtypes (your own job types): 'aijobs_empty_types' has no JOB_DEFINITIONS"
