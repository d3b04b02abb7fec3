"""``asyncsync check``'s table of runs at a narrow terminal: one block per run, never a
header or a value folded mid-word."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from asyncsync.study.describe import check_table
from asyncsync.study.recipe import load_recipe

ROOT = Path(__file__).parent.parent
HEADERS = ("run", "protocol", "workers", "compute", "network", "data", "model", "budget",
           "clock")


def _lines(width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(check_table(load_recipe(ROOT / "recipes" / "quickstart.toml"), width))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def test_a_narrow_terminal_gets_a_block_per_run_with_every_value_whole() -> None:
    lines = _lines(60)
    assert max(map(len, lines)) <= 60
    words = [line.split() for line in lines]
    assert ["bsp", "bsp"] in words and ["asp", "asp"] in words  # each block's first line
    assert ["compute", "1,1,1,3x"] in words and ["data", "synthetic", "iid", "b32"] in words
    assert ["budget", "30", "s,", "to", "0.7"] in words and ["clock", "real"] in words


def test_a_wide_terminal_gets_the_table() -> None:
    lines = _lines(150)
    header = next(line.split() for line in lines if line.lstrip().startswith("run "))
    assert tuple(header) == HEADERS
    assert ["bsp", "bsp", "4", "1,1,1,3x", "-", "synthetic", "iid", "b32", "cnn", "30", "s,",
            "to", "0.7", "real"] in [line.split() for line in lines]


def test_devices_at_a_narrow_terminal_wrap_only_the_sources() -> None:
    from asyncsync.study.describe import devices_table

    console = Console(width=60, file=io.StringIO(), color_system=None)
    console.print(devices_table())
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert max(len(line.rstrip()) for line in lines) <= 60
    rule = next(i for i, line in enumerate(lines) if line.lstrip().startswith("─"))
    headers = [word for line in lines[:rule] for word in line.split()]
    assert sorted(headers) == sorted(["device", "peak", "TFLOP/s", "efficiency", "per", "op",
                                      "(us)", "source"])
    first = next(line.split() for line in lines if line.lstrip().startswith("cpu-core"))
    assert first[:4] == ["cpu-core", "0.096", "0.25", "10"]
