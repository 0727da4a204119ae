"""Speed and scale of the simulator: one table, written as CSV and Markdown.

    python benchmarks/bench_scaling.py [--out benchmarks/results] [--quick]

Rows:
* kernel alone and end to end (workload build + lowering + kernel + metrics, no files) on Llama-2-7B
  and DeepSeek-V3 eager decode;
* one small graph on the kernel, the Python oracle (tests/oracle.py) and SimPy, timed in the same
  run (`kernel_speedup`); the SimPy model below implements the engine's semantics (lanes FIFO, FIFO
  pools, ready at the latest predecessor end) and its start times are checked against the kernel's;
* Numba compile time with a cold cache and load time with a warm one (fresh processes, the sweep
  warm-up: every kernel through a 2-step run);
* scaling: end-to-end time against steps and against ops per step (rows named `scale`);
* whole `python -m harness workload=deepseek_v3 strategy=eager workload.steps=N` processes (N = 1000,
  3000): wall time and peak memory (long runs are simulated in chunks, so memory stays flat).
SimPy is a benchmark-only dependency (`pip install simpy`), not part of the package.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import best_of  # noqa: E402

from hydra import compose, initialize_config_dir  # noqa: E402

from harness.config.compose import register_configs, to_run_config  # noqa: E402
from harness.config.paths import CONF_DIR  # noqa: E402
from harness.sim.kernel import _simulate, links, simulate  # noqa: E402
from harness.sim.lowering import lower  # noqa: E402
from harness.cli.job import execute  # noqa: E402
from harness.sim.simulate import simulate_run  # noqa: E402
from harness.model.workload import build_workload  # noqa: E402


def compose_run(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_run_config(compose(config_name="config", overrides=list(overrides)))


def simpy_model(graph) -> np.ndarray:
    """The engine's semantics in SimPy: one process per task. Returns start times."""
    import simpy

    tasks = graph.tasks
    n = tasks.shape[0]
    env = simpy.Environment()
    pools = [simpy.Container(env, capacity=int(c), init=int(c)) for c in graph.pool_capacity]
    done = [env.event() for _ in range(n)]
    start = np.zeros(n)
    last_on_lane: dict[int, int] = {}
    preds: list[list[int]] = []
    for i in range(n):
        p = list(graph.dep_idx[graph.dep_ptr[i]:graph.dep_ptr[i + 1]])
        lane = int(tasks["lane"][i])
        if lane in last_on_lane:
            p.append(last_on_lane[lane])
        last_on_lane[lane] = i
        preds.append(p)

    def task(i: int):
        if preds[i]:
            yield env.all_of([done[p] for p in preds[i]])
        release = float(tasks["release_us"][i])
        if release > env.now:
            yield env.timeout(release - env.now)
        pool, units = int(tasks["pool"][i]), int(tasks["units"][i])
        if pool >= 0 and units > 0:
            yield pools[pool].get(units)
        start[i] = env.now
        yield env.timeout(float(tasks["duration_us"][i]))
        if pool >= 0 and units > 0:
            yield pools[pool].put(units)
        done[i].succeed()

    for i in range(n):
        env.process(task(i))
    env.run()
    return start


def run_process(args: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS GiB) of one command in a fresh process (GNU time reads the peak)."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        began = time.perf_counter()
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", report.name, *args], check=True, capture_output=True,
                       env={**os.environ, **(env or {})}, cwd=tempfile.gettempdir())
        wall = time.perf_counter() - began
        peak_kib = int(Path(report.name).read_text().split()[-1])
    return wall, peak_kib / 2**20


def harness_process(*overrides: str) -> tuple[float, float, int]:
    """(wall s, peak RSS GiB, tasks simulated) of a whole `python -m harness …` run, tracking off."""
    run_dir = Path(tempfile.mkdtemp())
    wall, peak = run_process([sys.executable, "-m", "harness", *overrides, "tracking.enabled=false",
                              "output.print_summary=false", f"hydra.run.dir={run_dir}"])
    return wall, peak, int(json.loads((run_dir / "summary.json").read_text())["tasks_simulated"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--quick", action="store_true", help="smaller graphs, no long processes")
    args = parser.parse_args()
    register_configs()
    rows: list[dict] = []

    def row(what: str, tasks: int, seconds: float, **extra) -> None:
        rows.append({"what": what, "tasks": tasks, "seconds": seconds, "M_tasks_per_s": tasks / seconds / 1e6 if tasks else np.nan, **extra})
        print(f"{what:60s} {tasks:>10d} tasks {seconds:8.3f} s", file=sys.stderr)

    def kernel_seconds(graph, repeat: int = 5) -> float:
        """The jitted event loop alone, on prepared links (no validation, no allocation of inputs)."""
        simulate(graph)
        lane_prev, lane_next, succ_ptr, succ_idx = links(graph)
        n = graph.n_tasks
        start, end, decider = np.zeros(n), np.zeros(n), np.empty(n, dtype=np.int64)
        return best_of(repeat, lambda: _simulate(graph.tasks, lane_prev, lane_next, graph.dep_ptr, succ_ptr, succ_idx, graph.pool_capacity, start, end, decider))

    for preset, steps in [("llama2_7b_decode", 64 if args.quick else 256), ("deepseek_v3", 16 if args.quick else 64)]:
        run = compose_run(f"workload={preset}", "strategy=eager", f"workload.steps={steps}", "tracking.enabled=false")
        graph = lower(build_workload(run.workload), run.hardware, run.strategy, run.seed)
        row(f"kernel: {preset} eager, {steps} steps", graph.n_tasks, kernel_seconds(graph))
        simulate_run(run)
        row(f"end to end (build + lower + kernel + metrics): {preset} eager, {steps} steps", graph.n_tasks, best_of(3, lambda: simulate_run(run)))
        with tempfile.TemporaryDirectory() as run_dir:
            execute(run, Path(run_dir), {})
            row(f"end to end + output files (summary, steps, 2-step trace, 1-step timeline): {preset} eager, {steps} steps",
                graph.n_tasks, best_of(3, lambda: execute(run, Path(run_dir), {})))

    # One small graph on all three engines, timed in this run: the ratios compare like with like.
    small = compose_run("workload=llama2_7b_decode", "strategy=eager", "workload.steps=8")
    small_graph = lower(build_workload(small.workload), small.hardware, small.strategy, small.seed)
    from oracle import simulate_reference

    t = small_graph.tasks
    deps = [d.tolist() for d in np.split(small_graph.dep_idx, small_graph.dep_ptr[1:-1])]
    inputs = (t["lane"].tolist(), t["pool"].tolist(), t["units"].tolist(), t["duration_us"].tolist(), deps, small_graph.pool_capacity.tolist())
    kernel_small = kernel_seconds(small_graph, repeat=20)
    row("kernel, small graph (Llama-2-7B eager, 8 steps)", small_graph.n_tasks, kernel_small)
    oracle_s = best_of(1, lambda: simulate_reference(*inputs))
    same = simulate_reference(*inputs)[0] == simulate(small_graph).start_us.tolist()
    row("Python oracle, small graph", small_graph.n_tasks, oracle_s, kernel_speedup=oracle_s / kernel_small, agrees_with_kernel=same)
    try:
        simpy_s = best_of(1, lambda: simpy_model(small_graph))
        same = bool(np.allclose(simpy_model(small_graph), simulate(small_graph).start_us))
        row("SimPy model, small graph", small_graph.n_tasks, simpy_s, kernel_speedup=simpy_s / kernel_small, agrees_with_kernel=same)
    except ImportError:
        print("simpy not installed: skipping the SimPy row (pip install simpy)", file=sys.stderr)

    probe = [sys.executable, "-c", "from harness.sweep.callbacks import warm_numba_cache; warm_numba_cache()"]
    with tempfile.TemporaryDirectory() as cache:
        cold, cold_peak = run_process(probe, {"NUMBA_CACHE_DIR": cache})
        warm, warm_peak = run_process(probe, {"NUMBA_CACHE_DIR": cache})
    row("process: import + compile all kernels + 2-step run, cold cache", 0, cold, peak_rss_gib=round(cold_peak, 2))
    row("process: import + load all kernels + 2-step run, warm cache", 0, warm, peak_rss_gib=round(warm_peak, 2))

    for scale_steps in ([50, 100, 200] if args.quick else [100, 300, 1000]):
        r = compose_run("workload=deepseek_v3", "strategy=eager", f"workload.steps={scale_steps}", "tracking.enabled=false")
        outcome = simulate_run(r)
        row(f"scale: deepseek_v3 eager, {scale_steps} steps", outcome.summary["tasks_simulated"], best_of(2, lambda: simulate_run(r)))
        with tempfile.TemporaryDirectory() as run_dir:
            row(f"scale + output files: deepseek_v3 eager, {scale_steps} steps", outcome.summary["tasks_simulated"],
                best_of(2, lambda: execute(r, Path(run_dir), {})))
    for preset in ("qwen25_7b_decode", "llama2_7b_decode", "qwen3_30b_decode", "deepseek_v3"):
        r = compose_run(f"workload={preset}", "strategy=eager", "workload.steps=64")
        outcome = simulate_run(r)
        row(f"scale: {preset} eager, 64 steps, {outcome.summary['ops_per_step']} ops/step", outcome.summary["tasks_simulated"], best_of(2, lambda: simulate_run(r)))

    if not args.quick:
        for steps in (1000, 3000):
            wall, peak, tasks = harness_process("workload=deepseek_v3", "strategy=eager", f"workload.steps={steps}")
            row(f"process: python -m harness workload=deepseek_v3 strategy=eager workload.steps={steps}", tasks, wall, peak_rss_gib=round(peak, 2))

    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "scaling.csv", index=False)
    (args.out / "scaling.md").write_text(table.to_markdown(index=False, floatfmt=".4g") + "\n")
    print(table.to_markdown(index=False, floatfmt=".4g"))


if __name__ == "__main__":
    main()
