"""moto, fitted to stand in for AWS under the engine: one place, used by the embedded stack, the tests,
the soak and the bench.

- Linearizable: moto checks a write's condition and applies the write without a lock, so two
  concurrent conditional writes can both pass where DynamoDB lets only one. Every operation of
  moto's DynamoDB backend here takes one process-wide lock, so that a race tests the engine's
  conditions and not moto's: in process (`mock_aws`) and in the local server alike, since both
  run the same backend.
- Fast enough for thousands of items: moto deep-copies every table a transaction names as its
  rollback copy (O(table) per transaction); here a transaction keeps a copy of the items it
  touches and puts them back when it fails, with the same outcome. And moto's server lists its
  own package directory on every request; that list is cached.
- Numbers as DynamoDB reads them: moto's `ADD` and `SET a = a - :b` parse a number without a
  decimal point as an int, so a value it stored in exponent notation itself (a headroom that
  reached `0E-9`) could not be added to again. Here they add and subtract as decimals, as
  DynamoDB does.
- Idempotent transactions: DynamoDB answers a `TransactWriteItems` repeated with the same
  `ClientRequestToken` within 10 minutes as the first, without applying it again (what makes an
  SDK retry of a write that landed harmless); moto applies it again. Here it is answered as the
  first (and refused when the token comes with other items, as DynamoDB does).
- SQS message groups read safely: a receive on a queue whose messages carry a `MessageGroupId`
  iterates the queue's set of pending messages while other requests change it; here it iterates
  a copy.
- SQS queues of thousands of messages: moto reads the clock (a datetime) once per message each time
  it scans a queue, computes all of a queue's attributes (three scans, for the counts) three times
  for every message a receive returns (to read its retention period) and once for every message
  sent (to read `ContentBasedDeduplication`), and a delete scans the queue twice per message,
  building a list of receipt handles for each message it passes: on a queue of 3,000, a receive
  of 10 took 3.6 s of the server's interpreter and a send of 10 0.75 s. Here a scan reads the
  clock once, the retention period is read alone, and a delete finds its message in one pass
  (a receive of 10 then takes 18 ms); what a request returns and what the counts say are
  unchanged.
- DynamoDB update expressions of many actions: moto checks an update expression's clause counts
  and overlapping paths at every node of its syntax tree (nearly every node counts as an update
  expression), each check walking the node's whole subtree: quadratic in the number of actions,
  which made a job's claim (some twenty actions, validated twice when it creates the item) cost
  about 40 ms. Here both checks run once, on the whole expression; what is refused is refused
  with the same errors, and what is accepted is applied as before.
- Parsed once: moto parses an update expression twice per request (the response checks its names
  and values, the backend applies it), and EventBridge builds a JSONPath parser (its grammar
  tables) for each of the eight input paths of every event it delivers to a target. Both parse
  the same few strings over and over: here each string's parse is kept (the trees are only read,
  never changed: moto's validators work on a copy).
- EventBridge's request size: moto accepts a `PutEvents` of any size; EventBridge refuses a request
  whose entries add up to 256 KiB or more (a `ValidationException`, nothing put). Here so does moto,
  sizing entries by EventBridge's rule: 14 bytes for a `Time`, the UTF-8 bytes of `Source`,
  `DetailType`, `Detail` and each of `Resources` (`EventBusName` does not count).

`fit_moto()` applies all of it once per process; it changes moto in this process only.
"""

from __future__ import annotations

import copy as stdlib_copy
import functools
import inspect
import json
import operator
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

_LOCK = threading.RLock()
_fitted = False


def fit_moto() -> None:
    """Make moto's DynamoDB linearizable, its transactions, update checks, queue scans and routing cheap,
    its limits AWS's (idempotent)."""
    global _fitted
    with _LOCK:
        if _fitted:
            return
        _cheap_transaction_rollback()
        _exact_numbers()
        _idempotent_transactions()
        _copied_pending_groups()
        _cheap_queue_scans()
        _cheap_update_checks()
        _parsed_once()
        _sized_put_events()
        _serialize_dynamodb()
        _cache_server_routing()
        _fitted = True


def _serialize_dynamodb() -> None:
    from moto.dynamodb.models import DynamoDBBackend

    for name, function in list(vars(DynamoDBBackend).items()):
        if not name.startswith("_") and inspect.isfunction(function):
            setattr(DynamoDBBackend, name, _under_lock(function))


def _under_lock(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def serialized(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return function(*args, **kwargs)

    return serialized


def _exact_numbers() -> None:
    from moto.dynamodb.models.dynamo_type import DDBType, DynamoType

    Operation = Callable[[Decimal, Decimal], Decimal]

    def arithmetic(original: Callable[..., Any], operation: Operation) -> Callable[..., Any]:
        @functools.wraps(original)
        def exact(self: Any, other: Any) -> Any:
            if self.type == other.type == DDBType.NUMBER:
                result = operation(Decimal(self.value), Decimal(other.value))
                return DynamoType({DDBType.NUMBER: format(result, "f")})
            return original(self, other)

        return exact

    DynamoType.__add__ = arithmetic(DynamoType.__add__, operator.add)  # type: ignore[method-assign]
    DynamoType.__sub__ = arithmetic(DynamoType.__sub__, operator.sub)  # type: ignore[method-assign]


# How long DynamoDB remembers a transaction's ClientRequestToken.
TOKEN_SECONDS = 600


def _idempotent_transactions() -> None:
    from moto.dynamodb.exceptions import MockValidationException
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.transact_write_items
    answered: dict[str, tuple[float, str, Any]] = {}

    @functools.wraps(original)
    def transact_write_items(self: Any) -> Any:
        token = self.body.get("ClientRequestToken")
        if not token:
            return original(self)
        items = json.dumps(self.body["TransactItems"], sort_keys=True)
        with _LOCK:
            now = time.time()
            for old in [key for key, (at, _, _) in answered.items() if now - at > TOKEN_SECONDS]:
                del answered[old]
            if token in answered:
                _, first_items, result = answered[token]
                if first_items != items:
                    raise MockValidationException("IdempotentParameterMismatch: the token was used with other items")
                return result
            result = original(self)
            answered[token] = (now, items, result)
            return result

    DynamoHandler.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _copied_pending_groups() -> None:
    from moto.sqs.models import Queue

    def pending_message_groups(self: Any) -> set[str]:
        return {message.group_id for message in self._pending_messages.copy() if message.group_id is not None}

    Queue.pending_message_groups = property(pending_message_groups)  # type: ignore[method-assign,assignment]


def _cheap_queue_scans() -> None:
    from moto.core.utils import unix_time, unix_time_millis
    from moto.sqs.exceptions import ReceiptHandleIsInvalid
    from moto.sqs.models import Queue, SQSBackend

    # What moto's Message.visible and Message.delayed say, with the clock read by the caller.
    def visible(message: Any, now_ms: float) -> bool:
        return bool(now_ms > message.visible_at)

    def delayed(message: Any, now_ms: float) -> bool:
        return bool(now_ms < message.delayed_until)

    def messages(self: Any) -> list[Any]:
        now = unix_time_millis()
        return [message for message in self._messages if visible(message, now) and not delayed(message, now)]

    def delayed_count(self: Any) -> int:
        now = unix_time_millis()
        return sum(1 for message in self._messages if delayed(message, now))

    def not_visible_count(self: Any) -> int:
        now = unix_time_millis()
        return sum(1 for message in self._messages if not visible(message, now))

    def within_retention(self: Any, queue_name: str, message: Any) -> bool:
        retention_seconds = int(self.get_queue(queue_name).message_retention_period)
        return bool(retention_seconds + message.sent_timestamp / 1000 > unix_time())

    def delete_message(self: Any, receipt_handle: str) -> None:
        if receipt_handle in self.deleted_messages:
            return  # already deleted: SQS accepts it again
        for index, message in enumerate(self._messages):
            if receipt_handle == message.receipt_handle or receipt_handle in message._old_receipt_handles:
                self.pending_messages.discard(message)
                self.deleted_messages.update(message.all_receipt_handles)
                # A new list, as moto makes: a receive may be iterating the old one.
                self._messages = self._messages[:index] + self._messages[index + 1 :]
                return
        raise ReceiptHandleIsInvalid()

    Queue.messages = property(messages)  # type: ignore[method-assign,assignment]
    Queue.approximate_number_of_messages_delayed = property(delayed_count)  # type: ignore[method-assign,assignment]
    Queue.approximate_number_of_messages_not_visible = property(not_visible_count)  # type: ignore[method-assign,assignment]
    Queue.delete_message = delete_message  # type: ignore[method-assign]
    SQSBackend.is_message_valid_based_on_retention_period = within_retention  # type: ignore[method-assign]


def _cheap_update_checks() -> None:
    from moto.dynamodb.parsing.ast_nodes import UpdateExpression  # type: ignore[attr-defined]
    from moto.dynamodb.parsing.validators import ActionCountValidator, OverlappingPathsValidator

    # The clauses and paths of any subtree are among the whole expression's: checking the root alone
    # refuses what checking every node refuses.
    def count_actions(self: Any, node: Any) -> Any:
        return self.verify_action_counts(node) if isinstance(node, UpdateExpression) else node

    def check_paths(self: Any, node: Any) -> Any:
        return self.check_for_overlapping_paths(node) if isinstance(node, UpdateExpression) else node

    ActionCountValidator.traverse = count_actions
    OverlappingPathsValidator.traverse = check_paths


# Distinct strings whose parse is kept: the engine's update expressions and EventBridge's input paths
# are a few dozen.
PARSED_STRINGS = 1024


def _parsed_once() -> None:
    import jsonpath_ng.ext
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]

    parse_update = functools.lru_cache(maxsize=PARSED_STRINGS)(UpdateExpressionParser.make)
    UpdateExpressionParser.make = staticmethod(parse_update)
    # moto.events imports `parse` from jsonpath_ng.ext each time it delivers an event.
    jsonpath_ng.ext.parse = functools.lru_cache(maxsize=PARSED_STRINGS)(jsonpath_ng.ext.parse)  # type: ignore[attr-defined]


# EventBridge refuses a PutEvents request whose entries add up to this many bytes or more.
PUT_EVENTS_REQUEST_BYTES = 256 * 1024


def _sized_put_events() -> None:
    from moto.events.exceptions import ValidationException
    from moto.events.models import EventsBackend

    original = EventsBackend.put_events

    def entry_bytes(entry: dict[str, Any]) -> int:
        texts = [entry.get(name) or "" for name in ("Source", "DetailType", "Detail")]
        texts += entry.get("Resources") or []
        return (14 if entry.get("Time") is not None else 0) + sum(len(text.encode()) for text in texts)

    @functools.wraps(original)
    def put_events(self: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if sum(entry_bytes(entry) for entry in events) >= PUT_EVENTS_REQUEST_BYTES:
            raise ValidationException("Total size of the entries in the request is over the limit.")
        return original(self, events)

    EventsBackend.put_events = put_events  # type: ignore[method-assign]


def _cheap_transaction_rollback() -> None:
    from moto.dynamodb import models as dynamodb_models
    from moto.dynamodb.models.table import Table

    if getattr(dynamodb_models, "copy", None) is not stdlib_copy:
        raise RuntimeError("moto.dynamodb.models no longer deep-copies through `copy`: revisit fit_moto")
    backend_class = dynamodb_models.DynamoDBBackend
    original = backend_class.transact_write_items

    class _CopyKeepingTables:
        """`copy` as moto.dynamodb.models sees it: deep copies of a Table are the table itself."""

        def __getattr__(self, name: str) -> Any:
            return getattr(stdlib_copy, name)

        @staticmethod
        def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
            return value if isinstance(value, Table) else stdlib_copy.deepcopy(value, memo)

    def touched_items(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], Any]]:
        touched = []
        for entry in transact_items:
            for operation, request in entry.items():
                table = backend.tables.get(request.get("TableName"))
                if table is None:
                    continue
                attributes = request["Item"] if operation == "Put" else request.get("Key", {})
                key_names = [name for name in (table.hash_key_attr, table.range_key_attr) if name]
                key = {name: attributes[name] for name in key_names if name in attributes}
                if len(key) != len(key_names):
                    continue  # moto itself rejects the request
                current = backend.get_item(table.name, key)
                touched.append(
                    (table.name, key, stdlib_copy.deepcopy(current.to_json()["Attributes"]) if current else None)
                )
        return touched

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        touched = touched_items(self, transact_items)
        try:
            original(self, transact_items)
        except Exception:
            for table_name, key, attributes in reversed(touched):
                if attributes is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, attributes)
            raise

    dynamodb_models.copy = _CopyKeepingTables()  # type: ignore[attr-defined,assignment]
    backend_class.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _cache_server_routing() -> None:
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = functools.cache(lambda: modules)
