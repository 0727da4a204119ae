"""Simulated tasks per second: the Numba kernel alone, end to end, and the Python oracle.

    python benchmarks/bench_engine.py [--steps 256] [--strategy eager] [--repeat 5] [--csv out.csv]

Graph: the preset Llama-2-7B decode on Atlas A2 under the chosen strategy. "kernel" times the jitted
event loop on prepared arrays; "simulate" adds validation and the successor/lane links; "end to end"
is workload build + lowering + kernel + metrics (no files, no tracking). The oracle (tests/oracle.py)
runs the same graph for the ratio. Best of --repeat runs; the first call (compile or cache load) is
left out and reported separately.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hydra import compose, initialize_config_dir  # noqa: E402

from harness.config.compose import register_configs, to_run_config  # noqa: E402
from harness.config.paths import CONF_DIR  # noqa: E402
from harness.sim.kernel import _simulate, links, simulate  # noqa: E402
from harness.sim.lowering import lower  # noqa: E402
from harness.sim.simulate import simulate_run  # noqa: E402
from harness.model.workload import build_workload  # noqa: E402


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--oracle-steps", type=int, default=16)
    parser.add_argument("--strategy", default="eager")
    parser.add_argument("--workload", default="llama2_7b_decode")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[f"strategy={args.strategy}", f"workload={args.workload}", f"workload.steps={args.steps}"],
        )
    run = to_run_config(cfg)
    graph = lower(build_workload(run.workload), run.hardware, run.strategy, run.seed)
    n = graph.n_tasks

    began = time.perf_counter()
    simulate(graph)
    first_call_s = time.perf_counter() - began

    lane_prev, lane_next, succ_ptr, succ_idx = links(graph)
    start, end, decider = np.zeros(n), np.zeros(n), np.empty(n, dtype=np.int64)
    kernel_s = best_of(
        args.repeat,
        lambda: _simulate(graph.tasks, lane_prev, lane_next, graph.dep_ptr, succ_ptr, succ_idx, graph.pool_capacity, start, end, decider),
    )
    simulate_s = best_of(args.repeat, lambda: simulate(graph))
    e2e_s = best_of(args.repeat, lambda: simulate_run(run))

    from oracle import simulate_reference

    small = to_run_config(cfg)
    small.workload.steps = args.oracle_steps
    small_graph = lower(build_workload(small.workload), small.hardware, small.strategy, 0)
    t = small_graph.tasks
    deps = np.split(small_graph.dep_idx, small_graph.dep_ptr[1:-1])
    inputs = (t["lane"].tolist(), t["pool"].tolist(), t["units"].tolist(), t["duration_us"].tolist(), [d.tolist() for d in deps], small_graph.pool_capacity.tolist())
    oracle_s = best_of(1, lambda: simulate_reference(*inputs))
    small_kernel_s = best_of(args.repeat, lambda: simulate(small_graph))

    rows = [
        ("kernel", n, kernel_s),
        ("simulate (validate + links + kernel)", n, simulate_s),
        ("end to end (build + lower + kernel + metrics)", n, e2e_s),
        ("python oracle", small_graph.n_tasks, oracle_s),
        ("simulate, oracle's graph", small_graph.n_tasks, small_kernel_s),
    ]
    table = pd.DataFrame(rows, columns=["what", "tasks", "seconds"])
    table["M_tasks_per_s"] = table["tasks"] / table["seconds"] / 1e6
    print(f"graph: {args.workload} / {args.strategy} / atlas_a2, {args.steps} steps, {n} tasks; first call {first_call_s:.2f} s")
    print(table.to_markdown(index=False, floatfmt=".4g") if _has_tabulate() else table.to_string(index=False))
    print(f"kernel vs oracle: {table.M_tasks_per_s[0] / table.M_tasks_per_s[3]:.0f}x")
    if args.csv:
        table.to_csv(args.csv, index=False)


def _has_tabulate() -> bool:
    return importlib.util.find_spec("tabulate") is not None


if __name__ == "__main__":
    main()
