"""Lambda entry point of the scheduled batcher (the providers' batch APIs: docs/batches.md): one pass,
its counts as `Batches_<what>`."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_batcher, entry_point
from handlers.invocation import scheduled


def build(settings: Settings) -> Handle:
    return scheduled(build_batcher(settings).run, "Batches")


lambda_handler = entry_point(build)
