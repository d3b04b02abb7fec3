"""Timeline of one exchange: where a bsp push's round trip goes, across both processes.

Run: ``.venv/bin/python bench/timeline.py`` (about 10 seconds).

The setting is `overhead.py`'s (the cnn, one bsp worker, the stream channel, the server in a
process of its own). Both processes note `time.perf_counter` (CLOCK_MONOTONIC, one clock
for the whole host) at the points below by wrapping the stream's methods; each push is
paired with the server's handling of it, and the medians over the run are printed in ms
from the worker's request start. The wrappers add a few microseconds to every point, so
read the gaps between points, not the absolute figures, as a step's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from overhead import asyncsync_loop, serve

from asyncsync.engine import core
from asyncsync.transport import frame_stream, http_client
from asyncsync.wire import frames as wire

Marks = list[tuple[str, float]]


def note_calls(owner: Any, name: str, marks: Marks, start: str | None, end: str | None) -> None:
    """Wrap the coroutine method `owner.name` to note `start` before and `end` after."""
    original = getattr(owner, name)

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        if start:
            marks.append((start, time.perf_counter()))
        result = await original(*args, **kwargs)
        if end:
            marks.append((end, time.perf_counter()))
        return result

    setattr(owner, name, wrapped)


def note_received(marks: Marks) -> None:
    """Note each time a stream end receives bytes."""
    original = frame_stream._Receiver.buffer_updated

    def wrapped(self: frame_stream._Receiver, nbytes: int) -> None:
        marks.append(("bytes", time.perf_counter()))
        original(self, nbytes)

    frame_stream._Receiver.buffer_updated = wrapped  # type: ignore[method-assign]


def noted_server(seconds: float, port: Any, out: str) -> None:
    marks: Marks = []
    note_received(marks)
    note_calls(frame_stream, "answer_frame", marks, "op read", None)
    note_calls(wire.FrameReader, "header", marks, None, "frame head read")
    note_calls(frame_stream._Receiver, "read_into", marks, "tensor wanted", None)
    note_calls(wire.FrameReader, "tensor", marks, None, "tensor read")
    note_calls(core.ServerCore, "handle", marks, None, "handled")
    note_calls(frame_stream, "_answer_next", marks, None, "reply drained")
    serve(seconds, port)
    Path(out).write_text(json.dumps(marks))


async def noted_worker(seconds: float, out: str) -> Marks:
    marks: Marks = []
    note_received(marks)
    note_calls(http_client.HttpTransport, "_stream_once", marks, "start", "returned")
    note_calls(frame_stream.StreamConnection, "send", marks, None, "writes done")
    note_calls(frame_stream.StreamConnection, "reply", marks, None, "reply head read")
    await asyncsync_loop(seconds, "stream", noted_server, out)
    return marks


def spans(marks: Marks, first: str, last: str) -> list[dict[str, list[float]]]:
    """`marks` cut into spans from each `first` to the next `last`: label -> times."""
    out: list[dict[str, list[float]]] = []
    current: dict[str, list[float]] | None = None
    for label, at in marks:
        if label == first:
            current = {}
        if current is not None:
            current.setdefault(label, []).append(at)
            if label == last:
                out.append(current)
                current = None
    return out


def pushes(worker: Marks, server: Marks) -> list[dict[str, float]]:
    """Each push with a tensor both ways, as times from the worker's request start."""
    handled = [s for s in spans(server, "op read", "reply drained") if "tensor read" in s]
    rows = []
    for request in spans(worker, "start", "returned"):
        start, end = request["start"][0], request["returned"][0]
        match = next((s for s in handled if start < s["op read"][0] < end), None)
        if match is None or "writes done" not in request:
            continue
        writes_done = request["writes done"][0]
        server_bytes = [t for t in server if t[0] == "bytes" and start < t[1] < end]
        reply_bytes = [t for t in request.get("bytes", []) if t > writes_done]
        if not server_bytes or not reply_bytes:
            continue
        row = {"worker's writes done": writes_done,
               "server: first bytes in": server_bytes[0][1]}
        row |= {f"server: {label}": match[label][0] for label in
                ("op read", "frame head read", "tensor wanted", "tensor read", "handled",
                 "reply drained")}
        row |= {"worker: first reply bytes in": reply_bytes[0],
                "worker: reply head read": request["reply head read"][0],
                "worker: last reply bytes in": reply_bytes[-1], "worker: request returned": end}
        rows.append({label: (at - start) * 1e3 for label, at in row.items()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--skip", type=int, default=50, help="pushes left out at the start")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "server.json")
        worker = asyncio.run(noted_worker(args.seconds, out))
        server = [(label, at) for label, at in json.loads(Path(out).read_text())]
    rows = pushes(worker, server)[args.skip :]
    if not rows:
        raise SystemExit("no push was paired with the server's handling of it")

    def median(label: str) -> float:
        return statistics.median(row[label] for row in rows)

    whole = median("worker: request returned")
    print(f"one bsp push of the cnn (0.55 MB each way), medians of {len(rows)} pushes, "
          "ms from the worker's request start, and as a share of the whole request:")
    for label in sorted(rows[0], key=median):
        print(f"  {median(label):6.3f}  {median(label) / whole:5.0%}  {label}")
    print("each point's median is taken on its own, so two points close in time may "
          "print in either order")


if __name__ == "__main__":
    main()
