"""Hostile trace files, as a user might hand them over: every reader answers with one
error line naming the file and the problem, quickly, never a traceback, a hang or
gigabytes of memory."""

from __future__ import annotations

import os
import pickle
import random
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncsync import cli
from asyncsync.hetero import compute
from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.capacity import load_capacity
from asyncsync.hetero.fedscale import MAX_TUPLES, convert, read_plain_pickle
from asyncsync.hetero.traces import TraceError

READERS: dict[str, Callable[[Path], object]] = {
    "availability": lambda path: load_availability(path, 4),
    "capacity": load_capacity,
    "compute": lambda path: compute.read_trace(path, 4),
    "pickle": read_plain_pickle,
}
VALID = {
    "availability": b"worker,online_from_s,online_to_s\n0,0,5\n1,2.5,7\n0,6,9\n",
    "capacity": b"worker,s_per_sample,up_mbps,down_mbps\n0,0.01,5,10\n1,0.02,1e1,2E+01\n",
    "compute": b"time_s,worker,factor\n0,1,2\n5,1,4\n3,0,1.5\n",
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("reader", READERS)
def test_a_fifo_or_a_folder_is_refused_not_waited_on(tmp_path: Path, reader: str) -> None:
    """Opening a FIFO waited for a writer that never came (and ``/dev/zero`` would be read
    until memory ran out)."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        compute._LAST_TRACE.clear()
        with pytest.raises(TraceError, match=rf"^{path}: not a regular file"):
            READERS[reader](path)


def mutated(data: bytes, rng: random.Random) -> bytes:
    """`data` with a few seeded edits: bytes cut, inserted, doubled or swapped for
    pieces a hostile or broken file holds."""
    out = bytearray(data)
    pieces = [b",", b"\n", b"\r", b"\r\n", b'"', b"\xef\xbb\xbf", b"#", b"1e400", b"nan",
              b"-", b"_", b"+", "\u0661".encode(), b"\x00", b" ", b"9" * 30, b"\xff"]
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out) + 1)
        edit = rng.randrange(6)
        if edit == 0 and out:
            del out[at % len(out)]
        elif edit == 1:
            out[at:at] = rng.choice(pieces)
        elif edit == 2:
            out = out[:at]
        elif edit == 3 and out:
            out[at % len(out)] = rng.randrange(256)
        elif edit == 4:
            out = out[:at] + out[at:] * 2
        else:
            out += b",extra"
    return bytes(out)


def assert_one_line_error_or_a_value(read: Callable[[Path], object], path: Path) -> None:
    try:
        read(path)
    except TraceError as exc:
        text = str(exc)
        assert text.startswith(f"{path}"), text
        assert "\n" not in text and "\r" not in text and len(text) < len(str(path)) + 200, text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reader", VALID)
def test_seeded_mutations_of_a_csv_trace_are_read_or_one_error_line(
        tmp_path: Path, reader: str) -> None:
    rng = random.Random(f"traces3/{reader}")
    path = tmp_path / "trace.csv"
    for _ in range(300):
        path.write_bytes(mutated(VALID[reader], rng))
        compute._LAST_TRACE.clear()
        assert_one_line_error_or_a_value(READERS[reader], path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_seeded_mutations_of_a_fedscale_pickle_are_read_or_one_error_line(
        tmp_path: Path, protocol: int) -> None:
    """They raised OverflowError (a FRAME or memo index past 2^63, a text float past
    the largest) as a traceback, or an error message with the pickle's line breaks."""
    rng = random.Random(f"traces3/pickle/{protocol}")
    behave = {0: {"active": [0, 10], "inactive": [5, 20], "finish_time": 30},
              7: {"active": [1], "inactive": [3]}}
    device = {0: {"computation": 12.5, "communication": 800.0}}
    path = tmp_path / "trace.pkl"
    for kind, value in (("behave", behave), ("capacity", device)):
        for _ in range(150):
            path.write_bytes(mutated(pickle.dumps(value, protocol=protocol), rng))
            assert_one_line_error_or_a_value(
                lambda source, kind=kind: convert(kind, source, tmp_path / "o.csv", 100.0,
                                                  None, 0), path)


@pytest.mark.parametrize(("data", "problem"), [
    (b"\x80\x04\x95" + struct.pack("<Q", 2**63) + b"N.", "not a plain pickle: FRAME"),
    (b"(dp0\nI0\nF1e999\ns.", "not a plain pickle: "),
    (b"(dp0\np" + b"9" * 30 + b"\n.", "refused memo slot 999"),
    (b"(dp0\np" + b"9" * 5000 + b"\n.", "not a plain pickle: "),
    (b"(dp0\nI0\nF#1\r\ns.", "not a plain pickle: could not convert string to float"),
])
def test_a_malformed_pickle_is_one_error_line(tmp_path: Path, data: bytes,
                                              problem: str) -> None:
    path = tmp_path / "x.pkl"
    path.write_bytes(data)
    with pytest.raises(TraceError) as caught:
        read_plain_pickle(path)
    assert str(caught.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)


def test_a_memo_slot_past_the_pickle_is_refused_before_the_unpickler_allocates_it(
        tmp_path: Path) -> None:
    """``LONG_BINPUT 2^24``: 9 bytes that had the unpickler allocate a memo of 2^25 slots
    (256 MiB; 2^32 - 1 asks for 64 GiB)."""
    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02}r" + struct.pack("<I", 2**24) + b".")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=rf"^{path}: refused memo slot {2**24}"):
            read_plain_pickle(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**24


def tower(levels: int, make: Callable[[object], object]) -> object:
    """A container holding the one below twice, `levels` deep: 2^levels references in a
    pickle of a few hundred bytes (the memo shares each level)."""
    value: object = 0
    for _ in range(levels):
        value = make(value)
    return value


@pytest.mark.timeout(20)
def test_a_client_id_of_shared_tuples_is_refused_before_it_is_hashed(
        tmp_path: Path) -> None:
    """Hashing a tuple walks it unfolded: 2^26 tuples took minutes."""
    key = tower(25, lambda inner: (inner, inner))
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({key: {"active": [0], "inactive": [5]}}, protocol=2))
    with pytest.raises(TraceError, match=rf"^{path}: refused a tuple reaching over "
                                         f"{MAX_TUPLES:,} tuples"):
        read_plain_pickle(path)


def test_a_tuple_within_the_bound_is_read(tmp_path: Path) -> None:
    key = tower(18, lambda inner: (inner, inner))  # 2^19 - 1 tuples
    assert MAX_TUPLES >= 2**19 - 1
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({key: 1}, protocol=2))
    assert read_plain_pickle(path) == {key: 1}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ["computation", "communication"])
def test_a_figure_of_shared_lists_is_named_in_a_short_line(tmp_path: Path, key: str) -> None:
    """The error printed the figure's whole repr first: here 2^22 lists, a string of 20 MB
    (at the depth bound, 2^31 of them: minutes and gigabytes)."""
    entry: dict[str, object] = {"computation": 5.0, "communication": 100.0}
    entry[key] = tower(22, lambda inner: [inner, inner])
    path = tmp_path / "device.pkl"
    path.write_bytes(pickle.dumps({3: entry}, protocol=2))
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as caught:
            convert("capacity", path, tmp_path / "c.csv", 100.0, None, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(f"{path}: client 3: '{key}' is [[[")
    assert len(str(caught.value)) < len(str(path)) + 200 and peak < 2**22


@pytest.mark.timeout(20)
def test_a_header_of_many_columns_is_refused_in_linear_time(tmp_path: Path) -> None:
    """The repeated-column check compared each name with all before it: 200,000 names
    (a 1.5 MB line) took some ten minutes."""
    path = tmp_path / "a.csv"
    path.write_text(",".join(f"c{index}" for index in range(200_000)) + "\n0,0,5\n")
    with pytest.raises(TraceError, match=rf"^{path}:1: unknown column 'c0'"):
        load_availability(path, 2)


@pytest.mark.parametrize("kind", ["behave", "capacity"])
def test_an_output_that_cannot_be_written_is_named_not_its_temporary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """The error named the hidden temporary file beside it (``.a.csv.k3j2``), or, for a
    folder given as the output, a temporary in the folder above."""
    source = tmp_path / "x.pkl"
    source.write_bytes(pickle.dumps({0: {"active": [0], "inactive": [5], "computation": 1.0,
                                         "communication": 100}}))
    extra = ["--horizon-s", "100"] if kind == "behave" else []
    for out, problem in ((tmp_path / "none" / "a.csv", "No such file or directory"),
                         (tmp_path, "Is a directory")):
        assert cli.main(["traces", "convert", kind, str(source), str(out), *extra]) == 2
        assert capsys.readouterr().out.strip() == f"error: {out}: {problem}"
