"""FedScale's client traces, converted once to asyncsync's CSV traces.

FedScale (F. Lai et al., "FedScale: Benchmarking Model and System Performance of
Federated Learning at Scale", ICML 2022) ships two Python pickles:

- ``client_behave_trace``: ``{client_id: {"active": [t...], "inactive": [t...],
  "finish_time": T, ...}}``; a client is online from ``active[i]`` to ``inactive[i]``
  (seconds), and FedScale replays the trace modulo ``finish_time``. An ``inactive`` time
  beyond the last ``active`` one is unused, as in FedScale; an ``active`` time without
  its ``inactive`` one is refused.
- ``client_device_capacity``: ``{client_id: {"computation": ms per sample,
  "communication": kbit/s}}``. ``computation`` is the device's inference latency; FedScale
  charges a training sample `TRAINING_FACTOR` times it (its ``augmentation_factor``: the
  backward pass costs about twice the forward one).

`read_plain_pickle` reads them with an unpickler that builds only plain containers and
numbers (dict, list, tuple, int, float, str, bool, None): any other object (a class, a
function, a numpy value, a set, bytes, an int wider than `MAX_INT_BITS`) is refused with
`TraceError`, before anything of it runs. The converters write the CSV forms
(`asyncsync.hetero.availability`, `asyncsync.hetero.capacity`); runs read only CSV. No
other pickle is ever loaded.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import reprlib
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from asyncsync.hetero.availability import OnlineTimes, merged, write_availability
from asyncsync.hetero.capacity import Capacity, write_capacity
from asyncsync.hetero.traces import TraceError, read_bytes

PLAIN = (dict, list, tuple, int, float, str, bool, type(None))
MAX_INT_BITS = 64
"""The widest integer read (a wider one would not even print: Python refuses to write an
integer of over 4,300 digits as text)."""
SHOWN_CHARS = 40
"""The most characters of a client id or a value an error message shows."""
MAX_DEPTH = 32
"""The deepest nesting of containers read (a trace needs 3: a map of clients, each a map
of lists). Deeper, Python's own recursion through the structure (hashing a tuple key,
printing a value) can overflow the C stack and kill the process, so the pickle's
opcodes are scanned for it before anything is built (`_refusal`)."""
MAX_TUPLES = 1_000_000
"""The most tuples a tuple may reach, itself included and counted unfolded (one shared
through the memo counts each time it is reached): hashing a tuple, as a dict key, walks
it unfolded, and a few hundred bytes of pickle can unfold to 2^31 tuples (a trace needs
none)."""
MAX_INTERVALS = 1_000_000
"""The most online intervals one client's replay may write (a guard against a
``finish_time`` far shorter than the horizon)."""


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global (class, function) and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: only plain containers and "
                                     "numbers are read (dict, list, tuple, int, float, str, "
                                     "bool, None)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id")


def _check_plain(value: Any, path: str | Path) -> None:
    """Every object `value` reaches is plain; each container is visited once (a pickle's
    memo can share one container many times, or make it contain itself)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if type(item) not in PLAIN:
            raise TraceError(path, 0, f"refused a {type(item).__name__}: only plain "
                                      "containers and numbers are read")
        if type(item) is int and item.bit_length() > MAX_INT_BITS:
            raise TraceError(path, 0, f"refused an integer of {item.bit_length():,} bits: no "
                                      f"id, time or figure of a trace needs over "
                                      f"{MAX_INT_BITS}")
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


_BUILDS = frozenset({"EMPTY_LIST", "LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
                     "TUPLE3", "EMPTY_DICT", "DICT"})
_FILLS = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS"})


def _refusal(data: bytes) -> str | None:
    """Why the pickle `data` is refused before it is unpickled (None: it is not): it nests
    containers beyond `MAX_DEPTH`, builds a tuple reaching over `MAX_TUPLES` tuples, or
    stores into a memo slot past its own length (a pickle numbers its memo from 0; a slot
    of 2^32 - 1 would have the unpickler allocate gigabytes for a few bytes).

    A dry run of the pickle machine's stack over the opcodes (`pickletools.genops`,
    iterative: no object is built) that tracks each item's nesting depth (a new container
    is one deeper than its deepest item, and a filled one at least that) and each tuple's
    count of tuples unfolded (`MAX_TUPLES`). A malformed pickle is left to the unpickler to
    refuse (None)."""
    stack: list[tuple[int, int]] = []  # each item's (depth, tuples unfolded)
    marks: list[int] = []  # where each open mark is on the stack
    memo: dict[Any, tuple[int, int]] = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            name, before = op.name, op.stack_before
            if name == "MARK":
                marks.append(len(stack))
                continue
            items: list[tuple[int, int]] = []
            fixed = len(before)
            if pickletools.markobject in before:
                fixed = before.index(pickletools.markobject)
                start = marks.pop()
                items, stack[start:] = stack[start:], []
            popped = [stack.pop() for _ in range(fixed)][::-1] + items
            if name in _BUILDS or name in _FILLS:
                filled = popped[0][0] if name in _FILLS else 0
                inner = popped[1 if name in _FILLS else 0:]
                depth = max(filled, 1 + max((d for d, _ in inner), default=0))
                tuples = 1 + sum(n for _, n in inner) if "TUPLE" in name else 0
                if depth > MAX_DEPTH:
                    return f"refused containers nested {depth} deep: no trace needs over " \
                           f"{MAX_DEPTH}"
                if tuples > MAX_TUPLES:
                    return f"refused a tuple reaching over {MAX_TUPLES:,} tuples (shared " \
                           "through the memo): no trace needs one"
                stack.append((depth, tuples))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int) \
                    and arg > len(data):
                return f"refused memo slot {_label(arg)}: a pickle of {len(data)} bytes numbers " \
                       "its memo from 0"
            elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memo[len(memo) if name == "MEMOIZE" else arg] = (popped or stack)[-1]
                stack.extend(popped)
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg, (0, 0)))
            else:  # DUP copies its item; every other item is no container
                stack.extend(popped * 2 if name == "DUP" else [(0, 0)] * len(op.stack_after))
    except (ValueError, IndexError):
        return None
    return None


def read_plain_pickle(path: str | Path) -> Any:
    """The plain data a pickle holds (see the module docstring).

    Raises:
        TraceError: it is unreadable, or holds anything but plain containers and numbers.
    """
    data = read_bytes(path)
    problem = _refusal(data)
    if problem:
        raise TraceError(path, 0, problem)
    try:
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except RecursionError:
        raise  # (`convert` names the nesting)
    except Exception as exc:  # (no code of the pickle runs: any error is its malformed data)
        raise TraceError(path, 0, f"not a plain pickle: {_one_line(str(exc))}") from None
    _check_plain(value, path)
    return value


def _one_line(text: str) -> str:
    """An unpickler's message as one line of at most `SHOWN_CHARS` x 3 characters (it may
    quote the pickle's bytes, line breaks included)."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= 3 * SHOWN_CHARS else escaped[:3 * SHOWN_CHARS - 3] + "..."


def _clients(value: Any, path: str | Path) -> list[tuple[Any, dict[str, Any]]]:
    if not isinstance(value, dict) or not value:
        raise TraceError(path, 0, "expected a non-empty map of client id to a map")
    items = sorted(value.items(), key=lambda item: (not isinstance(item[0], int),
                                                    item[0] if isinstance(item[0], int) else 0,
                                                    str(item[0])))
    for client, entry in items:
        if not isinstance(entry, dict):
            raise TraceError(path, 0, f"client {_label(client)}: expected a map, got "
                                      f"{type(entry).__name__}")
    return items


def _pick(count: int, workers: int | None, seed: int) -> list[int]:
    """Which of `count` clients become ranks 0..workers-1 (all, in order, by default)."""
    if workers is None or workers >= count:
        return list(range(count))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(count, workers,
                                                                    replace=False))


def convert_behave_trace(source: str | Path, out: str | Path, horizon_s: float,
                         workers: int | None = None, seed: int = 0) -> int:
    """Write FedScale's availability trace as a CSV availability trace over
    ``[0, horizon_s)`` (each client's trace repeated modulo its ``finish_time``); with
    `workers`, that many clients drawn with `seed` become ranks ``0..workers-1``.
    Returns the number of ranks written."""
    items = _clients(read_plain_pickle(source), source)
    if workers is not None and workers > len(items):
        raise TraceError(source, 0, f"--workers {workers}: the trace has {len(items)} "
                                    "clients")
    chosen = _pick(len(items), workers, seed)
    times: list[OnlineTimes] = []
    names = []
    for index in chosen:
        client, entry = items[index]
        times.append(_online(entry, client, horizon_s, source))
        names.append(str(client))
    try:
        write_availability(out, times, f"converted from FedScale's {Path(source).name} by "
                                       "`asyncsync traces convert behave`; horizon "
                                       f"{horizon_s:g} s\nrank i = client ids: "
                                       f"{' '.join(names)}")
    except ValueError as exc:
        raise TraceError(source, 0, f"{exc} (over --horizon-s {horizon_s:g} s)") from None
    return len(times)


def _finite(value: Any) -> TypeGuard[int | float]:
    """Whether `value` is an int or a float (not a bool) and finite."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _not_seconds(values: list[Any] | tuple[Any, ...], key: str) -> str | None:
    """Why `values` (times under `key`) are not all finite numbers, naming the first bad
    one (None: they are)."""
    for index, value in enumerate(values):
        if not _finite(value):
            return f"'{key}'[{index}] is {_shown(value)}"
    return None


_CONTAINER_REPR = reprlib.Repr()
_CONTAINER_REPR.maxlevel = _CONTAINER_REPR.maxdict = _CONTAINER_REPR.maxlist = 3
_CONTAINER_REPR.maxtuple = 3
_CONTAINER_REPR.maxstring = _CONTAINER_REPR.maxlong = _CONTAINER_REPR.maxother = SHOWN_CHARS


def _label(value: Any) -> str:
    """`value` (a client id or a figure) as an error message shows it: its repr, cut to
    `SHOWN_CHARS` characters (a key of a megabyte would make an error line of one), a
    container's cut as it is written (its full repr may be exponentially long: memo)."""
    text = _CONTAINER_REPR.repr(value) if isinstance(value, dict | list | tuple) else repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _shown(value: Any) -> str:
    """A figure as an error message shows it (`_label`), with its type where its text
    could pass for a number."""
    text = _label(value)
    return text if isinstance(value, int | float) else f"{text} ({type(value).__name__})"


def _online(entry: dict[str, Any], client: Any, horizon_s: float,
            source: str | Path) -> OnlineTimes:
    active, inactive = entry.get("active"), entry.get("inactive")
    if not isinstance(active, list | tuple) or not isinstance(inactive, list | tuple):
        raise TraceError(source, 0, f"client {_label(client)}: 'active' and 'inactive' must "
                                    "be lists")
    if len(inactive) < len(active):
        raise TraceError(source, 0, f"client {_label(client)}: {len(active)} 'active' times but "
                                    f"{len(inactive)} 'inactive' ones")
    bad = _not_seconds(active, "active") or _not_seconds(inactive[:len(active)], "inactive")
    if bad:
        raise TraceError(source, 0, f"client {_label(client)}: 'active' and 'inactive' must hold "
                                    f"finite numbers (seconds): {bad}")
    pairs = [(float(a), float(b)) for a, b in zip(active, inactive, strict=False)]
    for index, (a, b) in enumerate(pairs):
        if a < 0 or b <= a:
            raise TraceError(source, 0, f"client {_label(client)}: interval {index} from 'active' "
                                        f"{a:g} to 'inactive' {b:g} is "
                                        f"{'negative' if a < 0 else 'empty or reversed'}")
    finish = entry.get("finish_time")
    finish = 0 if finish is None else finish
    if not _finite(finish) or finish < 0:
        raise TraceError(source, 0, f"client {_label(client)}: 'finish_time' {_shown(finish)} is "
                                    "not a finite number >= 0 (seconds; 0: no replay)")
    period = float(finish)
    if period <= 0 or not pairs:
        return merged((a, min(b, horizon_s)) for a, b in pairs if a < horizon_s)
    if horizon_s / period * len(pairs) > MAX_INTERVALS:
        raise TraceError(source, 0, f"client {_label(client)}: replaying 'finish_time' {period:g} "
                                    f"over {horizon_s:g} s would write over {MAX_INTERVALS:,} "
                                    "intervals")
    intervals = []
    offset = 0.0
    while offset < horizon_s:
        intervals += [(offset + a, min(offset + min(b, period), horizon_s))
                      for a, b in pairs if offset + a < horizon_s and a < period]
        offset += period
    return merged(intervals)


TRAINING_FACTOR = 3.0
"""A training sample's cost in inference latencies: FedScale's ``augmentation_factor``."""


def convert_device_capacity(source: str | Path, out: str | Path) -> int:
    """Write FedScale's device capacities as a CSV capacity trace: ``computation`` (ms of
    inference per sample) times `TRAINING_FACTOR` becomes ``s_per_sample`` (a training
    sample, as FedScale charges it), ``communication`` (kbit/s) both ``up_mbps`` and
    ``down_mbps`` (FedScale gives one figure). Rows keep FedScale's client ids when they
    are integers, else their order. Returns the number of rows written."""
    items = _clients(read_plain_pickle(source), source)
    own_ids = all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c, _ in items)
    rows = []
    for index, (client, entry) in enumerate(items):
        computation = _figure(entry, "computation", client, source)
        communication = _figure(entry, "communication", client, source)
        ident = client if own_ids else index
        try:
            rows.append(Capacity(ident, TRAINING_FACTOR * computation / 1000, None,
                                 communication / 1000,
                                 communication / 1000))
        except ValueError as exc:
            raise TraceError(source, 0, f"client {_label(client)} ('computation' {computation:g} "
                                        f"ms, 'communication' {communication:g} kbit/s): "
                                        f"{exc}") from None
    write_capacity(out, rows, f"converted from FedScale's {Path(source).name} by "
                              "`asyncsync traces convert capacity`")
    return len(rows)


def _figure(entry: dict[str, Any], key: str, client: Any, source: str | Path) -> float:
    """A device's ``computation`` or ``communication``: a finite number > 0.

    Raises:
        TraceError: naming the client, the key and what it holds instead.
    """
    if key not in entry:
        raise TraceError(source, 0, f"client {_label(client)}: no '{key}' (each client needs "
                                    "'computation' and 'communication')")
    value = entry[key]
    if not _finite(value) or value <= 0:
        raise TraceError(source, 0, f"client {_label(client)}: '{key}' is {_shown(value)}: "
                                    "'computation' and 'communication' must be finite "
                                    "numbers > 0")
    return float(value)


def convert(kind: str, source: str | Path, out: str | Path, horizon_s: float,
            workers: int | None, seed: int) -> str:
    """``asyncsync traces convert``: write `source` (``behave`` or ``capacity``) as a CSV
    trace at `out`; returns what was written."""
    try:
        if kind == "behave":
            if not 0 < horizon_s < math.inf or (workers is not None and workers < 1):
                raise TraceError(source, 0, "--horizon-s must be finite and > 0, and "
                                            "--workers >= 1")
            count = convert_behave_trace(source, out, horizon_s, workers, seed)
            return f"{out}: availability of {_count(count, 'worker')} over {horizon_s:g} s"
        return f"{out}: capacity of {_count(convert_device_capacity(source, out), 'client')}"
    except RecursionError:  # lists nested through the memo, which `_refusal` cannot see
        raise TraceError(source, 0, f"refused containers nested over {MAX_DEPTH} deep: no "
                                    "trace needs them") from None


def _count(number: int, noun: str) -> str:
    """`number` `noun`s, in the singular for one."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
