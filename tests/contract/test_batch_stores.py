"""The batch path's stores, in memory and on AWS (moto, the template's table and bucket): the same answers.

engine.testing's MemoryBatchRecords and MemoryObjects let the batcher's decisions be tested without
moto; these tests (on conftest.py's `records` and `objects`) hold them to
engine.store.batches.BatchTable (records: a create refused when the record exists, a save fenced on
the `updated_at` it was read with, listings oldest first) and to engine.store.payloads.PayloadStore
(objects: put, get, keys by prefix, delete; a missing key raises PayloadMissingError).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.batching.files import Objects
from engine.core.batches import BatchPhase, BatchRecord, BatchRecords, BatchState
from engine.core.errors import PayloadMissingError

NOW = 1_800_000_000_000
HOUR_MS = 3_600_000


def record(key: str = "1800000000000-gpt-4o-mini-a1", created_at: int = NOW, **changes: Any) -> BatchRecord:
    made = BatchRecord(
        key=key,
        model="gpt-4o-mini",
        provider="openai",
        lines=3,
        phase=BatchPhase.CREATING,
        created_at=created_at,
        updated_at=created_at,
        rescue_at=created_at + 20 * HOUR_MS,
        abandon_at=created_at + 22 * HOUR_MS,
    )
    return replace(made, **changes)


# ---------------------------------------------------------------- records


def test_a_created_record_reads_back_as_written(records: BatchRecords) -> None:
    assert records.create(record())

    assert records.get(record().key) == record()
    assert records.get("no-such-batch") is None


def test_a_create_is_refused_when_the_record_exists(records: BatchRecords) -> None:
    records.create(record())

    assert records.create(record(phase=BatchPhase.PENDING, batch_id="batch_1")) is False
    assert records.get(record().key) == record()


def test_a_save_replaces_the_record_it_was_read_as(records: BatchRecords) -> None:
    read = record()
    records.create(read)
    pending = replace(read, phase=BatchPhase.PENDING, batch_id="batch_1", updated_at=NOW + 1, state=BatchState.PENDING)

    assert records.save(pending, read)
    assert records.get(read.key) == pending


def test_a_save_is_fenced_on_the_updated_at_it_was_read_with(records: BatchRecords) -> None:
    # Given a record another pass saved since this one read it
    read = record()
    records.create(read)
    records.save(replace(read, updated_at=NOW + 1, detail="another pass"), read)

    # When this pass saves over the record it read
    stale = replace(read, updated_at=NOW + 2, phase=BatchPhase.CANCELLING)

    # Then the save is refused and the other pass's record stands
    assert records.save(stale, read) is False
    assert records.get(read.key) == replace(read, updated_at=NOW + 1, detail="another pass")


def test_a_save_of_a_record_never_created_is_refused(records: BatchRecords) -> None:
    assert records.save(replace(record(), updated_at=NOW + 1), record()) is False
    assert records.get(record().key) is None


def test_the_listing_is_oldest_first_in_flight_or_all(records: BatchRecords) -> None:
    # Given records created in another order than their ages, one of them ended
    newest = record("c-newest", NOW + 2)
    oldest = record("b-oldest", NOW)
    same_age = record("a-same-age", NOW)
    ended = record("d-ended", NOW + 1)
    for made in (newest, oldest, same_age, ended):
        records.create(made)
    done = replace(ended, phase=BatchPhase.ENDED, updated_at=NOW + 5, ended_at=NOW + 5)
    records.save(done, ended)

    # Then in flight: oldest first, the key breaking ties; all: the ended one in its place
    assert records.listed() == [same_age, oldest, newest]
    assert records.listed(in_flight_only=False) == [same_age, oldest, done, newest]


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=40)
counts = st.integers(min_value=0, max_value=50_000)
times = st.integers(min_value=NOW, max_value=NOW + 30 * 24 * HOUR_MS)
records_written = st.builds(
    BatchRecord,
    key=st.just(""),
    model=names.filter(bool),
    provider=st.sampled_from(["openai", "bedrock"]),
    lines=counts,
    phase=st.sampled_from(BatchPhase),
    created_at=times,
    updated_at=times,
    rescue_at=times,
    abandon_at=times,
    next_poll_at=times,
    batch_id=st.none() | names.filter(bool),
    state=st.none() | st.sampled_from(BatchState),
    detail=names,
    answered=counts,
    failed=counts,
    cancel_sent=st.booleans(),
    handed_back_through=times,
    handed_back=st.booleans(),
    unanswerable=st.booleans(),
    concluded=counts,
    redo=st.lists(names.filter(bool), max_size=4).map(tuple),
    finished=counts,
    returned=counts,
    discarded=counts,
    ended_at=st.none() | times,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(written=records_written)
def test_any_record_reads_back_as_written(records: BatchRecords, written: BatchRecord) -> None:
    written = replace(written, key=uuid.uuid4().hex)

    assert records.create(written)
    assert records.get(written.key) == written
    assert written in records.listed(in_flight_only=False)


# ---------------------------------------------------------------- objects


def test_an_object_reads_back_as_put_and_is_replaced_by_the_next_put(objects: Objects) -> None:
    objects.put("batches/parts/w/m/1.json", b'{"entries": []}')
    assert objects.get("batches/parts/w/m/1.json") == b'{"entries": []}'

    objects.put("batches/parts/w/m/1.json", b"{}")
    assert objects.get("batches/parts/w/m/1.json") == b"{}"


def test_a_missing_object_raises_payload_missing(objects: Objects) -> None:
    with pytest.raises(PayloadMissingError, match=r"batches/manifests/gone\.json"):
        objects.get("batches/manifests/gone.json")


def test_keys_are_those_under_the_prefix_in_key_order(objects: Objects) -> None:
    for key in ("batches/parts/w2/m/2.json", "batches/parts/w1/m/1.json", "batches/manifests/k.json", "inputs/j"):
        objects.put(key, b"x")

    assert objects.keys("batches/parts/") == ["batches/parts/w1/m/1.json", "batches/parts/w2/m/2.json"]
    assert objects.keys("batches/") == [
        "batches/manifests/k.json",
        "batches/parts/w1/m/1.json",
        "batches/parts/w2/m/2.json",
    ]
    assert objects.keys("batches/unreadable/") == []


def test_a_delete_removes_the_keys_asked_and_ignores_absent_ones(objects: Objects) -> None:
    for key in ("batches/parts/w/m/1.json", "batches/parts/w/m/2.json", "batches/parts/w/m/3.json"):
        objects.put(key, b"x")

    objects.delete(["batches/parts/w/m/1.json", "batches/parts/w/m/3.json", "batches/parts/w/m/never.json"])
    objects.delete([])

    assert objects.keys("batches/parts/") == ["batches/parts/w/m/2.json"]
    with pytest.raises(PayloadMissingError):
        objects.get("batches/parts/w/m/1.json")
