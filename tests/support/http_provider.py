"""The loopback model provider of the tests: the project's own local OpenAI-compatible provider.

`LocalProvider` (aijobs.local) is a real HTTP server on 127.0.0.1; `expected_output` is the answer it
gives to a job, computed from the schema the engine sends for the job's input and its user prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aijobs.local.answers import answer_for
from aijobs.local.faults import FaultKind
from aijobs.local.provider import LocalProvider, ServedRequest
from engine.definitions import JobRegistry
from engine.gateway.schema import strict_json_schema

__all__ = ["FaultKind", "LocalProvider", "ServedRequest", "expected_output"]


def expected_output(job_type: str, raw_input: Mapping[str, Any], registry: JobRegistry | None = None) -> dict[str, Any]:
    """The local provider's (fault-free) answer to a job of `job_type` with `raw_input`.

    The schema is the one the OpenAI-compatible adapter sends in json_schema mode (the default);
    json_object mode sends the definition's own schema, to which the answer is the same unless the
    output model has optional fields (strict mode requires every field).
    """
    definition = (registry or JobRegistry()).get(job_type)
    job_input = definition.parse_input(raw_input)
    schema = strict_json_schema(definition.output_schema(job_input))
    answer: dict[str, Any] = answer_for(schema, definition.render_prompt(job_input).user)
    return answer
