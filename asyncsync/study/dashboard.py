"""Live view of a running recipe: a rich `Live` panel on a terminal, plain lines otherwise.

Per worker: effective slowdown of its last step, emulated link, state (computing /
pushing / pulling / waiting), steps, samples/s, compute proportion, bytes up and down, last
loss, and paced-mode overruns (red when the host could not keep the pace). Above
`ROWS_MAX` workers (virtual runs of hundreds), one row per state instead: how many workers
are in it, their slowdown range, median steps, and summed or mean figures. Globally:
protocol, version, latest and best accuracy, elapsed time against the budget. Where no
panel is shown (output to a file, a Slurm log), a plain line per status every
`PLAIN_EVERY_S`, never folded at the console's width, however many workers it names: a log
reads, and greps, one status a line.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from asyncsync.clock import now
from asyncsync.hetero.network import LinkSpec
from asyncsync.results.layout import make_console
from asyncsync.study.recipe import Recipe
from asyncsync.study.specs import RunSpec

WORKER_COLUMNS = ("w", "slow", "link", "state", "steps", "smp/s", "comp", "MB up", "MB dn",
                  "loss", "ovr")
NARROW_DROPS = ("link", "MB dn", "MB up", "loss", "smp/s", "steps")
"""The worker columns a terminal too narrow for all of them loses, first to last."""
STUDY_DROPS = (1, 6, 3, 5)
"""The columns of the runs in progress (protocol, speed, version, best) a terminal too
narrow for them and the run's name loses, first to last (the name has the protocol)."""
PLAIN_EVERY_S = 5.0
ROWS_MAX = 16
STATE_STYLE = {"computing": "green", "pushing": "cyan", "pulling": "cyan",
               "waiting": "yellow", "left": "dim", "starting": "dim"}
NAME_MIN = 15
WORKED_MIN = 0.05
"""The share of a run that must be done before the time left is estimated: before, a
1,000-worker run's set-up (14 s) over its first instants said "about 98h29m left"."""
"""The columns a running run's name keeps before the study table drops a figure's column
(a longer name folds onto more lines)."""


def _mb(value: float) -> str:
    """Bytes as MB in at most six characters (GB or TB with a suffix past 10,000 MB)."""
    mb = value / 1e6
    if mb < 1e4:
        return f"{mb:.1f}"
    return f"{mb / 1e3:.1f}G" if mb < 1e7 else f"{mb / 1e6:.1f}T"


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def link_label(link: LinkSpec) -> str:
    """``up/downM latency~jitter ms`` of a worker's emulated link (Mbit/s); ``-`` when
    unshaped."""
    if not link.shaped:
        return "-"

    def rate(mbps: float) -> str:
        return f"{mbps:g}" if mbps else "inf"

    label = f"{rate(link.uplink_mbps)}/{rate(link.downlink_mbps)}M"
    if link.latency_ms or link.jitter_ms:
        label += f" {link.latency_ms:g}" + (f"~{link.jitter_ms:g}" if link.jitter_ms else "")
        label += "ms"
    return label


class Dashboard:
    """Shows run progress; `live=None` chooses the rich view when stdout is a terminal."""

    def __init__(self, recipe: Recipe, live: bool | None = None,
                 console: Console | None = None) -> None:
        self.recipe = recipe
        self.console = console or make_console()
        self.live = self.console.is_terminal if live is None else live
        self._live: Live | None = None
        self._last_plain = 0.0
        self._status: dict[str, Any] | None = None
        self._total = 0
        self._done = 0
        self._counted = 0
        self._began = now()
        self._active: dict[str, tuple[RunSpec, dict[str, Any]]] = {}
        self._seen: dict[str, float] = {}  # when each run in progress first reported
        self._durations: list[float] = []  # real seconds of the runs finished since
        self._early = any(spec.stop.stop_at_target and spec.stop.target_accuracy is not None
                          for spec in recipe.runs)  # runs may end before their budget

    def __enter__(self) -> Dashboard:
        if self.live:
            self._live = Live(Text("starting..."), console=self.console,
                              refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def _title(self, spec: RunSpec, index: int, repeat: int) -> str:
        return (f"{self.recipe.name} - run {index + 1}/{len(self.recipe.runs)}"
                f"{self._repeat(repeat, ', ')} [bold]{escape(spec.name)}[/bold] "
                f"({spec.protocol.name}, {spec.workers} workers)")

    def _repeat(self, repeat: int, before: str) -> str:
        """``repeat R/K`` (after `before`) when the recipe repeats its runs, else nothing."""
        repeats = self.recipe.repeats
        return f"{before}repeat {repeat + 1}/{repeats}" if repeats > 1 else ""

    def update(self, spec: RunSpec, index: int, status: dict[str, Any],
               repeat: int = 0) -> None:
        """Render one status snapshot from the server of run `index`'s repeat `repeat`."""
        if self._live is not None:
            self._status = status
            self._live.update(self.render(spec, index, status, repeat))
        elif now() - self._last_plain >= PLAIN_EVERY_S and status.get("started"):
            self._last_plain = now()
            name = spec.name + self._repeat(repeat, " ")
            self._line(self.plain_line(spec, status, name), plain=True)
            self.console.file.flush()

    def study(self, total: int, done: int = 0) -> None:
        """Start the study's progress: `total` runs, of which `done` already finished."""
        self._total, self._done, self._began = total, done, now()
        self._counted = done

    def progress(self) -> str:
        """``done/total runs``, elapsed time and an estimate of the time left.

        The estimate carries the pace of this session's work over to the work left: the
        real time elapsed per run done, where a run in progress counts as the share of
        it done, so it holds for runs side by side. That share is the larger of the share
        of its time budget it has used (it ends at its budget at the latest) and its real
        age over the mean real duration of the runs finished in this session (a run that
        stops early at its target takes less than its budget). Until one finishes, only
        the budgets are known: where runs may stop at their target, the estimate is then
        an upper bound, and says "up to". Before a twentieth of a run is done (`WORKED_MIN`)
        it says nothing: the set-up would weigh as the whole pace.
        """
        moment = now()
        elapsed = moment - self._began
        typical = sum(self._durations) / len(self._durations) if self._durations else None
        running = 0.0
        for name, (_, status) in self._active.items():
            share = status["elapsed_s"] / status["time_s"] if status.get("time_s") else 0.0
            if typical and name in self._seen:
                share = max(share, (moment - self._seen[name]) / typical)
            running += min(1.0, share)
        worked = self._done - self._counted + running
        remaining = self._total - self._done - running
        bound = "up to about" if self._done == self._counted and self._early else "about"
        left = ("" if worked < WORKED_MIN or self._done >= self._total
                else f", {bound} {_duration(elapsed / worked * remaining)} left")
        return (f"{self._done}/{self._total} runs done, {len(self._active)} running, "
                f"{_duration(elapsed)} elapsed{left}")

    def update_run(self, name: str, spec: RunSpec, status: dict[str, Any]) -> None:
        """Render the status of one of several runs in progress (`name`: its folder)."""
        if name not in self._seen:
            self._seen[name] = now()
        self._active[name] = (spec, status)
        if self._live is not None:
            self._live.update(self.render_study())
        elif now() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = now()
            self._line(self.progress(), plain=True)
            for run, (run_spec, run_status) in self._active.items():
                if run_status.get("started"):
                    self._line(self.plain_line(run_spec, run_status, run), plain=True)
            self.console.file.flush()

    def render_study(self) -> Group:
        """The recipe's progress bar, then one line per run in progress."""
        share = self._done / self._total if self._total else 0.0
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(self.recipe.name, style="bold"),
                     ProgressBar(total=max(self._total, 1), completed=self._done, width=30),
                     Text(f"{share:.0%}  {self.progress()}"))
        rows = []
        for name, (spec, status) in self._active.items():
            speed = status.get("virtual_per_real")
            rows.append((name, spec.protocol.name,
                         f"{status['elapsed_s']:.0f}/{status.get('time_s') or 0:.0f} s",
                         str(status["version"]), _acc(status["accuracy"]),
                         _acc(status["best_accuracy"]),
                         "-" if speed is None else f"{speed:.2g}x"))
        headers = ("run", "protocol", "elapsed", "version", "accuracy", "best", "speed")
        widths = [max([len(column), *(len(row[i]) for row in rows)])
                  for i, column in enumerate(headers)]
        # in a narrow terminal the figures are never cut: whole columns go (`STUDY_DROPS`)
        # until the run's name has room, then it folds; each column after the name takes
        # its width, the padding before it and the box's divider, the table its two edges
        shown = list(range(len(headers)))
        for column in STUDY_DROPS:
            room = self.console.width - 2 - sum(widths[i] + 2 for i in shown[1:])
            if room >= min(widths[0], NAME_MIN):
                break
            shown.remove(column)
        runs = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
        for i in shown:
            if i == 0:
                runs.add_column(headers[i], overflow="fold")
            else:
                runs.add_column(headers[i], justify="left" if i == 1 else "right",
                                no_wrap=True, min_width=widths[i])
        for row in rows:
            runs.add_row(*(row[i] for i in shown))
        return Group(head, runs)

    def render(self, spec: RunSpec, index: int, status: dict[str, Any],
               repeat: int = 0) -> Group:
        budget = status.get("time_s")
        head = Text.from_markup(
            f"{self._title(spec, index, repeat)}\nversion {status['version']}  "
            f"accuracy {_acc(status['accuracy'])} (best {_acc(status['best_accuracy'])}, "
            f"target {_acc(spec.stop.target_accuracy)})  "
            f"elapsed {status['elapsed_s']:.0f}/{budget:.0f} s{_virtual(status)}"
            + ("  [yellow]stopping[/yellow]" if status.get("stopping") else ""))
        rows = [[f"{w['count']}x", f"{w['factor_min']:.1f}-{w['factor']:.1f}x", "",
                 *_figures(w)] if "count" in w  # a state's workers together
                else [str(w["rank"]), f"{w['factor']:.1f}x",
                      link_label(spec.network.link(w["rank"])), *_figures(w)]
                for w in condensed(status)["workers"]]
        # short headers, no wrapping: the panel stays whole in an 80-column terminal; in a
        # narrower one whole columns go (`NARROW_DROPS`), never part of a figure
        widths = {column: max([len(column), *(Text.from_markup(row[i]).cell_len
                                              for row in rows)])
                  for i, column in enumerate(WORKER_COLUMNS)}
        shown = list(WORKER_COLUMNS)
        for column in NARROW_DROPS:
            if sum(widths[c] + 2 for c in shown) + 1 <= self.console.width:  # padding, rule
                break
            shown.remove(column)
        table = Table(expand=False, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
        for column in shown:
            table.add_column(column, justify="left" if column in ("state", "link") else "right",
                             no_wrap=True, min_width=widths[column])
        for row in rows:
            table.add_row(*(row[WORKER_COLUMNS.index(c)] for c in shown))
        return Group(head, table)

    @staticmethod
    def plain_line(spec: RunSpec, status: dict[str, Any], name: str | None = None) -> str:
        rows = condensed(status)["workers"]
        if rows and "count" in rows[0]:
            workers = " ".join(f"{w['state']}:{w['count']}" for w in rows)
        else:
            workers = " ".join(
                f"w{w['rank']}:{w['state'][:4]}/{w['steps']}st/{w['compute_proportion']:.0%}"
                + (f"/{w['overruns']}overruns" if w["overruns"] else "")
                for w in rows)
        return (f"[{name or spec.name}] t={status['elapsed_s']:.0f}s{_virtual(status)} "
                f"v={status['version']} "
                f"acc={_acc(status['accuracy'])} best={_acc(status['best_accuracy'])} "
                f"{workers}")

    def finished(self, spec: RunSpec, index: int, summary: dict[str, Any],
                 name: str | None = None) -> None:
        """Print a one-line result when a run ends (kept above the live panel), and show
        the panel once more with the run's last accuracy (from an evaluation after the last
        refresh); `name` (its folder) tells apart runs of a study that run together."""
        self._done += 1
        if name is not None and name in self._seen:
            self._durations.append(now() - self._seen.pop(name))
        if name is not None and self._active.pop(name, None) is not None:
            if self._live is not None:
                self._live.update(self.render_study())
        elif self._live is not None and self._status is not None and "error" not in summary:
            self._live.update(self.render(spec, index, {
                **self._status, "accuracy": summary["final_accuracy"],
                "best_accuracy": summary["best_accuracy"]}, summary.get("repeat", 0)))
        shown = name or spec.name
        if "error" in summary:
            line = f"[red]{escape(shown)} failed: {escape(str(summary['error']))}[/red]"
        else:
            ttt = summary["time_to_target_s"]
            line = (f"{escape(shown)}: best accuracy {_acc(summary['best_accuracy'])}, "
                    f"time to target {'-' if ttt is None else f'{ttt:.1f} s'}, "
                    f"compute proportion {summary['compute_proportion'] or 0:.2f}")
            if summary.get("worker_math_fallback"):
                line += (f" [yellow](steps ran one by one: "
                         f"{escape(str(summary['worker_math_reason']))})[/yellow]")
        count = (f"{self._done}/{self._total}" if self._total
                 else f"{index + 1}/{len(self.recipe.runs)}")
        self._line(f"[{count}] {line}")

    def _line(self, text: str, plain: bool = False) -> None:
        """Print `text` (with rich markup unless `plain`) as one line, however long, where
        no panel is shown: a log file or a Slurm log reads one line per status. Above the
        live panel, rich folds it to the terminal."""
        self.console.print(text, markup=not plain, highlight=not plain,
                           soft_wrap=self._live is None)


def condensed(status: dict[str, Any]) -> dict[str, Any]:
    """`status` as the dashboard shows it: above `ROWS_MAX` workers, one row per state
    (``count`` workers, slowdowns ``factor_min`` to ``factor``, median steps, summed or
    mean figures) instead of a row per worker; a child sends its supervisor this, not the
    megabytes of JSON of 10,000 workers' rows."""
    workers = status["workers"]
    if len(workers) <= ROWS_MAX or (workers and "count" in workers[0]):
        return status
    rows = []
    for state, group in _by_state(workers).items():
        factors = [w["factor"] for w in group]
        rows.append({
            "state": state, "count": len(group), "factor_min": min(factors),
            "factor": max(factors), "steps": sorted(w["steps"] for w in group)[len(group) // 2],
            "samples_per_s": sum(w["samples_per_s"] for w in group),
            "compute_proportion": sum(w["compute_proportion"] for w in group) / len(group),
            "bytes_up": sum(w["bytes_up"] for w in group),
            "bytes_down": sum(w["bytes_down"] for w in group),
            "loss": sum(w["loss"] for w in group) / len(group),
            "overruns": sum(w["overruns"] for w in group)})
    return {**status, "workers": rows}


def _figures(w: dict[str, Any]) -> list[str]:
    """A row's cells from state to overruns (one worker's, or a state's aggregate)."""
    state, overruns = w["state"], w["overruns"]
    return [f"[{STATE_STYLE.get(state, 'white')}]{state}[/]", str(w["steps"]),
            f"{w['samples_per_s']:.0f}", f"{w['compute_proportion']:.0%}",
            _mb(w["bytes_up"]), _mb(w["bytes_down"]), f"{w['loss']:.3f}",
            f"[red]{overruns}[/red]" if overruns else "0"]


def _by_state(workers: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Workers grouped by state, states in the order of `STATE_STYLE`."""
    order = list(STATE_STYLE)
    groups: dict[str, list[dict[str, Any]]] = {}
    for w in sorted(workers, key=lambda w: order.index(w["state"]) if w["state"] in order
                    else len(order)):
        groups.setdefault(w["state"], []).append(w)
    return groups


def _duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def _virtual(status: dict[str, Any]) -> str:
    """`` virtual (N x real time)`` for a virtual-time run's status, else nothing."""
    speed = status.get("virtual_per_real")
    return "" if speed is None else f" virtual ({speed:.2g}x real time)"
