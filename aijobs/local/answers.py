"""Deterministic answers for the built-in job types, and the rule-breaking answers of the content faults.

Answers are computed from the prompt the engine renders, so they pass the job types' own validation.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from aijobs.local.faults import FaultKind, find_fault_marker


def _field(prompt: str, label: str) -> Any:
    """The JSON value the prompt gives on its `<label>: <json>` line (the engine renders fields as JSON)."""
    match = re.search(rf"^{label}: (.*)$", prompt, flags=re.MULTILINE)
    if match is None:
        return None
    try:
        return json.loads(match.group(1))
    except ValueError:
        return None


def _text(prompt: str, label: str = "Text") -> str:
    value = _field(prompt, label)
    return value if isinstance(value, str) else ""


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _words(text: str) -> list[str]:
    """The text's words, without the fault markers (they steer this provider, they are not content)."""
    return [word for word in text.split() if find_fault_marker(word) is None]


def _labels(prompt: str) -> list[str]:
    labels = _field(prompt, "Labels")
    return [label for label in labels if isinstance(label, str)] if isinstance(labels, list) else []


def _classify(prompt: str) -> dict[str, Any]:
    text = _text(prompt) or prompt
    labels = _labels(prompt) or ["unknown"]
    digest = _stable_int(text)
    return {"label": labels[digest % len(labels)], "confidence": round(0.5 + (digest >> 8) % 50 / 100, 2)}


def _word_budget(prompt: str) -> int:
    match = re.search(r"at most (\d+) words", prompt)
    return int(match.group(1)) if match else 100


def _summarize(prompt: str) -> dict[str, Any]:
    words = _words(_text(prompt) or prompt)
    return {"summary": " ".join(words[: _word_budget(prompt)]) or "Nothing to summarize."}


def _documents(prompt: str) -> list[tuple[str, str]]:
    """(id, text) of the documents the prompt gives as a JSON list of {"id", "text"} objects."""
    documents = _field(prompt, "Documents")
    if not isinstance(documents, list):
        return []
    return [
        (str(document.get("id")), str(document.get("text", "")))
        for document in documents
        if isinstance(document, dict) and "id" in document
    ]


def _answer_with_citations(prompt: str) -> dict[str, Any]:
    documents = _documents(prompt)
    if not documents:
        return {"answer": "The documents do not say.", "citations": ["unknown"]}
    document_id, text = documents[0]
    excerpt = " ".join(_words(text)[:40]) or "the document"
    return {"answer": f"According to [{document_id}]: {excerpt}", "citations": [document_id]}


def answer_for(schema_name: str | None, prompt: str) -> dict[str, Any]:
    """The valid answer to a rendered prompt of a built-in job type; `{}` for any other schema."""
    match schema_name:
        case "classify":
            return _classify(prompt)
        case "summarize":
            return _summarize(prompt)
        case "answer_with_citations":
            return _answer_with_citations(prompt)
        case _:
            return {}


def _unknown_name(known: Iterable[str], candidate: str) -> str:
    taken = set(known)
    while candidate in taken:
        candidate += "-x"
    return candidate


def _rule_breaking_answer(schema_name: str | None, prompt: str) -> dict[str, Any] | list[Any]:
    """An answer of the right shape that breaks the job type's one rule.

    Each built-in type has one rule (classify and summarize a business rule, answer_with_citations a
    reference rule), so business_invalid and reference_invalid break that same rule; any other
    schema gets a wrong shape.
    """
    valid = answer_for(schema_name, prompt)
    match schema_name:
        case "classify":
            return {**valid, "label": _unknown_name(_labels(prompt), "label-not-offered")}
        case "summarize":
            budget = _word_budget(prompt)
            filler = _words(_text(prompt) or prompt) or ["word"]
            return {"summary": " ".join(filler[i % len(filler)] for i in range(budget * 2 + 10))}
        case "answer_with_citations":
            return {
                **valid,
                "citations": [
                    _unknown_name((document_id for document_id, _ in _documents(prompt)), "doc-not-in-input")
                ],
            }
        case _:
            return [valid]


def faulty_content(kind: FaultKind, schema_name: str | None, prompt: str) -> str:
    """The 200 answer's content for a content fault (non_json, wrong_shape, *_invalid, repairable)."""
    if kind is FaultKind.NON_JSON:
        return "Sure! Here is the answer you asked for, in plain words rather than JSON."
    if kind in (FaultKind.WRONG_SHAPE, FaultKind.REPAIRABLE):
        # The right answer wrapped in a list: a model's plausible slip, and not any object model.
        return json.dumps([answer_for(schema_name, prompt)])
    return json.dumps(_rule_breaking_answer(schema_name, prompt))
