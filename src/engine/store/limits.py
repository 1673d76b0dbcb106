"""Rate-limit buckets in the jobs table: one small item per model and shard (`LIMIT#<model>#<shard>`).

Each write is one conditional UpdateItem whose refusal returns the bucket as it was (ALL_OLD), so
that a retry needs no read. The arithmetic is engine.fleet.limits'; docs/fleet.md gives the items.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from engine.fleet.limits import Bounds, BucketState
from engine.store.expressions import Expression
from engine.store.items import Item, from_item
from engine.store.table import conditional_update, default_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

LIMIT_SK = "LIMIT"
# An idle bucket's item is removed by TTL this long after its last take; a new one starts full.
IDLE_EXPIRY_SECONDS = 86_400


def limit_key(model: str, shard: int) -> Item:
    return {"pk": {"S": f"LIMIT#{model}#{shard}"}, "sk": {"S": LIMIT_SK}}


def bucket_from_item(item: Item) -> BucketState:
    data = from_item(item)
    return BucketState(
        request_at=int(data.get("request_at", 0)),
        token_at=int(data.get("token_at", 0)),
        factor=float(data.get("factor", 1)),
        factor_at=int(data.get("factor_at", 0)),
        interactive_request_at=int(data.get("interactive_request_at", 0)),
        interactive_token_at=int(data.get("interactive_token_at", 0)),
        background_at=int(data.get("background_at", 0)),
    )


def _lowered_at(expr: Expression, factor_at: int) -> str:
    """The condition that the bucket's rate was last lowered at `factor_at` (0: never)."""
    at = expr.name("factor_at")
    return f"{at} = {expr.value('seen_factor_at', factor_at)}" if factor_at else f"attribute_not_exists({at})"


class LimitTable:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client or default_client()

    def add(
        self,
        model: str,
        shard: int,
        request_ns: int,
        token_ns: int,
        bounds: Bounds,
        factor_at: int,
        now_ms: int,
        interactive: bool = False,
    ) -> tuple[bool, BucketState | None]:
        """Move a busy bucket's arrival times on: (True, the bucket after) when both lay within
        `bounds` and its rate was last lowered at `factor_at` (0: never), else (False, the bucket as
        it was, None when there is none). `interactive`: the interactive lane's arrival times lie
        within the bounds, and move on with the shared ones."""
        expr = self._touched(model, shard, now_ms)
        expr.add("request_at", request_ns)
        expr.add("token_at", token_ns)
        prefix = "interactive_" if interactive else ""
        if interactive:
            expr.add("interactive_request_at", request_ns)
            expr.add("interactive_token_at", token_ns)
        conditions = []
        for attribute, bound in ((f"{prefix}request_at", bounds.request), (f"{prefix}token_at", bounds.token)):
            if bound is not None:
                low, high = bound
                name = expr.name(attribute)
                conditions.append(
                    f"{name} BETWEEN {expr.value(attribute + '_low', low)} AND {expr.value(attribute + '_high', high)}"
                )
        conditions.append(_lowered_at(expr, factor_at))
        expr.condition = f"attribute_exists({expr.name('pk')}) AND " + " AND ".join(conditions)
        return self._update(expr, model, shard)

    def replace(
        self,
        model: str,
        shard: int,
        old: BucketState | None,
        request_at: int,
        token_at: int,
        now_ms: int,
        interactive: tuple[int, int] | None = None,
    ) -> tuple[bool, BucketState | None]:
        """Set a bucket's arrival times (and `interactive`, the interactive lane's), fenced on the shared
        ones and its rate being `old`'s (or on there being no bucket): any take changes the shared ones."""
        expr = self._touched(model, shard, now_ms)
        expr.set("request_at", request_at)
        expr.set("token_at", token_at)
        if interactive is not None:
            expr.set("interactive_request_at", interactive[0])
            expr.set("interactive_token_at", interactive[1])
        if old is None:
            expr.condition = f"attribute_not_exists({expr.name('pk')})"
        else:
            expr.condition = (
                f"{expr.name('request_at')} = {expr.value('old_request_at', old.request_at)}"
                f" AND {expr.name('token_at')} = {expr.value('old_token_at', old.token_at)}"
                f" AND {_lowered_at(expr, old.factor_at)}"
            )
        return self._update(expr, model, shard)

    def lower(
        self, model: str, shard: int, seen: BucketState, factor: float, now_ms: int
    ) -> tuple[bool, BucketState | None]:
        """Set the adaptive factor, fenced on it not having been lowered since `seen`: (True, the bucket
        after), or (False, the bucket as it was; None when there is none)."""
        expr = Expression()
        expr.set("factor", Decimal(str(round(factor, 6))))
        expr.set("factor_at", now_ms)
        expr.condition = f"attribute_exists({expr.name('pk')}) AND {_lowered_at(expr, seen.factor_at)}"
        return self._update(expr, model, shard)

    def line_up(self, model: str, shard: int, tokens: bool, cost_ns: int, now_ms: int) -> int:
        """Join the background line: ADD to its end while it runs ahead of the shared arrival time and
        of now (one write); else start it there, fenced on the end as it was (a second write)."""
        now_ns = now_ms * 1_000_000
        timeline = "token_at" if tokens else "request_at"
        expr = Expression()
        expr.add("background_at", cost_ns)
        line = expr.name("background_at")
        expr.condition = f"{line} >= {expr.name(timeline)} AND {line} >= {expr.value('now', now_ns)}"
        joined, item = conditional_update(self._client, self.table_name, limit_key(model, shard), expr)
        if joined and item is not None:
            return int(from_item(item)["background_at"]) - cost_ns
        old = from_item(item or {})
        start = max(int(old.get(timeline, 0)), now_ns)
        expr = Expression()
        expr.set("background_at", start + cost_ns)
        line = expr.name("background_at")
        ended = f"{line} = {expr.value('old_end', old['background_at'])}" if "background_at" in old else None
        expr.condition = f"attribute_exists({expr.name('pk')}) AND " + (ended or f"attribute_not_exists({line})")
        # Refused: another worker started the line meanwhile; this start is still where it begins.
        conditional_update(self._client, self.table_name, limit_key(model, shard), expr)
        return start

    def _touched(self, model: str, shard: int, now_ms: int) -> Expression:
        expr = Expression()
        expr.set("model", model)
        expr.set("shard", shard)
        expr.set("expires_at", now_ms // 1000 + IDLE_EXPIRY_SECONDS)
        return expr

    def _update(self, expr: Expression, model: str, shard: int) -> tuple[bool, BucketState | None]:
        written, item = conditional_update(self._client, self.table_name, limit_key(model, shard), expr)
        return written, bucket_from_item(item) if item else None
