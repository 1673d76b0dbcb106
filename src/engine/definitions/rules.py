"""The rules of a job type file: CEL expressions over `input` and `output`, true when the answer is acceptable.

A rule is compiled once (at push to check it, then once per compiled job type) and run on every
answer after the output schema passed. What a rule can make the worker do is bounded at push: at
most MAX_CHECK_CHARS characters, at most MAX_MACROS comprehension macros (all, exists, exists_one,
map, filter: each walks a list, so two nest to a square of the input's size at most), and the only
variables it reads are `input` and `output` (and the names its macros bind).

What a rule costs is bounded again when it runs, since its lists are the job's: a macro walks a
list, and what it does for each item (`x in list`, a comparison of lists) may walk one more, so a rule
of m macros takes at most about N^(m + 1) steps over an input and an answer of N JSON values in all.
A rule is run only when that is at most MAX_RULE_STEPS (under a second); otherwise it is not run,
and fails (an input on which no answer could pass is refused at intake, by the definition): two
nested macros over 3,000 labels would otherwise hold a worker for the better part of an hour, in
native code no timeout interrupts.

A rule that is not true, whether false, not a boolean, failing to run (a key the answer lacks, a
type it cannot compare) or too costly to run, fails: the answer is refused with the rule's message.

`cel` (common-expression-language) is imported on first use: it costs ~150 ms, which a worker that
serves no data job type never pays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core.errors import JobTypeFileError
from engine.text import one_line

if TYPE_CHECKING:
    from cel import Program

MAX_CHECK_CHARS = 1000
MAX_MESSAGE_CHARS = 200
MAX_MACROS = 2
MAX_RULE_STEPS = 10_000_000
VARIABLES = frozenset({"input", "output"})

# A comprehension macro and the name it binds: `.all(x, ...)`, `.map(x, ...)` (found in the source
# text, so one named in a string literal counts too: the bound errs on the safe side).
_MACRO = re.compile(r"\.\s*(?:all|exists_one|exists|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)?")


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One rule, compiled: its program and the message an answer that fails it is refused with."""

    program: Program
    message: str
    macros: int = 0

    def problem(self, job_input: Any, output: Any, values: int) -> str | None:
        """None when the rule is true on (`job_input`, `output`), else why not, in a few words that
        follow the rule's name (`rule 1 (...) is false`). `values`: what they hold (rule_values),
        counted once for all the rules they go through."""
        if (steps := self.steps(values)) > MAX_RULE_STEPS:
            return f"is not run: it could take {steps} steps on this input and answer, more than {MAX_RULE_STEPS}"
        try:
            result = self.program.execute({"input": job_input, "output": output})
        except Exception as exc:  # any failure of a foreign evaluator: the rule failed
            return one_line(f"errors: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 200)
        if result is True:
            return None
        return "is false" if result is False else f"gives a {type(result).__name__}, not true or false"

    def steps(self, values: int) -> int:
        """The most steps the rule could take on an input and an answer of `values` JSON values in all:
        values^(macros + 1)."""
        return int(values ** (self.macros + 1))


def rule_values(job_input: Any, output: Any) -> int:
    """How many JSON values a rule walks over on (`job_input`, `output`)."""
    return json_values(job_input) + json_values(output)


def json_values(value: Any) -> int:
    """How many JSON values `value` holds, itself included (a string counts one, as a macro sees it)."""
    count, level = 0, [value]
    while level:
        count += len(level)
        level = [child for node in level if isinstance(node, dict | list) for child in _children(node)]
    return count


def _children(node: dict[str, Any] | list[Any]) -> list[Any]:
    return list(node.values()) if isinstance(node, dict) else node


def compile_rule(check: str, message: str, where: str) -> CompiledRule:
    """The compiled rule; JobTypeFileError naming `where` (e.g. `rules[1].check`) when it cannot be one."""
    import cel  # lazy: see the module's docstring

    macros = _MACRO.findall(check)
    if len(macros) > MAX_MACROS:
        raise JobTypeFileError(f"{where}: uses {len(macros)} comprehension macros; a rule uses at most {MAX_MACROS}")
    try:
        program = cel.compile(check)
    except Exception as exc:  # a parse error is a ValueError; anything else fails too
        raise JobTypeFileError(one_line(f"{where}: does not compile: {_first_line(exc)}")) from exc
    bound = {name for name in macros if name}
    unknown = sorted(set(program.variables()) - VARIABLES - bound)
    unknown += sorted(bound & _names_outside_macros(check))
    if unknown:
        raise JobTypeFileError(one_line(f"{where}: names {', '.join(unknown)}; a rule reads only input and output"))
    return CompiledRule(program, message, len(macros))


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_VARIABLE = re.compile(r"(?<![.\w])([A-Za-z_]\w*)")
_FIELD = re.compile(r"(?<![.\w])(input|output)\s*\.\s*([A-Za-z_]\w*)")


def fields_read(check: str) -> set[tuple[str, str]]:
    """The top-level fields the rule reads by name, as (`input` or `output`, field): `output.label`
    gives ("output", "label"); string literals are left out."""
    return set(_FIELD.findall(_STRING.sub('""', check)))


def _names_outside_macros(check: str) -> set[str]:
    """The names the rule reads outside every comprehension macro's parentheses (string literals and
    fields left out): a name a macro binds means nothing there."""
    text = _STRING.sub('""', check)
    outside, position = [], 0
    for found in _MACRO.finditer(text):
        if found.start() < position:
            continue  # within a macro already left out
        outside.append(text[position : found.start()])
        depth, index = 0, text.index("(", found.start())
        while index < len(text):
            depth += {"(": 1, ")": -1}.get(text[index], 0)
            if depth == 0:
                break
            index += 1
        position = index + 1
    outside.append(text[position:])
    return set(_VARIABLE.findall("".join(outside)))


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # "Failed to parse expression '<the check>': ERROR: <input>:1:4: Syntax error: ..." -> from "1:4".
    _, found, after = text.partition("ERROR: <input>:")
    return after if found else text
