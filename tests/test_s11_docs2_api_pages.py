"""The API reference documents every name the package exports, and its package page lists
them all."""

from __future__ import annotations

import re

import asyncsync
from tests.doc_pages import ROOT

API = ROOT / "docs" / "api"


def rendered_modules() -> set[str]:
    """The modules the API pages render (their ``::: module`` lines)."""
    return {module for page in API.glob("*.md")
            for module in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.MULTILINE)}


def defining_module(name: str) -> str:
    """The module that defines an exported name (the registry: its protocols' base)."""
    value = getattr(asyncsync, name)
    return "asyncsync.protocols.base" if name == "PROTOCOLS" else value.__module__


def test_every_exported_name_is_defined_in_a_rendered_module() -> None:
    """`ConnectionLimits` (an argument of `ParameterServer`) was exported from a module no
    page rendered, so the reference had no entry for it."""
    rendered = rendered_modules()
    assert {name: defining_module(name) for name in asyncsync.__all__
            if defining_module(name) not in rendered} == {}


def test_the_package_page_lists_every_exported_name() -> None:
    listed = set(re.findall(r"`(\w+)`", (API / "package.md").read_text()))
    assert sorted(set(asyncsync.__all__) - listed) == []
