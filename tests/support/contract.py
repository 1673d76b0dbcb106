"""Facts of the documented contract (docs/messages.md) that several test tiers check."""

# The job view's fields, in the order docs/messages.md gives.
VIEW_FIELDS = [
    "job_id",
    "job_type",
    "user_id",
    "status",
    "attempt_count",
    "max_attempts",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "output",
    "output_hash",
    "error",
    "cancel_requested",
    "usage",
]
