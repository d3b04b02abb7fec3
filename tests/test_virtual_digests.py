"""Virtual results pinned: a small virtual run of each protocol family gives the same bytes.

Each run's events.jsonl, worker logs and summary.json (less its real-time fields) are
hashed together; the digests below are literals, so any change to what a virtual run
computes or logs (the engine, the rules, the link model, the log format, the torch math)
fails here loudly.

Updating them deliberately: when a change is meant to alter virtual results, run
``.venv/bin/python -m pytest tests/test_virtual_digests.py``, check in the failure
message that only the intended runs changed, and paste the new digests below with the
reason in the commit message. A speed-up must never need that. The mlp runs' digests
also depend on torch's float arithmetic: a new torch build or CPU may change them too
(the timing runs' stand-in is far less exposed); say so when updating for that reason.

The runs happen in a child process with ``ATEN_CPU_CAPABILITY=avx2``: torch picks its
vector kernels by the CPU (AVX2 or AVX-512 on x86), and the mlp runs' sums come out
differently in the last bits on an AVX-512 machine (seen: the four mlp digests differed on
an AMD Zen 5 host and matched again with the capability pinned). The capability is read
once per process, before the first kernel runs, hence the child.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.results.report import summarize_run
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import REAL_TIME_FIELDS, simulate

RECIPE = """
name = "digest"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 2
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 16
[defaults.eval]
interval_s = 0.5
[defaults.compute]
slowdown = [1, 2, 3]
base_step_s = 0.05
[defaults.network]
bandwidth_mbps = 200
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
[[runs]]
name = "local_sgd"
protocol = "local_sgd"
[[runs]]
name = "nbsync"
protocol = "nbsync"
[[runs]]
name = "asp_timing"
protocol = "asp"
workers = 8
model = {name = "timing", size_mb = 47}
network = {bandwidth_mbps = 1000, server_mbps = 4000, latency_ms = 5, jitter_ms = 2}
stop = {time_s = 6}
[[runs]]
name = "bsp_timing"
protocol = "bsp"
workers = 8
model = {name = "timing", size_mb = 47}
network = {bandwidth_mbps = 1000, server_mbps = 4000, latency_ms = 5, jitter_ms = 2}
stop = {time_s = 6}
"""


DIGESTS = {
    "bsp":
        "21a4cc5bea8b8bd1baa704d42f8aaf4abf6a3c3e83a825716e8d1ab7d82de730",
    "asp":
        "4e1cbdc505a12c23a68f7b4cee51bda325c55efedf14f91c4fa943393ffbc9ba",
    "local_sgd":
        "f013cc4ff46d294f9b37c42f61dea4063a9d535453b88f53c1fc7dd1ae1fcf49",
    "nbsync":
        "0639c0b10fe03441150b40618adc29777cc60f531556830d0a56ab637d528ed5",
    "asp_timing":
        "16b8bac8ea2d006cec001a59cbacf7cfc981867d5b3981a4346c91fb621a076d",
    "bsp_timing":
        "06e3ca295c0b715b59eb195a90ec084bfcb0c7280ecf9b972b4860028bb2177a",
}


CPU_CAPABILITY = "avx2"
"""The vector kernels the digests were recorded with (any x86-64 CPU of the last decade)."""


def digest(run_dir: Path, name: str) -> str:
    """The sha256 of one virtual run's logs and summary (real-time fields left out)."""
    recipe = run_dir.parent / "digest.toml"
    recipe.write_text(RECIPE)
    spec = load_recipe(recipe).run(name)
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "digest", "baseline": "bsp", "runs": [spec.as_table()]}))
    facts = simulate(spec, run_dir, f"digest/{name}")
    summary = {k: v for k, v in {**summarize_run(run_dir), **facts}.items()
               if k not in REAL_TIME_FIELDS}
    sha = hashlib.sha256()
    for path in [run_dir / "events.jsonl", *sorted(run_dir.glob("worker-*.jsonl"))]:
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    sha.update(json.dumps(summary, indent=2).encode())
    return sha.hexdigest()


@pytest.fixture(scope="module")
def digests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every run's digest, computed in one child process with the CPU capability pinned."""
    tmp = tmp_path_factory.mktemp("digests")
    code = ("import json, sys; from pathlib import Path; "
            "from tests.test_virtual_digests import DIGESTS, digest; "
            "print(json.dumps({n: digest(Path(sys.argv[1]) / n, n) for n in DIGESTS}))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": CPU_CAPABILITY}
    done = subprocess.run([sys.executable, "-c", code, str(tmp)], env=env, check=True,
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    found: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return found


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_virtual_results_are_pinned(digests: dict[str, str], name: str) -> None:
    assert digests[name] == DIGESTS[name], name
