"""A recipe as its file holds it: the table read from TOML (or a run's JSON), and the
``--set`` overrides applied to its defaults. No torch here: `asyncsync.study.children`
reads a recipe this way before the command line imports torch; `asyncsync.study.recipe`
resolves the table into typed runs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from asyncsync.schema import ConfigError


def read_recipe_table(path: Path) -> dict[str, Any]:
    """The table of the recipe file `path` (``.toml``, or the ``.json`` a run writes).

    Raises:
        ConfigError: the file cannot be read or does not parse (the message names it).
    """
    kind = "JSON" if path.suffix == ".json" else "TOML"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); a recipe is a UTF-8 "
                          f"{kind} file") from None
    try:
        raw: Any = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {kind}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a table of keys at the top, got "
                          f"{type(raw).__name__}")
    return raw


def apply_override(defaults: dict[str, Any], item: str) -> str:
    """Apply ``--set KEY=VALUE`` to `defaults`; returns the key."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if text.strip()[:1] in TOML_OPENERS:  # meant as TOML: say why it is not
            why = str(exc).split(" (at line")[0]  # its column counts a prefix of ours
            raise ConfigError(f"--set {item}: not a TOML value ({why}); a string inside a "
                              "list or table needs quotes, e.g. protocol={name=\"ssp\"}"
                              ) from None
        value = text
    set_default(defaults, key.strip(), value, "--set")
    return key.strip()


TOML_OPENERS = ("[", "{", '"', "'")
"""What a ``--set`` value starts with when it is meant as a TOML list, table or string
(not a bare word, which is taken as a string)."""


def set_default(defaults: dict[str, Any], key: str, value: Any, origin: str) -> None:
    """``defaults.KEY = value`` for a dotted `key` (tables made on the way).

    Raises:
        ConfigError: `key` has an empty part, or starts with ``defaults.`` (named with
            `origin`, ``--set`` or ``sweep``).
    """
    parts = key.split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{origin} {key}: a dotted key with an empty part (e.g. "
                          "stop.time_s)")
    if parts[0] == "defaults" and len(parts) > 1:
        raise ConfigError(f"{origin} {key}: a key of [defaults] is written without "
                          f"'defaults.': {origin} {'.'.join(parts[1:])}=...")
    table = defaults
    for depth, part in enumerate(parts[:-1], 1):
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{origin} {key}: defaults.{'.'.join(parts[:depth])} is not "
                              "a table")
    table[parts[-1]] = value
