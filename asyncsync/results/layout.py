"""Terminal layout shared by the report and the study's views (``check``, the dashboard):
the console, a renderable's widths, and one run as a block for a narrow terminal."""

from __future__ import annotations

import io
import os

from rich.console import Console, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def make_console() -> Console:
    """A console that does not squeeze tables when output goes to a file or pipe.

    Lines that carry a path or a command to copy are printed with ``soft_wrap``: never
    folded mid-word (a terminal wraps them for the eye; a pipe gets them whole).
    """
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:  # else the width asked
        console.width = max(console.width, 150)
    return console


_MEASURE = Console(width=10_000, file=io.StringIO())


def measured(renderable: RenderableType) -> Measurement:
    """A renderable's least and natural widths, whatever the terminal's."""
    return Measurement.get(_MEASURE, _MEASURE.options, renderable)


def run_block(name: str, protocol: str, lines: list[tuple[RenderableType, RenderableType]],
              justify: JustifyMethod = "left") -> Table:
    """One run as a block, for a terminal too narrow for a table's row: its name (bold)
    and protocol, then `lines` of (label, value)."""
    block = Table.grid(padding=(0, 2))
    block.add_column(no_wrap=True)
    block.add_column(justify=justify, no_wrap=justify == "right")
    block.add_row(Text(name, style="bold"), protocol)
    for line in lines:
        block.add_row(*line)
    return block
