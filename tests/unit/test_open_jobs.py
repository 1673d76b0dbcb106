"""Walks over the open jobs (engine.core.open_jobs) on the in-memory store, one segment: each saved walk
goes on where the last one stopped, wraps around at the end, and never hands a job out twice."""

from __future__ import annotations

from itertools import islice

from engine.core import NewJob
from engine.testing import InMemoryJobStore

NOW = 1_800_000_000_000


def store_of(count: int) -> InMemoryJobStore:
    """`count` open jobs j0, j1, ... whose deadlines come in that order."""
    store = InMemoryJobStore()
    for index in range(count):
        new_job = NewJob("classify", "user-1", 1, 3, 3_600 + index, "hash")
        store.create_job(f"j{index}", new_job, {"text": "t", "labels": ["a", "b"]}, NOW)
    return store


def saved_walks(store: InMemoryJobStore, limit: int, walks: int) -> list[list[str]]:
    handed = []
    for _ in range(walks):
        walk = store.open_jobs(limit)
        handed.append([job.job_id for job in walk])
        walk.save()
    return handed


def test_each_saved_walk_goes_on_where_the_last_stopped_and_wraps_around_at_the_end() -> None:
    assert saved_walks(store_of(5), limit=2, walks=4) == [["j0", "j1"], ["j2", "j3"], ["j4", "j0"], ["j1", "j2"]]


def test_a_walk_that_wraps_around_stops_before_the_jobs_it_handed_out() -> None:
    # Five jobs, walks of four: the second walk reads j4, then j0..j2 from the start
    assert saved_walks(store_of(5), limit=4, walks=3) == [
        ["j0", "j1", "j2", "j3"],
        ["j4", "j0", "j1", "j2"],
        ["j3", "j4", "j0", "j1"],
    ]
    # Fewer jobs than a walk holds: every walk hands each out once
    assert saved_walks(store_of(3), limit=4, walks=2) == [["j0", "j1", "j2"]] * 2


def test_a_walk_stopped_early_goes_on_after_the_last_job_it_handed_out() -> None:
    store = store_of(5)
    walk = store.open_jobs(4)
    assert [job.job_id for job in islice(walk, 1)] == ["j0"]
    walk.save()

    assert saved_walks(store, limit=2, walks=1) == [["j1", "j2"]]


def test_a_job_that_ends_leaves_the_walk() -> None:
    store = store_of(4)
    assert saved_walks(store, limit=2, walks=1) == [["j0", "j1"]]
    store.request_cancel("j2", NOW + 1)

    assert saved_walks(store, limit=2, walks=2) == [["j3", "j0"], ["j1", "j3"]]
