"""The DynamoDB store (and, in payloads.py, the S3 payload bucket): the only code that talks to either.

DynamoJobStore keeps every Protocol of engine.core.ports, one role per module: worker_writes
(claim, finish, settle), dead_letter_writes, admin_writes (submit, cancel, retry, re-enqueue),
pipeline_writes (a child counted, a parent moved on, a review decided), reads; table.py holds what
they share. listing.py and usage.py read the listing and usage indexes.
"""

from engine.store.admin_writes import AdminWrites
from engine.store.dead_letter_writes import DeadLetterWrites
from engine.store.listing import JobListing
from engine.store.payloads import PayloadStore
from engine.store.pipeline_writes import PipelineWrites
from engine.store.reads import JobReads
from engine.store.usage import ROUTES, UsageLedger, UsageReport, UsageRow, by_route, summed
from engine.store.worker_writes import WorkerWrites


class DynamoJobStore(WorkerWrites, DeadLetterWrites, AdminWrites, PipelineWrites, JobReads):
    """The jobs table, in every role: what is deployed."""


__all__ = [
    "ROUTES",
    "DynamoJobStore",
    "JobListing",
    "PayloadStore",
    "UsageLedger",
    "UsageReport",
    "UsageRow",
    "by_route",
    "summed",
]
