"""Reading a run's log files: JSONL records, and the label a run goes by in reports."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from asyncsync.errors import InputError
from asyncsync.runlog.schema import KEY, RANK, WORKERS_LOG, Kind, upgrade

LineFilter = Callable[[str], bool]
"""Whether a JSONL line may hold a record wanted (False: skipped unparsed)."""
RANK_HEAD = '{"' + RANK + '":'
"""How a line of a shared workers' log starts (`RankLog` writes the rank first)."""


def line_rank(line: str) -> int | None:
    """The rank a shared log's line starts with, without parsing it (None: not known)."""
    if line.startswith(RANK_HEAD):
        with contextlib.suppress(ValueError):
            return int(line[len(RANK_HEAD):line.find(",", len(RANK_HEAD))])
    return None


class DamagedLog(InputError, ValueError):
    """A log line that is not a record: the log's file and line, and what is wrong."""


def iter_jsonl(path: Path, keep: LineFilter | None = None) -> Iterator[dict[str, Any]]:
    """The records of a JSONL log one at a time, in the current schema (old logs' field
    names are renamed, see `asyncsync.runlog.schema`). A line `keep` refuses is skipped
    unparsed (a cheap test; damage there goes unseen). A 100,000-worker run's log is
    millions of records: readers that need few of them stream it rather than hold it.

    A record cut short by its killed writer is skipped: the last line when it lacks its
    newline, or the start of a line where a resumed writer appended its next record.

    Raises:
        DamagedLog: any other line that is not a JSON object.
    """
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if keep is not None and not keep(line):
                continue
            try:
                found = [json.loads(line)]
            except json.JSONDecodeError as exc:
                found = _after_torn(line)
                if not found and not line.endswith("\n"):
                    return  # the last line, torn
                if not found:
                    raise DamagedLog(f"{path}: line {number}: not JSON at column {exc.colno}: "
                                     f"{exc.msg.removesuffix(' at')}") from None
            for one in found:
                try:
                    record = upgrade(one)
                except ValueError as exc:
                    raise DamagedLog(f"{path}: line {number}: {exc}") from None
                yield record


def _after_torn(line: str) -> list[Any]:
    """The record a resumed writer appended to a torn one's line: the line's longest tail
    from a ``{`` that parses, where the line starts as a record does; preceded by the
    killed writer's last record when that was whole, only its newline lost (empty: no
    such tail)."""
    start = line.find("{", 1) if line.startswith("{") else -1
    while start > 0:
        with contextlib.suppress(json.JSONDecodeError):
            tail = json.loads(line[start:])
            with contextlib.suppress(json.JSONDecodeError):
                return [json.loads(line[:start]), tail]
            return [tail]
        start = line.find("{", start + 1)
    return []


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All the records of a JSONL log (see `iter_jsonl`)."""
    return list(iter_jsonl(path))


def worker_records(run_dir: Path, keep: LineFilter | None = None,
                   ) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(rank, record)`` for every worker record of a run (of the lines `keep` lets
    through), streamed from its ``worker-<rank>.jsonl`` files (rank by rank) or its one
    `WORKERS_LOG` (in the order written, the `RANK` field taken out): readers need not know
    which layout a run has."""
    shared = run_dir / WORKERS_LOG
    if shared.exists():
        for record in iter_jsonl(shared, keep):
            yield int(record.pop(RANK)), record
        return
    paths = {int(path.stem.split("-")[1]): path for path in run_dir.glob("worker-*.jsonl")}
    for rank in sorted(paths):
        for record in iter_jsonl(paths[rank], keep):
            yield rank, record


def worker_logs(run_dir: Path, ranks: Collection[int] | None = None,
                ) -> dict[int, list[dict[str, Any]]]:
    """Each worker's records by rank (only those of `ranks`, when given: a shared log's
    other lines are skipped unparsed)."""
    wanted = None if ranks is None else set(ranks)

    def mine(line: str) -> bool:
        rank = line_rank(line)
        return wanted is None or rank is None or rank in wanted

    logs: dict[int, list[dict[str, Any]]] = {}
    for rank, record in worker_records(run_dir, mine):
        if ranks is None or rank in ranks:
            logs.setdefault(rank, []).append(record)
    return dict(sorted(logs.items()))


def final_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Each worker's last ``final`` record (its run's totals) by rank; a worker that wrote
    none is absent.

    A worker started again appends to its own log. Its `COUNTED` totals are those of every
    process: the ``final`` records' sums, plus the steps that no ``final`` record counts (a
    killed process's, from its ``compute`` records; ``unfinished_steps`` says how many:
    a lower bound, as the records a killed process had not flushed, at most its last
    `asyncsync.runlog.metrics.FLUSH_S` or so, are lost); its times and bytes are the last
    process's. Streams the logs, parsing only the
    lines that may be a ``final`` record or (a worker's own log; a shared log is a virtual
    run's, with no processes to kill) a computation."""
    shared = (run_dir / WORKERS_LOG).exists()
    finals: dict[int, dict[str, Any]] = {}
    computed: dict[int, dict[str, int]] = {}  # by rank: compute records' totals
    counted: dict[int, dict[str, int]] = {}  # by rank: those of all its final records
    for rank, record in worker_records(run_dir, _may_be_final if shared else _may_count):
        kind = record.get(KEY)
        if kind not in (Kind.FINAL, Kind.COMPUTE):
            continue
        sums = (counted if kind == Kind.FINAL else computed).setdefault(
            rank, dict.fromkeys(COUNTED, 0))
        for key in COUNTED:
            sums[key] += int(record.get(key) or 0)
        if kind == Kind.FINAL:
            finals[rank] = record
    for rank, final in finals.items():
        done = computed.get(rank, {})
        extra = {key: max(0, done.get(key, 0) - counted[rank][key]) for key in COUNTED}
        finals[rank] = {**final, **{key: counted[rank][key] + extra[key] for key in COUNTED},
                        **({"unfinished_steps": extra["steps"]} if extra["steps"] else {})}
    return dict(sorted(finals.items()))


COUNTED = ("steps", "samples")
"""The totals a killed process's ``compute`` records still tell (see `final_records`)."""


def _may_be_final(line: str) -> bool:
    """Whether a line may hold a ``final`` record (its kind's name appears in it)."""
    return Kind.FINAL in line


def _may_count(line: str) -> bool:
    """Whether a line may hold a ``final`` or a ``compute`` record."""
    return Kind.FINAL in line or Kind.COMPUTE in line


def label(summary: dict[str, Any]) -> str:
    """``recipe/run``: unique across recipes."""
    return f"{summary.get('recipe', '?')}/{summary['run']}"


def sweep_suffix(sweep: dict[str, Any]) -> str:
    """What a swept run's name, and so its folder's, carries after its name in the recipe:
    ``@key=value``, written with letters, digits and ``._+,=@-`` only, so that a shell
    takes the folder's path unquoted (``bsp@compute.slowdown=1,3``): a list of plain values
    is written comma-separated; any other value as its plain characters, each run of others
    as ``_``, then ``_`` and 8 hex digits of its hash, which keep two values apart."""
    return "".join(f"@{key}={_plain(value)}" for key, value in sweep.items())


def legacy_sweep_suffix(sweep: dict[str, Any]) -> str:
    """`sweep_suffix` as asyncsync wrote it before 2026-11-27: each value as Python prints
    it (``@compute.slowdown=[1, 3]``), which a shell must quote."""
    return "".join(f"@{key}={value}" for key, value in sweep.items())


def unswept_name(name: str, sweep: dict[str, Any]) -> str:
    """A swept run's `name` without its sweep point (its name in the recipe), written as
    now or as before 2026-11-27 (`legacy_sweep_suffix`)."""
    return name.removesuffix(sweep_suffix(sweep)).removesuffix(legacy_sweep_suffix(sweep))


def run_name(name: str, sweep: dict[str, Any]) -> str:
    """A run's `name` as this version writes it: a name of a swept run written with a
    `legacy_sweep_suffix` gets its `sweep_suffix` instead (reports of old studies)."""
    old, new = legacy_sweep_suffix(sweep), sweep_suffix(sweep)
    return name.removesuffix(old) + new if old != new and name.endswith(old) else name


PLAIN = re.compile(r"[A-Za-z0-9._+-]+")
"""A value written as it is in a run's folder name."""


def _plain(value: Any) -> str:
    """A sweep value in a folder name (see `sweep_suffix`)."""
    items = value if isinstance(value, list) and value else [value]
    texts = [str(item) for item in items if isinstance(item, str | int | float)]
    plain = ",".join(texts)
    if (len(texts) == len(items) and all(PLAIN.fullmatch(text) for text in texts)
            and len(plain) <= PLAIN_MAX):
        return plain
    written = json.dumps(value, sort_keys=True)
    digest = hashlib.sha256(written.encode()).hexdigest()[:8]
    return "_".join([*PLAIN.findall(written), ""])[:PLAIN_MAX - 8] + digest


PLAIN_MAX = 64
"""The most characters of a value in a folder name (a longer one is cut before its hash:
a name has at most 255 bytes)."""
