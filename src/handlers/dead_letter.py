"""Lambda entry point of the dead-letter queue."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_recorder, entry_point


def build(settings: Settings) -> Handle:
    return build_recorder(settings).handle


lambda_handler = entry_point(build)
