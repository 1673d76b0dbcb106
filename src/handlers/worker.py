"""Lambda entry point of the jobs queue."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_worker, entry_point


def build(settings: Settings) -> Handle:
    return build_worker(settings).handle


lambda_handler = entry_point(build)
