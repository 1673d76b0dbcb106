"""A map step's kinds on the in-memory store (docs/pipelines.md, "Map kinds"): a list field of the input,
one child an item, shaped by `as` and `with`, at most 1000; and a PDF attachment by page ranges, one
child a PDF of its own under its attachments, written once however often its parent's advance runs."""

from __future__ import annotations

import io
from typing import Any

import pytest
from pypdf import PdfReader

from engine.attachments.pages import PageRanges
from engine.core import ErrorCode, JobStatus
from engine.core.errors import AttachmentInvalidError, InputValidationError
from engine.definitions.data import DataPipelineDefinition, compile_job_type
from engine.definitions.pipelines import PART_PAGES, SUMMARIZE_LONG
from engine.pipelines import children_ids
from engine.testing import MemoryAttachments
from tests.support.documents import pdf
from tests.support.pipelines import BUCKET, PartsBucket, Stack

NAME = "digest_lines"


def digest(map_spec: dict[str, Any] | None = None, max_failed: int = 0) -> DataPipelineDefinition:
    """A data pipeline: summarize each line (a map over `lines`), then classify the summaries."""
    spec = map_spec or {"over": "lines", "as": "text", "with": {"max_words": 40}}
    document = {
        "name": NAME,
        "input_schema": {
            "type": "object",
            "properties": {"lines": {"type": "array", "items": {"type": "string"}}, "topic": {"type": "string"}},
            "required": ["lines"],
        },
        "output_schema": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
        "steps": [
            {"name": "each", "map": spec, "run": "summarize", "max_failed": max_failed},
            {"name": "all", "run": "summarize", "as": "parts", "with": {"text": "", "max_words": 80}},
        ],
    }
    definition = compile_job_type(document, 1)
    assert isinstance(definition, DataPipelineDefinition)
    return definition


def test_a_map_over_a_list_field_makes_one_child_an_item_shaped_by_as_and_with() -> None:
    definition = digest()
    stack = Stack([definition])
    stack.submit(definition, {"lines": ["first line", "second line", "third line"], "topic": "t"})

    stack.advance()

    ids = children_ids(stack.job())[0]
    assert [stack.store.get_input(job_id) for job_id in ids] == [
        {"text": "first line", "max_words": 40},
        {"text": "second line", "max_words": 40},
        {"text": "third line", "max_words": 40},
    ]
    assert {stack.job(job_id).job_type for job_id in ids} == {"summarize"}
    assert stack.job().status is JobStatus.WAITING
    assert stack.queue.sent == ids


def test_the_step_after_a_map_takes_its_outputs_as_a_list_named_by_as() -> None:
    definition = digest()
    stack = Stack([definition])
    stack.submit(definition, {"lines": ["a", "b"]})
    stack.advance()
    for job_id in children_ids(stack.job())[0]:
        stack.run_child(job_id)

    stack.advance()

    (summary,) = children_ids(stack.job())[1]
    given = stack.store.get_input(summary)
    assert given == {
        "parts": [{"summary": "summary of p:s0:0"}, {"summary": "summary of p:s0:1"}],
        "text": "",
        "max_words": 80,
    }


def test_a_map_without_as_makes_each_object_item_a_childs_input() -> None:
    definition = digest({"over": "lines", "with": {"max_words": 30}})
    stack = Stack([definition])
    # (the schema says strings: an object item is still refused by the map, in one line)
    stack.submit(definition, {"lines": ["not an object"]})

    stack.advance()

    failed = stack.job()
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None
    assert failed.error.code is ErrorCode.INPUT_VALIDATION_FAILED
    assert failed.error.message == "input.lines[0]: an item mapped without `as` must be an object"


@pytest.mark.parametrize(("count", "refused"), [(1000, False), (1001, True), (0, True)])
def test_a_map_takes_one_to_1000_items_and_refuses_more_in_one_line(count: int, refused: bool) -> None:
    definition = digest()
    job_input = {"lines": [f"line {n}" for n in range(count)]}

    if not refused:
        assert definition.parse_input(job_input) is not None
        return
    with pytest.raises(InputValidationError) as raised:
        definition.parse_input(job_input)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("input.lines: ")


def test_summarize_long_over_a_pdf_makes_one_child_a_page_range_each_a_pdf_of_its_own() -> None:
    # Given a PDF of 45 pages attached to a summarize_long with no text
    stack = Stack()
    document = stack.objects.put(BUCKET, "report.pdf", pdf(45))
    stack.submit(SUMMARIZE_LONG, {"max_words": 100}, attachments=(document,))

    # When its first step starts, twice over (a worker that lost its lease before it wrote the wait)
    parent = stack.store.claim_job("p", "w-p", 60_000, stack.clock.tick(), None)
    raw = stack.store.get_input("p") or {}
    for _ in range(2):
        stack.pipelines.advance(parent, SUMMARIZE_LONG, SUMMARIZE_LONG.parse_input(raw), raw)

    # Then each child has its range of pages, as a PDF under its own attachments
    ids = children_ids(stack.job())[0]
    assert len(ids) == 3
    pages = []
    for job_id in ids:
        (ref,) = stack.job(job_id).attachments
        assert ref.bucket == BUCKET
        assert ref.key.startswith(f"attachments/{job_id}/pages-")
        data = stack.objects.read(ref, stack.objects.head(ref))
        pages.append(len(PdfReader(io.BytesIO(data)).pages))
        assert stack.store.get_input(job_id) == {"text": "", "max_words": 200}  # (8000 words over 3 parts)
    assert pages == [PART_PAGES, PART_PAGES, 45 - 2 * PART_PAGES]
    assert [stack.job(job_id).attachments[0].name for job_id in ids] == [
        "report.pdf pages 1-20",
        "report.pdf pages 21-40",
        "report.pdf pages 41-45",
    ]
    # and each part was written once, the second advance finding them there
    assert len(stack.parts.written) == 3
    assert stack.job().status is JobStatus.WAITING


@pytest.mark.parametrize(
    ("content", "text", "code", "says"),
    [
        (b"just some text", "", ErrorCode.ATTACHMENT_INVALID, "not a PDF"),
        (None, "a text as well", ErrorCode.INPUT_VALIDATION_FAILED, "a text or a PDF's pages, not both"),
    ],
)
def test_a_pdf_map_that_cannot_be_made_fails_its_pipeline_in_one_line(
    content: bytes | None, text: str, code: ErrorCode, says: str
) -> None:
    stack = Stack()
    ref = stack.objects.put(BUCKET, "in.pdf", content or pdf(3))
    stack.submit(SUMMARIZE_LONG, {"text": text} if text else {}, attachments=(ref,))

    stack.advance()

    failed = stack.job()
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None
    assert failed.error.code is code
    assert says in failed.error.message
    assert "\n" not in failed.error.message
    assert children_ids(failed) == []


@pytest.mark.parametrize(("pages", "cut"), [(4, [2, 2]), (6, [3, 3]), (7, None)])
def test_a_pdf_makes_larger_parts_past_the_parts_a_map_takes_and_is_refused_past_the_providers_pages(
    pages: int, cut: list[int] | None
) -> None:
    # Given a map of at most 2 parts, each at most 3 pages (the provider's), asked for parts of 2 pages
    objects = MemoryAttachments()
    ranges = PageRanges(objects, PartsBucket(objects), {BUCKET}, max_bytes=1 << 20, max_parts=2, max_part_pages=3)
    ref = objects.put(BUCKET, "doc.pdf", pdf(pages))

    if cut is None:
        with pytest.raises(AttachmentInvalidError) as refused:
            ranges.split(ref, 2, lambda part, first, last: f"p/{part}.pdf")
        assert str(refused.value) == (
            "attachment doc.pdf: 7 pages; a map over its pages takes at most 6 "
            "(2 parts of 3, the provider's pages a request)"
        )
        assert objects.reads() == [ref.uri]  # and nothing was written
        return
    parts = ranges.split(ref, 2, lambda part, first, last: f"p/{part}.pdf")
    assert [len(PdfReader(io.BytesIO(objects.read(part, objects.head(part)))).pages) for part in parts] == cut
