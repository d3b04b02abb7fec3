"""What an embedder may pass for a protocol's parameters (`Protocol.make_params`)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncsync.protocols.base import get_protocol
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
