"""Old module paths, kept importable for one release.

asyncsync 0.2 grouped its flat modules into packages that name the layers (`study`,
`results`, `runlog`, `training`, `wire`). Code written against 0.1 may still say
``import asyncsync.recipe`` or ``from asyncsync.report import comparison_table``: such an
import gets a module that forwards every attribute to the new one, with a
`DeprecationWarning` naming the new path. The aliases go in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

MOVED = {
    "asyncsync.assembly": "asyncsync.study.assembly",
    "asyncsync.buffers": "asyncsync.training.buffers",
    "asyncsync.comparison": "asyncsync.results.comparison",
    "asyncsync.compression": "asyncsync.wire.codecs",
    "asyncsync.dashboard": "asyncsync.study.dashboard",
    "asyncsync.data": "asyncsync.training.data",
    "asyncsync.describe": "asyncsync.study.describe",
    "asyncsync.device_copies": "asyncsync.training.device_copies",
    "asyncsync.executors": "asyncsync.study.executors",
    "asyncsync.launch": "asyncsync.study.launch",
    "asyncsync.logschema": "asyncsync.runlog.schema",
    "asyncsync.metrics": "asyncsync.runlog.metrics",
    "asyncsync.models": "asyncsync.training.models",
    "asyncsync.nodes": "asyncsync.study.nodes",
    "asyncsync.optim": "asyncsync.training.optim",
    "asyncsync.plots": "asyncsync.results.plots",
    "asyncsync.prepare": "asyncsync.study.prepare",
    "asyncsync.recipe": "asyncsync.study.recipe",
    "asyncsync.report": "asyncsync.results.report",
    "asyncsync.runlogs": "asyncsync.runlog.reading",
    "asyncsync.runner": "asyncsync.study.runner",
    "asyncsync.simulation": "asyncsync.study.simulation",
    "asyncsync.trainer": "asyncsync.training.trainer",
}
"""Each old module path and the module that now holds its code."""


class _Alias(types.ModuleType):
    """A module under an old path whose attributes are the new module's."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self._target = target

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._target, attribute)

    def __dir__(self) -> list[str]:
        return dir(self._target)


class _AliasLoader(importlib.abc.Loader):
    """Creates the alias of one old path, warning once per import."""

    def __init__(self, new: str) -> None:
        self._new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {self._new}; the old path goes in asyncsync 0.3",
                      DeprecationWarning, stacklevel=2)
        return _Alias(spec.name, importlib.import_module(self._new))

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the alias forwards to a module that is already imported."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in `MOVED`, and nothing else."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname,
                                                                         _AliasLoader(new))


def install() -> None:
    """Make the old paths importable (once per interpreter)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
