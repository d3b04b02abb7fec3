"""Write the population study's traces: ``capacity.csv`` and ``availability.csv``.

Device capacity (500 devices; the run's 1,000 workers draw rows with the run's seed):

- seconds per sample (forward and backward of one sample): lognormal, median 0.162 s,
  sigma 0.8 (in log space). The median is the ``computation`` of 162 ms per sample that
  FedScale's ``client_device_capacity`` gives its client 432802 (the row quoted in public
  forks of FedScale's client code); the spread is our choice, not fitted. FedScale's
  figure is that device's inference latency, and FedScale charges a training sample three
  times it, so these devices train three times faster than FedScale would charge them.
- uplink Mbit/s: lognormal, median 5.6, sigma 0.9; the median is that client's
  ``communication`` of 5,648 kbit/s (FedScale gives one figure; we use it for the
  uplink). Downlink: the uplink times a factor drawn uniformly from 2 to 4 (mobile
  downlinks are faster than uplinks; the factor is our choice).

Availability (1,000 workers, 100 s): alternating online and offline periods drawn from
exponential distributions, means 60 s online and 1,940 s offline, so about 3% of the
workers (about 30) are online at a time, each starting online with that probability. The
means are our choice, made so that the study's protocols train about 30 workers at once
and the 15 runs fit in about 15 minutes of 2 CPU cores; they are not fitted to a trace.
FedScale's measured availability can replace them: ``asyncsync traces convert behave
client_behave_trace availability.csv --workers 1000 --horizon-s 100``.

Seeded: the files are the same on every run of this script.

Run: ``python recipes/population/make_traces.py`` (from the repository root).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asyncsync.hetero.availability import exponential_availability, write_availability
from asyncsync.hetero.capacity import Capacity, write_capacity

HERE = Path(__file__).resolve().parent
DEVICES, WORKERS, HORIZON_S, SEED = 500, 1000, 100.0, 43
S_PER_SAMPLE_MEDIAN, S_PER_SAMPLE_SIGMA = 0.162, 0.8
UP_MBPS_MEDIAN, UP_MBPS_SIGMA, DOWN_OVER_UP = 5.6, 0.9, (2.0, 4.0)
MEAN_ONLINE_S, MEAN_OFFLINE_S = 60.0, 1940.0


def capacity_rows(rng: np.random.Generator) -> list[Capacity]:
    """The device pool (see the module docstring)."""
    speed = rng.lognormal(np.log(S_PER_SAMPLE_MEDIAN), S_PER_SAMPLE_SIGMA, DEVICES)
    up = rng.lognormal(np.log(UP_MBPS_MEDIAN), UP_MBPS_SIGMA, DEVICES)
    down = up * rng.uniform(*DOWN_OVER_UP, DEVICES)
    return [Capacity(i, round(float(speed[i]), 4), None, round(float(up[i]), 3),
                     round(float(down[i]), 3)) for i in range(DEVICES)]


def main(out: Path = HERE) -> None:
    """Write both traces into `out` (by default beside this script)."""
    rng = np.random.default_rng(SEED)
    write_capacity(out / "capacity.csv", capacity_rows(rng),
                   "written by recipes/population/make_traces.py (see its docstring)")
    times = exponential_availability(WORKERS, MEAN_ONLINE_S, MEAN_OFFLINE_S, HORIZON_S, SEED)
    write_availability(out / "availability.csv", times,
                       "written by recipes/population/make_traces.py (see its docstring)")
    print(f"wrote {out / 'capacity.csv'} ({DEVICES} devices) and {out / 'availability.csv'} "
          f"({WORKERS} workers, {HORIZON_S:g} s)")


if __name__ == "__main__":
    main()
