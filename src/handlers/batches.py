"""Lambda entry point of the scheduled batcher (the providers' batch APIs: docs/batches.md)."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_batcher, entry_point


def build(settings: Settings) -> Handle:
    return build_batcher(settings).handle


lambda_handler = entry_point(build)
