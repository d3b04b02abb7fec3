"""`asyncsync server`, `worker` and `launch` answer bad input (a refused token or run id, a
rank outside the run, a URL without a scheme, a port out of range, an unwritable port
file) with one ``error:`` line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsync.protocols.base import Forbidden, OutOfStep
from asyncsync.study.launch import from_environ
from asyncsync.study.node_commands import join_refused
from tests.test_cli import cli, one_error, run_main

pytestmark = pytest.mark.xdist_group("real-clock")  # starts a server process

RECIPE = """
[defaults]
workers = 2
[defaults.stop]
time_s = 600
[defaults.model]
name = "mlp"
[[runs]]
name = "net"
protocol = "bsp"
"""


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    return path


def start_server(recipe: Path, log_dir: Path, env: dict[str, str],
                 *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """A server on 127.0.0.1 (a port it picked) and its URL, once it listens."""
    port_file = log_dir / "server.port"
    server = subprocess.Popen(
        [sys.executable, "-m", "asyncsync", "server", "--recipe", str(recipe), "--port", "0",
         "--port-file", str(port_file), "--log-dir", str(log_dir), *extra],
        stdout=(log_dir.parent / "server.out").open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    deadline = time.monotonic() + 120
    while not port_file.exists():
        assert server.poll() is None, (log_dir.parent / "server.out").read_text()
        assert time.monotonic() < deadline, "the server did not start listening"
        time.sleep(0.1)
    return server, f"http://127.0.0.1:{int(port_file.read_text())}"


@pytest.fixture
def server(recipe: Path, tmp_path: Path) -> Iterator[str]:
    """The URL of a server whose run token is ``aaa`` (its run never starts)."""
    process, url = start_server(recipe, tmp_path / "logs", {"ASYNCSYNC_TOKEN": "aaa"})
    try:
        yield url
    finally:
        process.kill()
        process.wait()


def test_a_refused_token_is_one_error_line(recipe: Path, server: str) -> None:
    env = {key: value for key, value in os.environ.items()
           if key != "ASYNCSYNC_WORKER_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "asyncsync", "worker", "--recipe",
                           str(recipe), "--server", server, "--rank", "0"],
                          env={**env, "ASYNCSYNC_TOKEN": "bbb", "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=120)
    error = one_error(done)
    assert error.startswith(f"error: the server at {server} refused this worker's token "
                            "(401: missing or wrong bearer token)"), error
    assert "ASYNCSYNC_TOKEN" in error and "ASYNCSYNC_WORKER_TOKEN" in error
    assert "asyncsync worker-token" in error


def test_a_join_refused_for_another_run_is_one_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, recipe: Path,
        server: str) -> None:
    monkeypatch.setenv("ASYNCSYNC_TOKEN", "aaa")
    error = one_error(run_main(capsys, "worker", "--recipe", str(recipe), "--server", server,
                               "--rank", "1", "--run-id", "other"))
    assert error.startswith(f"error: the server at {server} refused worker 1's join (403: "
                            "wrong run 'other': this server runs 'r/net')"), error
    assert "--run-id" in error


def test_a_refused_join_names_the_reason_and_what_to_check() -> None:
    live = join_refused(OutOfStep("worker 0 has a live session"), "http://h:1", 0)
    assert str(live) == ("the server at http://h:1 refused worker 0's join (409: worker 0 "
                         "has a live session): is another worker running with rank 0?")
    other = join_refused(Forbidden("no"), "http://h:1", 3)
    assert str(other).startswith("the server at http://h:1 refused worker 3's join (403: no)")


@pytest.mark.parametrize("rank", ["5", "-1", "2"])
def test_a_worker_rank_outside_the_run_is_one_error_line(
        capsys: pytest.CaptureFixture[str], recipe: Path, rank: str) -> None:
    assert one_error(run_main(capsys, "worker", "--recipe", str(recipe), "--server",
                              "http://127.0.0.1:9", "--rank", rank)) == (
        f"error: --rank {rank}: the run has workers 0..1")


def test_a_launch_rank_outside_the_job_is_one_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        recipe: Path) -> None:
    for name, value in (("RANK", "5"), ("WORLD_SIZE", "3"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "9")):
        monkeypatch.setenv(name, value)
    assert one_error(run_main(capsys, "launch", "--recipe", str(recipe))) == (
        "error: RANK=5 is outside the job's ranks 0..2 (WORLD_SIZE=3)")
    monkeypatch.delenv("WORLD_SIZE")
    assert one_error(run_main(capsys, "launch", "--recipe", str(recipe))) == (
        "error: RANK=5: the run has workers 0..1 (ranks 1..2; rank 0 serves)")


@pytest.mark.parametrize(("environ", "problem"), [
    ({"RANK": "-1"}, "RANK=-1 must be >= 0"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "3"},
     "SLURM_PROCID=4 is outside the job's ranks 0..2 (SLURM_NTASKS=3)"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a port (0-65535)"),
])
def test_launcher_variables_out_of_range_are_refused(environ: dict[str, str],
                                                     problem: str) -> None:
    with pytest.raises(ValueError) as err:
        from_environ(environ)
    assert str(err.value) == problem


@pytest.mark.parametrize("url", ["127.0.0.1:18470", "ftp://127.0.0.1:18470", "http://",
                                 "http://127.0.0.1:99999"])
def test_a_server_url_workers_cannot_dial_is_one_error_line(
        capsys: pytest.CaptureFixture[str], recipe: Path, url: str) -> None:
    error = one_error(run_main(capsys, "worker", "--recipe", str(recipe), "--server", url,
                               "--rank", "0"))
    assert error.startswith(f"error: --server {url}: "), error
    assert "http://HOST:PORT" in error


@pytest.mark.parametrize("port", ["99999", "-1", "eighty"])
def test_a_port_out_of_range_is_refused_by_the_parser(
        capsys: pytest.CaptureFixture[str], recipe: Path, port: str) -> None:
    assert one_error(run_main(capsys, "server", "--recipe", str(recipe), "--port", port)) == (
        f"error: asyncsync server: argument --port: expected a port number 0-65535, got "
        f"{port!r} (see asyncsync server --help)")


def test_an_unwritable_port_file_is_named_as_given(tmp_path: Path, recipe: Path) -> None:
    port_file = tmp_path / "nowhere" / "p"
    done = cli("server", "--recipe", str(recipe), "--port", "0", "--port-file",
               str(port_file))
    assert one_error(done) == (f"error: --port-file {port_file}: cannot write it: No such "
                               "file or directory")
