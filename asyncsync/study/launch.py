"""Ranks and the server's address from launcher variables (torchrun, Slurm).

Global rank 0 is the parameter server; global rank r > 0 is worker r - 1, so a job of
``workers + 1`` tasks runs one run of a recipe. torchrun sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; Slurm sets SLURM_PROCID and SLURM_NTASKS (export MASTER_ADDR,
e.g. the first host of ``scontrol show hostnames``, and optionally MASTER_PORT).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 8470

TOKEN_ENV = "ASYNCSYNC_TOKEN"
"""The environment variable that carries a run's secret token to its server and workers."""


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher told this process (None where it said nothing)."""

    rank: int | None
    world_size: int | None
    master_addr: str | None
    master_port: int

    @property
    def server_url(self) -> str | None:
        return f"http://{self.master_addr}:{self.master_port}" if self.master_addr else None

    @property
    def worker_rank(self) -> int | None:
        return None if self.rank is None or self.rank == 0 else self.rank - 1


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
    return None


def from_environ(environ: Mapping[str, str]) -> LaunchEnv:
    """Read torchrun's or Slurm's variables (torchrun's win when both are set)."""
    port = _int(environ, "MASTER_PORT")
    return LaunchEnv(
        rank=_int(environ, "RANK", "SLURM_PROCID"),
        world_size=_int(environ, "WORLD_SIZE", "SLURM_NTASKS"),
        master_addr=environ.get("MASTER_ADDR"),
        master_port=DEFAULT_PORT if port is None else port,
    )
