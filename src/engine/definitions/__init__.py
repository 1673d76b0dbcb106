"""Job definitions: what each job type takes, asks and returns."""

from engine.definitions.base import MAX_INPUT_BYTES, JobDefinition, Prompt, RenderedPrompt
from engine.definitions.registry import BUILTIN_DEFINITIONS, JobRegistry

__all__ = ["BUILTIN_DEFINITIONS", "MAX_INPUT_BYTES", "JobDefinition", "JobRegistry", "Prompt", "RenderedPrompt"]
