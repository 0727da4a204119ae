"""Sweep throughput: configurations per second of a whole `python -m harness -m ...` sweep, per launcher.

    python benchmarks/bench_sweep.py [--configs 50,200] [--launchers basic,joblib,ray] [--csv benchmarks/results/sweep.csv]

The sweep: Llama-2-7B decode, 8 steps, over batch sizes × strategies × host threads × seeds (200
configurations by default; fewer with --configs), tracking on (a fresh sqlite store) and every file a
sweep's job writes by default (summary.json, steps.parquet, trace.json; timeline.png only when asked), in
a fresh folder. Each launcher runs the same sweep once, as a user would; the time is the whole command's
(start-up, checking the combinations, making the store, compilation-cache load, jobs, results.csv). A
simulation alone takes ~0.02 s of it (issue 15 item 1 wants >= 8 configurations/s on 2 cores, and
parallel launchers no slower than the basic one from 50 jobs up). `ray` needs the `cluster` extra.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
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
    "basic": [],
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


def run(launcher: str, overrides: list[str]) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-sweep-{launcher}-"))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "RAY_USAGE_STATS_ENABLED": "0"}
    command = [sys.executable, "-m", "harness", "-m", *LAUNCHERS[launcher], *overrides, "workload.steps=8",
               "output.print_summary=false", "hydra.sweep.dir=sweep"]
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    jobs = len(pd.read_csv(folder / "sweep" / "results.csv"))
    return {"launcher": launcher, "configs": jobs, "seconds": round(seconds, 1), "configs_per_s": round(jobs / seconds, 2),
            "s_per_config": round(seconds / jobs, 3), "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="200", help="comma-separated sweep sizes")
    parser.add_argument("--launchers", default="basic,joblib", help=f"comma-separated, of {', '.join(LAUNCHERS)}")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args()
    rows = [run(launcher, sweep_axes(int(size))) for size in args.configs.split(",") for launcher in args.launchers.split(",")]
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False))
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
