"""Where jobs wait for their batch: parts and manifests, in the payload bucket under `batches/`.

- `batches/parts/<window>/<model>/<written at>-<id>.json`: the entries one worker invocation
  claimed into a window for a model (the model's id percent-encoded);
- `batches/manifests/<batch key>.json`: a batch's entries, written before its record;
- `batches/unreadable/<window>/<model>/<name>.json`: a part that is not a part's JSON, set aside.
Parts are deleted once their batch is recorded, manifests once their batch has ended.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote

from engine.batching.entries import BatchEntry, Manifest, Part, dumps

PARTS_PREFIX = "batches/parts/"
MANIFESTS_PREFIX = "batches/manifests/"
# Parts that are not a part's JSON (never to be read), moved out of the way with their key kept.
UNREADABLE_PREFIX = "batches/unreadable/"


class Objects(Protocol):
    """The bucket, as the batch files use it (engine.store.PayloadStore; a dict in tests)."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def keys(self, prefix: str) -> list[str]: ...

    def delete(self, keys: Sequence[str]) -> None: ...


@dataclass(frozen=True, slots=True)
class PartKey:
    """A part's key, and the window and model it names."""

    key: str
    window: str
    model: str

    @property
    def name(self) -> str:
        """Its file name without `.json`: when it was written, then a random id (parts sort by age)."""
        return self.key.rsplit("/", 1)[-1].removesuffix(".json")


def part_key(window: str, model: str, written_ms: int) -> str:
    return f"{PARTS_PREFIX}{window}/{quote(model, safe='')}/{written_ms:013d}-{secrets.token_hex(6)}.json"


def parse_part_key(key: str) -> PartKey | None:
    """The window and model a part's key names; None for a key that is not a part's."""
    parts = key.removeprefix(PARTS_PREFIX).split("/")
    if not key.startswith(PARTS_PREFIX) or len(parts) != 3 or not parts[2].endswith(".json"):
        return None
    return PartKey(key, parts[0], unquote(parts[1]))


def manifest_key(batch_key: str) -> str:
    return f"{MANIFESTS_PREFIX}{batch_key}.json"


class BatchFiles:
    def __init__(self, objects: Objects) -> None:
        self._objects = objects

    def put_part(self, window: str, model: str, entries: Sequence[BatchEntry], now_ms: int) -> str:
        """Keep a worker's entries of one window and model; the part's key."""
        key = part_key(window, model, now_ms)
        self._objects.put(key, dumps({"entries": [entry.document() for entry in entries]}))
        return key

    def parts(self) -> list[PartKey]:
        """Every part waiting for a batch, oldest window first."""
        keys = (parse_part_key(key) for key in self._objects.keys(PARTS_PREFIX))
        return sorted((key for key in keys if key is not None), key=lambda part: (part.window, part.name))

    def read_part(self, key: PartKey) -> Part:
        document = json.loads(self._objects.get(key.key))
        entries = tuple(BatchEntry.of(entry) for entry in document["entries"])
        return Part(key.key, key.window, key.model, entries)

    def delete_parts(self, keys: Sequence[str]) -> None:
        self._objects.delete(keys)

    def set_aside(self, key: PartKey) -> str:
        """Move a part that cannot be read out of the way of the others; where it went."""
        aside = UNREADABLE_PREFIX + key.key.removeprefix(PARTS_PREFIX)
        self._objects.put(aside, self._objects.get(key.key))
        self._objects.delete([key.key])
        return aside

    def put_manifest(self, manifest: Manifest) -> None:
        self._objects.put(manifest_key(manifest.key), manifest.to_bytes())

    def manifest(self, batch_key: str) -> Manifest:
        return Manifest.from_bytes(self._objects.get(manifest_key(batch_key)))

    def delete_manifest(self, batch_key: str) -> None:
        self._objects.delete([manifest_key(batch_key)])
