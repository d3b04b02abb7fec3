"""Staleness functions s(d) of asynchronous aggregation, shared by FedAsync and FedBuff.

An update computed from version ``tau`` and applied at version ``t`` has staleness
``d = t - tau`` and is weighted by s(d):

- ``constant``: 1
- ``polynomial``: ``(d + 1) ** -a``
- ``hinge``: 1 if ``d <= b``, else ``1 / (a (d - b) + 1)``

From C. Xie, S. Koyejo, I. Gupta, "Asynchronous Federated Optimization", OPT 2020
(arXiv:1903.03934); FedBuff (Nguyen et al., AISTATS 2022) weights its deltas the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from asyncsync.schema import option

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


@dataclass(frozen=True, kw_only=True)
class StalenessOptions:
    """The staleness function's parameters, mixed into a protocol's parameters (whose
    ``__post_init__`` runs the checks)."""

    staleness_fn: str = option("polynomial", lambda v: v in STALENESS_FUNCTIONS,
                               f"must be one of {', '.join(STALENESS_FUNCTIONS)}",
                               "s(d): constant | polynomial | hinge")
    a: float = option(0.5, lambda v: v >= 0, "must be >= 0",
                      "exponent (polynomial) or slope (hinge) of s")
    b: int = option(4, lambda v: v >= 0, "must be >= 0",
                    "hinge: largest staleness still weighted 1")

    def check_staleness(self) -> None:
        """Refuse, naming it, a constant of s set to other than its default that the chosen
        function does not have (``a``: polynomial and hinge; ``b``: hinge); call it from
        the parameters' ``__post_init__``."""
        used = {"constant": (), "polynomial": ("a",), "hinge": ("a", "b")}[self.staleness_fn]
        for item in fields(StalenessOptions):
            if (item.name in ("a", "b") and item.name not in used
                    and getattr(self, item.name) != item.default):
                raise ValueError(f"{item.name}: not used by the {self.staleness_fn!r} staleness "
                                 "function (a: polynomial and hinge; b: hinge); leave this "
                                 "key out")

    def staleness_weight(self, staleness: int) -> float:
        """s(staleness) for the configured staleness function."""
        if self.staleness_fn == "constant":
            return 1.0
        if self.staleness_fn == "polynomial":
            return float((staleness + 1) ** -self.a)
        if staleness <= self.b:
            return 1.0
        return 1.0 / (self.a * (staleness - self.b) + 1.0)
