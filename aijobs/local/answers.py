"""Answers computed from a request's JSON schema alone, and the rule-breaking answers of the content faults.

A job type may instead be answered from examples of its own (`example_answer`: a job type file's
`{input, output}` pairs, `aijobs dev --answers FILE`, `aijobs types test`): the output of the example
whose input the prompt renders, so a rule a schema cannot say (a label that is one of the input's)
is met as a model would meet it.

No prompt wording is read: the schema the engine sends (JobDefinition.output_schema, narrowed to the
input, e.g. classify's label to an enum of the labels offered) says what a valid answer is, so any
job type is answered, built-in or not. The schema is walked: an object gets its required
properties, a string with an enum one of its values, a plain string a short text, a number one
within its bounds, an array at least its minItems items. Choices come from a stable hash of the
request's user content, so the same request always gets the same answer.

Texts are made of the words of the longest JSON string in the user content (the engine renders
every prompt field as a JSON literal), else of the whole content, never more than MAX_TEXT_WORDS.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aijobs.local.faults import FaultKind, find_fault_marker

# A plain string's answer is at most this many words: within any summarize word budget (>= 10).
MAX_TEXT_WORDS = 10
# The rule-breaking text: more words than 1.2 x the largest summarize budget (1000), and, at most
# LONG_WORD_CHARS + 1 characters a word, far within the characters max_tokens allows (2048 x 16).
LONG_TEXT_WORDS = 1250
LONG_WORD_CHARS = 10
_FALLBACK_WORDS = ("A", "short", "answer.")
# Past this depth arrays get only their minItems items, so a recursive schema ends; past the
# limit a value is null.
_SHALLOW_DEPTH = 8
_MAX_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
# Values for the string formats pydantic emits.
_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "duration": "P1D",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}
_PATTERN_CANDIDATES = ("a", "A", "1", "a1", "abc", "ABC", "x-1", "2024-01-01")

Path = tuple[str | int, ...]


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _words(text: str) -> list[str]:
    """The text's words, without the fault markers (they steer this provider, they are not content)."""
    return [word for word in text.split() if find_fault_marker(word) is None]


def source_words(content: str) -> list[str]:
    """The words texts are made of: the longest JSON string's in `content`, else the content's own."""
    longest = ""
    for match in _JSON_STRING.finditer(content):
        try:
            value = json.loads(match.group())
        except ValueError:
            continue
        if isinstance(value, str) and len(value) > len(longest):
            longest = value
    return _words(longest) or _words(content)


@dataclass(frozen=True, slots=True)
class _Site:
    """Where in the answer a string was chosen from an enum, or made up as text."""

    path: Path
    enum: tuple[str, ...] = ()
    # True when the string is an item of an array (a list of references, like citations).
    in_array: bool = False


@dataclass
class _Builder:
    root: Mapping[str, Any]
    content: str
    words: list[str] = field(default_factory=list)
    enum_sites: list[_Site] = field(default_factory=list)
    text_sites: list[_Site] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.words = source_words(self.content)

    def _hash(self, path: Path) -> int:
        return _stable_int(self.content + "\x1f" + "/".join(map(str, path)))

    def _resolve(self, node: Any) -> Mapping[str, Any]:
        """The schema `node` is: $refs followed, allOf merged; {} for anything that is not a schema."""
        for _ in range(_MAX_DEPTH):
            if not isinstance(node, Mapping):
                return {}
            reference = node.get("$ref")
            if not isinstance(reference, str):
                break
            node = self._pointer(reference)
        if not isinstance(node, Mapping):
            return {}
        parts = node.get("allOf")
        if isinstance(parts, list) and parts:
            merged: dict[str, Any] = {key: value for key, value in node.items() if key != "allOf"}
            for part in parts:
                for key, value in self._resolve(part).items():
                    if key == "properties" and isinstance(value, Mapping):
                        merged["properties"] = {**merged.get("properties", {}), **value}
                    elif key == "required" and isinstance(value, list):
                        merged["required"] = [*merged.get("required", []), *value]
                    else:
                        merged.setdefault(key, value)
            return merged
        return node

    def _pointer(self, reference: str) -> Any:
        if not reference.startswith("#"):
            return {}
        node: Any = self.root
        for token in reference[1:].split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return {}
        return node

    def value(self, raw: Any, path: Path = (), depth: int = 0, in_array: bool = False) -> Any:
        """A valid value for the schema `raw` at `path` of the answer."""
        if depth > _MAX_DEPTH:
            return None
        node = self._resolve(raw)
        if "const" in node:
            return node["const"]
        enum = node.get("enum")
        if isinstance(enum, list) and enum:
            chosen = enum[self._hash(path) % len(enum)]
            if all(isinstance(item, str) for item in enum):
                self.enum_sites.append(_Site(path, tuple(enum), in_array))
            return chosen
        for union in ("anyOf", "oneOf"):
            branches = node.get(union)
            if isinstance(branches, list) and branches:
                resolved = [self._resolve(branch) for branch in branches]
                chosen_branch = next((branch for branch in resolved if branch.get("type") != "null"), resolved[0])
                return self.value(chosen_branch, path, depth + 1, in_array)
        match _type_of(node):
            case "object":
                return self._object(node, path, depth)
            case "array":
                return self._array(node, path, depth)
            case "integer":
                return self._number(node, path, integer=True)
            case "number":
                return self._number(node, path, integer=False)
            case "boolean":
                return self._hash(path) % 2 == 0
            case "null":
                return None
            case _:
                return self._string(node, path, in_array)

    def _object(self, node: Mapping[str, Any], path: Path, depth: int) -> dict[str, Any]:
        properties = node.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = node.get("required")
        names = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
        return {name: self.value(properties.get(name, {}), (*path, name), depth + 1) for name in names}

    def _array(self, node: Mapping[str, Any], path: Path, depth: int) -> list[Any]:
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = node.get("items", {})
        min_items = _int(node.get("minItems")) or 0
        count = max(min_items, len(prefix), 0 if depth > _SHALLOW_DEPTH or items is False else 1)
        if items is False:
            count = len(prefix)
        max_items = _int(node.get("maxItems"))
        if max_items is not None:
            count = min(count, max(max_items, min_items))
        values: list[Any] = []
        seen: set[str] = set()
        for index in range(count):
            schema = prefix[index] if index < len(prefix) else items
            item = self.value(schema, (*path, index), depth + 1, in_array=True)
            if node.get("uniqueItems") is True:
                item = self._distinct(schema, item, seen, index)
            values.append(item)
        return values

    def _distinct(self, schema: Any, item: Any, seen: set[str], index: int) -> Any:
        """`item`, or another valid value when an equal one is already in the array (uniqueItems)."""
        enum = self._resolve(schema).get("enum")
        candidates = [item]
        if isinstance(enum, list):
            candidates += enum
        elif isinstance(item, str):
            candidates.append(f"{item} {index + 1}")
        elif isinstance(item, int) and not isinstance(item, bool):
            candidates.append(item + index)
        for candidate in candidates:
            key = json.dumps(candidate, sort_keys=True)
            if key not in seen:
                seen.add(key)
                return candidate
        return item

    def _number(self, node: Mapping[str, Any], path: Path, integer: bool) -> int | float:
        low, high = _number(node.get("minimum")), _number(node.get("maximum"))
        low_open, high_open = _number(node.get("exclusiveMinimum")), _number(node.get("exclusiveMaximum"))
        step = _number(node.get("multipleOf"))
        digest = self._hash(path)
        if integer:
            lowest = _tightest(
                (
                    math.ceil(low) if low is not None else None,
                    math.floor(low_open) + 1 if low_open is not None else None,
                ),
                max,
            )
            highest = _tightest(
                (
                    math.floor(high) if high is not None else None,
                    math.ceil(high_open) - 1 if high_open is not None else None,
                ),
                min,
            )
            unit = int(step) if step is not None and step >= 1 and step.is_integer() else 1
            first = -(-lowest // unit) if lowest is not None else None
            last = highest // unit if highest is not None else None
            if first is not None and last is not None:
                return unit * (first + digest % max(last - first + 1, 1))
            if first is not None:
                return unit * (first + digest % 100)
            if last is not None:
                return unit * (last - digest % 100)
            return unit * (digest % 100)
        floor_ = max((value for value in (low, low_open) if value is not None), default=None)
        ceiling = min((value for value in (high, high_open) if value is not None), default=None)
        fraction = 0.5 + (digest >> 8) % 50 / 100  # 0.50 .. 0.99
        if floor_ is not None and ceiling is not None:
            value = floor_ + (ceiling - floor_) * fraction
            if not floor_ <= round(value, 2) <= ceiling or round(value, 2) in (low_open, high_open):
                return value
            return round(value, 2)
        if floor_ is not None:
            return round(floor_ + 100 * fraction, 2)
        if ceiling is not None:
            return round(ceiling - 100 * fraction, 2)
        return fraction

    def _string(self, node: Mapping[str, Any], path: Path, in_array: bool) -> str:
        format_ = node.get("format")
        if isinstance(format_, str) and format_ in _FORMATS:
            return _FORMATS[format_]
        if format_ == "uuid":
            digest = f"{self._hash(path):016x}" * 2
            return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
        text = " ".join(self.words[:MAX_TEXT_WORDS]) or " ".join(_FALLBACK_WORDS)
        max_length, min_length = _int(node.get("maxLength")), _int(node.get("minLength")) or 1
        if max_length is not None:
            text = text[:max_length].rstrip() or text[:max_length]
        if len(text) < min_length:
            text += "x" * (min_length - len(text))
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            text = _matching(pattern, [text, *_PATTERN_CANDIDATES]) or text
        elif max_length is None:  # a free text: the rule-breaking long one would pass its schema too
            self.text_sites.append(_Site(path, in_array=in_array))
        return text


def _type_of(node: Mapping[str, Any]) -> str:
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((item for item in kind if item != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return "string"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _tightest(bounds: Iterable[int | None], pick: Callable[[list[int]], int]) -> int | None:
    """The tightest of the bounds given (`pick` is max for lower bounds, min for upper ones)."""
    present = [bound for bound in bounds if bound is not None]
    return pick(present) if present else None


def _matching(pattern: str, candidates: Iterable[str]) -> str | None:
    try:
        compiled = re.compile(pattern)
    except re.error:
        return None
    return next((candidate for candidate in candidates if compiled.search(candidate)), None)


def answer_for(schema: Mapping[str, Any] | None, content: str) -> Any:
    """The valid answer to a request whose output schema is `schema` and whose user content is `content`.

    `{}` when the request carries no schema.
    """
    if schema is None:
        return {}
    return _Builder(schema, content).value(schema)


def _replaced(answer: Any, path: Path, value: Any) -> Any:
    """A copy of `answer` with `value` at `path`."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(answer, dict) and isinstance(head, str):
        return {**answer, head: _replaced(answer[head], rest, value)}
    if isinstance(answer, list) and isinstance(head, int):
        return [_replaced(item, rest, value) if index == head else item for index, item in enumerate(answer)]
    raise AssertionError("the path was recorded while building this answer")


def _outside(enum: Iterable[str], candidate: str) -> str:
    """A value that is none of `enum`'s."""
    taken = set(enum)
    while candidate in taken:
        candidate += "-x"
    return candidate


def _long_text(words: list[str]) -> str:
    """LONG_TEXT_WORDS short ASCII words: over any word budget, within any answer's character bound."""
    usable = [word[:LONG_WORD_CHARS] for word in words if word.isascii() and word.isalnum()] or ["word"]
    return " ".join(usable[index % len(usable)] for index in range(LONG_TEXT_WORDS))


def _rule_breaking_answer(schema: Mapping[str, Any] | None, content: str, *, reference: bool) -> Any:
    """An answer of the right shape that breaks the job type's rule.

    A string chosen from an enum gets a value outside it: for reference_invalid preferably an array
    item (a list of references: citations), for business_invalid preferably a single choice (a
    label). A schema without any enum string gets a text far past any word budget (summarize's
    rule); one with neither, a wrong shape.
    """
    if schema is None:
        return [{}]
    builder = _Builder(schema, content)
    valid = builder.value(schema)
    sites = [site for site in builder.enum_sites if site.in_array is reference] or builder.enum_sites
    if sites:
        site = sites[0]
        return _replaced(valid, site.path, _outside(site.enum, "not-in-input" if reference else "not-offered"))
    if builder.text_sites:
        return _replaced(valid, builder.text_sites[0].path, _long_text(builder.words))
    return [valid]


def faulty_content(kind: FaultKind, schema: Mapping[str, Any] | None, content: str) -> str:
    """The 200 answer's content for a content fault (non_json, wrong_shape, *_invalid, repairable)."""
    if kind is FaultKind.NON_JSON:
        return "Sure! Here is the answer you asked for, in plain words rather than JSON."
    if kind in (FaultKind.WRONG_SHAPE, FaultKind.REPAIRABLE):
        # The right answer wrapped in a list: a model's plausible slip, and not any object model.
        return json.dumps([answer_for(schema, content)])
    return json.dumps(_rule_breaking_answer(schema, content, reference=kind is FaultKind.REFERENCE_INVALID))


def example_answer(examples: Sequence[Mapping[str, Any]], prompt: str) -> Any:
    """The output of the example whose input's every field value, as the JSON literal the engine renders
    it as, appears in `prompt`; else (no example's does) the example a stable hash of the prompt picks.
    Each example is `{"input": {...}, "output": ...}`; None when there are none."""
    if not examples:
        return None
    for example in examples:
        example_input = example.get("input")
        if isinstance(example_input, Mapping) and all(
            json.dumps(value, ensure_ascii=False) in prompt for value in example_input.values()
        ):
            return example.get("output")
    return examples[_stable_int(prompt) % len(examples)].get("output")


def check_answers(answers: Any, source: str) -> dict[str, list[dict[str, Any]]]:
    """`{job_type: [{input, output}, ...]}` as read from `source` (`aijobs dev --answers FILE`), or
    ValueError naming what is wrong with it in one line."""
    if not isinstance(answers, Mapping):
        raise ValueError(f"{source}: must map job types to lists of examples, not a {type(answers).__name__}")
    checked: dict[str, list[dict[str, Any]]] = {}
    for job_type, examples in answers.items():
        if not isinstance(examples, list) or not examples:
            raise ValueError(f"{source}: {job_type}: must be a list of one example or more ({{input, output}})")
        for index, example in enumerate(examples):
            if (
                not isinstance(example, Mapping)
                or not isinstance(example.get("input"), Mapping)
                or "output" not in example
            ):
                raise ValueError(f"{source}: {job_type}[{index}]: an example is {{input: {{...}}, output: ...}}")
        checked[str(job_type)] = [dict(example) for example in examples]
    return checked
