"""What every bench prints: figures with their target and method, as one rich table."""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from engine.observability import logger as engine_logger


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: str
    target: str
    met: bool | None
    method: str


def quiet_engine() -> None:
    """The figures are the output: the engine's own logs and metrics would bury them."""
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
    engine_logger.setLevel(logging.CRITICAL)


def render(figures: list[Figure], title: str = "aijobs bench") -> Table:
    table = Table(title=f"{title} — {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for column in ("figure", "measured", "target", "met", "method"):
        table.add_column(column, overflow="fold")
    for figure in figures:
        met = "-" if figure.met is None else ("[green]yes[/]" if figure.met else "[red]no[/]")
        table.add_row(figure.name, figure.value, figure.target, met, figure.method)
    return table


def print_figures(title: str, measure: Callable[[Console], list[Figure]]) -> None:
    """A bench run alone: measure with the engine quiet (progress lines on the console), then print
    the figures. Lines are 200 wide when not on a terminal, so that a log keeps whole rows."""
    quiet_engine()
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(render(measure(console), title))
