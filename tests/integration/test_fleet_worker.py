"""The worker with shared limits and budgets on (moto): a batch claimed, admitted together, run at
the times its model's limit gives, and settled; jobs without capacity or budget wait, queued,
with no provider call and no attempt spent."""

from __future__ import annotations

import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from aijobs.stack import StackResources
from engine.aws_errors import is_transient
from engine.core import ErrorCode, JobStatus
from engine.core.days import utc_day
from engine.core.errors import ProviderRateLimitedError
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobRegistry
from engine.fleet.admission import BUDGET_RECHECK_MS, Admission
from engine.fleet.budgets import Budgets
from engine.fleet.limiter import RateLimiter
from engine.fleet.limits import ModelLimit
from engine.gateway import CompletionRequest, ModelGateway, ModelTiers
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.budgets import BudgetTable
from engine.store.items import budget_day_key
from engine.store.limits import LimitTable, bucket_from_item, limit_key
from engine.worker import Worker
from handlers.worker import WorkerHandler
from tests.conftest import RequestCounter
from tests.integration.conftest import ACKNOWLEDGED, MODEL, RecordingQueue, TableReader
from tests.support.events import InvocationContext, job_message, sqs_event, sqs_record
from tests.support.providers import FakeProvider, valid_answer

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


class FakeTime:
    """One clock for the worker, its admission and its waits: sleeping moves it on."""

    def __init__(self) -> None:
        self.now = T0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        # Records sleep side by side: each until its own time, the clock at the latest of them.
        start = self.now
        self.slept.append(seconds)
        self.now = max(self.now, start + seconds)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


FleetWorker = Callable[..., WorkerHandler]


@pytest.fixture
def fleet_worker(
    stack: StackResources,
    dynamodb: Any,
    store: DynamoJobStore,
    provider: FakeProvider,
    registry: JobRegistry,
    queue: RecordingQueue,
    fake_time: FakeTime,
) -> FleetWorker:
    """A worker whose admission has `limits` (model -> ModelLimit) and a default daily `budget`, as
    engine.wiring builds it: budgets are always there, for the caps users were given."""

    def build(
        limits: dict[str, ModelLimit] | None = None,
        budget: str | None = None,
        concurrency: int = 10,
        fallback: str | None = None,
    ) -> WorkerHandler:
        gateway = ModelGateway(provider, ModelTiers(MODEL, fallback))
        recorder = DeadLetterRecorder(store, registry, clock=fake_time)
        runner = JobRunner(
            store,
            gateway,
            registry,
            recorder,
            clock=fake_time,
            rng=random.Random(7),
            is_transient=is_transient,
            sleep=fake_time.sleep,
        )
        limiter = RateLimiter(LimitTable(stack.table_name, dynamodb), limits, random.Random(1)) if limits else None
        budgets = Budgets(BudgetTable(stack.table_name, dynamodb), Decimal(budget) if budget else None)
        admission = Admission(limiter, budgets, clock=fake_time, sleep=fake_time.sleep)
        return WorkerHandler(Worker(runner, concurrency, admission=admission, planner=gateway.plan), queue)

    return build


def batch(*job_ids: str, user: str = "acme", **overrides: Any) -> dict[str, Any]:
    return sqs_event(*(sqs_record(job_message("classify", job_id, user_id=user, **overrides)) for job_id in job_ids))


def call_times(provider: FakeProvider, fake_time: FakeTime) -> Callable[[], list[float]]:
    """Make the provider note when (on the fake clock) each call was made."""
    times: list[float] = []

    def answer(request: CompletionRequest) -> Any:
        times.append(fake_time.now - T0)
        return valid_answer(request)

    provider.script = answer
    return lambda: sorted(times)


# --- limits ---------------------------------------------------------------------------------------


def test_a_batch_under_a_shared_limit_calls_at_its_rate_after_one_take(
    fleet_worker: FleetWorker,
    provider: FakeProvider,
    fake_time: FakeTime,
    dynamodb_requests: RequestCounter,
    table: TableReader,
) -> None:
    # Given a model limited to 600 requests a minute (one per 100 ms)
    worker = fleet_worker({MODEL: ModelLimit(rpm=600)})
    times = call_times(provider, fake_time)

    # When a batch of ten jobs runs
    assert worker.handle(batch(*(f"rate-{n}" for n in range(10))), InvocationContext()) == ACKNOWLEDGED

    # Then all succeed; the first calls at once, the rest 100 ms apart, each after its own wait
    assert {table.job(f"rate-{n}").status for n in range(10)} == {JobStatus.SUCCEEDED}
    assert times() == pytest.approx([0.1 * n for n in range(10)], abs=0.002)
    # And the limit cost the batch one take (a new bucket: a refused add, then its first write), and
    # the budgets one read of whether anyone has a cap (once a minute)
    assert dynamodb_requests.operations == {"UpdateItem": 10 + 2, "TransactWriteItems": 10, "GetItem": 1}


def test_jobs_that_cannot_call_within_the_invocation_make_no_call_spend_no_attempt_and_wait_until_capacity(
    fleet_worker: FleetWorker, provider: FakeProvider, queue: RecordingQueue, table: TableReader, fake_time: FakeTime
) -> None:
    # Given a model limited to 3 requests a minute (one call every 20 s), and an invocation of 100 s:
    # a classify job (60 s timeout, 5 s to finish) must call within 35 s
    worker = fleet_worker({MODEL: ModelLimit(rpm=3)})

    # When a batch of four jobs is handled
    response = worker.handle(
        batch("slow-0", "slow-1", "slow-2", "slow-3"), InvocationContext(timeout_seconds=100, clock=fake_time)
    )

    # Then the two that could call in time ran, 20 s apart, and two were handed back for when capacity
    # is expected: queued, attempt refunded
    assert provider.calls == 2
    assert len(response["batchItemFailures"]) == 2
    for job_id in ("slow-2", "slow-3"):
        job = table.job(job_id)
        assert (job.status, job.attempt_count, job.usage.attempts) == (JobStatus.QUEUED, 0, 0)
        assert job.error is not None
        assert (job.error.code, job.error.retryable) == (ErrorCode.PROVIDER_RATE_LIMITED, True)
        assert job.error.message.startswith("waiting: gpt-4o-mini is at its shared rate limit")
    # And they wait until a take could include them (calls at 40 and 60 s, taken 35 s ahead), 20 s
    # apart as the rate spaces them: their messages hidden until then (the clock is at 20 s by now)
    waits = [table.job(job_id).error for job_id in ("slow-2", "slow-3")]
    assert [wait.message.rsplit("; ", 1)[-1] for wait in waits if wait] == [
        "next try in about 5s",
        "next try in about 25s",
    ]
    assert fake_time.now == T0 + 20
    assert sorted(seconds for _, seconds in queue.visibility_changes) == [1, 5]


def test_a_429_lowers_the_models_shared_rate_for_every_worker(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader
) -> None:
    worker = fleet_worker({MODEL: ModelLimit(rpm=600)})
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=2)

    worker.handle(batch("limited-0"), InvocationContext())

    item = table.client.get_item(TableName=table.table_name, Key=limit_key(MODEL, 0), ConsistentRead=True)["Item"]
    assert bucket_from_item(item).factor == pytest.approx(0.7)
    job = table.job("limited-0")
    assert (job.status, job.attempt_count) == (JobStatus.QUEUED, 0)


def test_a_429_mid_batch_makes_the_batchs_later_calls_wait_in_the_worker_for_capacity_taken_again(
    fleet_worker: FleetWorker,
    provider: FakeProvider,
    queue: RecordingQueue,
    table: TableReader,
    fake_time: FakeTime,
    dynamodb_requests: RequestCounter,
) -> None:
    # Given a batch of six run one after the other, whose third call meets a 429 (retry after 3 s)
    worker = fleet_worker({MODEL: ModelLimit(rpm=600)}, concurrency=1)
    answers = iter([None, None, ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=3)])
    times: list[float] = []

    def answer(request: CompletionRequest) -> Any:
        times.append(round(fake_time.now - T0, 3))
        return next(answers, None) or valid_answer(request)

    provider.script = answer

    worker.handle(batch(*(f"pause-{n}" for n in range(6))), InvocationContext())

    # Then the job that met it waits on the queue for the pause the provider asked
    job = table.job("pause-2")
    assert (job.status, job.attempt_count) == (JobStatus.QUEUED, 0)
    assert [seconds for _, seconds in queue.visibility_changes] == [3]
    # And the three later jobs did not call at the times taken before it: they waited in the worker
    # until the pause was over, took capacity again together at the lowered rate (x0.7, climbed back
    # 0.5 %/s for the 3 s of the pause), and succeeded, with no claim or release beyond their first
    spacing = 0.1 / (0.7 + 3 * 0.005)
    assert times == pytest.approx([0.0, 0.1, 0.2, 3.2, 3.2 + spacing, 3.2 + 2 * spacing], abs=0.002)
    assert [table.job(f"pause-{n}").status for n in (0, 1, 3, 4, 5)] == [JobStatus.SUCCEEDED] * 5
    # (six claims, the take and the take again: each an add refused by a new or idle bucket, then its
    # exact write, and the lowering; five finishes and the release)
    assert dynamodb_requests.operations == {"UpdateItem": 6 + 2 + 2 + 1, "TransactWriteItems": 6, "GetItem": 1}
    # And the shared rate was lowered once
    item = table.client.get_item(TableName=table.table_name, Key=limit_key(MODEL, 0), ConsistentRead=True)["Item"]
    assert bucket_from_item(item).factor == pytest.approx(0.7)


# --- budgets --------------------------------------------------------------------------------------


def test_a_user_without_budget_left_waits_queued_with_the_reason_and_no_call(
    fleet_worker: FleetWorker, provider: FakeProvider, queue: RecordingQueue, table: TableReader
) -> None:
    # Given a daily budget that holds the worst case of two classify jobs, not three
    worker = fleet_worker(budget="0.0016")

    # When a batch of three jobs of that user is handled
    worker.handle(batch("b-0", "b-1", "b-2"), InvocationContext())

    # Then two ran, and the third waits: queued, attempt refunded, its view saying why
    assert provider.calls == 2
    waiting = table.job("b-2")
    assert (waiting.status, waiting.attempt_count) == (JobStatus.QUEUED, 0)
    assert waiting.error is not None
    assert (waiting.error.code, waiting.error.retryable) == (ErrorCode.BUDGET_EXCEEDED, True)
    assert waiting.error.message == "waiting: user acme has spent or reserved its daily budget of $0.0016"
    assert [seconds for _, seconds in queue.visibility_changes] == [BUDGET_RECHECK_MS // 1000]
    # And the day holds exactly what the two calls cost, the reservations given back
    day = table.item(budget_day_key("acme", utc_day(int(T0 * 1000))))
    assert day is not None
    spent = table.job("b-0").usage.cost_usd + table.job("b-1").usage.cost_usd
    assert (Decimal(day["spent"]), Decimal(day["headroom"])) == (spent, Decimal("0.0016") - spent)


def test_a_job_held_for_capacity_holds_none_of_its_users_budget(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader, fake_time: FakeTime
) -> None:
    # Given a budget of one classify job's worst case, a limit of one call every 20 s, and an
    # invocation in which a classify job must call within 10 s
    worker = fleet_worker({MODEL: ModelLimit(rpm=3)}, budget="0.0009")

    worker.handle(batch("cap-0", "cap-1"), InvocationContext(timeout_seconds=75, clock=fake_time))

    # Then the second job waits for capacity, not for a budget it never reserved
    assert provider.calls == 1
    waiting = table.job("cap-1")
    assert waiting.error is not None
    assert (waiting.status, waiting.error.code) == (JobStatus.QUEUED, ErrorCode.PROVIDER_RATE_LIMITED)
    day = table.item(budget_day_key("acme", utc_day(int(T0 * 1000))))
    assert day is not None
    assert Decimal(day["headroom"]) == Decimal("0.0009") - table.job("cap-0").usage.cost_usd


def test_a_job_queued_again_gives_its_reservation_back_before_its_message_can_return(
    fleet_worker: FleetWorker,
    provider: FakeProvider,
    queue: RecordingQueue,
    table: TableReader,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a budget of one job's worst case, and a provider that answers 429 (retry after 1 s)
    worker = fleet_worker(budget="0.0009")
    provider.script = lambda _: ProviderRateLimitedError("provider rate limit (HTTP 429)", retry_after_seconds=1)
    headroom_when_hidden: list[Decimal] = []
    hide = queue.change_visibility

    def noting_the_budget(receipt_handle: str, seconds: int) -> None:
        day = table.item(budget_day_key("acme", utc_day(int(T0 * 1000))))
        assert day is not None
        headroom_when_hidden.append(Decimal(day["headroom"]))
        hide(receipt_handle, seconds)

    monkeypatch.setattr(queue, "change_visibility", noting_the_budget)

    # When its job is handled and meets the 429
    worker.handle(batch("again-0"), InvocationContext())

    # Then, by the time its message was hidden for a second, the whole budget was free again
    assert headroom_when_hidden == [Decimal("0.0009")]
    assert table.job("again-0").status is JobStatus.QUEUED


def test_a_job_whose_deadline_comes_before_the_budget_fails_with_budget_exceeded(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader
) -> None:
    worker = fleet_worker(budget="0")

    assert worker.handle(batch("late-budget", deadline_seconds=600), InvocationContext()) == ACKNOWLEDGED

    job = table.job("late-budget")
    assert provider.calls == 0
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == (ErrorCode.BUDGET_EXCEEDED, False)


def test_users_are_budgeted_apart(fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader) -> None:
    worker = fleet_worker(budget="0.0009")  # one classify job's worst case each
    event = sqs_event(*batch("u-a0", "u-a1", user="acme")["Records"], *batch("u-g0", user="globex")["Records"])

    worker.handle(event, InvocationContext())

    assert provider.calls == 2
    assert [table.job(job_id).status for job_id in ("u-a0", "u-a1", "u-g0")] == [
        JobStatus.SUCCEEDED,
        JobStatus.QUEUED,
        JobStatus.SUCCEEDED,
    ]


def test_a_cap_someone_set_holds_without_a_default_budget(
    fleet_worker: FleetWorker, provider: FakeProvider, stack: StackResources, dynamodb: Any, table: TableReader
) -> None:
    # Given no default budget, and a user given a cap of one classify job's worst case
    worker = fleet_worker()
    BudgetTable(stack.table_name, dynamodb).set_cap("acme", Decimal("0.0009"), int(T0 * 1000))

    # When three of that user's jobs and one of another user's are handled
    event = sqs_event(*batch("own-0", "own-1", "own-2")["Records"], *batch("free-0", user="globex")["Records"])
    worker.handle(event, InvocationContext())

    # Then the capped user's first job ran and the others wait for the budget; the other user ran
    assert provider.calls == 2
    statuses = [table.job(job_id).status for job_id in ("own-0", "own-1", "own-2", "free-0")]
    assert statuses == [JobStatus.SUCCEEDED, JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.SUCCEEDED]
    waiting = table.job("own-2").error
    assert waiting is not None
    assert waiting.code is ErrorCode.BUDGET_EXCEEDED


def test_with_no_cap_anywhere_jobs_cost_two_requests_and_the_marker_is_read_once_a_minute(
    fleet_worker: FleetWorker, fake_time: FakeTime, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    # Given no limits, no default budget and no cap set
    worker = fleet_worker()

    # When two batches run within a minute, and a third a minute later
    worker.handle(batch("free-0", "free-1"), InvocationContext())
    first = dict(dynamodb_requests.operations)
    dynamodb_requests.reset()
    fake_time.now += 30
    worker.handle(batch("free-2", "free-3"), InvocationContext())
    second = dict(dynamodb_requests.operations)
    dynamodb_requests.reset()
    fake_time.now += 31
    worker.handle(batch("free-4"), InvocationContext())

    # Then each job cost its claim and its finish, and whether anyone is capped was read once a minute
    assert {table.job(f"free-{n}").status for n in range(5)} == {JobStatus.SUCCEEDED}
    assert first == {"GetItem": 1, "UpdateItem": 2, "TransactWriteItems": 2}
    assert second == {"UpdateItem": 2, "TransactWriteItems": 2}
    assert dynamodb_requests.operations == {"GetItem": 1, "UpdateItem": 1, "TransactWriteItems": 1}


def test_a_capped_users_job_on_a_model_without_a_price_waits_with_the_reason(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader
) -> None:
    # Given a default budget, and a fallback model no price table knows
    worker = fleet_worker(budget="1", fallback="my-fine-tune")

    worker.handle(batch("unpriced-0"), InvocationContext())

    # Then it makes no call: what it would cost is unknown, so no budget can hold it
    assert provider.calls == 0
    job = table.job("unpriced-0")
    assert job.status is JobStatus.QUEUED
    assert job.error is not None
    assert job.error.code is ErrorCode.BUDGET_EXCEEDED
    assert job.error.message == (
        "waiting: my-fine-tune has no price (AIJOBS_PRICES), so user acme's budget cannot be kept"
    )


# --- both, and what they cost ---------------------------------------------------------------------


def test_with_limits_and_budgets_a_warm_batch_of_ten_costs_at_most_2_3_requests_a_job(
    fleet_worker: FleetWorker, provider: FakeProvider, dynamodb_requests: RequestCounter, table: TableReader
) -> None:
    worker = fleet_worker({MODEL: ModelLimit(rpm=6_000)}, budget="10")
    worker.handle(batch(*(f"warm-{n}" for n in range(10))), InvocationContext())  # the bucket and the caps
    dynamodb_requests.reset()

    worker.handle(batch(*(f"cost-{n}" for n in range(10))), InvocationContext())

    assert {table.job(f"cost-{n}").status for n in range(10)} == {JobStatus.SUCCEEDED}
    # 10 claims, one take, one reservation; 10 finishes, one settlement (a transaction: idempotent)
    assert dynamodb_requests.operations == {"UpdateItem": 12, "TransactWriteItems": 11}
    assert dynamodb_requests.total / 10 <= 2.3


def test_when_admission_cannot_reach_the_table_the_batch_waits_and_nothing_runs(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = fleet_worker({MODEL: ModelLimit(rpm=600)})

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the table is unavailable")

    monkeypatch.setattr(LimitTable, "add", unavailable)
    monkeypatch.setattr(LimitTable, "replace", unavailable)

    response = worker.handle(batch("down-0", "down-1"), InvocationContext())

    assert provider.calls == 0
    assert len(response["batchItemFailures"]) == 2
    assert {table.job(job_id).attempt_count for job_id in ("down-0", "down-1")} == {0}


def test_a_job_that_cannot_be_planned_runs_unadmitted_and_the_batch_goes_on(
    fleet_worker: FleetWorker, provider: FakeProvider, table: TableReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = fleet_worker({MODEL: ModelLimit(rpm=600)})
    planned = ModelGateway.plan

    def plan(self: ModelGateway, definition: Any, job_input: Any) -> Any:
        if "unplannable" in str(job_input):
            raise RuntimeError("the job type's own code failed")
        return planned(self, definition, job_input)

    monkeypatch.setattr(ModelGateway, "plan", plan)

    response = worker.handle(
        sqs_event(
            sqs_record(job_message("classify", "plan-ok")),
            sqs_record(job_message("classify", "plan-bad", input={"text": "unplannable", "labels": ["a", "b"]})),
        ),
        InvocationContext(),
    )

    # Then neither waits for a lease to expire: both ran, unadmitted or not, and ended
    assert response == ACKNOWLEDGED
    assert table.job("plan-ok").status is JobStatus.SUCCEEDED
    assert table.job("plan-bad").status.is_terminal
