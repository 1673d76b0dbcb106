"""The JSON schemas of a job type file: checked at push, compiled once, and their failures as one line.

A file's `input_schema` checks a job's input at intake; its `output_schema` is what the gateway
asks the model for as strict structured output (engine.gateway.schema.strict_json_schema, which
closes every object and requires every property) and what the answer is validated against. So:

- both are valid Draft 2020-12 schemas, their root an object, each at most MAX_SCHEMA_BYTES as
  JSON and nested at most MAX_SCHEMA_DEPTH levels;
- every `pattern` (and `patternProperties`' names) is one a linear-time matcher runs (below);
- a `$ref` points into the schema's own `$defs` (`#/$defs/NAME`, or `#`): nothing is fetched, and a
  reference that resolves to nothing is refused here, not when a job meets it; `$id`, `$anchor`
  and `$dynamicRef`, which move that resolution, are refused;
- the output schema is in the subset strict structured output serves (OpenAI's rules): keywords
  from STRICT_KEYWORDS only, every object closed (`additionalProperties: false`) with every
  property in `required`, at most MAX_OBJECT_DEPTH object levels, MAX_PROPERTIES properties and
  MAX_ENUM_VALUES enum values in all. The gateway's transform then keeps it as it is (but for the
  keywords it strips, which the answer's validation still checks).

A `pattern` is matched by Rust's regex crate, the one CEL's matches() runs (rules.py), never by
Python's re: re backtracks, and `^(a+)+$` on forty characters of someone's input would hold a worker
(or the client that checks a submission) for hours. Rust's never backtracks: a match takes time
linear in the text. It refuses what needs backtracking (backreferences, look-around), so a schema
holding those is refused at push, in one line.

A failure of an instance (an input, an answer, an example) is one line naming the position and the
keyword it fails, quoting the schema's bound, never the instance's content (it is stored and shown).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator

from engine.core.errors import JobTypeFileError
from engine.text import key_label, one_line

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_OBJECT_DEPTH = 10
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

# What strict structured output serves: anything else in an output schema is refused at push.
STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
        "$defs", "$ref", "description", "title", "default", "examples", "$comment",
        "pattern", "format", "minLength", "maxLength",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems",
    }
)  # fmt: skip
# The string formats strict structured output serves: another one is refused at push, as the provider
# would refuse every request carrying it.
STRICT_FORMATS = ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid")
# Keywords whose value is one schema, a list of schemas, or names mapped to schemas (Draft 2020-12).
_ONE_SCHEMA = frozenset(
    {
        "items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema",
    }
)  # fmt: skip
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})
# A schema of strict structured output says what it is.
_NAMES_A_TYPE = ("type", "enum", "const", "anyOf", "$ref")
_MOVES_RESOLUTION = ("$id", "$anchor", "$dynamicRef", "$dynamicAnchor")
# Where a schema sits in its file: keys and indexes from the root.
Path = tuple[str | int, ...]
_LOCAL_REF = re.compile(r"#(?:/\$defs/([A-Za-z0-9_.-]{1,64}))?")


def check_schema(schema: dict[str, Any], where: str, *, strict: bool) -> None:
    """Refuse `schema` (the file's field `where`) with one line unless it is usable as described above."""
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise JobTypeFileError(f"{where}: is {size} bytes as JSON; a schema holds at most {MAX_SCHEMA_BYTES}")
    if (depth := _json_depth(schema)) > MAX_SCHEMA_DEPTH:
        raise JobTypeFileError(f"{where}: is nested {depth} levels deep; a schema holds at most {MAX_SCHEMA_DEPTH}")
    if schema.get("$schema", DRAFT_2020_12) != DRAFT_2020_12:
        raise JobTypeFileError(f"{where}.$schema: the schemas of a job type are Draft 2020-12 ({DRAFT_2020_12})")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        # Named at the keyword at fault, as every other refusal of a file names its position.
        raise JobTypeFileError(one_line(f"{_named(where, exc.path)}: {exc.message}")) from exc
    if schema.get("type") != "object":
        raise JobTypeFileError(f"{where}: its root must be of type object")
    defs = schema.get("$defs", {})
    for path, node, _ in _subschemas(schema, (), 0):
        _check_references(node, defs, where, path)
        _check_patterns(node, where, path)
    if strict:
        _check_strict(schema, where)


def validator(schema: dict[str, Any]) -> Validator:
    """The compiled validator of a checked schema (built once per compiled job type); its patterns
    are matched in linear time."""
    return _LinearPatternValidator(schema)


def matches(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text` (as JSON Schema's `pattern` means), in time
    linear in `text`; RuntimeError for a pattern the matcher refuses."""
    global _MATCHES
    if _MATCHES is None:
        import cel  # lazy, as rules.py imports it: a worker that serves no data job type never pays it

        _MATCHES = cel.compile("text.matches(pattern)")
    return _MATCHES.execute({"text": text, "pattern": pattern}) is True


_MATCHES: Any = None


def _pattern(checker: Validator, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if checker.is_type(instance, "string") and not matches(pattern, instance):
        yield ValidationError(f"does not match {pattern!r}")


def _pattern_properties(
    checker: Validator, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not checker.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if matches(pattern, name):
                yield from checker.descend(value, subschema, path=name, schema_path=pattern)


_LinearPatternValidator = validators.extend(
    Draft202012Validator, {"pattern": _pattern, "patternProperties": _pattern_properties}
)


def instance_problem(checker: Draft202012Validator, instance: Any, name: str) -> str | None:
    """Why `instance` fails the schema, as one line naming the position (`name` is its root's), or None."""
    error = best_match(checker.iter_errors(instance))
    if error is None:
        return None
    path = _path(error.absolute_path)
    location = f"{name}.{path}" if path and not path.startswith("[") else f"{name}{path}"
    return one_line(f"{location}: {_describe(error)}")


def _describe(error: ValidationError) -> str:
    keyword, bound, instance = error.validator, error.validator_value, error.instance
    if keyword == "required" and isinstance(instance, dict):
        missing = next((name for name in bound if name not in instance), "?")
        return f"lacks the required property {key_label(str(missing))}"
    if keyword == "additionalProperties" and isinstance(instance, dict):
        return "has a property the schema does not allow"
    if keyword == "type":
        return f"must be of type {' or '.join(bound) if isinstance(bound, list) else bound}"
    if keyword == "enum":
        return f"is not one of the {len(bound)} values the schema allows"
    described = {
        "const": "is not the value the schema allows",
        "pattern": "does not match the schema's pattern",
        "anyOf": "matches none of the schemas anyOf offers",
        "oneOf": "matches none, or more than one, of the schemas oneOf offers",
        "minLength": f"has fewer than {bound} characters",
        "maxLength": f"has more than {bound} characters",
        "minItems": f"has fewer than {bound} items",
        "maxItems": f"has more than {bound} items",
        "minProperties": f"has fewer than {bound} properties",
        "maxProperties": f"has more than {bound} properties",
        "minimum": f"must be at least {bound}",
        "maximum": f"must be at most {bound}",
        "exclusiveMinimum": f"must be more than {bound}",
        "exclusiveMaximum": f"must be less than {bound}",
        "multipleOf": f"must be a multiple of {bound}",
        "uniqueItems": "has items that are not unique",
    }
    return described.get(str(keyword), f"fails the schema's {keyword} keyword")


def _check_references(node: dict[str, Any], defs: Any, where: str, path: Path) -> None:
    for keyword in _MOVES_RESOLUTION:
        if keyword in node:
            raise JobTypeFileError(f"{where}: {keyword} is not supported (a $ref names #/$defs/NAME) at {_at(path)}")
    if "$ref" not in node:
        return
    reference = node["$ref"]
    match = _LOCAL_REF.fullmatch(reference)
    if match is None:
        raise JobTypeFileError(one_line(f"{where}: $ref {reference} is not #/$defs/NAME at {_at(path)}"))
    if match.group(1) is not None and (not isinstance(defs, dict) or match.group(1) not in defs):
        raise JobTypeFileError(f"{where}: $ref {reference} names nothing in $defs at {_at(path)}")


def _check_patterns(node: dict[str, Any], where: str, path: Path) -> None:
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    patterns += list(node.get("patternProperties", {})) if isinstance(node.get("patternProperties"), dict) else []
    for pattern in patterns:
        try:
            matches(pattern, "")
        except Exception as exc:  # any refusal of the foreign matcher: the pattern cannot be run
            raise JobTypeFileError(
                one_line(
                    f"{where}: pattern {pattern!r} at {_at(path)} is not one the linear-time matcher runs "
                    f"({_matcher_reason(exc)}); write it without backreferences or look-around"
                )
            ) from exc


def _matcher_reason(exc: Exception) -> str:
    """The regex crate's own words (`look-around, including look-ahead and look-behind, is not
    supported`), from CEL's error: `... regex parse error: ... error: <reason>. Check function ...`."""
    _, found, reason = str(exc).rpartition("error: ")
    return reason.split(". Check function")[0].strip().rstrip(".") if found else type(exc).__name__


def _check_strict(schema: dict[str, Any], where: str) -> None:
    properties = enum_values = 0
    for path, node, objects in _subschemas(schema, (), 0):
        for keyword in node:
            if keyword not in STRICT_KEYWORDS and not (keyword == "$schema" and not path):
                raise JobTypeFileError(
                    f"{where}: strict structured output does not support {key_label(keyword)} at {_at(path)}"
                )
        if "format" in node and node["format"] not in STRICT_FORMATS:
            raise JobTypeFileError(
                one_line(
                    f"{where}: strict structured output does not support the format {node['format']!r} at "
                    f"{_at(path)} (it takes {', '.join(STRICT_FORMATS)})"
                )
            )
        if not any(keyword in node for keyword in _NAMES_A_TYPE):
            raise JobTypeFileError(f"{where}: strict structured output needs a type at {_at(path)}")
        if _is_object(node):
            if node.get("additionalProperties") is not False:
                raise JobTypeFileError(
                    f"{where}: strict structured output needs additionalProperties: false at {_at(path)}"
                )
            names = list(node.get("properties", {}))
            if sorted(node.get("required", [])) != sorted(names):
                raise JobTypeFileError(
                    f"{where}: strict structured output needs every property in required at {_at(path)}"
                )
            properties += len(names)
            if objects > MAX_OBJECT_DEPTH:
                raise JobTypeFileError(
                    f"{where}: objects nest {objects} levels deep; strict structured output takes at most "
                    f"{MAX_OBJECT_DEPTH} at {_at(path)}"
                )
        enum_values += len(node.get("enum", []))
    if properties > MAX_PROPERTIES:
        raise JobTypeFileError(f"{where}: has {properties} properties; strict structured output takes {MAX_PROPERTIES}")
    if enum_values > MAX_ENUM_VALUES:
        raise JobTypeFileError(
            f"{where}: has {enum_values} enum values; strict structured output takes {MAX_ENUM_VALUES}"
        )


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _subschemas(node: Any, path: Path, objects: int) -> Iterator[tuple[Path, dict[str, Any], int]]:
    """Every schema in `node` (itself first) with its path and how many objects enclose it (itself
    included); boolean schemas and values (enum, const, default) are skipped."""
    if not isinstance(node, dict):
        return
    objects += _is_object(node)
    yield path, node, objects
    for keyword, value in node.items():
        if keyword in _ONE_SCHEMA:
            yield from _subschemas(value, (*path, keyword), objects)
        elif keyword in _SCHEMA_LISTS and isinstance(value, list):
            for index, item in enumerate(value):
                yield from _subschemas(item, (*path, keyword, index), objects)
        elif keyword in _NAMED_SCHEMAS and isinstance(value, dict):
            for name, child in value.items():
                yield from _subschemas(child, (*path, keyword, name), objects)


def _json_depth(value: Any) -> int:
    """How many containers (objects, arrays) deep `value` nests, level by level (no recursion)."""
    depth, level = 0, [value]
    while level := [node for node in level if isinstance(node, dict | list)]:
        depth += 1
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{key_label(part)}"
    return text.removeprefix(".")


def _named(where: str, parts: Any) -> str:
    """`where` and the position within it: `input_schema.properties.text.type`."""
    position = _path(parts)
    return f"{where}{'' if not position or position.startswith('[') else '.'}{position}"


def _at(path: Path) -> str:
    return _path(path) or "the root"
