"""Reading a run's log files: JSONL records, and the label a run goes by in reports."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from asyncsync.logschema import upgrade


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log, in the current schema (old logs' field names are
    renamed, see `asyncsync.logschema`); a torn last line (a killed writer) is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(upgrade(json.loads(line)))
    return records


def label(summary: dict[str, Any]) -> str:
    """``recipe/run``: unique across recipes."""
    return f"{summary.get('recipe', '?')}/{summary['run']}"


def sweep_suffix(sweep: dict[str, Any]) -> str:
    """What a swept run's name carries after its recipe name: ``@key=value``."""
    return "".join(f"@{key}={value}" for key, value in sweep.items())
