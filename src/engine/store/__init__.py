"""The only package that talks to DynamoDB."""

from engine.store.jobs import Cancelled, Failed, JobStore, NewJob, Outcome, Released, Succeeded, explain_claim_refusal
from engine.store.listing import JobListing
from engine.store.usage import UsageLedger, UsageRow

__all__ = [
    "Cancelled",
    "Failed",
    "JobListing",
    "JobStore",
    "NewJob",
    "Outcome",
    "Released",
    "Succeeded",
    "UsageLedger",
    "UsageRow",
    "explain_claim_refusal",
]
