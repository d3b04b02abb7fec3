"""Time accounting and JSONL logs.

A worker's wall time splits into computing (local steps, emulated slowness included),
pushing and pulling (bytes moving), and held (the server held the request at a barrier
or staleness bound, as reported in the reply's ``held_s``). With overlapping protocols the
categories overlap in time; compute proportion is always computing time / wall time.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from asyncsync.clock import Stopwatch, now
from asyncsync.runlog.schema import RANK, Kind, record

FLUSH_S = 1.0
"""How often a log is flushed at least: a process killed (SIGKILL) loses at most about this
many seconds of its last records (see `asyncsync.runlog.reading.final_records`)."""


class JsonlLog:
    """Append-only JSON lines, flushed at least every `flush_s` seconds."""

    def __init__(self, path: Path | None, flush_s: float = FLUSH_S) -> None:
        self._file: IO[str] | None = path.open("a", encoding="utf-8") if path else None
        self._flush_s = flush_s
        self._last_flush = now()

    def write(self, record: dict[str, Any], flush: bool = False) -> None:
        """Append a record; `flush` forces it to disk now (events a crash must not lose)."""
        if self._file is not None:
            self.write_line(json.dumps(record, separators=(",", ":")), flush)

    def write_line(self, line: str, flush: bool = False) -> None:
        """Append one record already encoded (a JSON object, without the newline)."""
        if self._file is None:
            return
        self._file.write(line + "\n")
        moment = now()
        if flush or moment - self._last_flush >= self._flush_s:
            self._file.flush()
            self._last_flush = moment

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class RankLog(JsonlLog):
    """One worker's view of a run's shared log (`asyncsync.runlog.schema.WORKERS_LOG`): its
    records go there with the worker's rank first; closing it leaves the file to its
    owner."""

    def __init__(self, shared: JsonlLog, rank: int) -> None:
        super().__init__(None)
        self._shared = shared
        self._rank = rank
        self._head = json.dumps({RANK: rank}, separators=(",", ":"))[:-1] + ","

    def write(self, record: dict[str, Any], flush: bool = False) -> None:
        if record and RANK not in record:  # the rank's field, then the record's own
            line = self._head + json.dumps(record, separators=(",", ":"))[1:]
            self._shared.write_line(line, flush)
        else:
            self._shared.write({RANK: self._rank, **record}, flush)

    def close(self) -> None:
        """The shared file stays open for the other workers."""


@dataclass
class WorkerStats:
    """Running totals of one worker; sent in every request header for the dashboard."""

    steps: int = 0
    samples: int = 0
    compute_s: float = 0.0
    push_s: float = 0.0
    pull_s: float = 0.0
    comm_s: float = 0.0
    held_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    wall_s: float = 0.0
    loss: float = float("nan")
    factor: float = 1.0
    overruns: int = 0

    def as_header(self) -> dict[str, float | int]:
        """The totals as a flat dict (all fields are numbers: a shallow copy is enough,
        and it is on every request's path, where `dataclasses.asdict` costs ~70 us)."""
        return dict(vars(self))


STAT_FIELDS = frozenset(WorkerStats.__dataclass_fields__)


def json_loss(loss: float) -> float | None:
    """A loss as a log can write it: null when it is not a finite number (no step yet, or
    a diverged one): NaN is not JSON."""
    return loss if math.isfinite(loss) else None


class IntervalUnion:
    """The measure of a union of time intervals, added in roughly increasing time.

    The most recent `KEEP` disjoint pieces are kept (sorted) to merge overlaps; older ones
    are folded into a total, so memory stays bounded (an interval that reaches back past
    the kept pieces can then be counted twice for its overlap with them). An add touches
    only the pieces it overlaps, found from the end.
    """

    KEEP = 64

    def __init__(self) -> None:
        self.folded = 0.0
        self.kept = 0.0  # the measure of the kept pieces
        # The pieces' ends as two float arrays: 16 bytes a piece rather than a tuple's
        # ~100, for three unions a worker and 100,000 workers in a virtual run.
        self._starts = array("d")
        self._ends = array("d")

    @property
    def pieces(self) -> list[tuple[float, float]]:
        """The kept disjoint pieces, in increasing time."""
        return list(zip(self._starts, self._ends, strict=True))

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        if not ends or start > ends[-1]:  # after every piece (most adds): no scans
            starts.append(start)
            ends.append(end)
            self.kept += end - start
            if len(starts) > self.KEEP:
                self._fold()
            return
        last = len(starts)  # pieces first..last-1 overlap [start, end]
        while last and starts[last - 1] > end:
            last -= 1
        first = last
        while first and ends[first - 1] >= start:
            first -= 1
        if first == last:  # overlaps nothing (mostly: appended at the end)
            starts.insert(first, start)
            ends.insert(first, end)
        else:  # merged into pieces first..last-1, kept in place of the first
            for i in range(first, last):
                a, b = starts[i], ends[i]
                self.kept -= b - a
                start, end = min(a, start), max(b, end)
            starts[first], ends[first] = start, end
            del starts[first + 1 : last], ends[first + 1 : last]
        self.kept += end - start
        if len(starts) > self.KEEP:
            self._fold()

    def _fold(self) -> None:
        """Fold the oldest pieces into the total until `KEEP` are left."""
        starts, ends = self._starts, self._ends
        while len(starts) > self.KEEP:
            a, b = starts.pop(0), ends.pop(0)
            self.folded += b - a
            self.kept -= b - a

    def measure(self) -> float:
        return self.folded + self.kept


class WorkerMetrics:
    """Accumulates a worker's `WorkerStats` and logs one JSONL record per span.

    Time shares are exclusive, so ``compute_s + comm_s + held_s <= wall_s`` even when
    requests overlap each other or computation: computing counts first, then moving
    bytes (a request's time not held at the server), then held (``held_s``);
    each is the measure of a union of intervals (a request's held part is taken to be its
    last ``held`` seconds). ``push_s`` / ``pull_s`` are the per-kind sums of request time
    not held, overlaps included.
    """

    def __init__(self, log: JsonlLog) -> None:
        self.stats = WorkerStats()
        self.log = log
        self.clock = Stopwatch()
        self._computing = IntervalUnion()
        self._busy = IntervalUnion()  # computing or moving bytes
        self._present = IntervalUnion()  # computing, moving bytes or held

    def start(self) -> None:
        """Mark the run's start (the moment the join barrier released)."""
        self.clock.start()

    def now(self) -> float:
        """Seconds since the run's start."""
        return self.clock.elapsed()

    def snapshot(self) -> dict[str, float | int]:
        self.stats.wall_s = self.now()
        return self.stats.as_header()

    def computed(self, start: float, steps: int, samples: int, seconds: float,
                 loss: float, factor: float, overruns: int) -> None:
        """Account local computation; `factor` is the effective slowdown of the last step
        and `overruns` the paced-mode overrun count so far."""
        s = self.stats
        s.steps += steps
        s.samples += samples
        s.compute_s += seconds
        for union in (self._computing, self._busy, self._present):
            union.add(start, start + seconds)
        self._share()
        s.loss = loss
        s.factor = factor
        s.overruns = overruns
        self.log.write(record(Kind.COMPUTE, t=round(start, 4), dur=round(seconds, 4),
                              steps=steps, samples=samples, loss=json_loss(round(loss, 5)),
                              factor=round(factor, 3)))

    def transferred(self, op: str, start: float, seconds: float, held_s: float,
                    up: int, down: int, version: int | None) -> None:
        """Account one request; `up` / `down` are the tensor bytes it carried (the byte
        totals come from the transport, see `take_bytes`). An ``exchange`` (a push and the
        pull that follows it, fused) splits its moving time between push and pull by
        bytes."""
        s = self.stats
        held = max(0.0, min(held_s, seconds))
        moving = seconds - held
        if op == "exchange":  # a fused push and pull: its moving time split by bytes
            up_share = up / (up + down) if up + down else 0.5
            s.push_s += moving * up_share
            s.pull_s += moving * (1 - up_share)
        elif op == "push":
            s.push_s += moving
        else:
            s.pull_s += moving
        moving_until = start + seconds - held
        self._busy.add(start, moving_until)
        self._present.add(start, start + seconds)
        self._share()
        self.log.write(record(op, t=round(start, 4), dur=round(seconds, 4),
                              held_s=round(held, 4), up=up, down=down, version=version))

    def _share(self) -> None:
        """Exclusive communicating and held time from the unions."""
        busy = self._busy.measure()
        self.stats.comm_s = busy - self._computing.measure()
        self.stats.held_s = self._present.measure() - busy

    def take_bytes(self, up: int, down: int) -> None:
        """Take the byte totals from the transport, which counts every request exactly
        once even when several are in flight (heartbeats and headers included)."""
        self.stats.bytes_up, self.stats.bytes_down = up, down

    def final(self) -> dict[str, Any]:
        """Write and return the totals (``loss`` null when there is none: no step yet)."""
        totals = record(Kind.FINAL, **{**self.snapshot(), "loss": json_loss(self.stats.loss)})
        self.log.write(totals)
        return totals
