"""docs/jobtypes.md and docs/errors.md against the code: the built-ins' table is the registry's, the
examples run as written, a pushed file is refused with the lines the page shows, and every error
code has its row and its section."""

from __future__ import annotations

import copy
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.core import ErrorCode
from engine.core.errors import JobTypeFileError
from engine.definitions import BUILTIN_DEFINITIONS, JobDefinition, JobRegistry
from engine.definitions.data import AttachmentsFile, check_job_type
from engine.intake import BadMessageError, parse_message

DOCS = Path(__file__).resolve().parents[2] / "docs"
CODE_NAMES = tuple(definition.name for definition in BUILTIN_DEFINITIONS)
JOB_TYPES = (DOCS / "jobtypes.md").read_text()
ERRORS = (DOCS / "errors.md").read_text()


def section(page: str, heading: str) -> str:
    """The text under `heading`, up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    body = page.split(f"\n{heading}\n", 1)[1]
    ends = [match.start() for match in re.finditer(rf"^#{{1,{len(level)}}} ", body, flags=re.MULTILINE)]
    return body[: ends[0]] if ends else body


def table_rows(text: str) -> list[list[str]]:
    """The cells of the first table in `text`, header and separator left out."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    end = next((index for index in range(start, len(lines)) if not lines[index].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[start + 2 : end]]


def code_block(text: str, language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)
    assert match, f"no {language} block"
    return match[1]


# --- docs/jobtypes.md ---------------------------------------------------------------------------------


def test_a_files_attachments_are_named_by_the_keys_the_file_takes() -> None:
    # Given what the file's list of keys says `attachments` holds
    named = re.search(r"`attachments` \(`\{([a-z_, ]+)\}`", section(JOB_TYPES, "## Job types as data"))
    assert named is not None

    # Then those are the keys a pushed file's attachments take, in their order
    assert named[1].split(", ") == list(AttachmentsFile.model_fields)


def test_the_built_ins_table_is_the_registry_s_with_what_each_takes() -> None:
    rows = {row[0].strip("`"): row for row in table_rows(section(JOB_TYPES, "## Built in"))}

    assert sorted(rows) == sorted(definition.name for definition in BUILTIN_DEFINITIONS)
    for definition in BUILTIN_DEFINITIONS:
        policy = definition.attachments
        assert rows[definition.name][-1] == (f"up to {policy.max_count}" if policy.takes_any else "none")


def test_the_extract_example_is_a_message_the_intake_takes() -> None:
    body = code_block(section(JOB_TYPES, "### `extract`"), "json")

    request = parse_message(body, "m-1", JobRegistry())

    assert request.new_job is not None
    assert request.new_job.job_type == "extract"
    assert len(request.new_job.attachments) == 1


@pytest.fixture
def receipt_total(monkeypatch: pytest.MonkeyPatch) -> JobDefinition:
    """The job type of the attachments section, as written there, run as a module of its own."""
    module = types.ModuleType("docs_receipt_total")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(code_block(section(JOB_TYPES, "### Attachments"), "python"), module.__dict__)
    definition: JobDefinition = module.RECEIPT_TOTAL
    return definition


def receipt_message(text: str, attachments: int) -> str:
    refs = [{"s3": f"s3://receipts/r{n}.png"} for n in range(attachments)]
    body: dict[str, Any] = {"job_id": "r-1", "job_type": "receipt_total", "user_id": "u", "input": {"text": text}}
    return json.dumps(body | ({"attachments": refs} if refs else {}))


def test_the_attachments_example_takes_a_scan_or_a_text_and_refuses_neither(receipt_total: JobDefinition) -> None:
    registry = JobRegistry([receipt_total])

    assert parse_message(receipt_message("", 1), "m-1", registry).new_job is not None
    assert parse_message(receipt_message("TOTAL 12.50", 0), "m-1", registry).new_job is not None
    with pytest.raises(BadMessageError) as neither:
        parse_message(receipt_message("", 0), "m-1", registry)
    with pytest.raises(BadMessageError) as too_many:
        parse_message(receipt_message("", 3), "m-1", registry)

    assert neither.value.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert too_many.value.error.code is ErrorCode.ATTACHMENT_INVALID
    job_input = receipt_total.parse_input({"text": ""})
    assert receipt_total.render_prompt(job_input, attachments=1).version == "attachments-1"
    assert receipt_total.render_prompt(job_input).version == "1"


# --- docs/errors.md -----------------------------------------------------------------------------------


def test_the_lines_push_refuses_with_are_the_ones_the_page_shows() -> None:
    # Given the page's own job type file (which passes), and three files made wrong from it, each as
    # one of the page's examples of a refusal says
    file = yaml.safe_load(code_block(section(JOB_TYPES, "## Job types as data"), "yaml"))
    check_job_type(file, CODE_NAMES)
    bad_type = copy.deepcopy(file)
    bad_type["input_schema"]["properties"]["text"]["type"] = "nope"
    bad_field = copy.deepcopy(file)
    bad_field["prompt"]["user"] = "Ticket: {ticket}"
    bad_example = copy.deepcopy(file)
    bad_example["examples"][0]["output"]["label"] = "shipping"
    shown = " ".join(section(JOB_TYPES, "### Push, versions, labels").split())

    # When each is checked, then its one line is the one the page shows
    for document in (bad_type, bad_field, bad_example):
        with pytest.raises(JobTypeFileError) as refused:
            check_job_type(document, CODE_NAMES)
        assert f"`{refused.value}`" in shown


def test_every_error_code_has_its_row_and_its_section() -> None:
    rows = [row[0].strip("`") for row in table_rows(section(ERRORS, "## The codes"))]
    sections = re.findall(r"^### `(\w+)`$", ERRORS, flags=re.MULTILINE)

    assert sorted(rows) == sorted(code.value for code in ErrorCode)
    assert sorted(sections) == sorted(code.value for code in ErrorCode)
