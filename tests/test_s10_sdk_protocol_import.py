"""A protocol in the author's own module runs from a recipe as ``module:PROTOCOL``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from asyncsync.protocols.base import PROTOCOLS, get_protocol
from asyncsync.study.recipe import load_recipe

MODULE = '''
from dataclasses import dataclass
from asyncsync.protocols.asp import AspServer, AspWorker
from asyncsync.protocols.base import Params, Protocol, option

@dataclass(frozen=True)
class OwnParams(Params):
    k: int = option(2, lambda v: v >= 1, "must be >= 1", "k")

OWN = Protocol("s10_own_protocol", "ASP with an option", OwnParams, AspServer, AspWorker)
NOT_ONE = 3
'''


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "s10_own_module.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_recipe_names_a_protocol_of_its_own_module(own_module: Path) -> None:
    recipe = own_module / "own.toml"
    recipe.write_text(textwrap.dedent('''
        name = "own"
        [defaults]
        workers = 2
        [[runs]]
        name = "own"
        protocol = { name = "s10_own_module:OWN", k = 3 }
    '''))
    (run,) = load_recipe(recipe).runs
    assert run.protocol.name == "s10_own_module:OWN" and run.protocol.params.k == 3
    protocol = get_protocol("s10_own_module:OWN")
    assert protocol.name == "s10_own_protocol"
    assert "s10_own_module:OWN" not in PROTOCOLS  # the registry lists each protocol once


@pytest.mark.parametrize(("name", "match"), [
    ("s10_own_module:MISSING", "cannot be imported.*MISSING"),
    ("s10_no_such_module:OWN", "cannot be imported.*s10_no_such_module"),
    ("s10_own_module:NOT_ONE", "is a int, not a Protocol"),
])
def test_a_name_that_is_no_protocol_is_refused_by_name(own_module: Path, name: str,
                                                       match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_protocol(name)
