"""Lambda entry point of the scheduled reconciler."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_reconciler, entry_point


def build(settings: Settings) -> Handle:
    return build_reconciler(settings).handle


lambda_handler = entry_point(build)
