"""The package's folders are its layers: short modules, the public names, the old paths."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import asyncsync
from asyncsync._moved import MOVED

PACKAGE = Path(asyncsync.__file__).parent


def test_no_module_is_over_450_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long


def test_every_public_name_is_importable() -> None:
    for name in asyncsync.__all__:
        assert getattr(asyncsync, name) is not None, name


def test_old_module_paths_warn_and_forward_to_the_new_modules() -> None:
    """Each old path imports (in a fresh interpreter, so nothing is cached), warns with its
    new path, and its public attributes are the new module's own objects."""
    code = (
        "import importlib, json, sys, warnings\n"
        "bad = {}\n"
        "for old, new in json.loads(sys.argv[1]).items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        alias = importlib.import_module(old)\n"
        "    target = importlib.import_module(new)\n"
        "    if not any(issubclass(w.category, DeprecationWarning) and new in str(w.message)\n"
        "               for w in caught):\n"
        "        bad[old] = 'no warning naming ' + new\n"
        "    public = [n for n in vars(target) if not n.startswith('_')]\n"
        "    if not public or any(getattr(alias, n) is not getattr(target, n) for n in public):\n"
        "        bad[old] = 'attributes differ from ' + new\n"
        "print(json.dumps(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(MOVED)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == {}


def test_a_path_that_never_existed_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("asyncsync.no_such_module")
