"""A program that only runs a worker (its server elsewhere) dials the server's URL with
``from asyncsync import Worker``, as docs/embedding.md shows (`Worker.connect`)."""

from __future__ import annotations

import subprocess
import sys

WORKER_ONLY = """
import torch
from asyncsync import Worker
worker = Worker.connect(0, "http://127.0.0.1:9", torch.nn.Linear(4, 2),
                        lambda size: (torch.randn(size, 4), torch.zeros(size).long()), "asp")
print(type(worker.transport).__name__, worker.transport.url)
"""


def test_worker_connect_dials_http_without_the_server_imported() -> None:
    done = subprocess.run([sys.executable, "-c", WORKER_ONLY], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]  # before: "known schemes are none"
    assert done.stdout.split() == ["HttpTransport", "http://127.0.0.1:9"]
