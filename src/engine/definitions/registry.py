"""The job types a worker knows: the built-ins, your own in the `jobtypes` package, and the modules
named in AIJOBS_JOB_MODULES."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable

from engine.config import Settings
from engine.core.errors import ConfigurationError, UnknownJobTypeError
from engine.definitions.answer_with_citations import ANSWER_WITH_CITATIONS
from engine.definitions.base import JobDefinition
from engine.definitions.classify import CLASSIFY
from engine.definitions.extract import EXTRACT
from engine.definitions.summarize import SUMMARIZE

BUILTIN_DEFINITIONS: tuple[JobDefinition, ...] = (SUMMARIZE, CLASSIFY, ANSWER_WITH_CITATIONS, EXTRACT)
# Your own job types: a top-level package beside `engine` (src/jobtypes/, which `sam build` ships with
# every function), registered whenever it can be imported, with no setting.
JOB_TYPES_PACKAGE = "jobtypes"


class JobRegistry:
    def __init__(self, definitions: Iterable[JobDefinition] = BUILTIN_DEFINITIONS) -> None:
        self._definitions: dict[str, JobDefinition] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: JobDefinition) -> None:
        if definition.name in self._definitions:
            raise ValueError(f"job type {definition.name!r} is registered twice")
        self._definitions[definition.name] = definition

    def get(self, name: str) -> JobDefinition:
        try:
            return self._definitions[name]
        except KeyError:
            known = ", ".join(sorted(self._definitions))
            raise UnknownJobTypeError(f"no job type {name!r} is registered (known: {known})") from None

    @property
    def names(self) -> list[str]:
        """The registered job types' names, sorted."""
        return sorted(self._definitions)

    @classmethod
    def from_settings(cls, settings: Settings) -> JobRegistry:
        """The built-in job types, those of the `jobtypes` package when there is one, and those of
        AIJOBS_JOB_MODULES."""
        registry = cls()
        registry.load_modules(job_modules(settings))
        return registry

    def load_modules(self, module_names: Iterable[str]) -> None:
        """Register the `JOB_DEFINITIONS` of each module, e.g. AIJOBS_JOB_MODULES=myapp.jobs."""
        for module_name in module_names:
            # The package of your own job types is found, not named: a problem with it says so.
            source = "jobtypes (your own job types)" if module_name == JOB_TYPES_PACKAGE else "AIJOBS_JOB_MODULES"
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigurationError(f"{source}: cannot import {module_name!r}: {exc}") from exc
            definitions = getattr(module, "JOB_DEFINITIONS", None)
            if definitions is None:
                raise ConfigurationError(f"{source}: {module_name!r} has no JOB_DEFINITIONS")
            for definition in definitions:
                self.register(definition)


def job_modules(settings: Settings) -> tuple[str, ...]:
    """The modules whose job types a worker registers: `jobtypes` when it exists, then AIJOBS_JOB_MODULES."""
    named = settings.aijobs_job_modules
    if JOB_TYPES_PACKAGE in named or importlib.util.find_spec(JOB_TYPES_PACKAGE) is None:
        return named
    return (JOB_TYPES_PACKAGE, *named)
