"""The polynomial's exponent and the hinge's slope are two constants (Xie et al. 2019 run
the polynomial with a = 0.5 and the hinge with a = 10, b = 4)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from asyncsync.protocols.fedasync import FedAsyncParams
from asyncsync.protocols.fedbuff import FedBuffParams
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

BOTH = pytest.mark.parametrize("params", [FedAsyncParams, FedBuffParams])


@BOTH
def test_each_function_has_its_own_constant(params: Any) -> None:
    hinge = params(staleness_fn="hinge", hinge_a=10.0)
    assert [hinge.staleness_weight(d) for d in (4, 5, 6)] == [1.0, 1 / 11, 1 / 21]
    polynomial = params()  # a = 0.5, the paper's: (d + 1)^-0.5
    assert [polynomial.staleness_weight(d) for d in (0, 3, 8)] == [1.0, 0.5, 1 / 3]


@BOTH
def test_a_hinge_with_the_polynomials_exponent_says_which_key_to_write(params: Any) -> None:
    with pytest.raises(ValueError, match=r"^a: the polynomial's exponent.*hinge_a = 10\.0"):
        params(staleness_fn="hinge", a=10.0)


@BOTH
def test_a_hinge_without_its_slope_is_refused_not_given_one(params: Any) -> None:
    with pytest.raises(ValueError, match=r"^hinge_a: required with staleness_fn = 'hinge'"):
        params(staleness_fn="hinge", b=2)


@BOTH
@pytest.mark.parametrize("fn", ["constant", "polynomial"])
def test_a_hinge_slope_for_another_function_is_refused(params: Any, fn: str) -> None:
    with pytest.raises(ValueError, match=rf"^hinge_a: not used by the '{fn}'"):
        params(staleness_fn=fn, hinge_a=4.0)


def test_an_old_hinge_recipe_stops_at_check_with_file_and_key(tmp_path: Path) -> None:
    recipe = tmp_path / "old.toml"
    recipe.write_text(textwrap.dedent('''
        name = "old"
        [[runs]]
        name = "hinged"
        protocol = { name = "fedasync", staleness_fn = "hinge", a = 10.0, b = 4 }
    '''))
    with pytest.raises(ConfigError, match=r"old\.toml.*hinged.*a: .*hinge_a = 10\.0"):
        load_recipe(recipe)
