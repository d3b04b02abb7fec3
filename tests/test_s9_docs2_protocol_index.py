"""docs/protocols/index.md names the protocols that take the round policies, as the code does."""

from __future__ import annotations

import dataclasses
import re

from asyncsync import PROTOCOLS
from tests.doc_pages import ROOT


def _taking_backup_workers() -> set[str]:
    """Protocols whose parameters accept ``backup_workers = 1``."""
    taking = set()
    for name, protocol in PROTOCOLS.items():
        if not any(f.name == "backup_workers" for f in dataclasses.fields(protocol.params)):
            continue
        try:
            protocol.params(backup_workers=1)
        except ValueError:
            continue
        taking.add(name)
    return taking


def test_the_index_lists_every_protocol_taking_the_round_policies() -> None:
    text = (ROOT / "docs" / "protocols" / "index.md").read_text(encoding="utf-8")
    paragraph = re.search(r"The round protocols (.*?) take the SDK's round policies", text,
                          re.S)
    assert paragraph, "docs/protocols/index.md lost its paragraph on the round policies"
    named = set(re.findall(r"`(\w+)`", paragraph.group(1)))
    assert named == _taking_backup_workers()
    assert "bsp" in named and "asp" not in named
