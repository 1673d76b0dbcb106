"""Text that can be stored: valid Unicode, bounded in size, and JSON values checked before anything uses them.

DynamoDB, S3 and every HTTP body want UTF-8, and a Python str may hold lone surrogates (JSON's
`"\\ud800"`, what a JavaScript producer emits for a string cut inside an emoji), which UTF-8
cannot encode. Everything the engine stores or sends from outside text goes through here.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Reasons and error messages are one line of at most this many characters.
MAX_REASON_CHARS = 1_000
# Deeper JSON than this is refused: no job type needs it, and it would only test recursion limits.
MAX_JSON_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` as valid Unicode: surrogate pairs joined, lone surrogates replaced with U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def bounded(text: str, limit: int) -> str:
    """Valid text of at most `limit` characters; a longer one is cut and says how much was left out."""
    text = valid_text(text)
    if len(text) <= limit:
        return text
    marker = f"... [{len(text) - limit} more characters cut]"
    return text[: max(limit - len(marker), 0)] + marker


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """A reason as one bounded line, whatever text (keys, answers) it quotes."""
    return bounded(text.replace("\r", "\\r").replace("\n", "\\n"), limit)


class LongInteger:
    """A JSON integer of more digits than Python converts (its `sys.get_int_max_str_digits()`, 4300 by
    default): the parser keeps its length, for json_value_problem to refuse it with a path."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def json_integer(literal: str) -> int | LongInteger:
    """A JSON parser's `parse_int`: the integer, or a LongInteger past Python's limit (not an error that
    would take the whole document, and the job id it names, down with it)."""
    try:
        return int(literal)
    except ValueError:
        return LongInteger(len(literal.lstrip("-")))


def json_value_problem(value: Any, name: str) -> str | None:
    """Why a parsed JSON value cannot be used (lone surrogates, numbers out of range, too deep), or None.

    Walked iteratively: a value nested just under the parser's recursion limit must not hit it here.
    Paths name positions, not content: `input.documents[3].text`, never the text itself.
    """
    stack: list[tuple[Any, str, int]] = [(value, name, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"{path}: nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return f"{path}: holds a lone UTF-16 surrogate, which is not valid Unicode"
        elif isinstance(node, float):
            # Python's parser reads 1e999 as infinity, which JSON (and so every store) cannot hold.
            if not math.isfinite(node):
                return f"{path}: a number out of range ({node}), which JSON cannot hold"
        elif isinstance(node, LongInteger):
            return f"{path}: an integer of {node.digits} digits, too long to hold"
        elif isinstance(node, dict):
            for position, (key, item) in enumerate(node.items()):
                if _SURROGATE.search(key):
                    return f"{path}: key number {position + 1} holds a lone UTF-16 surrogate"
                stack.append((item, f"{path}.{key_label(key)}", depth + 1))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{index}]", depth + 1) for index, item in enumerate(node))
    return None


def key_label(key: str) -> str:
    """A key as it may appear in a reason: an identifier-like key as is, any other by its length only."""
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", key) else f"<key of {len(key)} characters>"
