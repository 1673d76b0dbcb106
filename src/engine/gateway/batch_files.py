"""The JSONL files of batches: written one line a request, read back one bounded line at a time.

A batch's results are copied to a spooled temporary file (memory while small, disk past that) before
any line is read: the caller may spend minutes on the answers (validation, a re-ask in real time),
longer than a provider keeps a paused download open. Each line is then read with a bound, so that a
line larger than any answer can be is skipped unread rather than held in memory.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from engine.core.errors import OutputTooLargeError, ProviderUnavailableError
from engine.gateway.batches import BatchAnswer

# A results file is held in memory up to this size, on disk past it.
SPOOL_MEMORY_BYTES = 8 * 1024 * 1024
# What is kept of a line that cannot be read: enough to find the id the provider writes first.
HEAD_BYTES = 4096


def jsonl_line(value: object) -> bytes:
    """One line of a JSONL file: compact JSON and a newline."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"


@dataclass(frozen=True, slots=True)
class UnreadableLine:
    """A line that is not JSON, or is longer than the bound (its rest was skipped unread)."""

    head: bytes
    oversized: bool

    def field(self, name: str) -> str | None:
        """The string value of the top-level field `name`, when the line's head holds it."""
        match = re.search(rb'"' + re.escape(name.encode()) + rb'"\s*:\s*("(?:[^"\\]|\\.)*")', self.head)
        if match is None:
            return None
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return None
        return value if isinstance(value, str) else None


def unreadable_answer(line: UnreadableLine, id_field: str, max_line_bytes: int) -> BatchAnswer | None:
    """The answer an unreadable line stands for, when its head names the request (in `id_field`): too
    large to keep, as a real-time body past the bound is, or malformed, as a provider's fault."""
    custom_id = line.field(id_field)
    if custom_id is None:
        return None
    if line.oversized:
        return BatchAnswer(custom_id, error=OutputTooLargeError(f"the batch's answer is past {max_line_bytes} bytes"))
    return BatchAnswer(custom_id, error=ProviderUnavailableError("the batch's answer is not JSON"))


def spooled(write: Callable[[IO[bytes]], object]) -> IO[bytes]:
    """A temporary file that `write` filled, positioned at its start; the caller closes it."""
    file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 - returned open
    try:
        write(file)
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return file


def write_chunks(chunks: Iterable[bytes]) -> Callable[[IO[bytes]], None]:
    """A writer (for `spooled`) of `chunks`, in order."""

    def write(file: IO[bytes]) -> None:
        for chunk in chunks:
            file.write(chunk)

    return write


def jsonl_values(file: IO[bytes], max_line_bytes: int) -> Iterator[Any | UnreadableLine]:
    """Each non-blank line's JSON value, or an UnreadableLine; no line is read past `max_line_bytes`."""
    while True:
        line = file.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            head = line[:HEAD_BYTES]
            _skip_rest_of_line(file)
            yield UnreadableLine(head, oversized=True)
            continue
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError:
            yield UnreadableLine(line[:HEAD_BYTES], oversized=False)


def _skip_rest_of_line(file: IO[bytes]) -> None:
    while True:
        rest = file.readline(SPOOL_MEMORY_BYTES)
        if not rest or rest.endswith(b"\n"):
            return


def request_count(counts: object, name: str) -> int:
    """A count of a batch's `request_counts` (OpenAI's, Anthropic's): a non-negative integer, else 0."""
    value = counts.get(name) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def names_a_request(value: object) -> bool:
    """Whether a results line names its request by `custom_id` (a request never run included)."""
    return isinstance(value, dict) and isinstance(value.get("custom_id"), str)
