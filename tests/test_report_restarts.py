"""A worker stopped cleanly (SIGTERM: it wrote its final record) and started again with the
same log appends a second process's records: both processes' steps count. Only the last
final record's were counted (2413 steps reported where the workers did 2513)."""

from __future__ import annotations

import json
from pathlib import Path

from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import final_records
from tests.test_report import fake_run


def test_a_worker_stopped_and_started_again_counts_both_processes(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    log = run_dir / "worker-1.jsonl"
    first = [{"event": "compute", "t": 1.0 * i, "dur": 0.5, "steps": 1, "samples": 8,
              "loss": 1.0} for i in range(3)]
    first.append({"event": "final", "steps": 3, "samples": 24, "compute_s": 1.5,
                  "wall_s": 3.0})
    log.write_text("".join(json.dumps(r) + "\n" for r in first) + log.read_text())
    finals = final_records(run_dir)
    assert finals[0]["steps"] == 10
    assert (finals[1]["steps"], finals[1]["samples"]) == (13, 104)
    assert "unfinished_steps" not in finals[1]  # each process finished its own
    assert summarize_run(run_dir)["steps"] == 23
