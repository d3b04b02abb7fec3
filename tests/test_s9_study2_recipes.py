"""Recipe errors that say what is wrong: a NaN or an infinity in any float option, a
sweep that repeats a value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

BASE = """
baseline = "a"
[defaults]
workers = 2
[defaults.stop]
time_s = 10
[[runs]]
name = "a"
protocol = "bsp"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", ["stop.time_s", "optim.lr", "optim.momentum",
                                 "compute.slowdown"])
def test_a_nan_is_named_as_not_a_number_in_any_float_option(tmp_path: Path,
                                                            key: str) -> None:
    value = "[1.0, nan]" if key == "compute.slowdown" else "nan"
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, BASE), [f"{key}={value}"])
    assert f"defaults.{key}: must be a number, got nan (not a number" in str(err.value)


@pytest.mark.parametrize("value", ["inf", "-inf"])
def test_an_infinity_is_named_as_not_finite(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=f"defaults.stop.time_s: must be a finite number, "
                                          f"got {value}"):
        load_recipe(write(tmp_path, BASE), [f"stop.time_s={value}"])


@pytest.mark.parametrize(("values", "shown"), [("[4, 4]", "4"), ("[2, 3, 2]", "2"),
                                               ("[[1, 2], [1, 2]]", "[1, 2]")])
def test_a_repeated_sweep_value_is_named_with_its_key(tmp_path: Path, values: str,
                                                      shown: str) -> None:
    key = "compute.slowdown" if "[[" in values else "workers"
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, f"{BASE}[sweep]\n\"{key}\" = {values}\n"))
    assert f"sweep.{key}: the value {shown} is listed twice" in str(err.value)


@pytest.mark.parametrize(("edit", "message"), [
    (".workers=3", "--set .workers: a dotted key with an empty part"),
    ("stop..time_s=3", "--set stop..time_s: a dotted key with an empty part"),
    ("stop.=3", "--set stop.: a dotted key with an empty part"),
    ("defaults.workers=3", "--set defaults.workers: a key of [defaults] is written without "
                           "'defaults.': --set workers=..."),
])
def test_a_set_key_a_user_might_write_is_named_with_its_fix(tmp_path: Path, edit: str,
                                                            message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, BASE), [edit])
    assert message in str(err.value)


def test_a_sweep_key_with_an_empty_part_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("sweep stop..time_s: a dotted key with "
                                                    "an empty part")):
        load_recipe(write(tmp_path, BASE + '[sweep]\n"stop..time_s" = [1, 2]\n'))


def test_workers_beyond_any_host_are_refused_at_once(tmp_path: Path) -> None:
    """(It hung: resolving the run walks every worker's link.)"""
    with pytest.raises(ConfigError, match=re.escape(
            "defaults.workers: must be > 0 and at most 1000000, got 99999999999999999999")):
        load_recipe(write(tmp_path, BASE), ["workers=99999999999999999999"])


@pytest.mark.parametrize("name", ["a b", "a@workers=3", "a'b", "a[1]", "a$b"])
def test_a_run_name_a_shell_would_need_quoted_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, BASE.replace('name = "a"', f"name = {name!r}")))
    assert f"runs[0] ({name}).name: letters, digits and ._+,=- only" in str(err.value)
