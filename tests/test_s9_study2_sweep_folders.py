"""A sweep over lists or tables names its runs' folders so that a shell takes their paths
unquoted, each point its own; a report over a study written before (its folders named
``bsp@compute.slowdown=[1, 3]``) tables as one written now."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from asyncsync.results import plots
from asyncsync.results.studies import upgrade_sweep_names
from asyncsync.runlog.reading import legacy_sweep_suffix, sweep_suffix
from asyncsync.study.recipe import load_recipe
from tests.test_cli import run_main

RECIPE = """
name = "swept"
baseline = "a"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 1
[defaults.model]
name = "mlp"
[defaults.data]
name = "synthetic"
[defaults.compute]
base_step_s = 0.05
[[runs]]
name = "a"
protocol = "bsp"
[[runs]]
name = "b"
protocol = "asp"
[sweep]
"compute.slowdown" = [[1, 3], [1, 2]]
"""


@pytest.mark.parametrize(("values", "points"), [
    ("[[1, 3], [1, 2], [1, 2.5e5], [13]]", 4),
    ('[{ name = "moving", factor = 3.0, dwell_s = 2.0 }, '
     '{ name = "moving", factor = 3.0, dwell_s = 20.0 }]', 2)])
def test_list_and_table_points_name_safe_distinct_folders(tmp_path: Path, values: str,
                                                          points: int) -> None:
    key = "compute.profile" if "name" in values else "compute.slowdown"
    text = RECIPE.replace('"compute.slowdown" = [[1, 3], [1, 2]]', f'"{key}" = {values}')
    (tmp_path / "r.toml").write_text(text)
    names = [spec.name for spec in load_recipe(tmp_path / "r.toml").runs]
    assert all(shlex.quote(name) == name for name in names), names
    assert len(set(names)) == len(names) == 2 * points
    assert names[0].startswith("a@" + key + "=") and names[1].startswith("b@" + key + "=")
    if key == "compute.slowdown":  # a list of numbers reads as itself
        assert names[:2] == ["a@compute.slowdown=1,3", "b@compute.slowdown=1,3"]


def _legacy(study: Path) -> Path:
    """A copy of `study` as asyncsync wrote it before 2026-11-27: its swept runs' names
    (folders, recipe.json, summary.json) with `legacy_sweep_suffix`."""
    old = study.parent / "old" / study.name
    shutil.copytree(study, old)
    table = json.loads((old / "recipe.json").read_text())
    for spec in table["runs"]:
        base = spec["name"].removesuffix(sweep_suffix(spec["sweep"]))
        new, spec["name"] = spec["name"], base + legacy_sweep_suffix(spec["sweep"])
        run_dir = (old / new).rename(old / spec["name"])
        for file in ("recipe.json", "summary.json"):
            written = json.loads((run_dir / file).read_text())
            if file == "recipe.json":
                written["runs"][0]["name"] = spec["name"]
            else:
                written["run"] = spec["name"]
            (run_dir / file).write_text(json.dumps(written))
    (old / "recipe.json").write_text(json.dumps(table))
    return old


def test_a_report_of_an_old_study_tables_as_a_new_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(Its plots are not drawn: they take seconds, and are another test's.)"""
    monkeypatch.setattr(plots, "write_plots", lambda *args: [])
    (tmp_path / "swept.toml").write_text(RECIPE.replace(
        "time_s = 1", "time_s = 1\ntarget_accuracy = 0.11").replace(
        '[[runs]]\nname = "b"\nprotocol = "asp"\n', ""))
    code, out = run_main(capsys, "run", str(tmp_path / "swept.toml"), "--logs",
                         str(tmp_path / "logs"), "--plain", "--jobs", "1")
    assert code == 0, out
    (study,) = (tmp_path / "logs" / "swept").iterdir()
    assert sorted(p.name for p in study.iterdir() if p.is_dir()) == [
        "a@compute.slowdown=1,2", "a@compute.slowdown=1,3"]
    old = _legacy(study)
    assert (old / "a@compute.slowdown=[1, 3]" / "summary.json").is_file()
    code, new_table = run_main(capsys, "report", str(study), "--out", str(tmp_path / "n"))
    assert code == 0, new_table
    code, old_table = run_main(capsys, "report", str(old), "--out", str(tmp_path / "o"))
    assert code == 0, old_table
    # each point's run is its own baseline: found, also in the old study
    rows = [line for line in new_table.splitlines() if line.strip().startswith("a@")]
    assert len(rows) == 2 and all(" 1.00x " in row for row in rows), new_table
    assert old_table.replace(str(old), str(study)).replace(
        str(tmp_path / "o"), str(tmp_path / "n")) == new_table
    # --resume of the old study: its runs take their new names, and are all done
    code, out = run_main(capsys, "run", str(tmp_path / "swept.toml"), "--resume", str(old),
                         "--plain", "--jobs", "1")
    assert code == 0 and f"resuming {old}: 2 of 2 runs done, 0 to run" in out, out
    assert sorted(p.name for p in old.iterdir() if p.is_dir()) == [
        "a@compute.slowdown=1,2", "a@compute.slowdown=1,3"]
    assert upgrade_sweep_names(old) == []  # done once, by the resume
