"""Malformed recipes, as `asyncsync run` meets them: a wrong type at every level, an
unknown key in a sweep or a ``--set``. Each is one ``error:`` line naming the file, the key
and the problem (exit status 2, no traceback), and the log root stays untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main

RUN = '[[runs]]\nname = "a"\nprotocol = "bsp"\n'
TOP = 'baseline = "a"\n[defaults]\nworkers = 2\nclock = "virtual"\nmodel = {name = "mlp"}\n'
HEAD = TOP + "stop = {time_s = 1}\n"

CASES = [  # (recipe text, --set items, the key named, the problem)
    ('baseline = "a"\ndefaults = "x"\n' + RUN, [], "defaults", "expected a table"),
    (TOP + 'stop = "x"\n' + RUN, [], "defaults.stop", "expected a table, got 'x'"),
    (HEAD + RUN + "model = 3\n", [], "runs[0] (a).model", "expected a table, got 3"),
    (HEAD + RUN + "[[runs.stop]]\ntime_s = 3\n", [], "runs[0] (a).stop",
     "expected a table, got [{'time_s': 3}]"),
    (HEAD + '[runs]\nname = "a"\nprotocol = "bsp"\n', [], "runs",
     "one table [runs]; write each run as a [[runs]] table"),
    ('runs = "a"\n' + HEAD, [], "runs", "expected [[runs]] tables, got 'a'"),
    ("repeat = 3\n" + HEAD + RUN, [], "repeat",
     "unknown top-level key (a run's own recipe.json says which repeat it is); for "
     "every run 3 times: repeats = 3"),
    (HEAD + RUN + "[sweep]\nbogus = [1, 2]\n", [], "sweep.bogus", "unknown key"),
    (HEAD + RUN + '[sweep]\n"stop.bogus" = [1, 2]\n', [], "sweep.stop.bogus",
     "unknown key (known: time_s"),
    (TOP + RUN + '[sweep]\n"stop.time_s.x" = [1, 2]\n', [], "sweep.stop.time_s",
     "expected float, got a table {'x': 1}: there is no key sweep.stop.time_s.x"),
    (HEAD + RUN + '[sweep]\n"stop.time_s.x" = [1, 2]\n', [], "sweep stop.time_s.x",
     "defaults.stop.time_s is not a table"),
    (HEAD + RUN + "[sweep]\nworkers = 3\n", [], "sweep.workers",
     "expected a non-empty list"),
    (HEAD + RUN, ["stop.bogus=1"], "defaults.stop.bogus",
     "unknown key (known: time_s, target_accuracy, stop_at_target, patience_s); set by "
     "--set stop.bogus=1"),
    (HEAD + RUN, ["nothere.deep=1"], "defaults.nothere", "unknown key (known: name"),
    (HEAD + RUN, ["workers=two"], "defaults.workers",
     "expected int, got 'two'; set by --set workers=two"),
    (TOP + RUN, ["stop.time_s.x=1"], "defaults.stop.time_s",
     "expected float, got a table {'x': 1}: there is no key defaults.stop.time_s.x; set "
     "by --set stop.time_s.x=1"),
    (HEAD + RUN, ["workers=[1,"], "--set workers=[1,", "not a TOML value"),
    (HEAD + RUN, ["workers"], "--set 'workers'", "expected KEY=VALUE"),
    (HEAD + RUN + '[[runs]]\nname = "a"\nprotocol = "asp"\n', [], "runs",
     "duplicate run names ['a']"),
    (HEAD + RUN + '[[runs]]\nname = "a"\nprotocol = "asp"\n[sweep]\nworkers = [2, 3]\n', [],
     "runs", "duplicate run names ['a'] (the recipe's, before the sweep names them)"),
]


@pytest.mark.parametrize(("text", "sets", "key", "problem"), CASES)
def test_a_malformed_recipe_is_one_error_line_naming_file_and_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, sets: list[str],
        key: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    logs = tmp_path / "logs"
    options = [item for edit in sets for item in ("--set", edit)]
    message = one_error(run_main(capsys, "run", str(path), "--plain", "--logs", str(logs),
                                 *options))
    assert message.startswith(f"error: {path}: {key}: {problem}"), message
    assert not logs.exists()
