"""Whole-command times of the commands users run most: medians of repeated runs, each in a new folder.

    python benchmarks/bench_startup.py [--repeat 5] [--only NAME ...] [--md benchmarks/results/startup.md]

What is timed is the whole process, as a user waits for it (start-up, imports, composing, checks,
simulation, files, MLflow, exit): `python -m harness` with its defaults, tracking off and on (on: with
the project's sqlite store already there, and a new one each time, as a project's first run makes it), the 1,000-step DeepSeek-V3 eager run, and
a 24-configuration sweep on a new store (configurations per second). The first round is a warm-up (Numba
cache, file cache, bytecode cache) and is not counted. Commands run with Python's bytecode cache on, as a
user's Python has it (PYTHONDONTWRITEBYTECODE, which some sandboxes set, is removed: with it every
command compiles the harness's modules again, ~0.07 s). The rounds take the commands in turn, so a machine that slows
down slows all of them. docs/benchmarks.md quotes the medians and the goals.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESS = [sys.executable, "-m", "harness"]
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
SWEEP_AXES = ["strategy=eager,async,pipeline,acl_graph", "workload.batch_size=1,8,32", "seed=0,1"]  # 4 × 3 × 2 = 24

# name → (arguments, configurations it runs, whether every round runs in one project folder: its store then exists)
COMMANDS: dict[str, tuple[list[str], int, bool]] = {
    "default, tracking off": (["tracking.enabled=false"], 1, False),
    "default, tracking on (existing store)": ([], 1, True),
    "default, tracking on (new store)": ([], 1, False),
    "deepseek_v3 eager, 1,000 steps": (["workload=deepseek_v3", "strategy=eager", "workload.steps=1000", "tracking.enabled=false"], 1, False),
    "24-configuration sweep (new store)": (["-m", *SWEEP_AXES, "workload.steps=8"], 24, False),
}


def run_once(arguments: list[str], folder: Path) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    done = subprocess.run([*HARNESS, *arguments], cwd=folder, capture_output=True, text=True, env=USER_ENV)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="names (or parts of names) of the commands to time")
    parser.add_argument("--md", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    chosen = {n: c for n, c in COMMANDS.items() if not args.only or any(part in n for part in args.only)}
    times: dict[str, list[float]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.repeat + 1):
            for i, (name, (arguments, _, shared)) in enumerate(chosen.items()):
                folder = Path(scratch) / (f"shared_{i}" if shared else f"{round_}_{i}")  # the warm-up round made its store
                seconds = run_once(arguments, folder)
                if round_:
                    times[name].append(seconds)
            print(f"round {round_}/{args.repeat} done", file=sys.stderr)
    rows = ["| command | median s | min–max s | configurations/s |", "|---|---|---|---|"]
    for name, seconds in times.items():
        configs = chosen[name][1]
        median = statistics.median(seconds)
        rate = f"{configs / median:.1f}" if configs > 1 else ""
        rows.append(f"| {name} | {median:.2f} | {min(seconds):.2f}–{max(seconds):.2f} | {rate} |")
    table = "\n".join(rows) + f"\n\n{args.repeat} counted runs each, after a warm-up round.\n"
    print(table)
    if args.md:
        args.md.write_text(table)


if __name__ == "__main__":
    main()
