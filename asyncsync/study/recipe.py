"""Recipes: TOML files composing protocol x model x data x heterogeneity into runs.

Shape (docs/recipes.md lists every key)::

    name = "quickstart"      # optional; defaults to the file's stem
    baseline = "bsp"         # run that speedups are measured against (default: first run)
    [defaults]               # every key of a run; each [[runs]] entry may override any
    [[runs]]
    name = "bsp"
    protocol = "bsp"         # or { name = "ssp", staleness = 3 }

Each run's table is ``defaults`` deep-merged with the run's own keys, then checked against
`RunSpec`: unknown keys and ill-typed or out-of-range values raise `ConfigError` naming the
key, e.g. ``runs[1] (asp).stop.time_s: must be > 0, got -1``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncsync.hetero.partition import PARTITION_KEYS, unused_keys
from asyncsync.protocols.base import get_protocol
from asyncsync.runlog.reading import sweep_suffix
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.study.recipe_table import apply_override, read_recipe_table, set_default
from asyncsync.study.specs import ProtocolSpec, RunSpec


@dataclass(frozen=True)
class Recipe:
    """A resolved recipe: its runs, the baseline, and how often each run is repeated (with
    seeds seed, seed + 1, ...)."""

    name: str
    baseline: str
    runs: list[RunSpec]
    repeats: int = 1
    tracking: dict[str, str] = field(default_factory=dict)
    """``[tracking]``: tool (tensorboard, mlflow, wandb) -> where, as ``--track`` takes it."""
    source: str = field(default="", compare=False)
    """The file it was read from ("" when built otherwise), for errors found later."""

    def run(self, name: str) -> RunSpec:
        for spec in self.runs:
            if spec.name == name:
                return spec
        raise ConfigError(f"no run named {name!r}; runs: {', '.join(r.name for r in self.runs)}")

    def as_table(self) -> dict[str, Any]:
        return {"name": self.name, "baseline": self.baseline, "repeats": self.repeats,
                **({"tracking": self.tracking} if self.tracking else {}),
                "runs": [r.as_table() for r in self.runs]}

    @property
    def track_specs(self) -> list[str]:
        """``[tracking]`` as ``--track`` specs (``tool=where``)."""
        return [f"{tool}={where}" if where else tool for tool, where in self.tracking.items()]

    def repeated(self, spec: RunSpec) -> list[RunSpec]:
        """`spec` once per repeat, with seeds ``seed .. seed + repeats - 1``; a protocol's
        own ``seed`` option (FedAvg's client sampling, DS-Sync's groups) moves with it, so
        the repeats' spread includes that randomness too."""
        return [_with_seeds(spec, k) for k in range(self.repeats)]


def _with_seeds(spec: RunSpec, k: int) -> RunSpec:
    """`spec` with its seed, and its protocol's seed if it has one, advanced by `k`."""
    params = spec.protocol.params
    if k and any(f.name == "seed" for f in dataclasses.fields(params)):
        params = dataclasses.replace(params, seed=params.seed + k)
    return dataclasses.replace(spec, seed=spec.seed + k,
                               protocol=ProtocolSpec(spec.protocol.name, params))


TOP_KEYS = ("name", "baseline", "repeats", "repeat", "sweep", "defaults", "runs", "tracking")
TRACKERS = ("tensorboard", "mlflow", "wandb")
"""``repeat`` is written by the runner into a run's own recipe.json (which repeat it is)."""


def load_recipe(path: str | Path, overrides: Sequence[str] = (),
                only: Sequence[str] = (), repeats: int | None = None) -> Recipe:
    """Read a recipe (``.toml``, or the ``.json`` a run writes) and resolve every run.

    Args:
        path: the recipe file.
        overrides: ``KEY=VALUE`` strings setting ``defaults.KEY`` (TOML value syntax; a
            bare word is taken as a string).
        only: run names to keep (all when empty).
        repeats: overrides the recipe's ``repeats``.
    """
    path = Path(path)
    raw = read_recipe_table(path)
    if repeats is not None:
        if repeats < 1:
            raise ConfigError(f"--repeats: must be >= 1, got {repeats}")
        raw = {**raw, "repeats": repeats}
    try:
        recipe = resolve(raw, path.stem, overrides, only, written=path.suffix == ".json")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return dataclasses.replace(recipe, source=str(path))


def resolve(raw: dict[str, Any], default_name: str, overrides: Sequence[str] = (),
            only: Sequence[str] = (), written: bool = False) -> Recipe:
    """Resolve a parsed recipe table (see `load_recipe`).

    Args:
        written: the table is a run's own recipe.json, whose runs carry their sweep point
            (``sweep``, which a recipe's runs may not set: its sweep is ``[sweep]``).
    """
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{key}: unknown top-level key (known: {', '.join(TOP_KEYS)})")
    if "repeat" in raw and not written:  # (`repeats = 3` mistyped would run each once)
        raise ConfigError(f"repeat: unknown top-level key (a run's own recipe.json says "
                          f"which repeat it is); for every run {raw['repeat']!r} times: "
                          f"repeats = {raw['repeat']!r}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError("defaults: expected a table")
    defaults = copy.deepcopy(defaults)
    runs_raw = raw.get("runs", [])
    if isinstance(runs_raw, dict):
        raise ConfigError("runs: one table [runs]; write each run as a [[runs]] table (two "
                          "brackets: a list of tables)")
    if not isinstance(runs_raw, list):
        raise ConfigError(f"runs: expected [[runs]] tables, got {runs_raw!r}")
    if not runs_raw:
        raise ConfigError("runs: a recipe needs at least one [[runs]] table")
    points = _sweep_points(raw.get("sweep", {}))
    swept = next(iter(points[0]), None)
    if swept is not None and (replaced := _every_run_sets(runs_raw, swept)):
        raise ConfigError(f"sweep.{swept}: every run sets {replaced} itself, so the sweep "
                          "would change nothing; sweep another key, or remove it from "
                          "the runs")
    set_items = {}
    for item in overrides:
        key = apply_override(defaults, item)
        set_items[key] = item
        _check_override(key, defaults, runs_raw, item)
        if swept is not None and _overlaps(key, swept):
            raise ConfigError(f"--set {item}: the sweep sets {swept} at each of its points, "
                              "so it would be ignored")
    runs = []
    for point in points:
        table = copy.deepcopy(defaults)
        for key, value in point.items():
            set_default(table, key, value, "sweep")
        for index, run in enumerate(runs_raw):
            try:
                spec = _resolve_run(table, run, index, swept, written)
            except ConfigError as exc:
                raise ConfigError(_naming_set(str(exc), set_items)) from None
            runs.append(dataclasses.replace(spec, name=spec.name + sweep_suffix(point),
                                            sweep=point) if point else spec)
    data = defaults.get("data")
    for key in unused_keys("", data if isinstance(data, dict) and not written else {}):
        if not any(key in PARTITION_KEYS[run.data.partition] for run in runs):
            raise ConfigError(_naming_set(f"defaults.data.{key}: no run's partition reads "
                                          "it; leave this key out", set_items))
    names = [r.name for r in runs]
    duplicates = sorted({r.base_name for r in runs if names.count(r.name) > 1})
    if duplicates:  # named as the recipe names them, not as each sweep point does
        raise ConfigError(f"runs: duplicate run names {duplicates}" + (
            " (the recipe's, before the sweep names them)" if swept is not None else ""))
    names = list(dict.fromkeys(r.base_name for r in runs))
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"name: must be a non-empty name without '/' (it names the "
                          f"recipe's log directory), got {name!r}")
    baseline = raw.get("baseline", names[0])
    if baseline not in names:
        raise ConfigError(f"baseline: {baseline!r} is not a run (runs: {', '.join(names)})")
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ConfigError(f"--only: no run named {unknown[0]!r} (runs: {', '.join(names)})")
        runs = [r for r in runs if r.base_name in only]
    repeats = raw.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats: must be an integer >= 1, got {repeats!r}")
    return Recipe(name, baseline, runs, repeats, _tracking(raw.get("tracking", {})))


def _tracking(table: Any) -> dict[str, str]:
    """``[tracking]``: each key a tool of `TRACKERS`, each value where it writes ("" for
    the tool's default)."""
    if not isinstance(table, dict):
        raise ConfigError("tracking: expected a table such as { tensorboard = \"tb\" }")
    for tool, where in table.items():
        if tool not in TRACKERS:
            raise ConfigError(f"tracking.{tool}: unknown tool (known: {', '.join(TRACKERS)})")
        if not isinstance(where, str):
            raise ConfigError(f"tracking.{tool}: expected a string (a folder, URI or "
                              f"project), got {where!r}")
    return dict(table)


def _check_override(key: str, defaults: dict[str, Any], runs: list[Any], item: str) -> None:
    """Refuse a ``--set`` that would change nothing: a protocol that does not exist, or a
    key every run sets itself (its own value wins over the defaults)."""
    if key == "protocol" or key == "protocol.name":
        named = defaults["protocol"]
        name = named.get("name") if isinstance(named, dict) else named
        try:
            get_protocol(str(name))
        except ValueError as exc:
            raise ConfigError(f"--set {item}: {exc}") from None
    if replaced := _every_run_sets(runs, key):
        raise ConfigError(f"--set {item}: every run sets {replaced} itself, so it would be "
                          "ignored; choose runs with --only and edit their tables, or add "
                          "a run")


def _naming_set(message: str, set_items: dict[str, str]) -> str:
    """`message`, an error in the defaults, with the ``--set`` that wrote its key named at
    its end (a recipe file without that key would leave the user wondering where)."""
    key = message.partition(":")[0].removeprefix("defaults.")
    item = next((item for set_key, item in set_items.items() if _overlaps(key, set_key)), "")
    return f"{message}; set by --set {item}" if item and message.startswith("defaults.") \
        else message


def _sweep_points(sweep: Any) -> list[dict[str, Any]]:
    """The points of a ``[sweep]`` table: one key (a dotted defaults key) and its values;
    no sweep is one point without overrides."""
    if not isinstance(sweep, dict):
        raise ConfigError("sweep: expected a table with one key, e.g. workers = [4, 16, 64]")
    sweep = _dotted(sweep)
    if len(sweep) > 1:
        raise ConfigError(f"sweep: one key at a time, got {', '.join(sweep)}: a grid of "
                          "several keys is not offered; sweep one and give the others their "
                          "values with --set, one study each")
    if not sweep:
        return [{}]
    key, values = next(iter(sweep.items()))
    if not isinstance(values, list) or not values:
        raise ConfigError(f"sweep.{key}: expected a non-empty list of values")
    for position, value in enumerate(values):
        if value in values[:position]:
            raise ConfigError(f"sweep.{key}: the value {_toml(value)} is listed twice (at "
                              f"positions {values.index(value) + 1} and {position + 1}); "
                              "list each value once")
    named: dict[str, Any] = {}
    for value in values:
        first = named.setdefault(sweep_suffix({key: value}), value)
        if first is not value:
            raise ConfigError(f"sweep.{key}: the values {_toml(first)} and {_toml(value)} "
                              f"would name one run folder (...{sweep_suffix({key: value})}); "
                              "give them one type")
    return [{key: value} for value in values]


def _toml(value: Any) -> str:
    """A sweep value as a recipe writes it (``true``, ``"a"``, ``[1, 2]``)."""
    return json.dumps(value)


def _dotted(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A ``[sweep]`` table with its nested tables as dotted keys: TOML reads an unquoted
    ``optim.lr = [...]`` (or ``[sweep.optim]``) as a table ``optim`` holding ``lr``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` into `base`; a table with a ``name`` (a protocol, a compute
    profile) replaces the default one whole instead of mixing keys with it."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "name" not in value:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _every_run_sets(runs: list[Any], key: str) -> str | None:
    """What every run's own table sets of the dotted `key`, so that a default for it
    reaches none (as the first run sets it: `key`, or the part of it that the run replaces
    whole, see `_replaced_by`); None when some run would see the default."""
    replaced = [_replaced_by(run, key) if isinstance(run, dict) else None for run in runs]
    return replaced[0] if all(replaced) else None


def _replaced_by(run: dict[str, Any], dotted: str) -> str | None:
    """The part of the dotted key that `run` sets itself, so that `_merge` gives the run
    its own value there: the key itself, or a key above it that the run sets to a value
    that is no table (``protocol = "bsp"`` under ``protocol.staleness``) or to a table
    with a ``name`` (which replaces the default one whole); None when the run takes the
    default."""
    node: Any = run
    parts = dotted.split("[")[0].rstrip(".").split(".")
    for depth, part in enumerate(parts, 1):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
        if depth == len(parts) or not isinstance(node, dict) or "name" in node:
            return ".".join(parts[:depth])
    return None


def _overlaps(key: str, other: str) -> bool:
    """Whether dotted keys `key` and `other` name the same value or one holds the other."""
    a, b = key.split("."), other.split(".")
    return a[: len(b)] == b or b[: len(a)] == a


def _has_key(table: dict[str, Any], dotted: str) -> bool:
    """Whether `table` holds the dotted key (``a.b.`` names table ``a.b`` itself)."""
    node: Any = table
    for part in dotted.split("[")[0].rstrip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


RUN_NAME = re.compile(r"[A-Za-z0-9._+,=-]+")
"""A run's name in a recipe (a run's written recipe.json adds its sweep point after '@')."""


def _resolve_run(defaults: dict[str, Any], run: Any, index: int, swept: str | None = None,
                 written: bool = False) -> RunSpec:
    """One run's spec: `defaults` (the sweep's point set in them at `swept`) merged with the
    run's own table; an error names where the bad value was written."""
    if not isinstance(run, dict):
        raise ConfigError(f"runs[{index}]: expected a table")
    label = f"runs[{index}]" + (f" ({run['name']})" if isinstance(run.get("name"), str) else "")

    def where(key: str) -> str:
        if _has_key(run, key) or not key:
            return f"{label}.{key}"
        return f"sweep.{key}" if swept is not None and _overlaps(key, swept) else \
            f"defaults.{key}"

    if not written and ("sweep" in defaults or "sweep" in run):
        raise ConfigError(f"{where('sweep')}: unknown key (a sweep is the recipe's top-level "
                          "[sweep] table)")
    merged = _merge(defaults, run)
    data = merged.get("data")
    if isinstance(data, dict) and not written:  # ([defaults.data] may serve other runs)
        kind = data.get("partition", "iid")
        reads = ", ".join(PARTITION_KEYS.get(kind, ())) or "none"
        for key in unused_keys(kind, data):
            if not where(f"data.{key}").startswith("defaults."):
                raise ConfigError(f"{where(f'data.{key}')}: not read by partition {kind!r} "
                                  f"(it reads {reads}); leave this key out")
    if "name" not in merged:
        raise ConfigError(f"{label}.name: every run needs a name")
    name = merged["name"]
    if (not written and isinstance(name, str) and name and "/" not in name  # (RunSpec's)
            and not RUN_NAME.fullmatch(name)):
        raise ConfigError(f"{label}.name: letters, digits and ._+,=- only (it names the "
                          "run's folder, which a shell then takes unquoted; '@' marks a "
                          f"sweep point), got {name!r}")
    if "protocol" not in merged:
        raise ConfigError(f"{label}.protocol: every run needs a protocol")
    protocol = _resolve_protocol(merged.pop("protocol", None), where)
    try:  # (the spec's checks of the protocol against the run, e.g. its workers)
        return dataclasses.replace(from_mapping(RunSpec, merged, "", where), protocol=protocol)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def _resolve_protocol(value: Any, where: Callable[[str], str]) -> ProtocolSpec:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ConfigError(f"{where('protocol')}: expected a name or a table with 'name'")
    params = dict(value)
    name = params.pop("name")
    try:
        protocol = get_protocol(name)
    except ValueError as exc:
        raise ConfigError(f"{where('protocol')}: {exc}") from None
    return ProtocolSpec(name, from_mapping(protocol.params, params, "",
                                           lambda key: where(f"protocol.{key}")))

