"""Budgets in the jobs table: users' caps of their own, and one item per user and UTC day.

- `pk = BUDGETS, sk = USER#<user>`: a cap of the user's own (`daily_usd`), written by `aijobs budget
  set`; one partition, read with BatchGetItem (and Query to list them).
- `pk = BUDGETS, sk = MARKER`: written by `aijobs budget set` before the first cap; while it is
  absent, workers with no default cap know that no one is capped from one GetItem a minute.
- `pk = BUDGET#<user>, sk = DAY#<YYYY-MM-DD>`: `cap` (as the day began, or as last set), `headroom`
  (the cap less what is reserved or spent) and `spent`; created by the day's first reservation,
  removed by TTL after the retention period.
docs/fleet.md gives every write and its condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from engine.core.days import utc_day
from engine.fleet.budgets import BudgetDay
from engine.store.expressions import Expression
from engine.store.items import Item, budget_day_key, from_item, to_item
from engine.store.retries import BATCH_GET_KEYS, Backoff, batch_get, transact
from engine.store.table import DAY_MS, conditional_update, default_client, is_condition_failure

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

CAPS_PK = "BUDGETS"
CAP_PREFIX = "USER#"
MARKER_KEY = {"pk": {"S": CAPS_PK}, "sk": {"S": "MARKER"}}


def cap_key(user_id: str) -> Item:
    return {"pk": {"S": CAPS_PK}, "sk": {"S": f"{CAP_PREFIX}{user_id}"}}


class BudgetTable:
    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        retention_days: int = 90,
        backoff: Backoff | None = None,
    ) -> None:
        self.table_name = table_name
        self._client = client or default_client()
        self._retention_ms = retention_days * DAY_MS
        self._backoff = backoff or Backoff()

    # --- the worker's side ---------------------------------------------------------------------

    def caps(self, user_ids: Sequence[str]) -> dict[str, Decimal]:
        items = self._batch_get([cap_key(user) for user in user_ids])
        return {item["user_id"]: Decimal(item["daily_usd"]) for item in items}

    def any_caps(self) -> bool:
        response = self._client.get_item(TableName=self.table_name, Key=MARKER_KEY, ConsistentRead=True)
        return "Item" in response

    def reserve(
        self, user_id: str, day: str, amount: Decimal, cap: Decimal, now_ms: int, keep: Decimal = Decimal(0)
    ) -> tuple[bool, Decimal]:
        expr = Expression()
        headroom = expr.name("headroom")
        expr.subtract("headroom", amount, start=cap)
        expr.set_if_absent("cap", cap)
        expr.set_if_absent("spent", Decimal(0))
        expr.set("user_id", user_id)
        expr.set("day", day)
        expr.set("expires_at", (now_ms + DAY_MS + self._retention_ms) // 1000)
        # A new day begins at the cap: the caller has checked that cap - amount leaves `keep`.
        enough = expr.value("enough", amount + keep)
        expr.condition = f"attribute_not_exists({headroom}) OR {headroom} >= {enough}"
        written, item = conditional_update(
            self._client, self.table_name, budget_day_key(user_id, day), expr, "UPDATED_NEW"
        )
        return written, Decimal(from_item(item or {}).get("headroom", cap))

    def settle(self, user_id: str, day: str, returned: Decimal, spent: Decimal) -> None:
        """Give back and count, once: an ADD is not idempotent, so it goes as a one-item transaction
        whose token makes an SDK retry of a write that did land (its answer lost) a no-op."""
        expr = Expression()
        expr.add("headroom", returned)
        expr.add("spent", spent)
        expr.condition = f"attribute_exists({expr.name('pk')})"
        update: Any = expr.update_params(self.table_name, budget_day_key(user_id, day))
        transact(self._client, [{"Update": update}], self._backoff, token=True)

    # --- administration (aijobs budget) --------------------------------------------------------

    def set_cap(self, user_id: str, daily_usd: Decimal, now_ms: int) -> None:
        """Give a user a cap of their own; today's headroom moves by the change (what was reserved or
        spent stays counted). The marker goes first: a cap is never there without it."""
        self._client.put_item(TableName=self.table_name, Item=MARKER_KEY | {"updated_at": {"N": str(now_ms)}})
        self._client.put_item(
            TableName=self.table_name,
            Item=cap_key(user_id)
            | {"user_id": {"S": user_id}, "daily_usd": {"N": str(daily_usd)}, "updated_at": {"N": str(now_ms)}},
        )
        day = utc_day(now_ms)
        for _ in range(5):
            current = self._day_item(user_id, day)
            if current is None:
                # Begin the day at the new cap now: a worker still holding the old cap (cached up to a
                # minute) would otherwise begin it at that one.
                if self._begin_day(user_id, day, daily_usd, now_ms):
                    return
                continue  # a worker began it meanwhile: move its headroom instead
            old_cap = Decimal(current["cap"])
            expr = Expression()
            expr.set("cap", daily_usd)
            expr.add("headroom", daily_usd - old_cap)
            expr.condition = f"{expr.name('cap')} = {expr.value('old_cap', old_cap)}"
            try:
                self._client.update_item(**expr.update_params(self.table_name, budget_day_key(user_id, day)))
            except ClientError as exc:
                if not is_condition_failure(exc):
                    raise
                continue  # a worker began the day, or the cap was set again, meanwhile
            return
        raise RuntimeError(f"the budget of {user_id} kept changing; set it again")

    def _begin_day(self, user_id: str, day: str, cap: Decimal, now_ms: int) -> bool:
        item = to_item(
            {
                "user_id": user_id,
                "day": day,
                "cap": cap,
                "headroom": cap,
                "spent": Decimal(0),
                "expires_at": (now_ms + DAY_MS + self._retention_ms) // 1000,
            }
        )
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=budget_day_key(user_id, day) | item,
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise
            return False
        return True

    def own_caps(self) -> dict[str, Decimal]:
        """Every cap of a user's own."""
        caps: dict[str, Decimal] = {}
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :caps)",
            ExpressionAttributeValues={":pk": {"S": CAPS_PK}, ":caps": {"S": CAP_PREFIX}},
            ConsistentRead=True,
        )
        for page in pages:
            for item in page.get("Items", []):
                data = from_item(item)
                caps[data["user_id"]] = Decimal(data["daily_usd"])
        return caps

    def day(self, user_id: str, cap: Decimal, now_ms: int) -> BudgetDay:
        """A user's today: with no reservation yet, all of the cap is left."""
        day = utc_day(now_ms)
        return _budget_day(user_id, day, cap, self._day_item(user_id, day))

    def days(self, caps: Mapping[str, Decimal], now_ms: int) -> list[BudgetDay]:
        """Today of each user at their cap, in the order given: BatchGetItem, 100 users a request."""
        day = utc_day(now_ms)
        items = {item["user_id"]: item for item in self._batch_get([budget_day_key(user, day) for user in caps])}
        return [_budget_day(user, day, cap, items.get(user)) for user, cap in caps.items()]

    def _batch_get(self, keys: Sequence[Item]) -> list[dict[str, Any]]:
        """The items of `keys` that exist (strongly consistent reads), 100 keys a request."""
        found: list[dict[str, Any]] = []
        for start in range(0, len(keys), BATCH_GET_KEYS):
            batch = list(keys[start : start + BATCH_GET_KEYS])
            found.extend(
                from_item(item) for item in batch_get(self._client, self.table_name, batch, True, self._backoff)
            )
        return found

    def _day_item(self, user_id: str, day: str) -> dict[str, Any] | None:
        response = self._client.get_item(
            TableName=self.table_name, Key=budget_day_key(user_id, day), ConsistentRead=True
        )
        item = response.get("Item")
        return from_item(item) if item else None


def _budget_day(user_id: str, day: str, cap: Decimal, item: dict[str, Any] | None) -> BudgetDay:
    """A user's day from its item; with no reservation yet (no item), all of the cap is left."""
    if item is None:
        return BudgetDay(user_id, day, cap, Decimal(0), Decimal(0), cap)
    day_cap, headroom, spent = Decimal(item["cap"]), Decimal(item["headroom"]), Decimal(item.get("spent", 0))
    return BudgetDay(user_id, day, day_cap, spent, day_cap - headroom - spent, max(headroom, Decimal(0)))
