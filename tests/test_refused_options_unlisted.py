"""A protocol lists only the options it takes.

`asyncsync protocols` (and the generated protocol pages) listed the round-policy keys
(backup_workers, deadline_s, overcommit, ...) under fedbuff and streaming_diloco, whose
parameters inherit them but refuse them.
"""

from __future__ import annotations

import pytest

from asyncsync.protocols import discover
from asyncsync.schema import describe
from tests.test_cli import run_main

ROUND_POLICY_KEYS = {"backup_workers", "deadline_s", "overcommit", "deadline_quantile",
                     "deadline_mad_k"}


@pytest.mark.parametrize("name", ["fedbuff", "streaming_diloco"])
def test_a_protocol_that_refuses_round_policies_does_not_list_them(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    params = discover()[name].params
    for key in ROUND_POLICY_KEYS:  # refused, as the listing now says by leaving them out
        with pytest.raises(ValueError, match=f"^{key}: not offered by"):
            params(**{key: 1})
    assert not ROUND_POLICY_KEYS & {row[0] for row in describe(params)}
    code, out = run_main(capsys, "protocols")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
    listed = set()
    for line in lines[start + 1:]:
        if not line.startswith("    "):  # the next protocol
            break
        listed.add(line.split()[0])
    assert code == 0 and listed and not ROUND_POLICY_KEYS & listed


def test_a_protocol_that_takes_round_policies_lists_them() -> None:
    assert {row[0] for row in describe(discover()["fedavg"].params)} >= ROUND_POLICY_KEYS
