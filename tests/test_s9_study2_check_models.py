"""``asyncsync check`` builds a recipe's own model once per dataset shape and refuses one
whose outputs do not fit the dataset's classes, naming the recipe file, the run and the
key, before any run starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import check_models
from tests.test_cli import one_error, run_main

MODEL = """import torch.nn as nn

BUILT = []


def build(input_shape, num_classes, classes=None):
    BUILT.append((tuple(input_shape), num_classes))
    size = 1
    for dim in input_shape:
        size *= dim
    return nn.Sequential(nn.Flatten(), nn.Linear(size, classes or num_classes))
"""

RECIPE = """
baseline = "a"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 5
[defaults.model]
name = "{module}:build"
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
[[runs]]
name = "c"
protocol = "ssp"
model = {{ name = "{module}:build", options = {{ classes = 3 }} }}
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
           ) -> str:
    """A model module of the test's own name, importable from `tmp_path`."""
    name = f"s9_study2_model_{request.node.name.replace('[', '_').replace(']', '')}"
    (tmp_path / f"{name}.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_a_model_that_does_not_fit_the_classes_is_refused_naming_file_run_and_key(
        tmp_path: Path, module: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(RECIPE.format(module=module))
    with pytest.raises(ConfigError) as err:
        check_models(load_recipe(path))
    assert str(err.value).startswith(
        f"{path}: c: model: model '{module}:build' gives outputs of shape (2, 3) for 2 "
        "samples; the dataset has 10 classes, so (2, 10) expected")
    # runs a and b share one model and shape: built once, then c's
    assert sys.modules[module].BUILT == [((1, 32, 32), 10)] * 2


def test_check_refuses_it_in_one_error_line(tmp_path: Path, module: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(RECIPE.format(module=module))
    assert one_error(run_main(capsys, "check", str(path), "--only", "c")).startswith(
        f"error: {path}: c: model: model '{module}:build' gives outputs of shape (2, 3)")
    assert main_ok(capsys, str(path))


def main_ok(capsys: pytest.CaptureFixture[str], path: str) -> bool:
    """Whether ``check`` passes the recipe without its run c (its model fits)."""
    code, out = run_main(capsys, "check", path, "--only", "a", "--only", "b")
    return code == 0 and ": ok (2 runs" in out
