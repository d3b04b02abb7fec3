"""A trace written by the converters or the generators' writers is written whole or not at
all: a write cut short (here by a file-size limit, as a full disk would) leaves the file
that was there, never a shorter trace that still reads as a valid one."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.hetero.availability import OnlineTimes, load_availability, write_availability
from asyncsync.hetero.capacity import Capacity, load_capacity, write_capacity

CUT_SHORT = """
import resource, signal, sys
from asyncsync.hetero.availability import OnlineTimes, write_availability
from asyncsync.hetero.capacity import Capacity, write_capacity
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
kind, path = sys.argv[1:]
try:
    if kind == "availability":
        write_availability(path, [OnlineTimes(((0.0, 1.0 + r),)) for r in range(2000)])
    else:
        write_capacity(path, [Capacity(r, 0.5, None, 1.0, 2.0) for r in range(2000)])
except OSError as exc:
    print(exc.errno)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
@pytest.mark.parametrize("kind", ["availability", "capacity"])
def test_a_write_cut_short_leaves_the_old_trace(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.csv"
    if kind == "availability":
        write_availability(path, [OnlineTimes(((0.0, 5.0),))] * 3)
    else:
        write_capacity(path, [Capacity(r, 0.25, None, 3.0, 4.0) for r in range(3)])
    before = path.read_bytes()
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, kind, str(path)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.stdout.strip() == "27"  # EFBIG: the limit cut the write short
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    read = load_availability(path, 3) if kind == "availability" else load_capacity(path)
    assert len(read) == 3


def test_a_written_trace_is_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "capacity.csv"
    umask = os.umask(0o022)
    try:
        write_capacity(path, [Capacity(0, 0.25, None, 3.0, 4.0)])
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert load_capacity(path)[0].s_per_sample == 0.25
