"""Ranks and the server's address from launcher variables (torchrun, Slurm).

Global rank 0 is the parameter server; global rank r > 0 is worker r - 1, so a job of
``workers + 1`` tasks runs one run of a recipe. torchrun sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; Slurm sets SLURM_PROCID and SLURM_NTASKS (export MASTER_ADDR,
e.g. the first host of ``scontrol show hostnames``, and optionally MASTER_PORT). torchrun's
agent itself listens on MASTER_PORT (its TCP store; it says so with
TORCHELASTIC_USE_AGENT_STORE=True), so the server then serves on MASTER_PORT + 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 8470

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""Set to ``True`` by torchrun when its agent holds a TCP store on MASTER_PORT."""

TOKEN_ENV = "ASYNCSYNC_TOKEN"
"""The environment variable that carries a run's secret token to its server and workers."""

SUPERVISOR_ENV = "ASYNCSYNC_SUPERVISOR"
"""``<pid>-<start>`` of the `asyncsync run` that started a node (`netns.owner`): the node
stops once that process has ended (killed outright, it could not stop its nodes)."""


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher told this process (None where it said nothing); `rank_name` is
    the variable that gave the rank (for messages); `server_port` is where the server
    listens (MASTER_PORT, or the port after it when torchrun's agent holds MASTER_PORT)."""

    rank: int | None
    world_size: int | None
    master_addr: str | None
    master_port: int
    server_port: int
    rank_name: str = "RANK"

    @property
    def server_url(self) -> str | None:
        return f"http://{self.master_addr}:{self.server_port}" if self.master_addr else None

    @property
    def worker_rank(self) -> int | None:
        return None if self.rank is None or self.rank == 0 else self.rank - 1


def _int(environ: Mapping[str, str], *names: str) -> tuple[str, int | None]:
    """The first of `names` that is set, and its value (the first name and None if none)."""
    for name in names:
        if name in environ:
            try:
                return name, int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
    return names[0], None


def from_environ(environ: Mapping[str, str]) -> LaunchEnv:
    """Read torchrun's or Slurm's variables (torchrun's win when both are set).

    Raises:
        ValueError: a variable is not an integer, a port or a rank of the job.
    """
    _, port = _int(environ, "MASTER_PORT")
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"MASTER_PORT={port} is not a port (0-65535)")
    rank_name, rank = _int(environ, "RANK", "SLURM_PROCID")
    size_name, world_size = _int(environ, "WORLD_SIZE", "SLURM_NTASKS")
    if rank is not None and rank < 0:
        raise ValueError(f"{rank_name}={rank} must be >= 0")
    if world_size is not None and world_size < 1:
        raise ValueError(f"{size_name}={world_size} must be >= 1")
    if rank is not None and world_size is not None and rank >= world_size:
        raise ValueError(f"{rank_name}={rank} is outside the job's ranks "
                         f"0..{world_size - 1} ({size_name}={world_size})")
    master_port = DEFAULT_PORT if port is None else port
    server_port = master_port
    if environ.get(AGENT_STORE_ENV, "").lower() == "true":  # torchrun's agent holds it
        server_port = master_port + 1
        if server_port > 65535:
            raise ValueError(f"MASTER_PORT={master_port}: torchrun's agent listens there "
                             "(its store), so the server takes the next port, and there is "
                             "none; give torchrun --master-port below 65535")
    return LaunchEnv(rank=rank, world_size=world_size, master_addr=environ.get("MASTER_ADDR"),
                     master_port=master_port, rank_name=rank_name, server_port=server_port)
