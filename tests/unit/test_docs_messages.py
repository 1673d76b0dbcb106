"""docs/messages.md against the code: the message body's table has a row for each field a message
may hold; the job view's example has the fields in their order, an attachment's included, and its
table has a row for each field."""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.messages import JobMessage
from tests.support.contract import ATTACHMENT_FIELDS, USAGE_FIELDS, VIEW_FIELDS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "messages.md"
SECTION = PAGE.read_text().split("\n## The job view\n", 1)[1].split("\n## ", 1)[0]
# The full request's table: the first run of table lines after its heading.
MESSAGE_TABLE = re.search(r"\n### Full request\n\n(?:[^|\n].*\n)*((?:\|.*\n)+)", PAGE.read_text())


def test_the_message_table_has_a_row_for_every_field_a_message_may_hold() -> None:
    # Given the rows of the full request's table
    assert MESSAGE_TABLE is not None
    rows = re.findall(r"^\| `([a-z_]+)` \|", MESSAGE_TABLE[1], flags=re.MULTILINE)

    # When compared with the message model, then every field the worker takes has one (a producer
    # writing raw messages reads this table), and no other
    assert sorted(rows) == sorted(JobMessage.model_fields)


def test_the_example_has_every_field_in_the_view_s_order() -> None:
    block = re.search(r"^```json\n(.*?)^```$", SECTION, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    example = json.loads(block[1])

    assert list(example) == VIEW_FIELDS
    assert list(example["usage"]) == USAGE_FIELDS
    assert [list(attachment) for attachment in example["attachments"]] == [ATTACHMENT_FIELDS]


def test_the_table_has_a_row_for_every_field() -> None:
    rows = re.findall(r"^\| (`[^|]+`) \|", SECTION, flags=re.MULTILINE)
    named = {name.strip("`") for row in rows for name in row.split(", ")}

    assert set(VIEW_FIELDS) - {"usage"} <= named
    assert {f"usage.{field}" for field in USAGE_FIELDS} <= named


def test_the_via_row_names_the_client_s_wait_among_the_reads_of_the_job_alone() -> None:
    # Given the row of `via`, which says where the view reads the job's attempts and where not
    row = next(line for line in SECTION.splitlines() if line.startswith("| `via` |"))
    alone = row.split("null where the job is read alone", 1)[1]

    # Then the client's wait, which polls the job alone as get does, is named there
    assert "`AiJobsClient.get`" in alone
    assert "`AiJobsClient.wait`" in alone
