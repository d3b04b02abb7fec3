"""docs/populations.md's table of which protocols take the round policies agrees with the
protocols: every registered protocol is in it; one marked "all" builds a server with each
policy set, any other refuses each policy with an error that names the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from asyncsync.protocols.base import discover
from asyncsync.protocols.testing import FakeStore
from asyncsync.schema import from_mapping

PAGE = Path(__file__).resolve().parents[1] / "docs" / "populations.md"
POLICIES = {"backup_workers": 1, "overcommit": 0.3, "deadline_s": 1.5,
            "deadline_quantile": 0.9, "deadline_mad_k": 2.0}
"""One value of each round policy (the `deadline_window` key goes with an adaptive one)."""


def documented() -> dict[str, bool]:
    """Each protocol the page's table names, and whether it takes every policy ("all")."""
    text = PAGE.read_text()
    table = text[text.index("| protocol | round policies | why |"):]
    table = table[:table.index("\n\n")]
    out: dict[str, bool] = {}
    for row in table.splitlines()[2:]:
        names, policies = row.split("|")[1:3]
        for name in re.findall(r"`(\w+)`", names):
            assert name not in out, f"{name} is in the table twice"
            out[name] = policies.strip() == "all"
    return out


def takes(name: str, key: str, value: float) -> bool:
    """Whether protocol `name` builds a server with `key` set (False: refused naming it)."""
    protocol = discover()[name]
    table = {key: value, **({"deadline_window": 5} if key.startswith("deadline_") and
                            key != "deadline_s" else {})}
    try:
        params = from_mapping(protocol.params, table, "protocol")
        protocol.server(params, FakeStore(torch.zeros(6), 4))
    except ValueError as exc:
        assert key in str(exc), f"{name}: refusing {key} without naming it: {exc}"
        return False
    return True


def test_every_protocol_is_in_the_table() -> None:
    assert set(documented()) == set(discover())


@pytest.mark.parametrize("key", POLICIES)
def test_the_table_says_which_protocols_take_each_policy(key: str) -> None:
    for name, all_taken in documented().items():
        assert takes(name, key, POLICIES[key]) == all_taken, (name, key)
