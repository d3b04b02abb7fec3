"""A compressed push of a kind no worker compresses (a model push, a control variate) is
refused with a 4xx and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import BadRequest
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.codecs import COMPRESSED_KINDS, encode
from tests.helpers import tiny_model


@pytest.mark.parametrize(("protocol", "kind"), [("fedasync", "model"), ("scaffold", "control")])
async def test_a_compressed_push_of_a_kind_never_compressed_is_refused(protocol: str,
                                                                        kind: str) -> None:
    assert kind not in COMPRESSED_KINDS
    core = build_core(tiny_model(), protocol, 1, ServerSettings(lr=0.1))
    transport = LocalTransport(core)
    who = {"worker": 0, "run_id": "run"}
    reply, _ = await transport.request("join", who)
    who["session"] = reply["meta"]["session"]
    before = core.store.w.clone()
    payload, codec = encode("topk", torch.randn(core.store.numel), fraction=0.01)
    with pytest.raises(BadRequest, match=f"a '{kind}' push is never compressed"):
        await transport.request("push", {**who, "base_version": 0, "kind": kind, "steps": 1,
                                          "samples": 16, "codec": codec}, payload)
    assert torch.equal(core.store.w, before) and core.store.version == 0
    await core.close()
