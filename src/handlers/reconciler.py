"""Lambda entry point of the scheduled reconciler: one pass, its counts as `Reconciled_<fate>`."""

from engine.config import Settings
from engine.observability import Handle
from engine.wiring import build_reconciler, entry_point
from handlers.invocation import scheduled


def build(settings: Settings) -> Handle:
    return scheduled(build_reconciler(settings).run, "Reconciled")


lambda_handler = entry_point(build)
