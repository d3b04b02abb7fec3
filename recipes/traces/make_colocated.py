"""Write ``colocated.csv``: a synthetic co-located-load trace for 16 workers, 1,200 s.

Each worker alternates between running alone (factor 1) and sharing its machine with a
co-located job (factor drawn uniformly from 1.5 to 4, as a second job of varying weight
would); both phases last an exponentially distributed time (means 40 s alone, 25 s
shared). Seeded: the file is the same on every run of this script. It stands in for the
load traces of LB-BSP's non-dedicated clusters (none is public); it is not a measurement.
Times are written to 0.1 s; a phase shorter than that is left out (its row would repeat
the next one's time, which a trace refuses).

Run: ``python recipes/traces/make_colocated.py`` (from the repository root).
"""

from __future__ import annotations

import random
from pathlib import Path

WORKERS, SECONDS, SEED = 16, 1200.0, 2026
ALONE_MEAN_S, SHARED_MEAN_S = 40.0, 25.0


def main() -> None:
    rng = random.Random(SEED)
    rows = ["time_s,worker,factor"]
    for worker in range(WORKERS):
        t, shared, first = rng.uniform(0, ALONE_MEAN_S), False, len(rows)
        while t < SECONDS:
            shared = not shared
            factor = rng.uniform(1.5, 4.0) if shared else 1.0
            row = f"{t:.1f},{worker},{factor:.2f}"
            if len(rows) > first and rows[-1].split(",")[0] == row.split(",")[0]:
                rows.pop()  # (the phase before this row lasted under 0.1 s)
            rows.append(row)
            t += rng.expovariate(1 / (SHARED_MEAN_S if shared else ALONE_MEAN_S))
    (Path(__file__).parent / "colocated.csv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
