"""Test support, not product: the engine's stores in memory, held to the real ones by tests/contract.

- attachments.py: MemoryAttachments (engine.attachments.loader.AttachmentObjects)
- jobs.py: InMemoryJobStore (every Protocol of engine.core.ports) and MemoryOpenJobs
- batches.py: MemoryBatchRecords (engine.core.batches.BatchRecords) and MemoryObjects (a bucket)
- fleet.py: InMemoryLimitStore and InMemoryBudgetStore (engine.fleet's stores)
- job_types.py: InMemoryJobTypes (engine.core.ports.JobTypeStore)

The Lambda functions do not ship this package (template.yaml's build, scripts/check_build.py), and
nothing else under engine imports it (pyproject.toml, [tool.importlinter]).
"""

from engine.testing.attachments import MemoryAttachments
from engine.testing.batches import MemoryBatchRecords, MemoryObjects
from engine.testing.fleet import InMemoryBudgetStore, InMemoryLimitStore
from engine.testing.job_types import InMemoryJobTypes
from engine.testing.jobs import InMemoryJobStore, MemoryOpenJobs

__all__ = [
    "InMemoryBudgetStore",
    "InMemoryJobStore",
    "InMemoryJobTypes",
    "InMemoryLimitStore",
    "MemoryAttachments",
    "MemoryBatchRecords",
    "MemoryObjects",
    "MemoryOpenJobs",
]
