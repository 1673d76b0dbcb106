"""The loopback model provider of the tests: the project's own local OpenAI-compatible provider.

`LocalProvider` (aijobs.local) is a real HTTP server on 127.0.0.1; `expected_output` is the answer it
gives to a job of a built-in type, computed from the prompt the engine renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aijobs.local import FaultKind, LocalProvider, ServedRequest, answer_for
from engine.definitions import JobRegistry

__all__ = ["FaultKind", "LocalProvider", "ServedRequest", "expected_output"]


def expected_output(job_type: str, raw_input: Mapping[str, Any], registry: JobRegistry | None = None) -> dict[str, Any]:
    """The local provider's (fault-free) answer to a job of `job_type` with `raw_input`."""
    definition = (registry or JobRegistry()).get(job_type)
    return answer_for(job_type, definition.render_prompt(definition.parse_input(raw_input)).user)
