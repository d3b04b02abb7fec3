"""TLS between the nodes, with a CA and a server certificate (for 127.0.0.1) that the tests
make with the openssl command: runs over https through the CLI and the runner, and a worker
that does not trust the CA is refused with a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncsync.runlog.schema import KEY, Kind
from asyncsync.transport.http_client import HttpTransport, TlsFailure, client_tls
from asyncsync.transport.http_server import ParameterServer, server_tls
from tests.helpers import tiny_model
from tests.test_multinode import free_port, start

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="the openssl command, which makes "
                                "the test certificates, is not installed")

EXTENSIONS = """
[req]
distinguished_name = name
[name]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""

RECIPE = """
[defaults]
workers = 1
[defaults.stop]
time_s = 2
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 0.5
[[runs]]
name = "tls"
protocol = "bsp"
"""


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and a certificate for 127.0.0.1 signed by it (EC P-256, valid for two days)."""
    root = tmp_path_factory.mktemp("pki")
    config = root / "openssl.cnf"
    config.write_text(EXTENSIONS)

    def openssl(*args: str) -> None:
        assert OPENSSL is not None
        subprocess.run([OPENSSL, *args], check=True, capture_output=True, timeout=60)

    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *new_key, "-keyout", str(root / "ca.key"), "-out",
            str(root / "ca.pem"), "-days", "2", "-subj", "/CN=asyncsync test CA", "-config",
            str(config), "-extensions", "ca")
    openssl("req", "-new", *new_key, "-keyout", str(root / "server.key"), "-out",
            str(root / "server.csr"), "-subj", "/CN=127.0.0.1", "-config", str(config))
    openssl("x509", "-req", "-in", str(root / "server.csr"), "-CA", str(root / "ca.pem"),
            "-CAkey", str(root / "ca.key"), "-CAcreateserial", "-out",
            str(root / "server.pem"), "-days", "2", "-extfile", str(config), "-extensions",
            "server")
    return Pki(root / "ca.pem", root / "server.pem", root / "server.key")


async def test_only_a_client_that_trusts_the_ca_is_served(pki: Pki) -> None:
    async with ParameterServer(tiny_model(), "asp", 1, token="run-secret",
                               tls=server_tls(pki.cert, pki.key)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        numel = server.core.store.numel
        untrusting = HttpTransport(server.url, numel, token="run-secret")
        with pytest.raises(TlsFailure, match="--tls-ca") as refused:  # at once, no retries
            await asyncio.wait_for(untrusting.request("join", {"worker": 0, "run_id": "run"}),
                                   untrusting.connect_timeout_s / 2)
        await untrusting.close()
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
        clear_text = HttpTransport(server.url.replace("https", "http"), numel,
                                   token="run-secret", connect_timeout_s=0.0)
        with pytest.raises(ConnectionError):
            await clear_text.request("join", {"worker": 0, "run_id": "run"})
        await clear_text.close()
        assert not server.core.workers[0].joined
        trusting = HttpTransport(server.url, numel, token="run-secret", tls=client_tls(pki.ca))
        reply, vector = await trusting.request("join", {"worker": 0, "run_id": "run"})
        await trusting.close()
        assert reply["version"] == 0 and vector is not None
        assert server.core.workers[0].joined


def test_a_run_over_tls_through_the_cli_flags(tmp_path: Path, pki: Pki) -> None:
    recipe = tmp_path / "tls.toml"
    recipe.write_text(RECIPE)
    port = free_port("127.0.0.1")
    common = ["--recipe", str(recipe), "--log-dir", str(tmp_path)]
    server = start(["server", *common, "--port", str(port), "--tls-cert", str(pki.cert),
                    "--tls-key", str(pki.key)])
    url = f"https://127.0.0.1:{port}"
    try:
        untrusting = start(["worker", *common, "--server", url, "--rank", "0"])
        out, _ = untrusting.communicate(timeout=120)
        assert untrusting.returncode == 2, out
        assert "error:" in out and "--tls-ca" in out and "Traceback" not in out
        worker = start(["worker", *common, "--server", url, "--rank", "0", "--tls-ca",
                        str(pki.ca)])
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0 and "worker 0 done" in out, out
        out, _ = server.communicate(timeout=120)
        assert server.returncode == 0 and f"at {url}" in out, out
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert next(e for e in events if e[KEY] == Kind.STOP)["versions"] > 0


def test_a_run_over_tls_from_the_recipe_keys(tmp_path: Path, pki: Pki) -> None:
    recipe = tmp_path / "tls.toml"
    recipe.write_text(RECIPE + f'[defaults.tls]\ncert = "{pki.cert}"\nkey = "{pki.key}"\n'
                               f'ca = "{pki.ca}"\n')
    done = subprocess.run([sys.executable, "-m", "asyncsync", "run", str(recipe), "--plain",
                           "--logs", str(tmp_path / "logs")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    (summary_file,) = (tmp_path / "logs").glob("*/*/tls/summary.json")
    summary = json.loads(summary_file.read_text())
    assert "error" not in summary and summary["versions"] > 0
    assert "at https://127.0.0.1:" in (summary_file.parent / "server.log").read_text()
