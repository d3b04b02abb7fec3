"""A round policy asked of a protocol without the SDK's round barrier is refused with the
reason (the protocol has no such rounds), not as an unknown key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.protocols.base import (
    Context,
    Params,
    Protocol,
    Push,
    ServerRule,
    WorkerLoop,
    discover,
    get_protocol,
    no_round_policies,
    option,
)
from asyncsync.protocols.rounds import CUTOFF_OPTIONS
from asyncsync.protocols.testing import FakeStore
from asyncsync.schema import ConfigError, describe, from_mapping
from asyncsync.study.recipe import load_recipe

WITHOUT_POLICIES = ("asp", "ssp", "dcasgd", "dssync", "easgd", "easgd_async", "fedasync",
                    "wbsp", "wbsp_opt", "lbbsp", "esync", "nbsync", "overlap_local_sgd")
"""The protocols whose rounds do not close at the SDK's round barrier (or have none)."""


def test_the_sdk_refuses_exactly_the_round_barriers_policies() -> None:
    assert set(no_round_policies("p", "why")) == CUTOFF_OPTIONS


@pytest.mark.parametrize("name", WITHOUT_POLICIES)
@pytest.mark.parametrize("key", ["deadline_s", "backup_workers", "overcommit",
                                 "deadline_quantile"])
def test_a_round_policy_is_refused_with_the_reason(name: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(discover()[name].params, {key: 1}, "protocol")
    message = str(caught.value)
    assert message.startswith(f"protocol.{key}: not offered by ")
    assert "unknown key" not in message and "round barrier" in message


@pytest.mark.parametrize("name", WITHOUT_POLICIES)
def test_the_refused_keys_are_not_listed_and_defaults_still_build(name: str) -> None:
    protocol = get_protocol(name)
    assert not {row[0] for row in describe(protocol.params)} & CUTOFF_OPTIONS
    protocol.server(protocol.make_params({}, 4), FakeStore(torch.zeros(6), 4))


def test_a_program_passing_protocol_params_gets_the_reason() -> None:
    with pytest.raises(ValueError, match=r"deadline_s: not offered by lbbsp \(its rounds"):
        get_protocol("lbbsp").make_params({"deadline_s": 2.0})


def test_a_recipe_names_the_key_and_reason(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[[runs]]\nname = "a"\nworkers = 2\n'
                      'protocol = { name = "asp", deadline_s = 2.0 }\n')
    with pytest.raises(ConfigError, match=r"protocol\.deadline_s: not offered by asp \(it"):
        load_recipe(recipe)


@dataclass(frozen=True)
class _OwnParams(Params):
    """An author's parameters, as docs/writing-a-protocol.md shows them."""

    NOT_OFFERED = no_round_policies("my_protocol", "it has no rounds: each push is applied "
                                    "on arrival")

    every: int = option(4, lambda v: v >= 1, "must be >= 1", "k")


def test_an_authors_protocol_refuses_round_policies_with_its_reason() -> None:
    protocol = Protocol("my_protocol", "s", _OwnParams, _Rule, _Loop)
    assert protocol.make_params({"every": 2}).every == 2
    with pytest.raises(ValueError, match=r"^protocol_params\.overcommit: not offered by "
                                         r"my_protocol \(it has no rounds: each push"):
        protocol.make_params({"overcommit": 0.5})
    with pytest.raises(ValueError, match=r"protocol_params\.evry: unknown key"):
        protocol.make_params({"evry": 2})  # a key it does not name is still unknown


class _Rule(ServerRule[_OwnParams]):
    push_kinds = frozenset({"delta"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        return {}


class _Loop(WorkerLoop[_OwnParams]):
    async def run(self, ctx: Context) -> None:
        await ctx.steps(1)
