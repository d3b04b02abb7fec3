"""``report --baseline`` of a swept study: a name it does not know is refused with the
names it takes, the runs' names in the recipe (it listed each sweep point's run,
``a@compute.slowdown=1,3``, which it then refused as "no such run" too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.cli import main
from asyncsync.results import plots
from tests.test_cli import run_main
from tests.test_s9_study2_sweep_folders import RECIPE


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs a and b at two sweep points, 1 virtual s each."""
    root = tmp_path_factory.mktemp("baseline")
    (root / "swept.toml").write_text(RECIPE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "write_plots", lambda *args: [])
        code = main(["run", str(root / "swept.toml"), "--logs", str(root / "logs"),
                     "--plain", "--jobs", "1"])
    assert code == 0
    (found,) = (root / "logs" / "swept").iterdir()
    return found


def test_an_unknown_baseline_is_refused_with_the_names_it_takes(
        study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for given in ("nosuch", "a@compute.slowdown=1,3"):
        code, out = run_main(capsys, "report", str(study), "--baseline", given,
                             "--out", str(tmp_path))
        assert code == 2
        assert out.strip().splitlines()[-1] == (
            f"error: --baseline {given}: no such run; runs are a, b, swept/a, swept/b "
            "(each sweep point is compared with the baseline's run at the same point)"), out


def test_each_name_it_lists_is_taken(study: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "write_plots", lambda *args: [])
    for given, shown in (("b", "b"), ("swept/b", "swept/b")):
        code, out = run_main(capsys, "report", str(study), "--baseline", given,
                             "--out", str(tmp_path))
        assert code == 0 and f"comparison (baseline {shown})" in out, out
