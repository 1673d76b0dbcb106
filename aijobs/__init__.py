"""aijobs: the client API and the `aijobs` command for the aijobs engine."""

from aijobs.client import AiJobsClient, SubmitResult

__all__ = ["AiJobsClient", "SubmitResult"]
