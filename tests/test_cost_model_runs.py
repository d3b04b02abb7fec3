"""Virtual runs charged by the cost model: host-independent, per-worker devices, and
calibration only when asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import REAL_TIME_FIELDS, simulate

MLP = """
name = "cost"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "mlp"
[defaults.stop]
time_s = 0.5
[defaults.eval]
interval_s = 0.25
[defaults.compute]
slowdown = [1, 2]
[[runs]]
name = "asp"
protocol = "asp"
"""

TIMING = """
name = "cost"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 1
[defaults.data]
batch_size = 32
[defaults.stop]
time_s = 1
[defaults.compute]
{compute}
[[runs]]
name = "asp"
protocol = "asp"
"""


def run(tmp_path: Path, text: str, name: str) -> tuple[Path, dict[str, Any]]:
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(text)
    run_dir = tmp_path / name
    run_dir.mkdir()
    return run_dir, simulate(load_recipe(recipe).run("asp"), run_dir, "cost/asp")


def logs(run_dir: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(run_dir.glob("*.jsonl"))}


def test_a_run_without_a_step_time_is_byte_identical_with_a_core_kept_busy(
        tmp_path: Path) -> None:
    quiet_dir, quiet = run(tmp_path, MLP, "quiet")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy_dir, loaded = run(tmp_path, MLP, "busy")
    finally:
        busy.kill()
        busy.wait()
    assert quiet["step_time_source"] == "device"
    assert logs(quiet_dir) == logs(busy_dir)
    assert len(logs(quiet_dir)) == 3  # events and both workers
    assert ({k: v for k, v in quiet.items() if k not in REAL_TIME_FIELDS}
            == {k: v for k, v in loaded.items() if k not in REAL_TIME_FIELDS})


def compute_spans(run_dir: Path, rank: int) -> list[float]:
    return [record["dur"] for record in read_jsonl(run_dir / f"worker-{rank}.jsonl")
            if record.get(KEY) == Kind.COMPUTE]


def test_a_per_worker_rate_gives_each_worker_its_own_step_time(tmp_path: Path) -> None:
    # 1e6 FLOPs per sample x 32 + the optimizer's 2 FLOPs on each of 250,000 parameters
    # (1 MB of float32): 32.5 MFLOP a step, at 1 and at 2.5 GFLOP/s.
    run_dir, facts = run(tmp_path, TIMING.format(
        compute="flops_per_sample = 1e6\nflops_per_s = [1e9, 2.5e9]"), "rates")
    assert [w["step_s"] for w in facts["step_time"]] == pytest.approx([0.0325, 0.013])
    assert set(compute_spans(run_dir, 0)) == {0.0325}
    assert set(compute_spans(run_dir, 1)) == {0.013}


def test_named_devices_charge_their_data_sheet_rates(tmp_path: Path) -> None:
    # T4: 8.1 TFLOP/s, V100: 15.7 TFLOP/s (NVIDIA data sheets), both at efficiency 0.5;
    # 1e9 FLOPs per sample x 32 + 500,000 for the optimizer. (The timing model has no
    # operations to count, so no per-operation time.)
    _, facts = run(tmp_path, TIMING.format(
        compute='flops_per_sample = 1e9\ndevice = ["t4", "v100"]\nefficiency = 0.5'),
        "devices")
    assert [w["device"] for w in facts["step_time"]] == ["t4", "v100"]
    assert [w["step_s"] for w in facts["step_time"]] == pytest.approx(
        [(32e9 + 5e5) / 4.05e12, (32e9 + 5e5) / 7.85e12])


def test_an_explicit_step_time_overrides_the_device(tmp_path: Path) -> None:
    _, facts = run(tmp_path, TIMING.format(
        compute='flops_per_sample = 1e6\ndevice = "h100"\nbase_step_s = 0.02'), "explicit")
    assert facts["step_time_source"] == "explicit"
    assert [w["step_s"] for w in facts["step_time"]] == [0.02, 0.02]


@pytest.mark.parametrize(("compute", "message"), [
    ('device = ["t4"]', "compute.device: 1 entries for 2 workers"),
    ('device = "tpu"', "compute.device: must name devices of cpu-core"),
    ('base_step_s = "soon"', 'compute.base_step_s: must be >= 0 or "calibrate"'),
])
def test_bad_compute_keys_are_named(tmp_path: Path, compute: str, message: str) -> None:
    recipe = tmp_path / "bad.toml"
    recipe.write_text(TIMING.format(compute=f"flops_per_sample = 1e6\n{compute}"))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_recipe(recipe)


def test_calibration_is_opt_in_and_labelled_host_dependent(tmp_path: Path) -> None:
    text = MLP.replace("slowdown = [1, 2]", 'base_step_s = "calibrate"')
    recipe = tmp_path / "calibrate.toml"
    recipe.write_text(text)
    spec = load_recipe(recipe).run("asp")
    with pytest.raises(ValueError, match="needs the calibrated step time"):
        simulate(spec, tmp_path, "cost/asp")
    run_dir = tmp_path / "calibrated"
    run_dir.mkdir()
    facts = simulate(spec, run_dir, "cost/asp", calibrated_s=0.004)
    assert facts["step_time_source"] == "calibrated (host-dependent)"
    assert facts["base_step_s"] == 0.004


def test_check_prints_each_runs_devices_flops_and_step_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncsync import cli

    recipe = tmp_path / "check.toml"
    recipe.write_text(TIMING.format(
        compute='flops_per_sample = 1e9\ndevice = ["t4", "t4"]\nefficiency = 0.5'))
    assert cli.main(["check", str(recipe)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # 32.0005 GFLOP a step at 4.05 TFLOP/s: 7.901 ms; both workers alike, so one group.
    assert "asp device 2 x t4 3.2e+04 MFLOP 7.901 ms" in out


def test_devices_lists_every_device_with_its_source(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    from asyncsync import cli

    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu-core", "laptop-cpu", "phone", "jetson-nano", "t4", "v100", "a100",
                 "h100"):
        assert name in out
    assert "T4 data sheet: 8.1 TFLOP/s FP32" in " ".join(out.split())
