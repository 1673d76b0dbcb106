"""A boto3 client whose calls run one at a time, for tests and runs on moto in one process.

moto is not linearizable: two threads' conditional writes can both pass where DynamoDB lets
one. Serializing the requests makes a race check the engine's conditions, not moto's.
"""

from __future__ import annotations

import functools
import threading
from typing import Any


class SerializedClient:
    def __init__(self, client: Any, lock: threading.Lock | None = None) -> None:
        self._client = client
        self._lock = lock or threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attribute(*args, **kwargs)

        return call
