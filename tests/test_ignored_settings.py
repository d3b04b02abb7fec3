"""Settings that would be silently ignored are refused with a message that says so: a
per-worker list longer than the workers, a ``--set`` that every run overrides, a protocol
that does not exist; ``check`` shows the rule for a shorter slowdown list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync.schema import ConfigError
from asyncsync.study.describe import check_table
from asyncsync.study.recipe import load_recipe

QUICKSTART = Path(__file__).parent.parent / "recipes" / "quickstart.toml"


@pytest.mark.parametrize(("overrides", "message"), [
    (["workers=2"], "compute.slowdown: 4 entries for 2 workers: entries past worker 1 would "
                    "be ignored"),
    (["workers=2", "compute.slowdown=[1, 3]", "network.latency_ms=[1, 2, 3]"],
     "network.latency_ms: 3 entries for 2 workers"),
    (["protocol=foo"], "--set protocol=foo: unknown protocol 'foo'"),
    (["protocol=asp"], "--set protocol=asp: every run sets protocol itself, so it would be "
                       "ignored"),
])
def test_a_setting_that_would_be_ignored_is_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(QUICKSTART, overrides)


def test_what_fits_is_accepted_and_check_shows_the_rest_at_1x() -> None:
    recipe = load_recipe(QUICKSTART, ["workers=6"])  # 4 factors: the other 2 run at 1x
    assert [spec.compute.build(rank, 6, 0).factor_at(0.0) for rank in range(6)
            for spec in recipe.runs[:1]] == [1, 1, 1, 3, 1, 1]
    console = Console(width=200, record=True, color_system=None)
    console.print(check_table(recipe))
    assert "1,1,1,3 +2 at 1x" in console.export_text()
    fitted = load_recipe(QUICKSTART, ["workers=2", "compute.slowdown=[1, 3]"])
    assert fitted.runs[0].compute.slowdown == [1, 3]
