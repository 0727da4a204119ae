"""Sweep throughput: configurations per second of a whole `python -m harness -m ...` sweep, per launcher.

    python benchmarks/bench_sweep.py [--configs 50,200] [--launchers default,basic,joblib,ray]
                                     [--store new|existing] [--repeat 3] [--csv benchmarks/results/sweep.csv]

The sweep: Llama-2-7B decode, 8 steps, over batch sizes × strategies × host threads × seeds (200
configurations by default; fewer with --configs), tracking on and every file a sweep's job writes by
default (summary.json, steps.parquet, trace.json; timeline.png only when asked), in a fresh folder. The
store is new (`--store new`: the sweep makes and migrates the sqlite database, ~2 s) or one an earlier
run made (`existing`, as in a project that has run before). Each launcher runs the same sweep, as a user
would; the time is the whole command's (start-up, checking the combinations, making the store,
compilation-cache load, jobs, results.csv, exit), the median of `--repeat` runs (taken round by round
over the launchers), min and max beside it.
`default` is conf/config.yaml's launcher (harness.sweep.launcher: warm workers forked from the sweep, one per
core); `basic` is Hydra's, one job after the other in the launching process. A simulation alone takes
~0.02 s of a job (issue 15 item 1 wants >= 8 configurations/s on 2 cores, and parallel launchers no
slower than the serial one from 50 jobs up). `ray` needs the `cluster` extra.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

AXES = {
    "workload.batch_size": ["1", "2", "4", "8", "16"],
    "strategy": ["eager", "async", "pipeline", "acl_graph", "tiling_cache"],
    "hardware.host.threads": ["1", "2", "4", "8"],
    "seed": ["0", "1"],
}
LAUNCHERS = {
    "default": [],  # conf/config.yaml's: harness.sweep.launcher, warm forked workers, one per core
    "basic": ["hydra/launcher=basic"],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "ray": ["hydra/launcher=ray"],
}


def sweep_axes(configs: int) -> list[str]:
    """Overrides whose product is the most configurations up to `configs`: a leading part of each axis
    (of the sizes that reach it, the most even)."""
    best = max(
        itertools.product(*[range(1, len(v) + 1) for v in AXES.values()]),
        key=lambda sizes: (math.prod(sizes) <= configs, math.prod(sizes) if math.prod(sizes) <= configs else -math.prod(sizes), min(sizes)),
    )
    return [f"{k}={','.join(v[:n])}" for (k, v), n in zip(AXES.items(), best)]


def run(launcher: str, overrides: list[str], store: str) -> tuple[int, float]:
    """(jobs, seconds) of one sweep in a fresh folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"bench-sweep-{launcher}-"))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "RAY_USAGE_STATS_ENABLED": "0"}
    if store == "existing":  # a project that has run before: its store and experiment exist
        made = subprocess.run([sys.executable, "-m", "harness", "workload.steps=1", "output.print_summary=false"],
                              cwd=folder, env=env, capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"making the store: exit {made.returncode}\n{made.stderr[-2000:]}")
    command = [sys.executable, "-m", "harness", "-m", *LAUNCHERS[launcher], *overrides, "workload.steps=8",
               "output.print_summary=false", "hydra.sweep.dir=sweep"]
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    jobs = len(pd.read_csv(folder / "sweep" / "results.csv"))
    shutil.rmtree(folder, ignore_errors=True)
    return jobs, seconds


def row(launcher: str, jobs: int, store: str, times: list[float]) -> dict:
    median = statistics.median(times)
    return {"launcher": launcher, "configs": jobs, "store": store, "runs": len(times), "seconds": round(median, 1),
            "seconds_min": round(min(times), 1), "seconds_max": round(max(times), 1), "configs_per_s": round(jobs / median, 2),
            "s_per_config": round(median / jobs, 3), "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="200", help="comma-separated sweep sizes")
    parser.add_argument("--launchers", default="default,basic,joblib", help=f"comma-separated, of {', '.join(LAUNCHERS)}")
    parser.add_argument("--store", default="new", help="comma-separated, of new, existing")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each sweep (the median is reported)")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args()
    cases = [(launcher, int(size), store) for store in args.store.split(",") for size in args.configs.split(",")
             for launcher in args.launchers.split(",")]
    times: dict[tuple, list[float]] = {case: [] for case in cases}
    jobs: dict[tuple, int] = {}
    for _ in range(args.repeat):  # round by round: a slow spell of this shared machine hits every launcher alike
        for launcher, size, store in cases:
            jobs[(launcher, size, store)], seconds = run(launcher, sweep_axes(size), store)
            times[(launcher, size, store)].append(seconds)
    table = pd.DataFrame([row(launcher, jobs[case], store, times[case]) for case in cases for launcher, _, store in [case]])
    print(table.to_markdown(index=False))
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
