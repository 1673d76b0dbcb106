"""The job types a worker knows: the built-ins, your own in the `jobtypes` package, the modules named
in AIJOBS_JOB_MODULES (code job types), and the data job types pushed into the stack (docs/jobtypes.md).

Both kinds share one name space: a name a code job type holds is served by it (a push refuses such a
name, so the two meet only when a code type is deployed after a data type of its name).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable

from engine.config import Settings
from engine.core.errors import ConfigurationError, InputValidationError, UnknownJobTypeError
from engine.definitions.answer_with_citations import ANSWER_WITH_CITATIONS
from engine.definitions.base import JobDefinition
from engine.definitions.catalog import DataJobTypes
from engine.definitions.classify import CLASSIFY
from engine.definitions.extract import EXTRACT
from engine.definitions.pipelines import PIPELINES
from engine.definitions.summarize import SUMMARIZE

BUILTIN_DEFINITIONS: tuple[JobDefinition, ...] = (SUMMARIZE, CLASSIFY, ANSWER_WITH_CITATIONS, EXTRACT, *PIPELINES)
# Your own job types: a top-level package beside `engine` (src/jobtypes/, which `sam build` ships with
# every function), registered whenever it can be imported, with no setting.
JOB_TYPES_PACKAGE = "jobtypes"


class JobRegistry:
    def __init__(
        self, definitions: Iterable[JobDefinition] = BUILTIN_DEFINITIONS, data: DataJobTypes | None = None
    ) -> None:
        self._definitions: dict[str, JobDefinition] = {}
        self._data = data
        for definition in definitions:
            self.register(definition)

    def register(self, definition: JobDefinition) -> None:
        if definition.name in self._definitions:
            raise ValueError(f"job type {definition.name!r} is registered twice")
        self._definitions[definition.name] = definition

    def get(self, name: str) -> JobDefinition:
        """A code job type, or a data job type's production version."""
        return self.resolve(name, "")

    def resolve(self, name: str, user_id: str, pinned: int | None = None) -> JobDefinition:
        """What a new job of `user_id` runs: a code job type (the same for everyone), or a data job type's
        `pinned` version, else the version its labels serve that user. UnknownJobTypeError for a name
        (or a pinned version) that does not exist; InputValidationError for a pin of a code job type."""
        code = self._definitions.get(name)
        if code is not None:
            # A registry may hold one version of a data job type as a definition (the client checks a
            # submission with the version it resolved): a pin of that version is that definition.
            if pinned is not None and pinned != code.job_type_version:
                raise InputValidationError(f"{name} is a code job type: it has no versions to pin")
            return code
        if self._data is not None and self._data.knows(name):
            return self._data.resolve(name, user_id, pinned)
        raise UnknownJobTypeError(f"no job type {name!r} is registered (known: {', '.join(self.names)})")

    def definition(self, name: str, version: int | None) -> JobDefinition:
        """What a job that exists runs: its recorded data job type's `version` (a retry runs what its
        first claim ran, whatever the labels say now), or, with None, its code job type."""
        if version is None or name in self._definitions:
            return self.resolve(name, "", version)
        if self._data is None:
            raise UnknownJobTypeError(f"no job type {name!r} is registered (known: {', '.join(self.names)})")
        return self._data.definition(name, version)

    def is_data(self, name: str) -> bool:
        """Whether `name` is a data job type (not a code one, which wins a name both hold)."""
        return name not in self._definitions and self._data is not None and self._data.knows(name)

    @property
    def names(self) -> list[str]:
        """The registered job types' names, code and data, sorted."""
        data = self._data.names() if self._data is not None else []
        return sorted({*self._definitions, *data})

    @classmethod
    def from_settings(cls, settings: Settings, data: DataJobTypes | None = None) -> JobRegistry:
        """The built-in job types, those of the `jobtypes` package when there is one, those of
        AIJOBS_JOB_MODULES, and with `data` the data job types."""
        registry = cls(data=data)
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
