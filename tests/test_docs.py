"""The README's and the documentation pages' code blocks run, or are checked, as written.

Which test a block gets is chosen by the comment before it (tests/doc_pages.py). Pages the
site adds later are picked up by the same rules: nothing here lists the pages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from asyncsync.cli import UsageError, _parser
from asyncsync.study.recipe import load_recipe
from tests.doc_pages import OUTPUT, ROOT, SHELLS, Block, all_blocks, pages, stray_fences

TINY = ["--set", "workers=2", "--set", "compute.slowdown=[1, 2]", "--set", "stop.time_s=2",
        "--set", "eval.interval_s=1", "--set", "eval.samples=500", "--set",
        "compute.base_step_s=0.05", "--clock", "virtual", "--plain", "--jobs", "1"]
"""Appended to each `asyncsync run` of a run block: two workers for 2 virtual seconds of
paced 50 ms steps, evaluated on 500 test samples, in one process with no child per run (a
later option wins; test_e2e runs the real clock, test_parallel the children)."""

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.lang in SHELLS and b.mark == "test: run"]
CHECKED = [b for b in BLOCKS if b.lang in SHELLS and b.mark != "test: run"]
SCRIPTS = [b for b in BLOCKS if b.lang == "python" and not b.mark]
TOML = [b for b in BLOCKS if b.lang == "toml" and not b.mark.startswith("test: skip")]


def commands(code: str, lang: str = "bash") -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blanks dropped; in
    a ``console`` block only the lines after a ``$`` prompt (the rest is output)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = joined.splitlines()
    if lang == "console":
        lines = [line.split("$ ", 1)[1] for line in lines if line.lstrip().startswith("$ ")]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def asyncsync_args(command: str) -> list[str] | None:
    """The arguments of an `asyncsync` (or `.venv/bin/asyncsync`) command, else None."""
    words = shlex.split(command, comments=True)
    if words and words[0] in ("asyncsync", ".venv/bin/asyncsync"):
        return words[1:]
    return None


def ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def test_every_block_has_a_known_kind() -> None:
    """A block is output (text), a shell block, Python or TOML; and a skip gives a reason."""
    for block in BLOCKS:
        assert block.lang in OUTPUT | SHELLS | {"python", "toml"}, (
            f"{block.where}: fence language {block.lang!r}; use text for output")
        if block.mark.startswith("test: skip"):
            assert len(block.mark.removeprefix("test: skip").strip(" :")) > 10, (
                f"{block.where}: say why it is skipped: <!-- test: skip: REASON -->")
        assert block.mark in ("", "test: run") or block.mark.startswith("test: skip") or (
            block.named), f"{block.where}: unknown marker {block.mark!r}"


def test_every_fence_opens_or_closes_a_block() -> None:
    """No line starts like a fence without being one."""
    stray = [f"{page.relative_to(ROOT)}:{number}: {line}" for page in pages()
             for number, line in stray_fences(page.read_text(encoding="utf-8"))]
    assert stray == [], "a fence line must hold only ``` and a language:\n" + "\n".join(stray)
    assert stray_fences("```text\nout\n``` Then prose.\n") == [(3, "``` Then prose.")]


def test_every_named_example_is_run_by_a_test() -> None:
    names = {b.named for b in BLOCKS if b.named}
    assert {"embedding-example", "protocol-example", "protocol-test-example"} <= names
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py")
                        if p.name != "test_docs.py")
    for name in names:
        assert f'"{name}"' in sources, f"no test runs the example {name!r}"


@pytest.mark.parametrize("block", CHECKED, ids=ids(CHECKED))
def test_shell_commands_parse_and_name_files_that_exist(block: Block) -> None:
    """Every `asyncsync` line parses with the CLI's own parser; a recipe or script a line
    names is in the repository."""
    parser = _parser()
    for command in commands(block.code, block.lang):
        for word in shlex.split(command, comments=True):
            if re.fullmatch(r"(recipes|bench)/[\w./-]+\.(toml|py)", word):
                assert (ROOT / word).is_file(), f"{block.where}: {word} does not exist"
        args = asyncsync_args(command)
        if args is None:
            continue
        args = [re.sub(r"^\$\w+$", "0", word) for word in args]  # `--rank $i`
        try:
            parser.parse_args(args)
        except UsageError as exc:
            pytest.fail(f"{block.where}: `{command}` does not parse ({exc})")


@pytest.mark.timeout(900)  # on a loaded 2-core host a block of runs takes minutes
@pytest.mark.parametrize("block", RUN, ids=ids(RUN))
def test_run_blocks_run_as_written(block: Block, tmp_path: Path) -> None:
    """Each command runs in a fresh folder with the recipes beside it and exits 0; an
    `asyncsync run` gets tiny budgets appended. Each command is a process of its own,
    forked from one that imported torch once (tests/doc_commands.py)."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    argvs, parsed = [], []
    for command in commands(block.code, block.lang):
        args = asyncsync_args(command)
        if args is None:
            argvs.append(["bash", "-euo", "pipefail", "-c", command])
        else:
            extra = (["--only", "asp"] if "--only" not in args else []) + TINY
            argvs.append(["asyncsync", *args, *(extra if args[0] == "run" else [])])
        parsed.append(args)
    out = tmp_path / ".doc-commands"
    out.mkdir()
    (out / "commands.json").write_text(json.dumps(argvs))
    driver = subprocess.run([sys.executable, "-m", "tests.doc_commands", str(out),
                             str(out / "commands.json")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=800)
    assert "Traceback" not in driver.stderr, driver.stderr
    ran = []
    for index, (argv, args) in enumerate(zip(argvs, parsed, strict=True)):
        assert (out / f"{index}.rc").exists(), (block.where, argv, driver.stderr)
        stdout, stderr = ((out / f"{index}.{kind}").read_text() for kind in ("out", "err"))
        assert (out / f"{index}.rc").read_text() == "0", (block.where, argv, stdout, stderr)
        assert "Traceback" not in stderr, stderr
        ran.append((args, stdout))
    assert driver.returncode == 0, driver.stderr
    runs = [args for args, _ in ran if args and args[0] == "run"]
    if runs:
        assert len(list((tmp_path / "logs" / "quickstart").iterdir())) == len(runs)
    for args, stdout in ran:
        if args and args[0] == "report":
            assert f"holds {len(runs)} studies: reporting the latest" in stdout
            assert "quickstart: comparison (baseline asp)" in stdout  # the last was --only asp


def test_the_command_driver_reports_a_failure_and_stops(tmp_path: Path) -> None:
    """The run test is not vacuous: a failing command's status comes back, and the block
    stops there, as its reader would."""
    (tmp_path / "commands.json").write_text(json.dumps(
        [["bash", "-c", "echo said; exit 3"], ["bash", "-c", "touch ran"]]))
    driver = subprocess.run([sys.executable, "-m", "tests.doc_commands", str(tmp_path),
                             str(tmp_path / "commands.json")], cwd=tmp_path, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert driver.returncode == 1
    assert (tmp_path / "0.rc").read_text() == "3" and (tmp_path / "0.out").read_text() == "said\n"
    assert not (tmp_path / "1.rc").exists() and not (tmp_path / "ran").exists()


def test_the_getting_started_block_runs_the_commands_it_shows() -> None:
    """The run test covers run, check, protocols and report (and would fail on a typo)."""
    block = next(b for b in RUN if b.page.name == "getting-started.md")
    verbs = [asyncsync_args(c)[0] for c in commands(block.code)]  # type: ignore[index]
    assert verbs.count("run") >= 4 and verbs[-3:] == ["check", "protocols", "report"]


@pytest.mark.parametrize("block", SCRIPTS, ids=ids(SCRIPTS))
def test_python_blocks_run_as_scripts(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (block.where, done.stderr[-3000:])


@pytest.mark.parametrize("block", TOML, ids=ids(TOML))
def test_toml_blocks_parse_and_recipes_load(block: Block, tmp_path: Path) -> None:
    """TOML parses; a block with runs is loaded as a recipe, so every key it shows exists
    and every value is accepted."""
    data = tomllib.loads(block.code)
    if "runs" in data:
        path = tmp_path / "recipe.toml"
        path.write_text(block.code)
        assert load_recipe(path).runs, block.where


def test_the_readme_is_a_front_door() -> None:
    """At most 250 lines, its links relative and pointing at files that exist."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        assert not re.match(r"[a-z]+://|/", link), f"README link {link} is not relative"
        target = link.split("#")[0]
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def _hook() -> object:
    spec = importlib.util.spec_from_file_location(
        "protocol_pages", ROOT / "docs" / "hooks" / "protocol_pages.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_protocol_pages_cover_the_registry_and_the_readme_table() -> None:
    """Every registered protocol has a section with each of its parameters and help texts,
    and the README's table names the same protocols per family."""
    from asyncsync.protocols import discover

    hook = _hook()
    pages = hook.family_pages()  # type: ignore[attr-defined]
    text = "\n".join(pages.values())
    for name, protocol in discover().items():
        assert f"## `{name}`" in text
        for field, _default, help_text in _fields(protocol.params):
            assert f"| `{field}` |" in text and help_text.replace("|", "\\|") in text
    readme = (ROOT / "README.md").read_text().split("| family | protocols |")[1]
    for _slug, (_title, _intro, names) in hook.FAMILIES.items():  # type: ignore[attr-defined]
        row = next(line for line in readme.splitlines() if f"`{names[0]}`" in line)
        assert re.findall(r"`(\w+)`", row.split("|")[2])[:len(names)] == list(names), row


def test_a_protocol_in_no_family_stops_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook()
    families = dict(hook.FAMILIES)  # type: ignore[attr-defined]
    title, intro, names = families["classical"]
    families["classical"] = (title, intro, names[1:])
    monkeypatch.setattr(hook, "FAMILIES", families)
    with pytest.raises(ValueError, match=r"in no family \['bsp'\]"):
        hook.family_pages()  # type: ignore[attr-defined]


def _fields(params: type) -> list[tuple[str, object, str]]:
    from asyncsync.schema import describe

    return describe(params)


def test_the_cli_parser_rejects_what_the_check_must_catch() -> None:
    """The parse check is not vacuous: a misspelt option fails it."""
    with pytest.raises(UsageError, match="--clok"):
        _parser().parse_args(["run", "recipes/quickstart.toml", "--clok", "virtual"])
    assert isinstance(_parser(), argparse.ArgumentParser)
