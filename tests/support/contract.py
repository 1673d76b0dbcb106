"""Facts of the documented contract (docs/messages.md) that several test tiers check."""

# The job view's fields, in the order docs/messages.md gives: fields added later come last.
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
    "lane",
    "usage",
    "via",
    "batch",
    "took_ms",
    "attachments",
    "job_type_version",
    "parent_id",
    "step",
    "pipeline",
    "reused_from",
]

# An attachment of the job view (engine.views.AttachmentView): its reference and name, then what was
# read of it.
ATTACHMENT_FIELDS = ["s3", "name", "media_type", "bytes", "sha256", "pages", "width", "height"]

# The view's usage fields: the four of the spec's example, then the token kinds that are parts of
# input_tokens and output_tokens, then what the same calls would have cost in real time.
USAGE_FIELDS = [
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "attempts",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "reasoning_tokens",
    "standard_cost_usd",
]

# A row of `aijobs usage --json`.
USAGE_ROW_FIELDS = [
    "user_id",
    "job_type",
    "model",
    "lane",
    "attempts",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_usd",
    "cache_savings_usd",
    "unpriced_attempts",
    "reused",
    "via",
    "standard_cost_usd",
    "saved_usd",
]

# A batch of `aijobs batches --json` (docs/batches.md).
BATCH_FIELDS = [
    "key",
    "model",
    "provider",
    "phase",
    "state",
    "detail",
    "lines",
    "batch_id",
    "created_at",
    "updated_at",
    "rescue_at",
    "abandon_at",
    "ended_at",
    "answered",
    "failed",
    "handed_back",
    "finished",
    "returned",
]
