"""docs/recipes.md: its "Every key" recipe names every key a run takes, and its table of
shipped recipes names every recipe under recipes/."""

from __future__ import annotations

import dataclasses
import re
from fnmatch import fnmatch
from typing import Any

from asyncsync.study.specs import RunSpec
from tests.doc_pages import ROOT, all_blocks

PAGE = ROOT / "docs" / "recipes.md"


def every_key_block() -> str:
    """The page's first TOML block: "A recipe with every section"."""
    return next(b.code for b in all_blocks() if b.page == PAGE and b.lang == "toml")


def run_keys(settings: Any = None, prefix: str = "") -> set[str]:
    """The dotted keys of a run's settings (a default run's), those the program sets
    itself left out."""
    settings = RunSpec() if settings is None else settings
    keys = set()
    for field in dataclasses.fields(settings):
        if field.metadata.get("internal") or field.name == "protocol":
            continue  # protocol: its own page lists each one's parameters
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            keys |= run_keys(value, f"{prefix}{field.name}.")
        else:
            keys.add(f"{prefix}{field.name}")
    return keys


def shown_keys(block: str) -> set[str]:
    """The dotted keys the block sets or shows commented out, under their [defaults.X]."""
    keys, table = set(), ""
    for line in block.splitlines():
        if header := re.match(r"^\[(?P<name>[\w.]+)\]", line):
            table = header["name"].removeprefix("defaults").lstrip(".")
            if header["name"] != "defaults" and not header["name"].startswith("defaults."):
                table = "-"  # [sweep], [tracking]: not a run's key
        elif (key := re.match(r"^(?:# )?(?P<key>[a-z_]+) = ", line)) and table != "-":
            keys.add(f"{table}.{key['key']}" if table else key["key"])
    return keys


def test_every_run_key_is_on_the_page() -> None:
    expected = run_keys()
    assert {"stop.time_s", "network.compression", "tls.ca", "availability.trace",
            "model.size_mb", "token"} <= expected  # the walk reaches nested tables
    missing = sorted(expected - shown_keys(every_key_block()))
    assert missing == [], f"docs/recipes.md's 'Every key' block lacks {missing}"


def test_every_shipped_recipe_is_in_the_table() -> None:
    text = PAGE.read_text(encoding="utf-8").split("## Recipes shipped", 1)[1]
    patterns = re.findall(r"^\| `([^`]+\.toml)` \|", text, flags=re.MULTILINE)
    assert "quickstart.toml" in patterns
    recipes = [str(p.relative_to(ROOT / "recipes")) for p in (ROOT / "recipes").rglob("*.toml")]
    unlisted = sorted(r for r in recipes if not any(fnmatch(r, p) for p in patterns))
    assert unlisted == [], f"docs/recipes.md's 'Recipes shipped' lacks {unlisted}"
