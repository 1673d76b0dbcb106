"""How a data job type's head moves: a push, a promote, a canary, a rollback, a guard ending a canary.

Pure functions from the head as read to the head to write (or a JobTypeLabelError naming why not in
one line), so that the DynamoDB store (engine.store.job_types) and the one in memory
(engine.testing.job_types) move labels the same way; each store fences its write on the revision
it read. Every move bumps the revision and records one LabelEvent.
"""

from __future__ import annotations

from dataclasses import replace

from engine.core.errors import JobTypeLabelError
from engine.core.job_types import Canary, Guard, JobTypeHead, LabelAction, LabelEvent

# What a head keeps of its past: production's earlier versions (what rollback moves back to) and its events.
MAX_PREVIOUS = 50
MAX_HISTORY = 100
# A rollback's reason, as its history row shows it: one line. The head (its history of MAX_HISTORY
# events) is one DynamoDB item, 400 KB at most: unbounded reasons would make its every move fail.
MAX_REASON_CHARS = 500


def recorded(head: JobTypeHead, event: LabelEvent, **changes: object) -> JobTypeHead:
    """`head` with `changes`, `event` at the end of its history, its revision bumped."""
    history = (*head.history, event)[-MAX_HISTORY:]
    return replace(head, history=history, revision=head.revision + 1, **changes)  # type: ignore[arg-type]


def first_head(name: str, now_ms: int, by: str | None = None) -> JobTypeHead:
    """The head of a name's first push: v1, production at once."""
    event = LabelEvent(at=now_ms, action=LabelAction.PUSH, version=1, by=by)
    return JobTypeHead(name=name, latest=1, production=1, history=(event,), revision=1)


def pushed(head: JobTypeHead, now_ms: int, by: str | None = None) -> JobTypeHead:
    """`head` with its next version stored (the labels stay where they are)."""
    version = head.latest + 1
    return recorded(head, LabelEvent(at=now_ms, action=LabelAction.PUSH, version=version, by=by), latest=version)


def promoted(
    head: JobTypeHead | None,
    name: str,
    version: int,
    now_ms: int,
    canary_percent: int | None = None,
    guard: Guard | None = None,
    by: str | None = None,
) -> JobTypeHead:
    """`version` made production (any canary ended; the old production kept for rollback), or, with
    `canary_percent`, served to that share of users (any canary replaced, its counts started anew).
    Promoting production again with no canary changes nothing: the head is returned as it was."""
    head = existing(head, name)
    if not 1 <= version <= head.latest:
        raise JobTypeLabelError(f"{name} has no version {version} (latest v{head.latest})")
    if canary_percent is None:
        if version == head.production and head.canary is None:
            return head
        previous = head.previous if version == head.production else (*head.previous, head.production)[-MAX_PREVIOUS:]
        event = LabelEvent(at=now_ms, action=LabelAction.PROMOTE, version=version, by=by)
        return recorded(head, event, production=version, canary=None, previous=previous)
    if not 1 <= canary_percent <= 99:
        raise JobTypeLabelError(f"{name}: a canary serves 1 to 99 percent of users, not {canary_percent}")
    if version == head.production:
        raise JobTypeLabelError(f"{name}: v{version} is production already; a canary serves another version")
    if guard is not None and (guard.min_jobs < 1 or guard.max_regression < 0):
        raise JobTypeLabelError(f"{name}: a guard needs min_jobs >= 1 and max_regression >= 0")
    started_at = now_ms
    if head.canary is not None and head.canary.version == version:
        # A canary is known by (version, started_at): a new one of the same version must not be taken
        # for the one it replaces by a tally still in flight.
        started_at = max(now_ms, head.canary.started_at + 1)
    canary = Canary(version=version, percent=canary_percent, started_at=started_at, guard=guard)
    reason = f"{canary_percent}% of users" + (", guarded" if guard is not None else "")
    event = LabelEvent(at=now_ms, action=LabelAction.CANARY, version=version, reason=reason, by=by)
    return recorded(head, event, canary=canary)


def rolled_back(
    head: JobTypeHead | None, name: str, now_ms: int, by: str | None = None, reason: str | None = None
) -> JobTypeHead:
    """The canary ended when there is one (the event names its version), else production moved back
    to the version before it (the event names the version production now is)."""
    head = existing(head, name)
    if reason is not None and (len(reason) > MAX_REASON_CHARS or not reason.isprintable()):
        unprintable = "" if reason.isprintable() else ", with a line break or a control character"
        raise JobTypeLabelError(
            f"{name}: a rollback's reason is one line of at most {MAX_REASON_CHARS} printable characters "
            f"(this one has {len(reason)}{unprintable})"
        )
    if head.canary is not None:
        event = LabelEvent(at=now_ms, action=LabelAction.ROLLBACK, version=head.canary.version, reason=reason, by=by)
        return recorded(head, event, canary=None)
    if not head.previous:
        raise JobTypeLabelError(f"{name}: production v{head.production} has no version before it")
    version = head.previous[-1]
    event = LabelEvent(at=now_ms, action=LabelAction.ROLLBACK, version=version, reason=reason, by=by)
    return recorded(head, event, production=version, previous=head.previous[:-1])


def guard_ended(head: JobTypeHead | None, canary: tuple[int, int], now_ms: int, reason: str) -> JobTypeHead | None:
    """The head with the canary `(version, started_at)` ended by its guard; None when that canary is
    no longer the head's."""
    if head is None or head.canary is None or (head.canary.version, head.canary.started_at) != canary:
        return None
    event = LabelEvent(at=now_ms, action=LabelAction.GUARD_ROLLBACK, version=canary[0], reason=reason)
    return recorded(head, event, canary=None)


def tallied(head: JobTypeHead | None, canary: tuple[int, int], counts: tuple[int, int, int, int]) -> JobTypeHead | None:
    """The head with `counts` (canary jobs, canary invalid, production jobs, production invalid) added
    to the canary `(version, started_at)`; None when that canary is no longer the head's. No event:
    a tally is not a label move (but it bumps the revision, so that no move overwrites it)."""
    if head is None or head.canary is None or (head.canary.version, head.canary.started_at) != canary:
        return None
    current = head.canary
    counted = replace(
        current,
        canary_jobs=current.canary_jobs + counts[0],
        canary_invalid=current.canary_invalid + counts[1],
        production_jobs=current.production_jobs + counts[2],
        production_invalid=current.production_invalid + counts[3],
    )
    return replace(head, canary=counted, revision=head.revision + 1)


def existing(head: JobTypeHead | None, name: str) -> JobTypeHead:
    if head is None:
        raise JobTypeLabelError(f"no job type named {name}")
    return head


def lost_race(name: str, tries: int) -> JobTypeLabelError:
    """A move whose every try met another write of the head."""
    return JobTypeLabelError(f"{name}: the labels changed under each of {tries} tries; try again")
