"""Reading a run's log files: JSONL records, and the label a run goes by in reports."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from asyncsync.logschema import RANK, WORKERS_LOG, upgrade


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log, in the current schema (old logs' field names are
    renamed, see `asyncsync.logschema`); a torn last line (a killed writer) is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(upgrade(json.loads(line)))
    return records


def worker_logs(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each worker's records by rank, from its ``worker-<rank>.jsonl`` or from the run's
    one `WORKERS_LOG` (their `RANK` field taken out): readers need not know which."""
    shared = run_dir / WORKERS_LOG
    if shared.exists():
        logs: dict[int, list[dict[str, Any]]] = {}
        for record in read_jsonl(shared):
            logs.setdefault(int(record.pop(RANK)), []).append(record)
        return dict(sorted(logs.items()))
    paths = {int(path.stem.split("-")[1]): path for path in run_dir.glob("worker-*.jsonl")}
    return {rank: read_jsonl(paths[rank]) for rank in sorted(paths)}


def label(summary: dict[str, Any]) -> str:
    """``recipe/run``: unique across recipes."""
    return f"{summary.get('recipe', '?')}/{summary['run']}"


def sweep_suffix(sweep: dict[str, Any]) -> str:
    """What a swept run's name carries after its recipe name: ``@key=value``."""
    return "".join(f"@{key}={value}" for key, value in sweep.items())
