"""aijobs: the client API and the `aijobs` command for the aijobs engine.

`aijobs.AiJobsClient` is imported on first use, so that a program importing only a submodule (the
local stack's Lambda event builders, say) does not load the client and the engine with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aijobs.client import AiJobsClient, SubmitResult

__all__ = ["AiJobsClient", "SubmitResult"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from aijobs import client

        return getattr(client, name)
    raise AttributeError(f"module 'aijobs' has no attribute {name!r}")
