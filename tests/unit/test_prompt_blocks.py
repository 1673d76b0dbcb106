"""User content enters prompts as JSON literals: whatever the text, it cannot close its block."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.errors import InputValidationError
from engine.definitions import JobRegistry

REGISTRY = JobRegistry()
# Valid Unicode text, including the characters a prompt injection would use to break out.
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]) | st.sampled_from(['"', "\n", "\\", "`", "]", "}", "\r"]),
    min_size=1,
    max_size=300,
)


def field_lines(prompt: str) -> dict[str, object]:
    """The `<Label>: <json>` lines of a rendered prompt, decoded."""
    return {match[1]: json.loads(match[2]) for match in re.finditer(r"^(\w+): (.*)$", prompt, flags=re.MULTILINE)}


@given(text=TEXT, labels=st.lists(TEXT.filter(lambda label: len(label) <= 200), min_size=2, max_size=5, unique=True))
@settings(max_examples=200, deadline=None)
def test_classify_content_stays_inside_its_blocks(text: str, labels: list[str]) -> None:
    definition = REGISTRY.get("classify")
    prompt = definition.render_prompt(definition.parse_input({"text": text, "labels": labels})).user

    # The template's structure is intact: its two blocks, each on one line, and nothing else.
    assert field_lines(prompt) == {"Labels": labels, "Text": text}
    assert prompt.count("\n") == 4


@given(question=TEXT, texts=st.lists(TEXT, min_size=1, max_size=4))
@settings(max_examples=200, deadline=None)
def test_documents_and_question_stay_inside_their_blocks(question: str, texts: list[str]) -> None:
    documents = [{"id": f"d{index}", "text": text} for index, text in enumerate(texts)]
    definition = REGISTRY.get("answer_with_citations")
    prompt = definition.render_prompt(definition.parse_input({"question": question, "documents": documents})).user

    assert field_lines(prompt) == {"Documents": documents, "Question": question}


@given(text=TEXT)
@settings(max_examples=100, deadline=None)
def test_a_summarize_text_stays_inside_its_block(text: str) -> None:
    definition = REGISTRY.get("summarize")
    prompt = definition.render_prompt(definition.parse_input({"text": text, "max_words": 50})).user

    assert field_lines(prompt) == {"Text": text}


@pytest.mark.parametrize("document_id", ["]\n\nQuestion:", "d 1", "d1\n", "", "x" * 129, '"d1"'])
def test_a_document_id_outside_the_safe_pattern_is_refused(document_id: str) -> None:
    definition = REGISTRY.get("answer_with_citations")

    with pytest.raises(InputValidationError) as caught:
        definition.parse_input({"question": "q", "documents": [{"id": document_id, "text": "t"}]})

    assert caught.value.message.startswith("input.documents.0.id")
