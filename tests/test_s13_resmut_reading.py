"""Reading workers' logs into the totals and names a report prints, from small logs
written here (mutation testing of `asyncsync.runlog.reading`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.runlog.reading import (
    DamagedLog,
    final_records,
    line_rank,
    read_jsonl,
    run_name,
    sweep_suffix,
    unswept_name,
    worker_logs,
)


def lines(records: list[dict[str, Any]]) -> str:
    """JSONL as `asyncsync.runlog.metrics.RankLog` writes it (no spaces)."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def compute(steps: int = 1) -> dict[str, Any]:
    return {"event": "compute", "t": 1.0, "dur": 0.5, "steps": steps, "samples": 8 * steps}


def final(steps: int, wall_s: float) -> dict[str, Any]:
    return {"event": "final", "steps": steps, "samples": 8 * steps, "compute_s": 1.0,
            "wall_s": wall_s, "bytes_up": 10, "bytes_down": 20}


def test_a_restarted_worker_counts_every_process_s_steps(tmp_path: Path) -> None:
    # 3 steps and a final; 2 steps, killed (no final); 4 steps and a final
    records = [compute(), compute(), compute(), final(3, 5.0), compute(), compute(),
               compute(), compute(), compute(), compute(), final(4, 7.0)]
    (tmp_path / "worker-0.jsonl").write_text(lines(records))
    (tmp_path / "worker-1.jsonl").write_text(lines([compute(2), final(2, 9.0)]))
    finals = final_records(tmp_path)
    assert finals[0]["steps"] == 9 and finals[0]["samples"] == 72  # 3 + 2 + 4
    assert finals[0]["unfinished_steps"] == 2
    assert finals[0]["wall_s"] == 7.0  # the last process's
    assert finals[1]["steps"] == 2 and "unfinished_steps" not in finals[1]


def test_a_shared_log_gives_the_ranks_asked_with_two_digit_ranks(tmp_path: Path) -> None:
    shared = [{"rank": 12, **compute()}, {"rank": 2, **compute()}, {"rank": 12, **final(1, 3.0)},
              {"event": "compute", "rank": 7, "t": 2.0, "dur": 0.5}]  # rank not first
    (tmp_path / "workers.jsonl").write_text(lines(shared))
    assert line_rank(lines(shared[:1])) == 12
    assert line_rank(lines(shared[3:])) is None
    logs = worker_logs(tmp_path, {12, 7})
    assert sorted(logs) == [7, 12] and len(logs[12]) == 2 and logs[7][0]["t"] == 2.0


def test_a_damaged_line_in_the_middle_is_an_error_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(DamagedLog, match=r"events\.jsonl: line 2: not JSON"):
        read_jsonl(path)


def test_a_resumed_writer_s_record_after_a_whole_one_keeps_both(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"a": 1}{"b": 2}\n{"c": 3, "d{"e": 5}\n{"f": ')  # last line torn
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}, {"e": 5}]


def test_an_old_sweep_name_is_read_as_the_name_of_now() -> None:
    sweep = {"compute.slowdown": [1, 3]}
    assert unswept_name("bsp@compute.slowdown=[1, 3]", sweep) == "bsp"
    assert unswept_name("bsp@compute.slowdown=1,3", sweep) == "bsp"
    assert run_name("bsp@compute.slowdown=[1, 3]", sweep) == "bsp@compute.slowdown=1,3"
    assert run_name("other", sweep) == "other"


def test_a_long_sweep_value_is_cut_before_its_hash() -> None:
    value = "a" * 70
    digest = hashlib.sha256(json.dumps(value).encode()).hexdigest()[:8]
    assert sweep_suffix({"k": value}) == "@k=" + "a" * 56 + digest  # 64 characters
    assert sweep_suffix({"k": "a" * 64}) == "@k=" + "a" * 64
