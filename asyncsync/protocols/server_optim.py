"""Server optimizers: the step a server takes with an aggregated delta (FedOpt's seam).

Protocols that aggregate deltas (local_sgd, fedavg, fedbuff, fednova, scaffold; DiLoCo's
outer step) treat the negated aggregate as a pseudo-gradient ``g = -delta`` and let a
server optimizer step the global parameters, ``w <- w - update(g)``:

- ``sgd``: ``w - lr g``, optionally with (Nesterov) momentum; at lr 1 without momentum it
  is plain delta averaging, ``w + delta``.
- ``adam``, ``yogi``, ``adagrad``: FedAdam, FedYogi and FedAdagrad of Reddi et al.,
  ``m <- beta1 m + (1 - beta1) g``; ``v <- beta2 v + (1 - beta2) g^2`` (adam),
  ``v - (1 - beta2) g^2 sign(v - g^2)`` (yogi) or ``v + g^2`` (adagrad); then
  ``w <- w - lr m_hat / (sqrt(v_hat) + tau)``.

**(choice)** Bias correction: ``m_hat = m / (1 - beta1^t)`` and, for adam and yogi,
``v_hat = v / (1 - beta2^t)``, as `torch.optim.Adam` does, so that FedAdam is
`torch.optim.Adam` (eps = tau) fed the pseudo-gradient; FedAdagrad with beta1 = 0 is
`torch.optim.Adagrad` (eps = tau). ``bias_correction = false`` gives the paper's
Algorithm 2 as printed (``m_hat = m``, ``v_hat = v``). **(choice)** The moments start at 0,
as torch's do (the paper's analysis takes ``v >= tau^2`` at the start; with tau added to
``sqrt(v)`` a zero start is safe).

Only parameters take the step: buffer slots (BatchNorm statistics) become ``w + delta``,
the workers' mean for a mean delta (`apply_delta`). A step that would make the
optimizer's state or the parameters non-finite is refused (`Unacceptable`): both stay as
they were, `ServerOptimizer.refused` counts it and a warning is logged (at the 1st, 10th,
100th, ... refusal), since the state is computed out of place and installed only when
finite. A round protocol then discards the round (see `rounds`).

Reference: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields

import torch

from asyncsync.protocols.base import CheckpointError
from asyncsync.protocols.messages import Unacceptable
from asyncsync.protocols.ports import Store
from asyncsync.schema import option

LOG = logging.getLogger(__name__)
SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")
ADAPTIVE = SERVER_OPTIMIZERS[1:]
ADAPTIVE_LR = 1e-2
"""FedOpt's server learning rate when none is given."""


class ServerOptimizer(ABC):
    """A server-side optimizer of flat parameters, with checkpointable state.

    Attributes:
        lr: the server learning rate; state: the optimizer's tensors (empty before the
            first step); refused: steps refused because they would be non-finite.
    """

    def __init__(self, lr: float) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.lr = lr
        self.state: dict[str, torch.Tensor] = {}
        self.refused = 0

    @abstractmethod
    def advance(self, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor,
                                                                dict[str, torch.Tensor]]:
        """The next parameters and state for pseudo-gradient `g` at `w`, out of place."""

    @abstractmethod
    def state_shapes(self, size: int) -> dict[str, tuple[int, ...]]:
        """The shape of each state tensor after a step on `size` parameters."""

    def step(self, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The parameters after one step on pseudo-gradient `g` (a new tensor), the state
        advanced; refused as `Unacceptable`, the state unchanged, if the result would be
        non-finite."""
        new, state = self.advance(w, g)
        if all(bool(torch.isfinite(t).all()) for t in (new, *state.values())):
            self.state = state
            return new
        self.refused += 1
        if math.log10(self.refused).is_integer():
            LOG.warning("%s refused %d server steps that would have made the model or its "
                        "state non-finite; training has probably diverged",
                        type(self).__name__, self.refused)
        raise Unacceptable("the server optimizer's step would make the model or its state "
                           "non-finite; refused, the model is unchanged")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state tensors (empty before the first step)."""
        return dict(self.state)

    def load_state_dict(self, state: dict[str, torch.Tensor], size: int) -> None:
        """Restore what `state_dict` returned, for `size` parameters (`CheckpointError`
        when it does not fit)."""
        expected = self.state_shapes(size) if state else {}
        if set(state) != set(expected):
            raise CheckpointError(f"server optimizer state holds {sorted(state)}, expected "
                                  f"{sorted(expected)}")
        for key, shape in expected.items():
            if tuple(state[key].shape) != shape:
                raise CheckpointError(f"server optimizer state {key} has shape "
                                      f"{tuple(state[key].shape)}, expected {shape}")
        self.state = {key: value.clone() for key, value in state.items()}


class ServerSgd(ServerOptimizer):
    """``w - lr g``, with optional momentum (``buf <- momentum buf + g``, torch's) and
    Nesterov (``g + momentum buf``)."""

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(lr)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if nesterov and momentum == 0:
            raise ValueError("nesterov needs momentum > 0")
        self.momentum = momentum
        self.nesterov = nesterov

    def advance(self, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor,
                                                                dict[str, torch.Tensor]]:
        if not self.momentum:
            return w - self.lr * g, {}
        old = self.state.get("momentum")
        buffer = g.clone() if old is None else old * self.momentum + g
        direction = g + self.momentum * buffer if self.nesterov else buffer
        return w - self.lr * direction, {"momentum": buffer}

    def state_shapes(self, size: int) -> dict[str, tuple[int, ...]]:
        return {"momentum": (size,)} if self.momentum else {}


class ServerAdaptive(ServerOptimizer):
    """FedAdam, FedYogi or FedAdagrad (see the module docstring)."""

    def __init__(self, kind: str, lr: float, beta1: float, beta2: float, tau: float,
                 bias_correction: bool = True) -> None:
        super().__init__(lr)
        if kind not in ADAPTIVE:
            raise ValueError(f"unknown adaptive optimizer {kind!r}; known: {', '.join(ADAPTIVE)}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and tau > 0):
            raise ValueError(f"need 0 <= beta1, beta2 < 1 and tau > 0, got {beta1}, {beta2}, "
                             f"{tau}")
        self.kind = kind
        self.beta1, self.beta2, self.tau = beta1, beta2, tau
        self.bias_correction = bias_correction

    def advance(self, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor,
                                                                dict[str, torch.Tensor]]:
        b1, b2 = self.beta1, self.beta2
        t = int(self.state["step"]) + 1 if self.state else 1
        m = self.state["m"] * b1 + g * (1 - b1) if self.state else g * (1 - b1)
        v = self.state["v"] if self.state else torch.zeros_like(g)
        g2 = g * g
        if self.kind == "adam":
            v = v * b2 + g2 * (1 - b2)
        elif self.kind == "yogi":
            v = v - torch.sign(v - g2) * g2 * (1 - b2)
        else:
            v = v + g2
        m_hat, v_hat = m, v
        if self.bias_correction:
            m_hat = m / (1 - b1**t)
            if self.kind != "adagrad":
                v_hat = v / (1 - b2**t)
        new = w - self.lr * m_hat / (v_hat.sqrt() + self.tau)
        return new, {"m": m, "v": v, "step": torch.tensor(float(t), dtype=torch.float64)}

    def state_shapes(self, size: int) -> dict[str, tuple[int, ...]]:
        return {"m": (size,), "v": (size,), "step": ()}


def apply_delta(optimizer: ServerOptimizer, w: torch.Tensor, delta: torch.Tensor,
                num_params: int) -> torch.Tensor:
    """The next global vector from `w` and an aggregated `delta`: the optimizer's step on
    ``-delta`` for the first `num_params` elements (parameters), ``w + delta`` for the
    rest (buffers). O(model): call it through ``store.compute``."""
    new = w + delta
    new[:num_params] = optimizer.step(w[:num_params], -delta[:num_params])
    return new


@dataclass(frozen=True, kw_only=True)
class AdaptiveOptions:
    """The adaptive optimizers' parameters, mixed into a protocol's parameters (whose
    ``__post_init__`` runs the checks)."""

    beta1: float = option(0.9, lambda v: 0 <= v < 1, "must be in [0, 1)",
                          "adam, yogi, adagrad: first-moment decay")
    beta2: float = option(0.99, lambda v: 0 <= v < 1, "must be in [0, 1)",
                          "adam, yogi: second-moment decay")
    tau: float = option(1e-3, lambda v: v > 0, "must be > 0",
                        "adam, yogi, adagrad: tau, added to sqrt(v)")
    bias_correction: bool = option(True, help="divide the moments by 1 - beta^t, as "
                                              "torch.optim.Adam (false: the paper's rule)")

    def check_unused(self, key: str, kind: str) -> None:
        """Refuse, naming it, a moment option set to other than its default that optimizer
        `kind` (the value of the option `key`) does not use: a silently ignored key would
        let a sweep over it compare identical runs."""
        unused = {"sgd": ("beta1", "beta2", "tau", "bias_correction"),
                  "adagrad": ("beta2",)}.get(kind, ())
        for item in fields(AdaptiveOptions):
            if item.name in unused and getattr(self, item.name) != item.default:
                raise ValueError(f"{item.name}: not used by the {kind!r} optimizer ({key} is "
                                 f"{kind!r}); leave this key out")

    def adaptive_optimizer(self, kind: str, lr: float) -> ServerAdaptive:
        """The adaptive optimizer `kind` (adam | yogi | adagrad) at learning rate `lr`."""
        return ServerAdaptive(kind, lr, self.beta1, self.beta2, self.tau, self.bias_correction)


@dataclass(frozen=True, kw_only=True)
class ServerOptimizerOptions(AdaptiveOptions):
    """The server optimizer of a protocol that aggregates deltas (mixed into its
    parameters)."""

    server_optimizer: str = option("sgd", lambda v: v in SERVER_OPTIMIZERS,
                                   f"must be one of {', '.join(SERVER_OPTIMIZERS)}",
                                   "server step on the negated aggregated delta: "
                                   "sgd | adam | yogi | adagrad")
    server_lr: float | None = option(None, lambda v: v is None or v > 0, "must be > 0",
                                     "eta_g (default: 1 with sgd, i.e. plain averaging; "
                                     f"{ADAPTIVE_LR} with the adaptive ones)")

    def check_server_optimizer(self) -> None:
        """Refuse the adaptive options the chosen server optimizer does not use (call it
        from the parameters' ``__post_init__``)."""
        self.check_unused("server_optimizer", self.server_optimizer)

    def make_server_optimizer(self) -> ServerOptimizer:
        """A fresh server optimizer as configured."""
        if self.server_optimizer == "sgd":
            return ServerSgd(1.0 if self.server_lr is None else self.server_lr)
        lr = ADAPTIVE_LR if self.server_lr is None else self.server_lr
        return self.adaptive_optimizer(self.server_optimizer, lr)


class ServerOptimizerState:
    """Checkpointing for a rule with one server optimizer (mixed in before `ServerRule`):
    its state goes under ``server.``."""

    optimizer: ServerOptimizer
    store: Store

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The server optimizer's state, under ``server.``."""
        return {f"server.{key}": value for key, value in self.optimizer.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the server optimizer's state (the ``server.`` entries of `state`)."""
        self.optimizer.load_state_dict({key.removeprefix("server."): value
                                        for key, value in state.items()
                                        if key.startswith("server.")}, self.store.num_params)
