"""What an embedder may pass for a protocol's parameters (`Protocol.make_params`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from asyncsync.protocols.asp import AspServer, AspWorker
from asyncsync.protocols.base import Params, Protocol, get_protocol, option
from asyncsync.protocols.fedasync import FedAsyncParams
from asyncsync.protocols.fedbuff import FedBuffParams


def test_make_params_takes_none_an_instance_or_a_dict_of_options() -> None:
    fedasync = get_protocol("fedasync")
    assert fedasync.make_params() == FedAsyncParams()
    given = FedAsyncParams(alpha=0.3)
    assert fedasync.make_params(given) is given
    assert fedasync.make_params({"alpha": 0.3, "local_steps": 2}) == FedAsyncParams(
        alpha=0.3, local_steps=2)


@pytest.mark.parametrize(("given", "match"), [
    (FedBuffParams(), r"^protocol_params: protocol 'fedasync' takes a FedAsyncParams.*"
                      r"got FedBuffParams"),
    ("alpha=0.3", r"^protocol_params: .*got str"),
    ({"alpah": 0.3}, r"protocol_params\.alpah: unknown key"),
    ({"alpha": 3.0}, r"protocol_params\.alpha: must be in \(0, 1\]"),
])
def test_other_parameters_are_refused_by_name(given: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_protocol("fedasync").make_params(given)


@dataclass(frozen=True)
class RankParams(Params):
    rank: int = option(0, lambda v: v >= 0, "must be >= 0", "a rank that must exist")

    def check_workers(self, workers: int) -> None:
        if self.rank >= workers:
            raise ValueError(f"rank: {self.rank} is not a rank of {workers} workers")


RANKED = Protocol("s10_ranked", "ASP with a rank option", RankParams, AspServer, AspWorker)


def test_with_the_runs_size_the_parameters_are_judged_against_it() -> None:
    with pytest.raises(ValueError, match=r"^rank: 3 is not a rank of 2 workers"):
        RANKED.make_params({"rank": 3}, workers=2)
    assert RANKED.make_params({"rank": 1}, workers=2) == RankParams(rank=1)
    assert RANKED.make_params({"rank": 3}) == RankParams(rank=3)  # no size: not judged
    assert get_protocol("fedasync").make_params(None, workers=3) == FedAsyncParams()


def test_a_base_class_of_the_parameters_is_made_into_them_with_their_checks() -> None:
    from asyncsync.protocols.easgd import EasgdParams, EasgdSyncParams

    made = get_protocol("easgd").make_params(EasgdParams(alpha=0.2), workers=4)
    assert type(made) is EasgdSyncParams and made.alpha == 0.2
    with pytest.raises(ValueError, match=r"^alpha: N alpha = 8 x 0.2 exceeds 1"):
        get_protocol("easgd").make_params(EasgdParams(alpha=0.2), workers=8)
