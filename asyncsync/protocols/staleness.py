"""Staleness functions s(d) of asynchronous aggregation, shared by FedAsync and FedBuff.

An update computed from version ``tau`` and applied at version ``t`` has staleness
``d = t - tau`` and is weighted by s(d):

- ``constant``: 1
- ``polynomial``: ``(d + 1) ** -a``
- ``hinge``: 1 if ``d <= b``, else ``1 / (hinge_a (d - b) + 1)``

From C. Xie, S. Koyejo, I. Gupta, "Asynchronous Federated Optimization", OPT 2020
(arXiv:1903.03934); FedBuff (Nguyen et al., AISTATS 2022) weights its deltas the same way.

**(choice)** The paper calls both the polynomial's exponent and the hinge's slope ``a``,
but they are two constants of two functions with different scales: it runs the polynomial
with a = 0.5 and the hinge with a = 4 or 10 (b = 2 or 4). They are two keys here, ``a``
(the polynomial's, default 0.5) and ``hinge_a`` (the hinge's, which the hinge requires:
earlier versions took the hinge's slope from ``a``, 0.5 by default, so a hinge run
without a slope is refused rather than silently given another one). A hinge recipe that
still sets ``a`` is refused with the key to write instead.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from asyncsync.schema import option

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")
POLYNOMIAL_A = 0.5
"""The polynomial's exponent by default (Xie et al.'s, and FedBuff's 1 / sqrt(1 + d))."""
USES = {"constant": (), "polynomial": ("a",), "hinge": ("hinge_a", "b")}
"""The constants of s each staleness function has."""


@dataclass(frozen=True, kw_only=True)
class StalenessOptions:
    """The staleness function's parameters, mixed into a protocol's parameters (whose
    ``__post_init__`` runs the checks)."""

    staleness_fn: str = option("polynomial", lambda v: v in STALENESS_FUNCTIONS,
                               f"must be one of {', '.join(STALENESS_FUNCTIONS)}",
                               "s(d): constant | polynomial | hinge")
    a: float = option(POLYNOMIAL_A, lambda v: v >= 0, "must be >= 0",
                      "polynomial: exponent a of s(d) = (d + 1)^-a")
    hinge_a: float | None = option(None, lambda v: v is None or v >= 0, "must be >= 0",
                                   "hinge (required): slope a of s(d) = 1 / (a (d - b) + 1) "
                                   "past b (Xie et al.: 10 with b = 4, or 4 with b = 2)")
    b: int = option(4, lambda v: v >= 0, "must be >= 0",
                    "hinge: largest staleness still weighted 1")

    def check_staleness(self) -> None:
        """Refuse, naming it, a constant of s set to other than its default that the chosen
        function does not have, and a hinge without its slope; call it from the
        parameters' ``__post_init__``."""
        used = USES[self.staleness_fn]
        if self.staleness_fn == "hinge" and self.a != POLYNOMIAL_A:
            raise ValueError(f"a: the polynomial's exponent, not the hinge's slope: write "
                             f"hinge_a = {self.a} instead (the paper's a of the hinge)")
        if self.staleness_fn == "hinge" and self.hinge_a is None:
            raise ValueError("hinge_a: required with staleness_fn = 'hinge': the slope a of "
                             "s(d) = 1 / (a (d - b) + 1) past b (Xie et al. use 10 with b = 4; "
                             "earlier versions took it from a, 0.5 by default)")
        for item in fields(StalenessOptions):
            if (item.name in ("a", "hinge_a", "b") and item.name not in used
                    and getattr(self, item.name) != item.default):
                raise ValueError(f"{item.name}: not used by the {self.staleness_fn!r} staleness "
                                 "function (a: polynomial; hinge_a and b: hinge); leave this "
                                 "key out")

    def staleness_weight(self, staleness: int) -> float:
        """s(staleness) for the configured staleness function."""
        if self.staleness_fn == "constant":
            return 1.0
        if self.staleness_fn == "polynomial":
            return float((staleness + 1) ** -self.a)
        if staleness <= self.b:
            return 1.0
        assert self.hinge_a is not None  # (check_staleness requires it)
        return 1.0 / (self.hinge_a * (staleness - self.b) + 1.0)
