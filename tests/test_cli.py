"""The CLI answers every user mistake with one ``error:`` line and exit status 2."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.cli import main
from asyncsync.results.report import summarize_run
from asyncsync.study import run_one
from asyncsync.study.executors import write_summary
from asyncsync.study.specs import RunSpec
from tests.test_report import fake_run

ROOT = Path(__file__).parent.parent
QUICKSTART = str(ROOT / "recipes" / "quickstart.toml")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncsync", *args], cwd=ROOT,
                          env={**os.environ, "COLUMNS": "120", **(env or {})},
                          capture_output=True, text=True, timeout=120)


def one_error(done: subprocess.CompletedProcess[str] | tuple[int, str]) -> str:
    """The single ``error:`` line of a refused command (no traceback)."""
    code, out = (done.returncode, done.stdout + done.stderr) if isinstance(
        done, subprocess.CompletedProcess) else done
    assert code == 2, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return " ".join(lines[0].split())


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def with_settings(run_dir: Path, **settings: object) -> Path:
    """Give a fake run's resolved recipe these top-level or stop settings."""
    path = run_dir / "recipe.json"
    recipe = json.loads(path.read_text())
    spec = recipe["runs"][0]
    for key, value in settings.items():
        if key == "time_s":
            spec["stop"]["time_s"] = value
        else:
            spec[key] = value
    path.write_text(json.dumps(recipe))
    return run_dir


def test_report_on_a_missing_path_says_so(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert one_error(run_main(capsys, "report", str(missing))) == \
        f"error: {missing}: no such directory"


def test_report_on_a_directory_without_runs(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    assert one_error(run_main(capsys, "report", str(tmp_path))).startswith(
        f"error: {tmp_path}: no run logs")


def test_report_on_a_broken_run_log(capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    run_dir = tmp_path / "stamp" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text("{}")
    (run_dir / "events.jsonl").write_text("")
    assert one_error(run_main(capsys, "report", str(run_dir))) == (
        f"error: {run_dir}: not a run's log directory (recipe.json: KeyError: 'runs')")


def test_report_with_an_unknown_baseline(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    fake_run(tmp_path, "r", "slow", "bsp", [0.1, 0.6])
    assert one_error(run_main(capsys, "report", str(tmp_path), "--baseline", "nope")) == (
        "error: --baseline nope: no such run; runs are r/slow, slow")


def test_report_of_a_recipe_directory_takes_its_latest_study(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.2, 0.3])
    new = tmp_path / "r" / "20260102-000000" / "bsp"
    old.parent.rename(new.parent)
    fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])  # the older study, again
    code, out = run_main(capsys, "report", str(tmp_path / "r"))
    assert code == 0, out
    assert f"reporting the latest, {new.parent}" in " ".join(out.split())
    assert (new.parent / "table.csv").exists()
    assert not (old.parent / "table.csv").exists()
    code, out = run_main(capsys, "report", str(tmp_path / "r"), "--all")
    assert code == 0 and out.count("r: comparison (baseline bsp)") == 2, out
    assert (old.parent / "table.csv").exists()


def test_report_refuses_to_pool_different_clocks(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    with_settings(fake_run(tmp_path, "a", "bsp", "bsp", [0.1, 0.6]), clock="real")
    with_settings(fake_run(tmp_path, "b", "asp", "asp", [0.6]), clock="virtual")
    assert one_error(run_main(capsys, "report", str(tmp_path / "a"), str(tmp_path / "b"),
                              "--baseline", "a/bsp")) == (
        "error: cannot pool runs with different clocks (a/bsp real, b/asp virtual): their "
        "times are not comparable; report each study separately (--all)")


def test_report_refuses_to_pool_different_budgets(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    with_settings(fake_run(tmp_path, "a", "bsp", "bsp", [0.1, 0.6]), time_s=60)
    with_settings(fake_run(tmp_path, "b", "asp", "asp", [0.6]), time_s=20)
    assert "different budgets (stop.time_s) (a/bsp 60, b/asp 20)" in one_error(
        run_main(capsys, "report", str(tmp_path / "a"), str(tmp_path / "b"),
                 "--baseline", "a/bsp"))


def test_report_refuses_one_run_from_two_studies(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    first = fake_run(tmp_path / "x", "r", "bsp", "bsp", [0.1, 0.6])
    second = fake_run(tmp_path / "y", "r", "bsp", "bsp", [0.1, 0.2, 0.6])
    assert one_error(run_main(capsys, "report", str(first.parent), str(second.parent))) == (
        f"error: r/bsp (repeat 0) is in two studies, {first.parent} and {second.parent}: "
        "report one of them, or each separately (--all)")


def test_report_refuses_one_run_with_different_settings(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    first = with_settings(fake_run(tmp_path / "x", "r", "bsp", "bsp", [0.6], repeat=0),
                          workers=2)
    second = with_settings(fake_run(tmp_path / "y", "r", "bsp", "bsp", [0.6], repeat=1),
                           workers=3)
    assert one_error(run_main(capsys, "report", str(first.parent), str(second.parent))) == (
        f"error: r/bsp ran with different settings in {first.parent} and {second.parent} "
        "(workers: 2 vs 3): report each study separately (--all)")


def test_a_port_in_use_is_one_line_and_the_log_dir_is_created(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log_dir = tmp_path / "logs" / "n"
        done = cli("server", "--recipe", QUICKSTART, "--run", "bsp", "--port", str(port),
                   "--log-dir", str(log_dir))
    assert one_error(done).startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert log_dir.is_dir()


def test_a_bad_launcher_variable_is_one_line() -> None:
    done = cli("server", "--recipe", QUICKSTART, "--run", "bsp", env={"MASTER_PORT": "abc"})
    assert one_error(done) == "error: MASTER_PORT='abc' is not an integer"


def test_a_missing_recipe_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert one_error(run_main(capsys, "check", "nowhere.toml")) == (
        "error: cannot read recipe nowhere.toml: No such file or directory")


def test_an_unwritable_log_root_is_one_line(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    error = one_error(run_main(capsys, "run", QUICKSTART, "--logs", str(blocker), "--plain",
                              "--set", "stop.time_s=1"))
    assert error.startswith(f"error: {blocker / 'quickstart'}/")
    assert error.endswith(": Not a directory")


@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_prints_interrupted_the_finished_runs_and_the_log_path(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """bsp finishes; Ctrl-C arrives during asp: exit 130, "interrupted", bsp's row, the logs
    path, and asp's folder marked interrupted."""

    async def fake_run_one(spec: RunSpec, recipe: object, run_dir: Path, *_: object
                           ) -> dict[str, object]:
        made = fake_run(tmp_path / "made", "quickstart", spec.name, spec.protocol.name,
                        [0.1, 0.75])
        made.rename(run_dir)
        if spec.name == "asp":
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends
            await asyncio.sleep(60)
        return summarize_run(run_dir)

    monkeypatch.setattr(run_one, "_run_one", fake_run_one)
    code, out = run_main(capsys, "run", QUICKSTART, "--logs", str(tmp_path / "logs"),
                         "--plain")
    assert code == 130
    (stamp,) = (tmp_path / "logs" / "quickstart").iterdir()
    assert "interrupted" in out and f"logs: {stamp}" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["bsp", "bsp", "2.0", "-", "0.750", "1.00x", "0.65", "16", "1.50"] in rows
    assert not any(row[:1] == ["asp"] for row in rows)
    assert json.loads((stamp / "bsp" / "summary.json").read_text())["best_accuracy"] == 0.75
    assert json.loads((stamp / "asp" / "summary.json").read_text())["interrupted"] is True


def test_check_prints_one_row_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_main(capsys, "check", str(ROOT / "recipes" / "wan.toml"))
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()]
    assert ["bsp", "bsp", "4", "1,1,1.5,2x", "20/20M", "40ms", "synthetic", "iid", "b32", "cnn",
            "50", "s", "real"] in rows
    assert any(row[:3] == ["streaming_diloco", "streaming_diloco", "inner_steps=16"]
               for row in rows)
    assert "wan.toml: ok (5 runs, baseline bsp; data found)" in out


def test_check_takes_the_options_that_choose_runs_as_run_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_main(capsys, "check", QUICKSTART, "--clock", "virtual", "--only", "asp")
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()]
    assert any(row[:2] == ["asp", "asp"] and row[-1] == "virtual" for row in rows)
    assert not any(row[:1] == ["bsp"] for row in rows)
    assert ("quickstart.toml: ok (1 run, no baseline: bsp is not among the runs, so no "
            "speedups; data found)") in out
    assert one_error(run_main(capsys, "check", QUICKSTART, "--repeats", "0")).endswith(
        "--repeats: must be >= 1, got 0")


def test_check_and_run_find_missing_data_before_any_folder(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = ["--set", "data.name=mnist", "--set", f"data.root={tmp_path / 'data'}"]
    code, out = run_main(capsys, "check", QUICKSTART, *missing)
    assert code == 2 and out.splitlines()[-1].startswith(
        f"error: {QUICKSTART}: bsp: data.root: mnist: files not found in "
        f"{tmp_path / 'data' / 'MNIST' / 'raw'}"), out
    code, out = run_main(capsys, "run", QUICKSTART, "--plain", "--logs", str(tmp_path / "logs"),
                         *missing)
    assert one_error((code, out)).startswith(
        f"error: {QUICKSTART}: bsp: data.root: mnist: files not found")
    assert not (tmp_path / "logs").exists()


def test_run_refuses_a_device_this_host_lacks_before_any_folder(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Each run failed on its own: a real run's server with a traceback in its log and "the
    server exited early" in the table. `check` notes it (a Slurm node may have it)."""
    device = ["--set", 'device="cuda:99"']  # no host here has 100 GPUs
    for clock in ("real", "virtual"):
        code, out = run_main(capsys, "run", QUICKSTART, "--plain", "--clock", clock,
                             "--logs", str(tmp_path / "logs"), *device)
        assert one_error((code, out)).startswith(
            f"error: {QUICKSTART}: device: device 'cuda:99' requested but "), out
        assert "(runs: bsp, asp)" in out
        assert not (tmp_path / "logs").exists()
    code, out = run_main(capsys, "check", QUICKSTART, *device)
    assert code == 0 and f"note: {QUICKSTART}: device: device 'cuda:99' requested but " in \
        " ".join(out.split())


def test_protocols_prints_toml_values_own_parameters_first(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_main(capsys, "protocols")
    assert code == 0
    block = out.split("\nlocal_sgd:")[1].split("\nnbsync:")[0].splitlines()[1:]
    names = [line.split()[0] for line in block]
    assert names[:2] == ["local_steps", "mu"]  # its own, then the shared server optimizer's
    assert "    bias_correction = true  # " in out
    assert "    server_lr (no default: unset)  # " in out
    assert "True" not in out and "None" not in out and "'sgd'" not in out


def test_report_without_the_recipes_baseline_compares_with_the_first_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A study run with --only asp has no bsp: the report says so and goes on."""
    run_dir = fake_run(tmp_path, "r", "asp", "asp", [0.1, 0.6])
    recipe = run_dir.parent / "recipe.json"
    recipe.write_text(json.dumps({"name": "r", "baseline": "bsp", "runs": []}))
    code, out = run_main(capsys, "report", str(tmp_path / "r"))
    assert code == 0, out
    assert "the recipe's baseline bsp is not among these runs: speedups against asp" in out


def test_report_on_one_swept_run_without_its_baseline_compares_with_that_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One sweep point of asp reported alone: the speedups are against that run, and the
    table has that baseline (it used to look for 'asp@workers=4@workers=4')."""
    run_dir = fake_run(tmp_path, "r", "asp@workers=4", "asp", [0.1, 0.6], repeat=1)
    recipe = json.loads((run_dir / "recipe.json").read_text())
    recipe["runs"][0]["sweep"] = {"workers": 4}
    (run_dir / "recipe.json").write_text(json.dumps(recipe))
    (run_dir.parent / "recipe.json").write_text(json.dumps({"name": "r", "baseline": "bsp",
                                                             "runs": []}))
    write_summary(run_dir, summarize_run(run_dir))
    code, out = run_main(capsys, "report", str(run_dir))
    assert code == 0, out
    assert ("the recipe's baseline bsp is not among these runs: speedups against asp\n"
            in out)
    assert "r: comparison (baseline asp)" in out
    assert ["asp@workers=4", "asp", "2.0", "-", "0.600", "1.00x"] in [
        line.split()[:6] for line in out.splitlines()]


def test_report_leaves_out_an_interrupted_run(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    cut = fake_run(tmp_path / "x", "r", "asp", "asp", [0.1])
    cut = cut.rename(tmp_path / "r" / "20260101-000000" / "asp")
    (cut / "summary.json").write_text(json.dumps({"run": "asp", "interrupted": True,
                                                 "error": "interrupted (Ctrl-C)"}))
    code, out = run_main(capsys, "report", str(tmp_path / "r"))
    assert code == 0, out
    assert f"{cut}: left out, it was interrupted (Ctrl-C)" in " ".join(out.split())
    assert not any(line.split()[:1] == ["asp"] for line in out.splitlines())


@pytest.mark.parametrize(("argv", "line"), [
    (["run", "recipes/quickstart.toml", "--clock", "virtaul"],
     "error: asyncsync run: argument --clock: invalid choice: 'virtaul'"),
    (["run"], "error: asyncsync run: the following arguments are required: recipe"),
    (["rnu"], "error: asyncsync: argument command: invalid choice: 'rnu'"),
])
def test_a_bad_command_line_is_one_error_line(capsys: pytest.CaptureFixture[str],
                                             argv: list[str], line: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == ""
    (printed,) = captured.out.strip().splitlines()
    assert printed.startswith(line) and printed.endswith(" --help)")
