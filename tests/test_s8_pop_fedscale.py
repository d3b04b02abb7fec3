"""FedScale pickles that are malformed in ways a converted trace hid: each is one error
line naming the file, the client, the key and what it holds, never a traceback or a
trace that a run refuses later."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from asyncsync import cli


def _convert(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str,
             value: object) -> str:
    """Convert `value`, pickled, as a `kind` trace: the one output line, which must be an
    error (exit status 2) that wrote nothing."""
    source = tmp_path / "trace.pkl"
    source.write_bytes(pickle.dumps(value))
    out = tmp_path / "out.csv"
    status = cli.main(["traces", "convert", kind, str(source), str(out),
                       "--horizon-s", "100"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert status == 2 and not out.exists()
    text = " ".join(" ".join(lines).split())
    assert text.startswith(f"error: {source}: ") and text.count("error:") == 1
    return text


@pytest.mark.parametrize(("entry", "expected"), [
    ({"computation": 162.0}, "no 'communication'"),
    ({"communication": 5.0}, "no 'computation'"),
    ({"computation": "162", "communication": 5.0}, "'computation' is '162' (str)"),
    ({"computation": -1.0, "communication": 5.0}, "'computation' is -1.0"),
    ({"computation": 162.0, "communication": 0}, "'communication' is 0"),
])
def test_a_bad_device_figure_names_the_client_the_key_and_its_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object],
        expected: str) -> None:
    """A missing, wrong or negative figure did not say which key held what."""
    text = _convert(tmp_path, capsys, "capacity", {5: entry})
    assert "client 5: " in text and expected in text


@pytest.mark.parametrize(("entry", "expected"), [
    ({"active": [0], "inactive": ["5"], "finish_time": 50}, "'inactive'[0] is '5' (str)"),
    ({"active": [0, 20], "inactive": [5, 10], "finish_time": 50},
     "interval 1 from 'active' 20 to 'inactive' 10 is empty or reversed"),
    ({"active": [-3], "inactive": [5], "finish_time": 50},
     "interval 0 from 'active' -3 to 'inactive' 5 is negative"),
    ({"active": [0], "inactive": [5], "finish_time": -30}, "'finish_time' -30 is not"),
    ({"active": [0], "inactive": [5], "finish_time": []}, "'finish_time' [] (list)"),
])
def test_a_bad_time_names_the_client_the_key_and_its_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object],
        expected: str) -> None:
    """A negative ``finish_time`` (or an empty list there) was read as "no replay"; the
    messages did not say which time was wrong."""
    text = _convert(tmp_path, capsys, "behave", {9: entry})
    assert "client 9: " in text and expected in text


def test_a_behave_trace_whose_clients_are_never_online_is_refused_at_conversion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was written as a header without rows, which every run then refused."""
    text = _convert(tmp_path, capsys, "behave", {
        1: {"active": [], "inactive": [], "finish_time": 50},
        2: {"active": [200], "inactive": [300], "finish_time": 400}})
    assert "no worker is ever online" in text and "--horizon-s 100" in text


@pytest.mark.parametrize(("kind", "value"), [
    ("capacity", {5: {"computation": 10 ** 400, "communication": 5.0}}),
    ("capacity", {10 ** 5000: {"computation": 1.0, "communication": 5.0}}),
    ("capacity", {5: {"computation": 1.0, "communication": 10 ** 5000}}),
    ("behave", {10 ** 5000: {"active": [0], "inactive": [5], "finish_time": 10}}),
    ("behave", {9: {"active": [0], "inactive": [5], "finish_time": -(10 ** 400)}}),
])
def test_an_integer_wider_than_64_bits_is_refused_as_it_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, value: object) -> None:
    """Beyond a float's range it was an OverflowError traceback; beyond 4,300 digits a
    ValueError one (the error message itself could not print the number)."""
    text = _convert(tmp_path, capsys, kind, value)
    assert "refused an integer of " in text and "no id, time or figure" in text


def test_an_error_shows_at_most_40_characters_of_a_client_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A client id of a megabyte made an error line of a megabyte."""
    text = _convert(tmp_path, capsys, "capacity", {"x" * 1_000_000: {"computation": -1.0,
                                                                     "communication": 5.0}})
    assert f"client '{'x' * 36}...: 'computation' is -1.0" in text and len(text) < 400
