"""Lambda entry point of the jobs table's stream: completion events to EventBridge."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_events, entry_point


def build(settings: Settings) -> Handle:
    return build_events(settings).handle


lambda_handler = entry_point(build)
