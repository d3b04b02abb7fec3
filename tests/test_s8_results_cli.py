"""What a new user met on the command line (session 8's walk through the docs): each
mistake is one ``error:`` line and exit status 2, before anything else is printed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync.results.report import comparison_table, report_summary
from tests.test_cli import one_error, run_main
from tests.test_report import fake_run


def _study(tmp_path: Path) -> Path:
    fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7])
    return tmp_path / "r" / "20260101-000000"


def test_report_out_that_is_a_file_fails_before_the_table(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = _study(tmp_path)
    taken = tmp_path / "taken"
    taken.write_text("")
    assert one_error(run_main(capsys, "report", str(study), "--out", str(taken))) == (
        f"error: {taken}: is a file, not a folder: --out takes a folder for table.csv and "
        "the plots")
    assert one_error(run_main(capsys, "report", str(study), "--out", str(taken / "x"))
                     ).startswith(f"error: {taken / 'x'}: cannot make this folder")
    assert not (study / "table.csv").exists()


def test_report_out_in_a_folder_it_cannot_write_fails_before_the_table(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = _study(tmp_path)
    assert one_error(run_main(capsys, "report", str(study), "--out", "/proc/asyncsync")
                     ).startswith("error: /proc/asyncsync: cannot make this folder")
    assert one_error(run_main(capsys, "report", str(study), "--out", "/proc")).startswith(
        "error: /proc: cannot write into this folder")


def test_report_all_checks_every_out_folder_before_printing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = _study(tmp_path)
    later = study.parent / "20260102-000000"
    later.mkdir()
    (study / "bsp").rename(later / "bsp")
    taken = tmp_path / "out"
    taken.mkdir()
    (taken / later.name).write_text("")  # the second study's folder under --out
    assert one_error(run_main(capsys, "report", str(study.parent), "--all", "--out",
                              str(taken))).startswith(f"error: {taken / later.name}: is a file")
    assert not (taken / study.name / "table.csv").exists()


def test_a_job_count_that_is_no_number_is_named_without_internals(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert one_error(run_main(capsys, "run", "recipe.toml", "--jobs", "abc")) == (
        "error: asyncsync run: argument --jobs: expected an integer >= 1, got abc (see "
        "asyncsync run --help)")


def _rendered(summaries: list[dict[str, object]], width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(comparison_table(summaries, "bsp", "r", width))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def test_a_failed_runs_error_does_not_turn_a_table_that_fits_into_blocks(
        tmp_path: Path) -> None:
    """The error wraps inside its row; the other rows keep their one line each."""
    study = _study(tmp_path)
    summaries = [report_summary(study / name) for name in ("bsp", "asp")]
    error = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x784 and 3072x10)"
    summaries.append({**summaries[1], "run": "boom", "error": error})
    lines = _rendered(summaries, 80)
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("run "))
    assert header.split()[:3] == ["run", "protocol", "t@0.50"]  # a table, not blocks
    rows = [line.split() for line in lines]
    assert next(r for r in rows if r[:1] == ["asp"])[2:4] == ["2.0", "-"]
    boom = next(i for i, r in enumerate(rows) if r[:1] == ["boom"])
    assert rows[boom][:3] == ["boom", "asp", "failed:"]
    wrapped = "".join(w for r in rows[boom:] for w in r)  # the row's lines, then the legend
    assert wrapped.startswith("boomaspfailed:" + error.replace(" ", ""))
    wide = _rendered(summaries, 200)  # room enough: the error on its row's one line
    assert f"failed: {error}" in "\n".join(wide)


def test_a_table_too_wide_without_the_error_still_turns_into_blocks(tmp_path: Path) -> None:
    study = _study(tmp_path)
    summaries = [report_summary(study / name) for name in ("bsp", "asp")]
    summaries.append({**summaries[1], "run": "boom", "error": "x " * 40})
    lines = _rendered(summaries, 50)
    assert not any(line.lstrip().startswith("run ") for line in lines)
    assert max(map(len, lines)) <= 50


def test_report_of_one_run_folder_leaves_its_studys_table_alone(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The study's table.csv (all its runs) is not replaced by a table of one run: the
    report of a run folder goes into that folder."""
    study = _study(tmp_path)
    assert run_main(capsys, "report", str(study))[0] == 0
    whole = (study / "table.csv").read_text()
    code, out = run_main(capsys, "report", str(study / "asp"))
    assert code == 0, out
    assert (study / "table.csv").read_text() == whole
    rows = (study / "asp" / "table.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("r,asp,")
    assert f"wrote {study / 'asp' / 'table.csv'}" in out
