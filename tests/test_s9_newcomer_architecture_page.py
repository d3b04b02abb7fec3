"""docs/architecture.md's map of the package names every module, layer by layer, in the
order of the import contract."""

from __future__ import annotations

import re
import tomllib

from asyncsync.protocols import discover
from tests.doc_pages import ROOT, blocks

PACKAGE = ROOT / "asyncsync"


def layer_map(text: str) -> dict[str, set[str]]:
    """Each entry of the map (``study/``, ``clock.py``, ...) and the words it holds."""
    entries: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        head = re.match(r"(\S+)\s", line + " ")
        if head:
            current = head[1]
            entries[current] = set()
        entries[current] |= set(re.findall(r"\w+", line))
    return entries


def unnamed(entries: dict[str, set[str]]) -> list[str]:
    """The package's public modules that the map's entry for their folder leaves out (a
    protocol's own module is "one module per protocol"; the SDK's are each named)."""
    protocols = {f"asyncsync.protocols.{name}" for name in discover()}
    left_out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.stem.startswith("_") or f"asyncsync.protocols.{path.stem}" in protocols:
            continue
        entry = f"{relative.parts[0]}/" if len(relative.parts) > 1 else relative.name
        if path.stem not in entries.get(entry, set()):
            left_out.append(relative.as_posix())
    return left_out


def the_map() -> str:
    page = ROOT / "docs" / "architecture.md"
    return next(b.code for b in blocks(page) if b.code.startswith("cli.py"))


def test_the_map_names_every_module() -> None:
    assert unnamed(layer_map(the_map())) == []


def test_the_map_lists_the_layers_in_the_contracts_order() -> None:
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = contract["tool"]["importlinter"]["contracts"][0]["layers"]
    expected = [name.strip().removeprefix("asyncsync.") for layer in layers
                for name in layer.split(":")]
    shown = [entry.removesuffix("/").removesuffix(".py") for entry in layer_map(the_map())]
    assert shown == expected


def test_a_module_missing_from_the_map_is_found() -> None:
    """The check is not vacuous: an entry without one of its folder's modules fails it."""
    entries = layer_map(the_map())
    entries["engine/"] = entries["engine/"] - {"cohort"}
    assert unnamed(entries) == ["engine/cohort.py"]
