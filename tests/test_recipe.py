"""Recipe loading: overrides, run selection, and errors that name the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

QUICKSTART = Path(__file__).parent.parent / "recipes" / "quickstart.toml"

BASE = """
baseline = "a"
[defaults]
workers = 2
[defaults.stop]
time_s = 10
[[runs]]
name = "a"
protocol = "bsp"
[[runs]]
name = "b"
protocol = "asp"
workers = 3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def test_quickstart_resolves() -> None:
    recipe = load_recipe(QUICKSTART)
    assert recipe.name == "quickstart"
    assert [r.protocol.name for r in recipe.runs] == ["bsp", "asp"]
    assert recipe.runs[0].compute_profile(3).factor_at(0.0) == 3.0
    assert recipe.runs[0].compute_profile(0).factor_at(0.0) == 1.0


def test_run_overrides_defaults_and_set_overrides_defaults(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, BASE), ["stop.time_s=4.5", "model.name=mlp"])
    a, b = recipe.runs
    assert (a.workers, b.workers) == (2, 3)
    assert a.stop.time_s == b.stop.time_s == 4.5
    assert a.model.name == "mlp"


def test_only_selects_runs(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, BASE), only=["b"])
    assert [r.name for r in recipe.runs] == ["b"]
    with pytest.raises(ConfigError, match="no run named 'z'"):
        load_recipe(write(tmp_path, BASE), only=["z"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (["stop.time_s=-1"], "defaults.stop.time_s: must be > 0, got -1"),
        (["stop.tme_s=3"], "defaults.stop.tme_s: unknown key"),
        (["workers='two'"], "defaults.workers: expected int, got 'two'"),
        (["data.batch_size=true"], "defaults.data.batch_size: expected int, got True"),
        (["compute.slowdown=[1, 0.5]"], "defaults.compute.slowdown: factors must be >= 1"),
        (["data.partition='zipf'"], "defaults.data.partition: must be one of"),
        (["optim.momentum=1.5"], "defaults.optim.momentum: must be in [0, 1)"),
        (["nonsense"], "expected KEY=VALUE"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, edit: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, BASE), edit)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE.replace('workers = 3', 'workers = 0'), "runs[1] (b).workers: must be > 0"),
        (BASE.replace('protocol = "asp"', 'protocol = "zzz"'),
         "runs[1] (b).protocol: unknown protocol 'zzz'"),
        (BASE.replace('protocol = "asp"', 'protocol = { name = "asp", s = 1 }'),
         "runs[1] (b).protocol.s: unknown key"),
        (BASE.replace('baseline = "a"', 'baseline = "q"'), "baseline: 'q' is not a run"),
        (BASE + '[[runs]]\nname = "a"\nprotocol = "bsp"\n', "duplicate run names"),
        (BASE + '[[runs]]\nname = "c"\n', "runs[2] (c).protocol: every run needs a protocol"),
        (BASE + 'extra = 1\n', "runs[1] (b).extra: unknown key"),
        ("colour = 1\n" + BASE, "colour: unknown top-level key"),
        (BASE.replace("[defaults.stop]", "[defaults.stopp]"), "defaults.stopp: unknown key"),
        ("[[runs]]\nprotocol = 'bsp'\n", "runs[0].name: every run needs a name"),
        ("[[runs]]\nname = 'a/b'\nprotocol = 'bsp'\n", "name: must be a non-empty name without"),
        ("x = [", "not valid TOML"),
        (BASE.replace("[defaults]", '[defaults]\ndevice = "tpu"'),
         "defaults.device: must be auto, cpu, cuda or cuda:i, got 'tpu'"),
        (BASE.replace("[defaults]", '[defaults.model]\nname = "resnet"\n[defaults]'),
         "defaults.model.name: must be one of mlp, cnn, resnet18, timing, or "
         "package.module:callable, got 'resnet'"),
        (BASE + '[sweep]\nworkers = [2, "four"]\n', "sweep.workers: expected int, got 'four'"),
        (BASE + "[sweep]\nworkerz = [2, 4]\n", "sweep.workerz: unknown key"),
        (BASE.replace('protocol = "bsp"', 'protocol = "bsp"\nworkers = 2')
         + "[sweep]\nworkers = [2, 4]\n",
         "sweep.workers: every run sets workers itself, so the sweep would change nothing"),
        (BASE.replace("[defaults.stop]", "[defaults.sweep]\nworkers = [2, 4]\n[defaults.stop]"),
         "defaults.sweep: unknown key (a sweep is the recipe's top-level [sweep] table)"),
        (BASE + "sweep = { workers = [2, 4] }\n", "runs[1] (b).sweep: unknown key"),
        (BASE.replace('protocol = "asp"',
                      'protocol = { name = "fedavg", deadline_s = 1, deadline_quantile = 0.5 }'),
         "runs[1] (b).protocol: deadline_s and deadline_quantile: choose one kind"),
        (BASE.replace("[defaults]", '[defaults]\nprotocol = { name = "fedavg", deadline_s = 1, '
                      'deadline_quantile = 0.5 }').replace('protocol = "bsp"\n', ""),
         "defaults.protocol: deadline_s and deadline_quantile: choose one kind"),
        (BASE.replace('protocol = "asp"', 'protocol = { name = "bsp", backup_workers = 3 }'),
         "runs[1] (b): protocol.backup_workers: must be < workers (3), got 3"),
        (BASE.replace('protocol = "asp"', 'protocol = { name = "fedbuff", deadline_s = 1 }'),
         "runs[1] (b).protocol: deadline_s: not offered by fedbuff"),
        (BASE.replace('protocol = "asp"',
                      'protocol = { name = "fedavg", deadline_window = 5 }'),
         "runs[1] (b).protocol: deadline_window: only an adaptive deadline"),
    ],
)
def test_malformed_recipes_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, text))
    assert message in str(err.value)


def test_an_error_names_the_recipe_file(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("workers = 3", "workers = 0"))
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    assert str(err.value).startswith(f"{path}: runs[1] (b).workers: must be > 0")


def test_options_that_would_change_nothing_name_the_option(tmp_path: Path) -> None:
    swept = write(tmp_path, BASE + "[sweep]\n'stop.time_s' = [5, 10]\n")
    assert [r.name for r in load_recipe(swept).runs][:2] == ["a@stop.time_s=5", "b@stop.time_s=5"]
    with pytest.raises(ConfigError, match=r"--set stop\.time_s=3: the sweep sets stop\.time_s"):
        load_recipe(swept, ["stop.time_s=3"])
    with pytest.raises(ConfigError, match=r"--set stop=.*: the sweep sets stop\.time_s"):
        load_recipe(swept, ["stop={ time_s = 3 }"])
    with pytest.raises(ConfigError, match="--repeats: must be >= 1, got 0"):
        load_recipe(write(tmp_path, BASE), repeats=0)


def test_a_file_that_is_not_a_recipe_table_is_named(tmp_path: Path) -> None:
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'name = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{latin}: not UTF-8 text")):
        load_recipe(latin)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=re.escape(
            f"{listed}: expected a table of keys at the top, got list")):
        load_recipe(listed)


def test_a_runs_written_recipe_keeps_its_sweep_point(tmp_path: Path) -> None:
    spec = load_recipe(write(tmp_path, BASE + "[sweep]\nworkers = [5]\n")).runs[0]
    written = tmp_path / "recipe.json"
    written.write_text(json.dumps({"name": "r", "baseline": "a", "runs": [spec.as_table()]}))
    assert load_recipe(written).runs == [spec]


def test_named_tables_replace_the_default_whole(tmp_path: Path) -> None:
    text = BASE.replace("[defaults.stop]", "[defaults.compute]\nprofile = { name = 'moving', "
                        "factor = 3.0, dwell_s = 2.0 }\n[defaults.stop]")
    text += "compute = { profile = { name = 'periodic', worker = 1 } }\n"
    a, b = load_recipe(write(tmp_path, text)).runs
    assert a.compute.profile["name"] == "moving"
    assert b.compute.profile == {"name": "periodic", "worker": 1}


@pytest.mark.parametrize("path", sorted((QUICKSTART.parent).rglob("*.toml")),
                         ids=lambda p: str(p.relative_to(QUICKSTART.parent)))
def test_every_shipped_recipe_is_valid(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(QUICKSTART.parent.parent)  # trace paths are relative to the root
    recipe = load_recipe(path)
    assert recipe.runs and recipe.baseline in [r.base_name for r in recipe.runs]
