"""The stored shape of jobs: keys, attribute names, and the mapping between items and `Job`.

One table holds a job's small state item (`JOB`), its input stored once (`INPUT`), one record per
attempt (`ATTEMPT#0001`...), and dead letters: the message kept (`DEADLETTER#<id>`), its entry in
the day's listing (`DEADLETTERS#<day>`) and, when it names a job, a pointer in the job's partition;
and answers already paid for, one item per request's key (`REUSE#<key>`).
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from engine.core import (
    AttemptOutcome,
    AttemptRecord,
    ChildOf,
    DeadLetter,
    DeadLetterEntry,
    ErrorCode,
    Job,
    JobErrorInfo,
    JobStatus,
    Lane,
    PaidAnswer,
    PipelineState,
    Reusable,
    Review,
    Usage,
    Via,
)
from engine.core.attachments import AttachmentInfo, AttachmentRef
from engine.core.days import utc_day
from engine.text import bounded, one_line

Item = dict[str, Any]  # a DynamoDB item in the low-level AttributeValue form

JOB_SK = "JOB"
INPUT_SK = "INPUT"
DEAD_LETTER_SK = "DEADLETTER"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


JOB_PREFIX = "JOB#"


def job_key(job_id: str, sk: str = JOB_SK) -> Item:
    return {"pk": {"S": f"{JOB_PREFIX}{job_id}"}, "sk": {"S": sk}}


ATTEMPT_PREFIX = "ATTEMPT#"


def attempt_sk(attempt: int) -> str:
    return f"{ATTEMPT_PREFIX}{attempt:04d}"


def budget_day_key(user_id: str, day: str) -> Item:
    """A user's UTC day of budget (engine.store.budgets)."""
    return {"pk": {"S": f"BUDGET#{user_id}"}, "sk": {"S": f"DAY#{day}"}}


def dead_letter_key(message_id: str) -> Item:
    return {"pk": {"S": f"DEADLETTER#{message_id}"}, "sk": {"S": DEAD_LETTER_SK}}


# A job's partition sorts ATTEMPT#... < DEADLETTER#... < INPUT < JOB: one Query between these two
# bounds reads its attempts and the dead letters that name it, not its input. '$' follows '#'.
DEAD_LETTER_POINTER_PREFIX = "DEADLETTER#"
JOB_HISTORY_END = "DEADLETTER$"


def dead_letter_pointer_key(job_id: str, message_id: str) -> Item:
    """The pointer in a job's partition to a dead letter that names the job."""
    return job_key(job_id, f"{DEAD_LETTER_POINTER_PREFIX}{message_id}")


def dead_letter_day_partition(day: str) -> str:
    """The partition listing the dead letters recorded on a UTC day (YYYY-MM-DD)."""
    return f"DEADLETTERS#{day}"


def dead_letter_listing_key(recorded_at: int, message_id: str) -> Item:
    """A listing entry: in its UTC day's partition, sorted by the time of recording (epoch ms zero-padded)."""
    return {
        "pk": {"S": dead_letter_day_partition(utc_day(recorded_at))},
        "sk": {"S": f"{recorded_at:013d}#{message_id}"},
    }


def dead_letter_listing_range(since_ms: int, until_ms: int) -> tuple[str, str]:
    """The sort keys bounding the entries recorded in [since, until]: '$' follows '#'."""
    return f"{since_ms:013d}#", f"{until_ms:013d}$"


def serialize(value: Any) -> dict[str, Any]:
    return dict(_serializer.serialize(value))


def to_item(attributes: dict[str, Any]) -> Item:
    """Plain values to AttributeValues; None values are left out (DynamoDB has no "absent" value)."""
    return {name: serialize(value) for name, value in attributes.items() if value is not None}


def from_item(item: Item) -> dict[str, Any]:
    return {name: _deserializer.deserialize(value) for name, value in item.items()}


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# Names a provider or a job type gives (model ids, prompt keys) are kept to this many characters.
MAX_NAME_CHARS = 256
# What an attempt keeps of an answer validation refused (aijobs inspect, the job page): its first
# characters, then how many more there were; the whole length is kept beside it.
MAX_REFUSED_ANSWER_CHARS = 16_384


def error_attribute(error: JobErrorInfo) -> dict[str, Any]:
    return {"code": error.code.value, "message": one_line(error.message), "retryable": error.retryable}


def _name(value: str | None) -> str | None:
    return None if value is None else bounded(value, MAX_NAME_CHARS)


def job_from_item(item: Item) -> Job:
    data = from_item(item)
    error = data.get("error")
    output = data.get("output")
    return Job(
        job_id=data["job_id"],
        job_type=data.get("job_type"),
        user_id=data.get("user_id"),
        status=JobStatus(data["status"]),
        created_at=int(data["created_at"]),
        updated_at=int(data.get("updated_at", data["created_at"])),
        max_attempts=int(data.get("max_attempts", 0)),
        attempt_count=int(data.get("attempt_count", 0)),
        claim_count=int(data.get("claim_count", 0)),
        schema_version=_int(data.get("schema_version")),
        deadline_seconds=_int(data.get("deadline_seconds")),
        deadline_at=_int(data.get("deadline_at")),
        request_hash=data.get("request_hash"),
        lease_owner=data.get("lease_owner"),
        lease_expires_at=_int(data.get("lease_expires_at")),
        cancel_requested=bool(data.get("cancel_requested", False)),
        input_stored=bool(data.get("input_stored", False)),
        started_at=_int(data.get("started_at")),
        finished_at=_int(data.get("finished_at")),
        output=json.loads(output) if output else None,
        output_hash=data.get("output_hash"),
        error=(
            JobErrorInfo(code=ErrorCode(error["code"]), message=error["message"], retryable=bool(error["retryable"]))
            if error
            else None
        ),
        usage=Usage(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost_usd=Decimal(data.get("cost_usd", 0)),
            attempts=int(data.get("usage_attempts", 0)),
            cached_input_tokens=int(data.get("cached_input_tokens", 0)),
            cache_write_input_tokens=int(data.get("cache_write_input_tokens", 0)),
            reasoning_tokens=int(data.get("reasoning_tokens", 0)),
            # Jobs whose attempts were all recorded before it: their cost is their real-time cost.
            standard_cost_usd=Decimal(data.get("standard_cost_usd", data.get("cost_usd", 0))),
        ),
        # Jobs created before lanes were all interactive.
        lane=Lane(data.get("lane", Lane.INTERACTIVE)),
        batch=data.get("batch"),
        batch_settled=frozenset(int(claim) for claim in data.get("batch_settled", ())),
        attachments=tuple(AttachmentRef.parse(ref["s3"], ref.get("name")) for ref in data.get("attachments") or ()),
        attachments_read=tuple(AttachmentInfo.of(info) for info in data.get("attachments_read") or ()),
        job_type_version=_int(data.get("job_type_version")),
        parent=_child_of(data),
        pipeline=_pipeline(data),
        reused_from=data.get("reused_from"),
    )


def _child_of(data: dict[str, Any]) -> ChildOf | None:
    if not data.get("parent_id"):
        return None
    return ChildOf(
        data["parent_id"], str(data.get("step", "")), int(data.get("step_index", 0)), int(data.get("part", 0))
    )


def _pipeline(data: dict[str, Any]) -> PipelineState | None:
    if data.get("pipeline_step") is None:
        return None
    review = data.get("review")
    return PipelineState(
        step=int(data["pipeline_step"]),
        children=int(data.get("pipeline_children", 0)),
        ended=frozenset(int(part) for part in data.get("pipeline_ended", ())),
        failed=frozenset(int(part) for part in data.get("pipeline_failed", ())),
        counts=tuple(int(count) for count in data.get("pipeline_counts", ())),
        review=review_from_document(review) if review else None,
        rerun=bool(data.get("pipeline_rerun", False)),
    )


def review_document(review: Review) -> dict[str, Any]:
    """A review as the job item keeps it (a map; its output as JSON text, as a job's output is)."""
    document: dict[str, Any] = {
        "output": json.dumps(review.output, separators=(",", ":"), ensure_ascii=False),
        "started_at": review.started_at,
        "timeout_ms": review.timeout_ms,
        "changed": review.changed,
    }
    for name in ("decision", "by", "at", "reason"):
        if (value := getattr(review, name)) is not None:
            document[name] = value
    return document


def review_from_document(data: dict[str, Any]) -> Review:
    return Review(
        output=json.loads(data["output"]),
        started_at=int(data["started_at"]),
        timeout_ms=int(data["timeout_ms"]),
        decision=data.get("decision"),
        by=data.get("by"),
        at=_int(data.get("at")),
        reason=data.get("reason"),
        changed=bool(data.get("changed", False)),
    )


# Non-terminal jobs carry OPEN_SHARD, the key of the sparse OpenJobs index (sorted by deadline_at);
# a terminal state removes it. Shards spread the index's writes over partitions.
OPEN_SHARD = "open_shard"
OPEN_SHARDS = 8


# Shards of a day in the JobsByDay index (list_day = "2026-12-02#3"): every job created that day
# writes its day's key, and one key takes ~1000 writes a second (docs/scale.md).
LIST_DAY_SHARDS = 8


def listing_keys(job_id: str, created_at: int) -> dict[str, str]:
    """The key of the JobsByDay index, on job items only."""
    return {"list_day": list_day_partition(utc_day(created_at), _shard(job_id, LIST_DAY_SHARDS))}


def list_day_partition(day: str, shard: int) -> str:
    return f"{day}#{shard}"


def open_shard(job_id: str) -> str:
    return open_shard_key(_shard(job_id, OPEN_SHARDS))


def open_shard_key(shard: int) -> str:
    return f"OPEN#{shard}"


def _shard(key: str, shards: int) -> int:
    return int(hashlib.blake2s(key.encode(), digest_size=2).hexdigest(), 16) % shards


# Shards of a day in the UsageByDay index; a query of one day reads them all.
USAGE_DAY_SHARDS = 8


def usage_day_partition(day: str, shard: int) -> str:
    return f"{day}#{shard}"


def attempt_item(record: AttemptRecord, expires_at: int) -> Item:
    return job_key(record.job_id, attempt_sk(record.attempt)) | to_item(
        {
            # Keys of the UsageByDay index (template.yaml).
            "usage_day": usage_day_partition(utc_day(record.finished_at), _shard(record.job_id, USAGE_DAY_SHARDS)),
            "usage_at": record.finished_at,
            "job_id": record.job_id,
            "attempt": record.attempt,
            "user_id": record.user_id,
            "job_type": record.job_type,
            "started_at": record.started_at,
            "finished_at": record.finished_at,
            "outcome": record.outcome.value,
            "error_code": record.error_code.value if record.error_code else None,
            "provider": _name(record.provider),
            "tier": _name(record.tier),
            "model": _name(record.model),
            "calls": record.calls,
            "prompt_key": _name(record.prompt_key),
            "prompt_version": _name(record.prompt_version),
            "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens,
            "cost_usd": record.cost_usd,
            "latency_ms": record.latency_ms,
            "cached_input_tokens": record.cached_input_tokens or None,
            "cache_write_input_tokens": record.cache_write_input_tokens or None,
            "reasoning_tokens": record.reasoning_tokens or None,
            "cache_savings_usd": record.cache_savings_usd or None,
            "unpriced": True if not record.priced else None,
            "lane": record.lane.value,
            "via": record.via.value,
            "batch_id": _name(record.batch_id),
            # Written only where a batch or the flex tier made the calls cheaper (read back as cost_usd).
            "standard_cost_usd": None if record.standard_cost_usd == record.cost_usd else record.standard_cost_usd,
            "service_tier": _name(record.service_tier),
            "job_type_version": record.job_type_version,
            "reasks": record.reasks or None,
            "refused_answer": None
            if record.refused_answer is None
            else bounded(record.refused_answer, MAX_REFUSED_ANSWER_CHARS),
            "prompt_sha256": _name(record.prompt_sha256),
            "refused_answer_s3": record.refused_answer_s3,
            "reused_from": record.reused_from,
            "expires_at": expires_at,
        }
    )


def attempt_from_item(item: Item) -> AttemptRecord:
    data = from_item(item)
    return AttemptRecord(
        job_id=data["job_id"],
        attempt=int(data["attempt"]),
        user_id=data.get("user_id"),
        job_type=data.get("job_type"),
        started_at=int(data["started_at"]),
        finished_at=int(data["finished_at"]),
        outcome=AttemptOutcome(data["outcome"]),
        error_code=ErrorCode(data["error_code"]) if data.get("error_code") else None,
        provider=data.get("provider"),
        tier=data.get("tier"),
        model=data.get("model"),
        calls=int(data.get("calls", 0)),
        prompt_key=data.get("prompt_key"),
        prompt_version=data.get("prompt_version"),
        input_tokens=int(data.get("input_tokens", 0)),
        output_tokens=int(data.get("output_tokens", 0)),
        cost_usd=Decimal(data.get("cost_usd", 0)),
        latency_ms=int(data.get("latency_ms", 0)),
        cached_input_tokens=int(data.get("cached_input_tokens", 0)),
        cache_write_input_tokens=int(data.get("cache_write_input_tokens", 0)),
        reasoning_tokens=int(data.get("reasoning_tokens", 0)),
        cache_savings_usd=Decimal(data.get("cache_savings_usd", 0)),
        priced=not data.get("unpriced", False),
        lane=Lane(data.get("lane", Lane.INTERACTIVE)),
        via=Via(data.get("via", Via.REALTIME)),
        batch_id=data.get("batch_id"),
        standard_cost_usd=Decimal(data.get("standard_cost_usd", data.get("cost_usd", 0))),
        service_tier=data.get("service_tier"),
        job_type_version=_int(data.get("job_type_version")),
        reasks=int(data.get("reasks", 0)),
        refused_answer=data.get("refused_answer"),
        prompt_sha256=data.get("prompt_sha256"),
        refused_answer_s3=data.get("refused_answer_s3"),
        reused_from=data.get("reused_from"),
    )


def dead_letter_from_item(item: Item, body: str | None = None) -> DeadLetter:
    """A dead letter from its item; `body` when it was read back from the payload bucket."""
    data = from_item(item)
    return DeadLetter(
        message_id=data["message_id"],
        body=body if body is not None else data.get("body"),
        body_key=data.get("body_key"),
        body_bytes=int(data.get("body_bytes", 0)),
        body_sha256=data.get("body_sha256", ""),
        attributes=dict(data.get("attributes", {})),
        receive_count=int(data.get("receive_count", 0)),
        reason=data.get("reason", ""),
        recorded_at=int(data.get("recorded_at", 0)),
        job_id=data.get("job_id"),
    )


def dead_letter_entry_from_item(item: Item) -> DeadLetterEntry:
    """A dead letter's listing entry or pointer (or the dead letter itself, its body left aside)."""
    data = from_item(item)
    return DeadLetterEntry(
        message_id=data["message_id"],
        recorded_at=int(data["recorded_at"]),
        receive_count=int(data.get("receive_count", 0)),
        reason=data.get("reason", ""),
        job_id=data.get("job_id"),
    )


def input_json(job_input: dict[str, Any]) -> str:
    # The input is kept as one JSON string: no float-to-Decimal conversion, one attribute to read.
    return json.dumps(job_input, separators=(",", ":"), ensure_ascii=False)


def input_item(job_id: str, stored: dict[str, str], request_hash: str | None, expires_at: int) -> Item:
    """The input item: `stored` holds the JSON itself (`input`) or its payload key (`input_key`)."""
    return job_key(job_id, INPUT_SK) | to_item(
        {"job_id": job_id, **stored, "request_hash": request_hash, "expires_at": expires_at}
    )


REUSE_SK = "REUSE"


def reuse_key(key: str) -> Item:
    """Where the answer last paid for a request's key is kept (engine.reuse, docs/reuse.md)."""
    return {"pk": {"S": f"REUSE#{key}"}, "sk": {"S": REUSE_SK}}


def reuse_item(kept: Reusable, job_id: str, stored: dict[str, str], answered_at: int, until: int) -> Item:
    """The answer kept: `stored` holds its JSON (`answer`) or its payload key (`answer_key`). `until` (ms)
    is the last moment it may be reused; its TTL (`expires_at`, seconds) the first second after it."""
    return reuse_key(kept.key) | to_item(
        {"job_id": job_id, **stored, "answered_at": answered_at, "until": until, "expires_at": until // 1000 + 1}
    )


def paid_answer_from_item(item: Item, answer: str | None = None) -> PaidAnswer:
    """An answer kept from its item; `answer` when it was read back from the payload bucket."""
    data = from_item(item)
    return PaidAnswer(
        key=str(data["pk"]).removeprefix("REUSE#"),
        job_id=data["job_id"],
        answer=answer if answer is not None else data["answer"],
        answered_at=int(data["answered_at"]),
        until=int(data["until"]),
    )
