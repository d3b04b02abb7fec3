"""matplotlib, imported only when a plot is drawn (the `plot` extra), on its file backend."""

from __future__ import annotations

from typing import Any


def matplotlib_available() -> bool:
    """Whether matplotlib is installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
