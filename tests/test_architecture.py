"""The architecture is checked, not hoped: layers, no cycles, one clock."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "asyncsync"
SUPERVISOR = {"cli.py", "study/runner.py",
              "results/report.py", "results/plots.py", "study/launch.py", "__main__.py",
              "clock.py"}
WALL_CLOCK = re.compile(r"\b(time\.(time|monotonic|perf_counter|sleep)|perf_counter|"
                        r"datetime\.now|time_ns)\s*\(")


def test_import_contracts_hold() -> None:
    """pyproject's import-linter contracts: the layers, protocols importing only the SDK,
    and no import cycle."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is not installed (pip install -e '.[dev]')"
    result = subprocess.run([lint], capture_output=True, text=True, cwd=PACKAGE.parent,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_no_wall_clock_below_the_supervisor() -> None:
    """Everything below the supervisor reads time from the one clock (asyncsync.clock)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in SUPERVISOR:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if WALL_CLOCK.search(line) or re.search(r"^\s*import time\b|from time import",
                                                    line):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_check_would_catch_a_wall_clock_read() -> None:
    """The pattern above is not vacuous: it flags the reads it is meant to forbid."""
    for line in ("t = time.monotonic()", "time.sleep(0.1)", "x = time.perf_counter()"):
        assert WALL_CLOCK.search(line), line
    assert not WALL_CLOCK.search("now = loop.time()")
