"""What a test reads of the stack an `aijobs dev` process runs: its jobs once they have ended, and
their attempt records (the session, store and client are tests/e2e/conftest.py's fixtures)."""

from __future__ import annotations

from engine.core import AttemptRecord, Job
from engine.store import DynamoJobStore
from tests.support.dev_process import DevProcess
from tests.support.waiting import eventually


def ended(store: DynamoJobStore, ids: list[str], dev: DevProcess, timeout: float) -> dict[str, Job]:
    """The jobs once every one has ended; the process's log is printed when they do not in time."""

    def all_ended() -> dict[str, Job]:
        jobs = store.get_jobs(ids)
        return jobs if len(jobs) == len(ids) and all(job.status.is_terminal for job in jobs.values()) else {}

    try:
        return eventually(all_ended, timeout=timeout, what="every job ended")
    except BaseException:
        print(dev.log[-4000:])
        raise


def attempts(store: DynamoJobStore, ids: list[str]) -> list[AttemptRecord]:
    return [attempt for job_id in ids for attempt in store.attempts(job_id)]
