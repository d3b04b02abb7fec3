"""bench/gpu_session.sh, rehearsed without a GPU: a lent machine gives 15 minutes, its start
included, and 10 minutes a command, so a mistake found there costs the session.

Checked here: every option the script gives bench/gpu_virtual.py exists; the caps fit the
script's budget and the budget a command's limit; each bench section's own caps fit its
section's; and the script, run with ``DEVICE=cpu``, writes its files, goes on past a
failing section and skips what its budget cannot hold.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
COMMAND_LIMIT_S = 600
"""The longest a command may run on a lent machine (docs/gpu.md)."""
RETURNED_FILES = 8
"""The most files a lent machine's command returns."""
START_S = 10
"""A bench process's own start on the lent machine (import torch, CUDA), counted for
each parent process in a section's cap."""


def sections() -> dict[str, tuple[int, list[str]]]:
    """Each section's cap and command words, from the script's ``section`` lines."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["section"] and len(words) > 3:
            found[words[1]] = (int(words[2]), words[3:])
    return found


def options(words: list[str]) -> dict[str, str]:
    """The ``--name value`` pairs of a command (a flag alone maps to "")."""
    out: dict[str, str] = {}
    for at, word in enumerate(words):
        if word.startswith("--"):
            following = words[at + 1] if at + 1 < len(words) else "--"
            out[word] = "" if following.startswith("--") else following
    return out


def budget() -> int:
    found = re.search(r"BUDGET_S=\$\{BUDGET_S:-(\d+)\}", SCRIPT.read_text())
    assert found, "the script names its default budget"
    return int(found.group(1))


def test_every_section_is_there_and_its_options_exist() -> None:
    declared = set(re.findall(r'add_argument\("(--[a-z0-9-]+)"',
                              (ROOT / "bench" / "gpu_virtual.py").read_text()))
    found = sections()
    assert set(found) == {"tests", "population", "resnet", "study", "steps"}
    for name, (_, words) in found.items():
        if name == "tests":
            assert {"tests/test_gpu.py", "tests/test_gpu_cohort.py"} <= set(words)
            continue
        assert words[:2] == ["python3", "bench/gpu_virtual.py"], name
        used = options(words)
        assert set(used) <= declared, (name, set(used) - declared)
        assert used["--only"] == name, name
        assert used["--json"].endswith(f'/{name}.json"'), name


def test_the_caps_fit_the_budget_and_the_budget_a_command() -> None:
    found = sections()
    # gpu.txt, session.log, tests.xml and a JSON a bench section: a lent machine returns
    # at most 8 files (the logs of each section apart made 10)
    assert 3 + sum("--json" in words for _, words in found.values()) <= RETURNED_FILES
    assert sum(cap for cap, _ in found.values()) <= budget()
    assert budget() + 5 + 15 <= COMMAND_LIMIT_S  # the kill's grace, the set-up before it


def test_each_bench_section_ends_within_its_cap() -> None:
    """The bench's own caps (children it stops) leave its section time to report."""
    found = sections()
    cap = {name: found[name][0] for name in found}
    args = {name: options(found[name][1]) for name in found}
    assert float(args["resnet"]["--resnet-wall-s"]) + START_S <= cap["resnet"]
    # a batched and a one-by-one run, each in a child capped at --population-wall-s
    assert 2 * float(args["population"]["--population-wall-s"]) + START_S <= cap["population"]
    # the study on the device and on the CPU, --study-repeats times each
    study = args["study"]
    runs = 2 * int(study["--study-repeats"])
    assert runs * float(study["--study-wall-s"]) + START_S <= cap["study"]


def _rehearse(tmp_path: Path, budget_s: int, *wanted: str, device: str = "cpu",
              ) -> tuple[Path, str]:
    """Run the script on `device`, this Python as its ``python3``; its files and output."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
           "OUT": str(out), "DEVICE": device, "BUDGET_S": str(budget_s),
           "BYTECODE": "off"}  # this host's bytecode: no compiling torch into /tmp
    done = subprocess.run(["bash", str(SCRIPT), *wanted], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_rehearsed_on_a_cpu_the_tests_section_writes_its_files(tmp_path: Path) -> None:
    out, said = _rehearse(tmp_path, 200, "tests")
    assert sorted(p.name for p in out.iterdir()) == ["gpu.txt", "session.log", "tests.xml"]
    suite = ET.parse(out / "tests.xml").getroot().find("testsuite")
    assert suite is not None
    assert int(suite.get("tests", "0")) > 10  # collected: every GPU test, skipped here
    assert int(suite.get("skipped", "-1")) == int(suite.get("tests", "0"))
    assert "== tests: exit 0" in said
    assert "== tests: exit 0" in (out / "session.log").read_text()


def test_a_failing_section_leaves_the_next_one_running(tmp_path: Path) -> None:
    out, said = _rehearse(tmp_path, 200, "study", "steps", device="no-such-device")
    log = (out / "session.log").read_text()
    for name in ("study", "steps"):
        assert f"== {name} (at most" in log
        assert f"== {name}: exit 1" in log and f"== {name}: exit 1" in said


def test_a_section_the_budget_cannot_hold_is_skipped(tmp_path: Path) -> None:
    out, said = _rehearse(tmp_path, 0, "tests", "steps")
    assert "== tests: skipped" in said
    log = (out / "session.log").read_text()
    assert "== tests: skipped" in log and "== steps: skipped" in log
    assert "(at most" not in log
    assert sorted(p.name for p in out.iterdir()) == ["gpu.txt", "session.log"]
