"""The keys each partition reads, as docs/populations.md's partition table lists them, are
the ones `unused_keys` lets through; every other partition key is named as unused."""

from __future__ import annotations

import re
from pathlib import Path

from asyncsync.hetero.partition import PARTITIONS, unused_keys

PAGE = Path(__file__).resolve().parents[1] / "docs" / "populations.md"
KEYS = ("alpha", "classes_per_worker", "sigma")


def documented() -> dict[str, set[str]]:
    """Each partition of the page's table and the keys it lists."""
    text = PAGE.read_text()
    table = text[text.index("| partition | keys | split |"):]
    table = table[:table.index("\n\n")]
    rows = [row.split("|")[1:3] for row in table.splitlines()[2:]]
    return {re.findall(r"`(\w+)`", name)[0]: set(re.findall(r"`(\w+)`", keys))
            for name, keys in rows}


def test_each_partition_reads_the_keys_the_docs_list() -> None:
    table = documented()
    assert set(table) == set(PARTITIONS)
    for kind, keys in table.items():
        assert set(unused_keys(kind, [*KEYS, "batch_size", "name"])) == set(KEYS) - keys, kind
