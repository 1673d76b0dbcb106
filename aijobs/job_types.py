"""Job type files on the client's side (docs/jobtypes.md, "Job types as data"): reading one, written
in YAML or JSON, into the plain JSON document `aijobs types push` checks and stores, and the
documents back as YAML, for `aijobs types show` and `aijobs types diff`.

What is refused here is what no check could read: text that is not YAML or JSON, a document that is
not a mapping, values JSON has no word for. What the document says is checked by
engine.definitions.data.check_job_type.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import JobTypeFileError
from engine.definitions.data import MAX_FILE_BYTES as MAX_DOCUMENT_BYTES
from engine.definitions.pipelines import PipelineDefinition
from engine.text import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from engine.definitions import JobDefinition

# The most a job type file may be, read: far beyond any prompt and schemas, well within a table item.
MAX_FILE_BYTES = 400_000
# Deeper than this, a document is a hostile one (the stored form is one DynamoDB item): the check's
# own bound on a JSON value (engine.text), so that whatever the check takes can be read from a file.
MAX_DEPTH = MAX_JSON_DEPTH


def read_job_type(path_or_text: str | Path) -> dict[str, Any]:
    """The document a job type file holds: `path_or_text` is a file's path, or the file's text itself
    (what starts with `{` or spans lines). JobTypeFileError, one line, for what cannot be read."""
    if isinstance(path_or_text, Path) or not _is_text(path_or_text):
        path = Path(path_or_text)
        try:
            raw = path.read_bytes()
        except FileNotFoundError as exc:
            raise JobTypeFileError(f"cannot read {path}: no such file") from exc
        except OSError as exc:
            raise JobTypeFileError(f"cannot read {path}: {(exc.strerror or str(exc)).lower()}") from exc
        if len(raw) > MAX_FILE_BYTES:
            raise JobTypeFileError(f"{path} is {len(raw)} bytes; a job type file is at most {MAX_FILE_BYTES}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JobTypeFileError(f"{path} is not UTF-8 text (byte {exc.start})") from exc
        return parse_document(text, str(path))
    return parse_document(path_or_text, "the job type file")


def _is_text(value: str) -> bool:
    return "\n" in value or value.lstrip().startswith("{")


def parse_document(text: str, source: str = "the job type file") -> dict[str, Any]:
    """The mapping `text` holds, as YAML (JSON is read as JSON); JobTypeFileError naming the line."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise JobTypeFileError(f"{source} is more than {MAX_FILE_BYTES} bytes")
    document = _json(text, source) if text.lstrip().startswith("{") else _yaml(text, source)
    if not isinstance(document, dict):
        kind = "empty" if document is None else f"a {_kind(document)}"
        raise JobTypeFileError(f"{source} is {kind}, not a mapping of fields (name, prompt, input_schema, ...)")
    _check_json(document, "", 0, _Size(source))
    return document


def _json(text: str, source: str) -> Any:
    try:
        return json.loads(text, parse_constant=_not_json, object_pairs_hook=_unique_keys)
    except RecursionError as exc:
        raise JobTypeFileError(f"{source} nests deeper than {MAX_DEPTH} levels") from exc
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise JobTypeFileError(f"{source} is not valid JSON: {exc.msg} ({where})") from exc
    except ValueError as exc:
        raise JobTypeFileError(f"{source} is not valid JSON: {exc}") from exc


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are distinct: a key written twice would keep its last value unseen (the
    first `prompt` of two silently dropped), so it is refused, as the YAML reader refuses it."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError(f"the key {json.dumps(key)} is written twice in one object")
        document[key] = value
    return document


def _yaml(text: str, source: str) -> Any:
    import yaml  # the client's only: the worker reads stored JSON

    try:
        return yaml.load(text, Loader=_loader())  # a SafeLoader's subclass: no object is built
    except RecursionError as exc:
        raise JobTypeFileError(f"{source} nests deeper than {MAX_DEPTH} levels") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = " ".join(str(exc.problem or exc.context or "unreadable").split())
        raise JobTypeFileError(f"{source} is not valid YAML: {problem}{where}") from exc
    except yaml.YAMLError as exc:
        raise JobTypeFileError(f"{source} is not valid YAML: {' '.join(str(exc).split())}") from exc
    except ValueError as exc:  # an integer past Python's digit limit for text
        raise JobTypeFileError(f"{source} is not valid YAML: {' '.join(str(exc).split())}") from exc


_LOADER: Any = None


def _loader() -> Any:
    """yaml's SafeLoader, but a date stays the string written (JSON has no dates: `2026-01-31` in an
    example's output is the text a schema's `format: date` checks)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class JsonLikeLoader(yaml.SafeLoader):
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                # A key written twice in one mapping is refused (yaml would keep the last unseen);
                # a merge (`<<`) may still be overridden, as YAML means it to be.
                seen: set[tuple[str, str]] = set()
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"the key {key_node.value!r} is written twice in one mapping",
                            key_node.start_mark,
                        )
                    seen.add((key_node.tag, key_node.value))
                return super().construct_mapping(node, deep=deep)

        JsonLikeLoader.yaml_implicit_resolvers = {
            first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
        }
        _LOADER = JsonLikeLoader
    return _LOADER


@dataclass(slots=True)
class _Size:
    """What a document read so far takes as JSON, at least. A YAML alias repeats all its anchor names,
    so a short file can hold a document of billions of values (aliases of aliases): the walk stops as
    soon as it is past what the check would take, before anything else walks it."""

    source: str
    taken: int = 0

    def add(self, count: int) -> None:
        self.taken += count
        if self.taken > MAX_DOCUMENT_BYTES:
            raise JobTypeFileError(
                f"{self.source} holds more than {MAX_DOCUMENT_BYTES} bytes as JSON "
                "(a YAML alias counts all it names again); a job type file holds at most that"
            )


def _check_json(value: Any, path: str, depth: int, size: _Size) -> None:
    """Refuse, naming where, a value JSON cannot hold (binary, a set, a key that is not a string, NaN),
    and a document larger as JSON than a job type file may be."""
    where = path or "the document"
    if depth > MAX_DEPTH:
        raise JobTypeFileError(f"{where} nests deeper than {MAX_DEPTH} levels")
    size.add(len(value) + 1 if isinstance(value, str) else 1)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise JobTypeFileError(f"{where}: the key {key!r} is not a string (quote it)")
            size.add(len(key) + 1)
            _check_json(item, f"{path}.{key}" if path else key, depth + 1, size)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]", depth + 1, size)
    elif isinstance(value, float) and not math.isfinite(value):
        raise JobTypeFileError(f"{where}: {value} is not a JSON number")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise JobTypeFileError(f"{where}: a {_kind(value)} is not a JSON value (quote it)")


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def document_yaml(document: Mapping[str, Any]) -> str:
    """A stored document as YAML, its fields in their stored order (what `types show` and `diff` print)."""
    import yaml

    return str(yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True, width=100))


def documents_diff(name: str, old: tuple[int, Mapping[str, Any]], new: tuple[int, Mapping[str, Any]]) -> str:
    """A unified diff of two versions' documents as YAML, `(version, document)` each; "" when equal."""
    (old_version, old_document), (new_version, new_document) = old, new
    lines = difflib.unified_diff(
        document_yaml(old_document).splitlines(keepends=True),
        document_yaml(new_document).splitlines(keepends=True),
        fromfile=f"{name} v{old_version}",
        tofile=f"{name} v{new_version}",
    )
    return "".join(lines)


@dataclass(frozen=True, slots=True)
class ExampleRun:
    """One example of `aijobs types test`: whether its answer passed, and the answer or why not."""

    number: int
    passed: bool
    detail: str


# The model the in-process provider answers `types test` as (any id is served).
TEST_MODEL = "local-model"


def run_examples(document: Mapping[str, Any]) -> tuple[str, list[ExampleRun]]:
    """Check a file as a push does (its examples through its schemas and rules), then send each
    example's input through the gateway (prompt rendered, output schema made strict, the request as
    OpenAI takes it) to a local provider that answers with the file's own example outputs, and
    validate each answer as a worker would (the compiled definition's validate_output: schema, rules).
    The file's name and one run per example; JobTypeFileError when the file is refused whole."""
    from engine.definitions.data import check_job_type, compile_job_type

    checked = check_job_type(document)
    examples = [example.model_dump() for example in checked.examples]
    if not examples:
        raise JobTypeFileError(f"{checked.name} has no examples to test: add some ({{input, output}}) to the file")
    definition = compile_job_type(checked.document(), 1)
    if isinstance(definition, PipelineDefinition):
        return checked.name, _steps_checked(definition, examples)
    return checked.name, _run(definition, examples, checked.name)


def _steps_checked(definition: PipelineDefinition, examples: list[dict[str, Any]]) -> list[ExampleRun]:
    """A pipeline's examples (its steps call the models, on a stack): each input as a job's is checked
    (its schema, its maps' lists), each output as a review's edit is."""
    from engine.core.errors import JobError

    runs: list[ExampleRun] = []
    for number, example in enumerate(examples, 1):
        try:
            job_input = definition.parse_input(example["input"])
            definition.edited_output(job_input, example["output"])
        except (JobError, ValueError) as exc:
            runs.append(ExampleRun(number, False, str(exc)))
            continue
        steps = ", ".join(step.name for step in definition.steps)
        runs.append(ExampleRun(number, True, f"input and output fit; its steps ({steps}) run on a stack"))
    return runs


def _run(definition: JobDefinition, examples: list[dict[str, Any]], name: str) -> list[ExampleRun]:
    """Each example's input through the gateway to a local provider that answers `name` from `examples`."""
    from aijobs.local.provider import LocalProvider
    from engine.core.errors import JobError
    from engine.gateway import ModelGateway, ModelPrice, ModelTiers, PriceTable
    from engine.gateway.openai import OpenAICompatibleProvider, static_api_key

    runs: list[ExampleRun] = []
    # The test model is free, and priced so: no "unpriced model" warning in the command's output.
    prices = PriceTable.with_overrides({TEST_MODEL: ModelPrice.of(0, 0)})
    with LocalProvider(latency_seconds=0, answers={name: examples}) as provider:
        gateway = ModelGateway(
            OpenAICompatibleProvider(provider.url, static_api_key(None)),
            ModelTiers(TEST_MODEL),
            prices,
            repair_attempts=0,
        )
        for number, example in enumerate(examples, 1):
            try:
                job_input = definition.parse_input(example["input"])
                execution = gateway.execute(definition, job_input)
            except JobError as exc:
                runs.append(ExampleRun(number, False, f"{exc.code.value}: {exc}"))
                continue
            if execution.error is not None or execution.output is None:
                error = execution.error
                detail = f"{error.code.value}: {error.message}" if error is not None else "no answer"
                runs.append(ExampleRun(number, False, detail))
            else:
                answer = json.dumps(definition.stored_output(execution.output), ensure_ascii=False)
                runs.append(ExampleRun(number, True, answer))
    return runs
