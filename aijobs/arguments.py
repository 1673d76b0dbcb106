"""A client call's refusal of one of its arguments, said so that the caller can point at it."""

from __future__ import annotations

import json

from engine.core.errors import InputValidationError

# A value quoted back in an error is cut to this many characters.
_QUOTED_CHARS = 64


class InvalidArgumentError(InputValidationError, ValueError):
    """An argument of a client call that no job could take, found before anything is written.

    `argument` names it as the call does (`user_id`, `job_id`, `input`, `max_attempts`,
    `deadline_seconds`, `lane`, `attachments`), so that a caller can point at what it was given (the
    CLI names its flag); `item`, the element of it at fault when it is a list (an attachment, as it
    was given); `detail` says what is wrong. An `InputValidationError` (code input_validation_failed),
    as the worker would record it, and a `ValueError`.
    """

    def __init__(self, argument: str, detail: str, item: str | None = None) -> None:
        super().__init__(f"{argument}{f' {item}' if item is not None else ''}: {detail}")
        self.argument = argument
        self.detail = detail
        self.item = item


def quoted(value: object) -> str:
    """A value a caller gave, quoted back to them in one bounded piece."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    cut = text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."
    return repr(cut)
