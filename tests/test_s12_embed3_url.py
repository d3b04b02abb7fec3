"""A server on an IPv6 address gives a URL its workers can dial (docs/embedding.md)."""

from __future__ import annotations

import socket

import pytest
import torch
from torch import nn

from asyncsync import ParameterServer
from asyncsync.transport.http_client import HttpTransport


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback")
async def test_an_ipv6_hosts_url_carries_the_address_in_brackets() -> None:
    torch.manual_seed(0)
    server = ParameterServer(nn.Linear(4, 2), "asp", 1, host="::1")
    async with server:
        assert server.url == f"http://[::1]:{server.port}"  # RFC 3986's form of the host
        transport = HttpTransport(server.url, numel=10)
        try:
            reply, _ = await transport.request("status", {})
        finally:
            await transport.close()
    assert "workers" in reply
