"""Update and condition expressions built from named parts, with ExpressionAttributeNames throughout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.store.items import Item, serialize


@dataclass
class Expression:
    """Collects SET / ADD / REMOVE clauses and a condition, with their names and values."""

    _sets: list[str] = field(default_factory=list)
    _adds: list[str] = field(default_factory=list)
    _removes: list[str] = field(default_factory=list)
    _names: dict[str, str] = field(default_factory=dict)
    _values: dict[str, Any] = field(default_factory=dict)
    condition: str | None = None

    def name(self, attribute: str) -> str:
        placeholder = f"#{attribute}"
        self._names[placeholder] = attribute
        return placeholder

    def value(self, key: str, value: Any) -> str:
        """The placeholder of `value`; a key used twice must name the same value (else ValueError)."""
        placeholder = f":{key}"
        serialized = serialize(value)
        if self._values.setdefault(placeholder, serialized) != serialized:
            raise ValueError(f"placeholder {placeholder} already stands for another value")
        return placeholder

    def set(self, attribute: str, value: Any) -> Expression:
        self._sets.append(f"{self.name(attribute)} = {self.value(attribute, value)}")
        return self

    def set_if_absent(self, attribute: str, value: Any) -> Expression:
        name = self.name(attribute)
        self._sets.append(f"{name} = if_not_exists({name}, {self.value(attribute, value)})")
        return self

    def subtract(self, attribute: str, amount: Any, start: Any, source: str | None = None) -> Expression:
        """attribute = (`source`, the attribute itself by default, or `start` when absent) - amount."""
        name, source_name = self.name(attribute), self.name(source or attribute)
        start_value, amount_value = self.value(attribute + "_start", start), self.value("sub_" + attribute, amount)
        self._sets.append(f"{name} = if_not_exists({source_name}, {start_value}) - {amount_value}")
        return self

    def add(self, attribute: str, amount: Any) -> Expression:
        self._adds.append(f"{self.name(attribute)} {self.value('add_' + attribute, amount)}")
        return self

    def remove(self, *attributes: str) -> Expression:
        self._removes.extend(self.name(attribute) for attribute in attributes)
        return self

    def update_expression(self) -> str:
        clauses = []
        if self._sets:
            clauses.append("SET " + ", ".join(self._sets))
        if self._adds:
            clauses.append("ADD " + ", ".join(self._adds))
        if self._removes:
            clauses.append("REMOVE " + ", ".join(self._removes))
        return " ".join(clauses)

    def update_params(self, table: str, key: Item) -> dict[str, Any]:
        """The parameters of an UpdateItem (or of an Update inside TransactWriteItems)."""
        params: dict[str, Any] = {
            "TableName": table,
            "Key": key,
            "UpdateExpression": self.update_expression(),
            "ExpressionAttributeNames": self._names,
        }
        if self.condition:
            params["ConditionExpression"] = self.condition
        if self._values:
            params["ExpressionAttributeValues"] = self._values
        return params

    def condition_params(self) -> dict[str, Any]:
        """The parameters of a conditional PutItem."""
        params: dict[str, Any] = {"ConditionExpression": self.condition, "ExpressionAttributeNames": self._names}
        if self._values:
            params["ExpressionAttributeValues"] = self._values
        return params


def index_query(
    table_name: str,
    index_name: str,
    key_condition: str,
    names: dict[str, str],
    values: dict[str, Any],
    user_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The parameters of a Query on an index, filtered to one user's items when `user_id` is set."""
    params: dict[str, Any] = {
        "TableName": table_name,
        "IndexName": index_name,
        "KeyConditionExpression": key_condition,
        "ExpressionAttributeNames": dict(names),
        "ExpressionAttributeValues": dict(values),
        **extra,
    }
    if user_id is not None:
        params["ExpressionAttributeNames"]["#user"] = "user_id"
        params["ExpressionAttributeValues"][":user"] = {"S": user_id}
        params["FilterExpression"] = "#user = :user"
    return params
