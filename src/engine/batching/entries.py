"""What waits for a batch: the entries of claimed jobs, in parts per window and model, then manifests.

A worker writes the jobs it claimed into a window as one part per model; the batcher gathers the
parts of a closed window into batches, each described by a manifest that lists its entries under
the ids of their lines (`custom_id`). Both are JSON documents in the payload bucket
(engine.batching.files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from engine.core import Lane
from engine.core.attachments import AttachmentRef, ref_documents


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """A job claimed into a batch, with what finishing it or handing it back needs."""

    job_id: str
    owner: str  # the claim's lease owner: the batch's answer is written fenced on it
    claim_count: int
    lane: Lane
    user_id: str | None
    job_type: str
    deadline_at: int
    job_input: dict[str, Any]
    # The message as it came, sent again (marked for real time) when the batch hands the job back.
    message_id: str
    body: str
    receive_count: int
    # The job's reservation of its user's budget (engine.fleet.budgets), settled when it ends.
    reserved_usd: Decimal = Decimal(0)
    reserved_day: str = ""
    # Its documents and images, by reference: read again to make its line (docs/attachments.md).
    attachments: tuple[AttachmentRef, ...] = ()

    def document(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "owner": self.owner,
            "claim_count": self.claim_count,
            "lane": self.lane.value,
            "user_id": self.user_id,
            "job_type": self.job_type,
            "deadline_at": self.deadline_at,
            "input": self.job_input,
            "message_id": self.message_id,
            "body": self.body,
            "receive_count": self.receive_count,
            "reserved_usd": str(self.reserved_usd),
            "reserved_day": self.reserved_day,
            **({"attachments": ref_documents(self.attachments)} if self.attachments else {}),
        }

    @classmethod
    def of(cls, document: dict[str, Any]) -> BatchEntry:
        return cls(
            job_id=document["job_id"],
            owner=document["owner"],
            claim_count=int(document["claim_count"]),
            lane=Lane(document["lane"]),
            user_id=document["user_id"],
            job_type=document["job_type"],
            deadline_at=int(document["deadline_at"]),
            job_input=document["input"],
            message_id=document["message_id"],
            body=document["body"],
            receive_count=int(document["receive_count"]),
            reserved_usd=Decimal(document["reserved_usd"]),
            reserved_day=document["reserved_day"],
            attachments=tuple(
                AttachmentRef.parse(ref["s3"], ref.get("name")) for ref in document.get("attachments", ())
            ),
        )


@dataclass(frozen=True, slots=True)
class Part:
    """The entries one worker invocation claimed into a window for one model."""

    key: str
    window: str
    model: str
    entries: tuple[BatchEntry, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    """A batch's entries, each under the id of its line; `lines` says which were sent (an entry whose
    request could not be made is in no line: it goes back to real time with the batch's end)."""

    key: str
    model: str
    entries: dict[str, BatchEntry]
    lines: frozenset[str]
    parts: tuple[str, ...]

    def to_bytes(self) -> bytes:
        document = {
            "key": self.key,
            "model": self.model,
            "entries": {custom_id: entry.document() for custom_id, entry in self.entries.items()},
            "lines": sorted(self.lines),
            "parts": list(self.parts),
        }
        return dumps(document)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        document = json.loads(data)
        return cls(
            key=document["key"],
            model=document["model"],
            entries={custom_id: BatchEntry.of(entry) for custom_id, entry in document["entries"].items()},
            lines=frozenset(document["lines"]),
            parts=tuple(document["parts"]),
        )


def line_id(index: int) -> str:
    """The id of a batch's `index`-th line: short and plain, as every provider accepts."""
    return f"j{index:010d}"


def dumps(document: object) -> bytes:
    # ASCII: inputs and bodies may hold lone surrogates, which only JSON's escapes carry.
    return json.dumps(document, separators=(",", ":")).encode()
