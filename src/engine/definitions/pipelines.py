"""Pipelines: job types whose steps are job types (docs/pipelines.md).

A pipeline makes no model call of its own: each step's work is ordinary child jobs, so lanes,
batches, budgets, fallback, attempts and usage apply to every call. Its steps:
- MapStep: split the pipeline's input into parts and run a job type on each (at most MAX_PARTS);
- ThenStep: run a job type once, on the pipeline's input and the previous step's outputs;
- ReviewStep: wait for a person to approve (or edit) the previous step's output, or reject it.
The pipeline's output is its last step's: the one child's output of a ThenStep or a map of one
part, or the output a review approved.

Built in: `summarize_long` (a text of up to 5 MB, or a PDF by page ranges: `summarize` over its parts,
then `summarize` the summaries) and `extract_reviewed` (`extract`, then a review).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.core.attachments import AttachmentPolicy, MediaType
from engine.definitions.base import JobDefinition, Prompt
from engine.definitions.extract import EXTRACT, ExtractInput
from engine.definitions.summarize import SummarizeOutput

MAX_PARTS = 1000
# A token is about four characters of text: what a part's size and overlap are counted in.
CHARS_PER_TOKEN = 4
PART_TOKENS = 4_000
OVERLAP_TOKENS = 200
# What the summaries of all the parts may add up to: the reduce step's text stays within one call.
SUMMARIES_WORDS = 8_000
MAX_REVIEW_SECONDS = 30 * 86_400
# summarize_long's input: a text of up to 5,000,000 characters, submitted (a message carries 1 MiB).
LONG_INPUT_BYTES = 24 * 1024 * 1024
# Or a PDF, each part of which is a range of this many pages (well within any provider's pages a request).
PART_PAGES = 20
ONE_PDF_OR_TEXT = AttachmentPolicy(max_count=1, media_types=frozenset({MediaType.PDF}), required_unless="text")

Parts = Callable[[BaseModel], list[dict[str, Any]]]
Then = Callable[[BaseModel, list[dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class PagesMap:
    """A map over a PDF attachment's pages: one child a range of `pages` pages, as a PDF of its own
    (engine.attachments.pages), with the input `input` gives from the pipeline's and the parts' count."""

    pages: int
    input: Callable[[BaseModel, int], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class MapStep:
    name: str
    run: str  # the job type each part runs
    parts: Parts  # the children's inputs, from the pipeline's input
    max_failed: int = 0  # children that may fail without failing the pipeline
    # With a PDF attached to the pipeline's job: its page ranges are the parts instead.
    pages: PagesMap | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ThenStep:
    name: str
    run: str
    input: Then  # the child's input, from the pipeline's input and the previous step's outputs
    max_failed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewStep:
    name: str
    # How long a person has to decide; a pipeline's input may set its own (`review_timeout_seconds`).
    timeout_seconds: int = 86_400
    max_failed: int = 0

    def timeout_for(self, job_input: BaseModel) -> int:
        given = getattr(job_input, "review_timeout_seconds", None)
        return given if isinstance(given, int) else self.timeout_seconds


Step = MapStep | ThenStep | ReviewStep

# A pipeline's own "prompt": it is never sent (a pipeline calls no model); it names the pipeline's
# version in its job's view and attempts, as a code job type's prompt does.
_NO_PROMPT = "a pipeline calls no model: its steps' job types do"


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineDefinition(JobDefinition):
    steps: tuple[Step, ...] = field(default=())

    def __post_init__(self) -> None:
        super(PipelineDefinition, self).__post_init__()
        if not self.steps:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        if self.reuse_seconds is not None:
            raise ValueError(f"pipeline {self.name!r} calls no model: its steps' job types reuse answers, not it")
        if isinstance(self.steps[0], ReviewStep):
            raise ValueError(f"pipeline {self.name!r}: a review reviews a step's output, so it cannot come first")
        for step in self.steps[:-1]:
            if isinstance(step, ReviewStep):
                raise ValueError(f"pipeline {self.name!r}: a review is a pipeline's last step")

    def child_types(self) -> set[str]:
        return {step.run for step in self.steps if not isinstance(step, ReviewStep)}

    def edited_output(self, job_input: BaseModel, output: dict[str, Any]) -> dict[str, Any]:
        """An output a review edited, as it is kept; ValueError (one line: where, and what) when the
        pipeline's output schema refuses it."""
        try:
            return review_output_model(self, job_input).model_validate(output).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "output"
            raise ValueError(f"{where}: {first['msg']}") from exc


def pipeline_prompt(name: str) -> Prompt:
    return Prompt(key=name, version="1", system=_NO_PROMPT, user=_NO_PROMPT)


# --- splitting a text ------------------------------------------------------------------------------


def split_text(text: str, part_tokens: int = PART_TOKENS, overlap_tokens: int = OVERLAP_TOKENS) -> list[str]:
    """`text` in parts of about `part_tokens` tokens, each starting `overlap_tokens` before the last one
    ended (so that a sentence cut between two is whole in one), cut at whitespace where there is some
    near the cut; at most MAX_PARTS parts (larger ones for a longer text)."""
    if not text:
        return [""]
    size = part_tokens * CHARS_PER_TOKEN
    overlap = min(overlap_tokens * CHARS_PER_TOKEN, size // 2)
    if math.ceil(len(text) / (size - overlap)) > MAX_PARTS:
        size = math.ceil(len(text) / MAX_PARTS) + overlap
    parts: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        parts.append(text[start:end])
        if end >= len(text):
            break
        start = max(end - overlap, start + 1)
    return parts


# --- summarize_long ---------------------------------------------------------------------------------


class SummarizeLongInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Empty only when a PDF attachment carries what is summarized (engine.intake.check_something_to_read).
    text: Annotated[str, Field(max_length=5_000_000)] = ""
    max_words: Annotated[int, Field(ge=10, le=1000)] = 200


def _part_words(parts: int) -> int:
    """Each part's word budget: the summaries' SUMMARIES_WORDS shared out, 30 to 200 words each."""
    return max(30, min(200, SUMMARIES_WORDS // parts))


def _summarize_parts(job_input: BaseModel) -> list[dict[str, Any]]:
    assert isinstance(job_input, SummarizeLongInput)
    parts = split_text(job_input.text)
    return [{"text": part, "max_words": _part_words(len(parts))} for part in parts]


def _summarize_pages(job_input: BaseModel, parts: int) -> dict[str, Any]:
    return {"text": "", "max_words": _part_words(parts)}


def _summarize_summaries(job_input: BaseModel, outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    assert isinstance(job_input, SummarizeLongInput)
    text = "\n\n".join(f"Part {number}: {output['summary']}" for number, output in enumerate(outputs, 1))
    return {"text": text, "max_words": job_input.max_words}


SUMMARIZE_LONG = PipelineDefinition(
    name="summarize_long",
    input_model=SummarizeLongInput,
    output_model=SummarizeOutput,
    prompt=pipeline_prompt("summarize_long"),
    max_input_bytes=LONG_INPUT_BYTES,
    attachments=ONE_PDF_OR_TEXT,
    steps=(
        MapStep(
            name="parts",
            run="summarize",
            parts=_summarize_parts,
            pages=PagesMap(pages=PART_PAGES, input=_summarize_pages),
        ),
        ThenStep(name="summary", run="summarize", input=_summarize_summaries),
    ),
)


# --- extract_reviewed -------------------------------------------------------------------------------


class ExtractReviewedInput(ExtractInput):
    """extract's input, and how long a person has to review the fields (the step's 24 hours by default)."""

    review_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_REVIEW_SECONDS)] | None = None


def _the_extraction(job_input: BaseModel) -> list[dict[str, Any]]:
    return [job_input.model_dump(mode="json", exclude={"review_timeout_seconds"})]


EXTRACT_REVIEWED = PipelineDefinition(
    name="extract_reviewed",
    input_model=ExtractReviewedInput,
    output_model=EXTRACT.output_model,
    output_model_for=EXTRACT.output_model_for,
    prompt=pipeline_prompt("extract_reviewed"),
    deadline_seconds=7 * 86_400,
    steps=(
        MapStep(name="fields", run="extract", parts=_the_extraction),
        ReviewStep(name="approve", timeout_seconds=86_400),
    ),
)

PIPELINES = (SUMMARIZE_LONG, EXTRACT_REVIEWED)


def review_output_model(definition: JobDefinition, job_input: BaseModel) -> type[BaseModel]:
    """What an edited output of a review is checked against: the pipeline's output model for its input."""
    if definition.output_model_for is not None:
        return definition.output_model_for(job_input)
    return definition.output_model
