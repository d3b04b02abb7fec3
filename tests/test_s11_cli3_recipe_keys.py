"""A recipe's device this host lacks, and its dataset's files absent or malformed, are
refused naming the recipe file and the key (they named the device, or the folder, alone:
which file and which key to change was left to guess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import QUICKSTART, one_error, run_main


def last_error(done: tuple[int, str]) -> str:
    """`check`'s ``error:`` line, under the table it printed first."""
    code, out = done
    assert code == 2 and "Traceback" not in out, out
    return " ".join(out.splitlines()[-1].split())


def test_a_device_this_host_lacks_names_the_file_and_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    device = ["--set", 'device="cuda:99"']  # no host here has 100 GPUs
    message = one_error(run_main(capsys, "run", QUICKSTART, "--plain", "--logs",
                                 str(tmp_path / "logs"), *device))
    assert message.startswith(f"error: {QUICKSTART}: device: device 'cuda:99' requested "
                              "but "), message
    assert message.endswith('(runs: bsp, asp); use device = "cpu", or "auto" for CUDA '
                            "where there is one"), message
    code, out = run_main(capsys, "check", QUICKSTART, *device)
    assert code == 0, out
    assert f"note: {QUICKSTART}: device: device 'cuda:99'" in " ".join(out.split()), out


@pytest.mark.parametrize("command", ["check", "run"])
def test_missing_dataset_files_name_the_file_run_and_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    root = tmp_path / "data"
    extra = ["--plain", "--logs", str(tmp_path / "logs")] if command == "run" else []
    done = run_main(capsys, command, QUICKSTART, *extra, "--set", "data.name=mnist",
                    "--set", f"data.root={root}")
    message = one_error(done) if command == "run" else last_error(done)
    assert message.startswith(f"error: {QUICKSTART}: bsp: data.root: mnist: files not "
                              f"found in {root / 'MNIST' / 'raw'}: "), message
    assert not (tmp_path / "logs").exists()


def test_a_malformed_dataset_file_names_the_file_run_and_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(b"\0\0")  # 2 bytes: not even a header
    message = last_error(run_main(capsys, "check", QUICKSTART, "--set", "data.name=mnist",
                                  "--set", f"data.root={tmp_path / 'data'}"))
    assert message.startswith(f"error: {QUICKSTART}: bsp: data.root: "
                              f"{raw / 'train-images-idx3-ubyte'}: 2 bytes, shorter than "
                              "the "), message
