"""Virtual mode on a device: batched worker math (cohorts) against one-by-one math.

Every figure is measured in this one run, on the device it names (``--device``):

1. steps: the real cost of one local SGD step per worker, one by one (each worker's step
   after the other's, as `VirtualWorkerSeam` runs them) against batched (one `Cohort`
   call over all the workers' stacked parameters), at 1, 8, 64 and 512 workers, for the
   mlp, the cnn and resnet18 (synthetic 1x32x32 images, batch 32, momentum 0.9);
2. study: the wall time of ``recipes/at_scale_cnn/nbsync.toml`` (1 repeat, ``--jobs``
   processes) with ``device = "cuda"`` against ``device = "cpu"`` (GPU only), each
   ``--study-repeats`` times, taking turns; the best of each counts (one study's wall
   time varied by a third between two machines of the same kind);
3. resnet18: virtual seconds per real second of that setting's nbsync run with resnet18
   (in a child process, stopped after ``--resnet-wall-s`` real seconds at most);
4. population: FedAvg over 1,000 clients, 50 a round, batch 10, 5 local steps, the cnn on
   32x32 images: wall time and simulated time per round, and the accuracy reached, batched
   and one by one (each in a child process with a wall-clock cap). The wall time per round
   is the steady rate, between the first progress report (one virtual second in: set-up,
   the joins and the first rounds done) and the last; the 1,500 rounds are projected as
   the time to that first report plus the remaining rounds at that rate.

Run: ``.venv/bin/python bench/gpu_virtual.py [--device auto|cpu|cuda] [--json OUT]``;
``--only steps,study,resnet,population`` picks sections; ``--models``, ``--sizes``,
``--resnet-sizes`` and ``--rounds`` bound them. The defaults take about 5 minutes on one
H100/H200. On 2 CPU cores (which skip the study and the resnet18 run unless named with
``--only``) resnet18's 8-worker row is 3 x 8 steps of each path, 1.5-11 s a step one by
one and 5-14 s batched (docs/gpu.md; the shared host's load decides), some 3 to 10
minutes; ``--models mlp,cnn`` leaves resnet18 out (a few minutes, mostly the population's
two capped runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training.batched import BatchedModel
from asyncsync.training.models import build_model
from asyncsync.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "recipes" / "at_scale_cnn" / "nbsync.toml"
SHAPE = (1, 32, 32)
SECTIONS = ("steps", "study", "resnet", "population")
POPULATION = """
name = "population"
[defaults]
workers = 1000
clock = "virtual"
device = "{device}"
[defaults.stop]
time_s = {virtual_s}
[defaults.model]
name = "cnn"
[defaults.data]
batch_size = 10
[defaults.eval]
interval_s = {eval_s}
[defaults.compute]
device = "v100"
batched = "{batched}"
[defaults.network]
bandwidth_mbps = 20
latency_ms = 40
[[runs]]
name = "fedavg"
protocol = {{ name = "fedavg", local_steps = 5, fraction = 0.05 }}
"""
ROUND_VIRTUAL_S = 0.55
"""About the simulated seconds of one population round (the cnn's 0.55 MB each way at
20 Mbit/s, 40 ms latency, 5 steps on a V100): sets the virtual time of `--rounds`."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fixed_batches(batch: int, seed: int) -> Any:
    """A batch source of one fixed random batch (drawing costs nothing)."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batch, *SHAPE, generator=gen), torch.randint(10, (batch,), generator=gen)
    return lambda size: (x[:size], y[:size])


def trainers(model: torch.nn.Module, count: int, device: torch.device,
             batch: int) -> list[Trainer]:
    return [Trainer(copy.deepcopy(model), fixed_batches(batch, rank), lr=0.01, momentum=0.9,
                    device=str(device)) for rank in range(count)]


def step_cost(name: str, workers: int, device: torch.device, batch: int, reps: int
              ) -> dict[str, Any]:
    """Seconds per worker-step, one by one and batched, over `workers` workers."""
    torch.manual_seed(0)
    model = build_model(name, SHAPE, 10, {})
    team = trainers(model, workers, device, batch)
    works = [LocalWork(t, batch, local=True) for t in team]
    cohort = Cohort(BatchedModel(model, device))

    def one_by_one() -> None:
        for work in works:
            work.compute()

    def batched() -> None:
        for work in works:
            cohort.file(work)
        cohort.compute()

    out: dict[str, Any] = {"model": name, "workers": workers}
    for label, fn in (("one_by_one_s", one_by_one), ("batched_s", batched)):
        fn()  # warm-up (and the first batched call's tracing)
        sync(device)
        began = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        out[label] = (time.perf_counter() - began) / (reps * workers)
    out["speedup"] = out["one_by_one_s"] / out["batched_s"]
    out["calls_per_step"] = cohort.calls / cohort.steps
    return out


def steps_section(args: argparse.Namespace, device: torch.device, rows: list[dict[str, Any]],
                  save: Callable[[], None]) -> None:
    """Append each row to `rows` as it is measured, and `save` after each."""
    print(f"\n1. per worker-step cost, batch {args.batch} (ratio = one by one / batched)")
    print(f"{'model':9} {'workers':>7} {'one by one':>12} {'batched':>12} {'ratio':>7}")
    for name in args.models.split(","):
        sizes = args.resnet_sizes if name == "resnet18" else args.sizes
        for workers in (int(s) for s in sizes.split(",") if s):
            try:
                row = step_cost(name, workers, device, args.batch, args.reps)
            except (RuntimeError, MemoryError) as exc:  # e.g. CUDA out of memory
                row = {"model": name, "workers": workers, "error": str(exc)[:200]}
                print(f"{name:9} {workers:>7} failed: {row['error']}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            else:
                print(f"{name:9} {workers:>7} {row['one_by_one_s'] * 1e3:>9.3f} ms "
                      f"{row['batched_s'] * 1e3:>9.3f} ms {row['speedup']:>6.2f}x")
            rows.append(row)
            save()


def study_wall(device: str, jobs: int, logs: Path, limit_s: float) -> dict[str, Any]:
    """Wall time of the nbsync study (1 repeat) with `device`, `jobs` processes."""
    command = [sys.executable, "-m", "asyncsync", "run", str(STUDY), "--repeats", "1",
               "--jobs", str(jobs), "--plain", "--logs", str(logs),
               "--set", f'device="{device}"']
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"device": device, "wall_s": None, "error": f"over {limit_s:g} s"}
    wall = time.perf_counter() - began
    if done.returncode != 0:
        return {"device": device, "wall_s": wall, "error": done.stderr[-300:]}
    return {"device": device, "wall_s": wall}


def study_section(args: argparse.Namespace, device: torch.device, tmp: Path
                  ) -> dict[str, Any]:
    print(f"\n2. {STUDY.relative_to(ROOT)}, 1 repeat, --jobs {args.jobs}, "
          f"{args.study_repeats} times each, taking turns (the best of each counts)")
    if device.type != "cuda":
        print("   skipped: the device is the CPU (nothing to compare)")
        return {"skipped": "the device is the CPU"}
    tries: dict[str, list[dict[str, Any]]] = {str(device): [], "cpu": []}
    for k in range(args.study_repeats):
        for name, rows in tries.items():
            rows.append(study_wall(name, args.jobs, tmp / f"study-{name}-{k}",
                                   args.study_wall_s))
    best: dict[str, float | None] = {}
    for name, rows in tries.items():
        walls = [r["wall_s"] for r in rows if r["wall_s"] is not None and "error" not in r]
        best[name] = min(walls) if len(walls) == len(rows) else None
        shown = ", ".join("-" if r["wall_s"] is None else f"{r['wall_s']:.1f} s" for r in rows)
        errors = " ".join(r["error"] for r in rows if "error" in r)
        print(f"   device={name:8} wall {shown} {errors}")
    ratio = None
    on_device, on_cpu = best[str(device)], best["cpu"]
    if on_device and on_cpu:
        ratio = on_cpu / on_device
        print(f"   {device} / {args.jobs} CPU processes, best against best: {on_cpu:.1f} / "
              f"{on_device:.1f} s = {ratio:.2f}x faster")
    return {"device": tries[str(device)], "cpu": tries["cpu"], "best_s": best,
            "speedup": ratio}


def child_run(recipe: str, out: Path) -> None:
    """(In a child process) simulate `recipe`'s run, writing progress then facts to `out`."""
    from asyncsync.study.recipe import load_recipe
    from asyncsync.study.simulation import simulate

    path = out.with_suffix(".toml")
    path.write_text(recipe)
    spec = load_recipe(path).runs[0]
    run_dir = out.with_suffix("")
    run_dir.mkdir()
    began = time.perf_counter()

    reports: list[tuple[float, int]] = []  # (real s, version) at the first and last report

    def progress(status: dict[str, Any]) -> None:
        real = time.perf_counter() - began
        report = (real, status["version"])
        reports[:] = [reports[0] if reports else report, report]
        out.write_text(json.dumps({
            "virtual_s": status["elapsed_s"], "version": status["version"],
            "accuracy": status["accuracy"], "real_s": real, "reports": reports}))

    facts = simulate(spec, run_dir, "bench", progress)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    evals = [r["accuracy"] for r in events if r.get("event") == "eval"]
    stop = [r for r in events if r.get("event") == "stop"]
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    out.write_text(json.dumps({**facts, "final_accuracy": evals[-1] if evals else None,
                               "peak_rss_bytes": rss,
                               "versions": stop[-1]["versions"] if stop else None,
                               "virtual_s": spec.stop.time_s, "gpu_peak_bytes": peak,
                               "reports": reports, "finished": True}))


def in_child(recipe: str, out: Path, limit_s: float) -> dict[str, Any]:
    """Run `recipe` in a child process for at most `limit_s` s; its facts, or its last
    progress when stopped (``finished`` false)."""
    command = [sys.executable, __file__, "--child", str(out)]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, input=recipe, capture_output=True, text=True,
                              timeout=limit_s, cwd=ROOT)
        error = done.stderr[-400:] if done.returncode else None
    except subprocess.TimeoutExpired:
        error = None
    facts: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    facts.setdefault("finished", False)
    facts["child_wall_s"] = time.perf_counter() - began
    if error:
        facts["error"] = error
    return facts


def resnet_section(args: argparse.Namespace, device: torch.device, tmp: Path
                   ) -> dict[str, Any]:
    print(f"\n3. resnet18 in the nbsync setting of {STUDY.name} (8 workers), "
          f"{args.resnet_virtual_s:g} virtual s at most, {args.resnet_wall_s:g} real s at most")
    recipe = STUDY.read_text()
    for old, new in (('name = "cnn"', 'name = "resnet18"'), ('baseline = "fedavg"', ""),
                     ("time_s = 900", f"time_s = {args.resnet_virtual_s:g}"),
                     ('clock = "virtual"', f'clock = "virtual"\ndevice = "{device}"')):
        if old not in recipe:  # else the study's own setting would run as resnet18's
            sys.exit(f"error: {STUDY}: no line {old!r} to edit for the resnet18 setting")
        recipe = recipe.replace(old, new)
    nbsync_only = recipe[: recipe.index("[[runs]]")] + (
        '[[runs]]\nname = "nbsync"\nprotocol = "nbsync"\noptim = { lr = 0.1 }\n')
    facts = in_child(nbsync_only, tmp / "resnet.json", args.resnet_wall_s)
    if facts.get("finished"):
        rate = facts.get("virtual_per_real")
        print(f"   {rate} virtual s per real s (real {facts.get('real_s')} s: math "
              f"{facts.get('math_real_s')} s, evaluations {facts.get('eval_real_s')} s, "
              f"set-up {facts.get('setup_real_s')} s; {facts.get('worker_math')})")
    elif "virtual_s" in facts:
        rate = facts["virtual_s"] / facts["real_s"] if facts.get("real_s") else None
        print(f"   stopped at {facts['virtual_s']:.1f} virtual s after {facts['real_s']:.0f} "
              f"real s of simulation: {rate and round(rate, 3)} virtual s per real s")
        facts["virtual_per_real"] = rate
    else:
        print(f"   no progress report within {args.resnet_wall_s:g} s (the set-up and the "
              f"first evaluation took longer) {facts.get('error', '')}")
    return facts


def population_run(args: argparse.Namespace, device: torch.device, batched: str,
                   rounds: int, tmp: Path) -> dict[str, Any]:
    virtual_s = round(rounds * ROUND_VIRTUAL_S, 2)
    recipe = POPULATION.format(device=device, virtual_s=virtual_s, batched=batched,
                               eval_s=max(virtual_s / 2, 1.0))
    facts = in_child(recipe, tmp / f"population-{batched}.json", args.population_wall_s)
    done = facts.get("versions") if facts.get("finished") else facts.get("version")
    facts["rounds"] = done
    reports = facts.get("reports") or []
    if len(reports) == 2 and reports[1][1] > reports[0][1]:
        (first_s, first_v), (last_s, last_v) = reports
        facts["wall_per_round_s"] = (last_s - first_s) / (last_v - first_v)
        # a finished run's virtual time and rounds at its stop, else at the last report
        facts["virtual_per_round_s"] = facts["virtual_s"] / done
        facts["projected_1500_rounds_s"] = first_s + (1500 - first_v) * facts[
            "wall_per_round_s"]
    return facts


def population_section(args: argparse.Namespace, device: torch.device, tmp: Path
                       ) -> dict[str, Any]:
    print("\n4. population: FedAvg, 1,000 clients, 50 a round, batch 10, 5 local steps, cnn "
          "(1x32x32)")
    out = {}
    for batched, rounds in (("on", args.rounds), ("off", args.rounds_one_by_one)):
        if rounds < 1:
            continue
        facts = population_run(args, device, batched, rounds, tmp)
        out[batched] = facts
        label = "batched   " if batched == "on" else "one by one"
        if facts.get("wall_per_round_s"):
            print(f"   {label}: {facts['rounds']} rounds, {facts['wall_per_round_s']:.3f} s "
                  f"wall and {facts['virtual_per_round_s']:.3f} s simulated per round, "
                  f"accuracy {facts.get('final_accuracy') or facts.get('accuracy')}, set-up "
                  f"{facts.get('setup_real_s', '-')} s, 1,500 rounds projected "
                  f"{facts['projected_1500_rounds_s'] / 60:.1f} min "
                  f"({facts.get('worker_math', 'stopped early')}, workers on "
                  f"{facts.get('worker_math_device', '-')}; peak memory "
                  f"{facts.get('peak_rss_bytes', 0) / 2**30:.1f} GiB host, "
                  f"{facts.get('gpu_peak_bytes', 0) / 2**30:.1f} GiB GPU)")
        else:
            print(f"   {label}: no round done {facts.get('error', '')}")
    if out.get("on", {}).get("wall_per_round_s") and out.get("off", {}).get("wall_per_round_s"):
        ratio = out["off"]["wall_per_round_s"] / out["on"]["wall_per_round_s"]
        out["speedup"] = ratio  # type: ignore[assignment]
        print(f"   wall per round, one by one / batched: {ratio:.2f}x")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (CUDA if present) | cpu | cuda")
    parser.add_argument("--only", default="", help=f"sections, comma-separated: {SECTIONS}")
    parser.add_argument("--models", default="mlp,cnn,resnet18")
    parser.add_argument("--sizes", default="", help="workers (default 1,8,64,512; CPU 1,8,64)")
    parser.add_argument("--resnet-sizes", default="",
                        help="workers for resnet18 (default 1,8,64,512; CPU 1,8)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=4, help="processes of the study runs")
    parser.add_argument("--study-wall-s", type=float, default=150.0)
    parser.add_argument("--study-repeats", type=int, default=2,
                        help="times each device runs the study (the best counts)")
    parser.add_argument("--resnet-virtual-s", type=float, default=40.0)
    parser.add_argument("--resnet-wall-s", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=0,
                        help="population rounds, batched (default 50; CPU 8)")
    parser.add_argument("--rounds-one-by-one", type=int, default=-1,
                        help="population rounds, one by one (default 5; CPU 8; 0 skips)")
    parser.add_argument("--population-wall-s", type=float, default=120.0)
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_run(sys.stdin.read(), args.child)
        return
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but CUDA is not available here (try --device cpu)")
    else:
        device = torch.device(args.device)
    gpu = device.type == "cuda"
    args.sizes = args.sizes or ("1,8,64,512" if gpu else "1,8,64")
    args.resnet_sizes = args.resnet_sizes or ("1,8,64,512" if gpu else "1,8")
    args.rounds = args.rounds or (50 if gpu else 8)
    if args.rounds_one_by_one < 0:
        args.rounds_one_by_one = 5 if gpu else 8
    only = set(args.only.split(",")) if args.only else (
        set(SECTIONS) if gpu else {"steps", "population"})
    if unknown := only - set(SECTIONS):
        sys.exit(f"error: --only: unknown sections {sorted(unknown)}; known: {SECTIONS}")
    torch.set_num_threads(1)  # as a virtual run (one torch thread a process)
    # and cuDNN's kernels as a virtual run picks them (`simulate`): deterministic ones,
    # not timed, so the per-step table costs the convolutions a run computes
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(f"device: {device} ({name}), torch {torch.__version__}, one torch thread")
    figures: dict[str, Any] = {"device": str(device), "device_name": name,
                               "torch": torch.__version__, "args": {
                                   k: str(v) for k, v in vars(args).items()}}
    began = time.perf_counter()

    def save() -> None:
        """Write the figures so far: a bench cut off (a lent machine's time cap) keeps the
        sections it finished."""
        figures["bench_wall_s"] = time.perf_counter() - began
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if "steps" in only:
            figures["steps"] = []
            steps_section(args, device, figures["steps"], save)
        if "study" in only:
            figures["study"] = study_section(args, device, tmp)
            save()
        if "resnet" in only:
            figures["resnet18"] = resnet_section(args, device, tmp)
            save()
        if "population" in only:
            figures["population"] = population_section(args, device, tmp)
            save()
    save()
    print(f"\nbench wall time: {figures['bench_wall_s']:.0f} s")
    if args.json:
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
