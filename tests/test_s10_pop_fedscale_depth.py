"""A hostile FedScale pickle of deeply nested containers is one error line, never a
crash: a tuple nested a million deep as a client id made hashing it overflow the C stack
(the converter died of a segmentation fault), and lists nested through the memo made
printing a value raise a bare RecursionError."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.hetero.fedscale import MAX_DEPTH, read_plain_pickle
from asyncsync.hetero.traces import TraceError

PROTO_2 = b"\x80\x02"
EMPTY_DICT, EMPTY_LIST, TUPLE1 = b"}", b"]", b"\x85"
SETITEM, APPEND, POP, STOP = b"s", b"a", b"0", b"."


def _int(value: int) -> bytes:
    return b"K" + bytes([value])  # BININT1


def _text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _put(index: int) -> bytes:
    return b"r" + struct.pack("<I", index)  # LONG_BINPUT


def _get(index: int) -> bytes:
    return b"j" + struct.pack("<I", index)  # LONG_BINGET


def deep_tuple_key(levels: int) -> bytes:
    """``{((...(0,)...),): {}}``: a client id of `levels` nested tuples (a few bytes each)."""
    return PROTO_2 + EMPTY_DICT + _int(0) + TUPLE1 * levels + EMPTY_DICT + SETITEM + STOP


def deep_list_through_the_memo(levels: int) -> bytes:
    """``{0: {"active": [0], "inactive": [L]}}`` where L is then nested `levels` deep, one
    list at a time, each fetched back from the memo (so no single stack item is deep)."""
    out = PROTO_2 + EMPTY_DICT + _int(0) + EMPTY_DICT
    out += _text("active") + EMPTY_LIST + _int(0) + APPEND + SETITEM
    out += _text("inactive") + EMPTY_LIST + EMPTY_LIST + _put(0) + APPEND + SETITEM
    out += SETITEM
    for level in range(levels):
        out += _get(level) + EMPTY_LIST + _put(level + 1) + APPEND + POP
    return out + STOP


def convert(kind: str, source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``asyncsync traces convert`` in a child process (a crash must not take pytest); its
    error line is on stdout."""
    extra = ["--horizon-s", "100"] if kind == "behave" else []
    return subprocess.run([sys.executable, "-m", "asyncsync", "traces", "convert", kind,
                           str(source), str(out), *extra],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["behave", "capacity"])
def test_a_client_id_of_a_million_nested_tuples_is_refused_not_a_crash(
        tmp_path: Path, kind: str) -> None:
    source = tmp_path / "client_trace"
    source.write_bytes(deep_tuple_key(1_000_000))
    done = convert(kind, source, tmp_path / "out.csv")
    assert done.returncode == 2, (done.returncode, done.stdout[-300:], done.stderr[-500:])
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {source}: refused containers")
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.timeout(60)
def test_lists_nested_through_the_memo_are_one_error_line(tmp_path: Path) -> None:
    """The error names the client and the key, the list shown cut short (its whole repr
    recursed past the interpreter's limit, and the error then named only the nesting)."""
    source = tmp_path / "client_behave_trace"
    source.write_bytes(deep_list_through_the_memo(5_000))
    done = convert("behave", source, tmp_path / "out.csv")
    assert done.returncode == 2, (done.returncode, done.stdout[-300:], done.stderr[-500:])
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {source}: client 0: ")
    assert "'inactive'[0] is [[[" in lines[0] and len(lines[0]) < len(str(source)) + 150


def test_the_depth_bound_is_exact_for_tuples_and_lists(tmp_path: Path) -> None:
    """Nested ``MAX_DEPTH`` deep (the outer map counting one) is read; one more is not."""
    for make in (lambda inner: (inner,), lambda inner: [inner]):
        value: object = 0
        for _ in range(MAX_DEPTH - 1):
            value = make(value)
        source = tmp_path / "x.pkl"
        source.write_bytes(pickle.dumps({0: value}, protocol=2))
        assert read_plain_pickle(source) == {0: value}
        source.write_bytes(pickle.dumps({0: make(value)}, protocol=2))
        with pytest.raises(TraceError, match=f"nested {MAX_DEPTH + 1} deep"):
            read_plain_pickle(source)
