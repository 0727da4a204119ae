"""How fast `python -m harness.advise` searches: 1,000 candidates (4 strategies × 125 batch sizes × 1 or 2
host threads of Llama-3.1-8B decode on an H100; every one fits in memory, so every one is simulated),
successive halving over 4 then 16 steps, on one worker process per core. The goal (issue 27): 1,000
candidates evaluated in under 60 s on a 2-core machine.

    python benchmarks/bench_advise.py [--out benchmarks/results]

Writes advise.csv / advise.md: candidates, how many were rejected before simulating, simulated at each
rung, and the seconds (the search's own clock and the whole process's). Kernels are warmed first by a
run of the default configuration, as a user's machine has them after its first run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

SPACE = ("{strategy:[eager,async,pipeline,cuda_graph],workload.batch_size:[" + ",".join(str(b) for b in range(1, 126))
         + "],hardware.host.threads:[1,2]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "harness", "tracking.enabled=false", "workload.steps=2", "hydra.run.dir=warm"],
                       cwd=folder, env=env, check=True, capture_output=True)
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "harness.advise", "hardware=h100", "workload=llama31_8b_decode", "advise=max_throughput",
             f"advise.space={SPACE}", "advise.steps=[4,16]", "advise.budget_s=600", "advise.out=advice", "advise.name=bench",
             "tracking.enabled=false"],
            cwd=folder, env=env, check=True, capture_output=True, text=True,
        )
        wall_s = time.perf_counter() - began
        table = pd.read_csv(Path(folder) / "advice" / "candidates.csv", keep_default_na=False)
    searched = next(line for line in proc.stdout.splitlines() if line.strip().startswith("searched"))
    search_s = float(searched.split(" in ", 1)[1].split(" s", 1)[0])
    row = {
        "candidates": len(table), "rejected_before_simulating": int((table["steps"] == 0).sum()),
        "simulated_at_4_steps": int((table["steps"] > 0).sum()), "simulated_at_16_steps": int((table["steps"] == 16).sum()),
        "cores": os.cpu_count(), "search_s": search_s, "process_s": round(wall_s, 2),
        "candidates_per_s": round(len(table) / search_s, 1),
    }
    frame = pd.DataFrame([row])
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "advise.csv", index=False)
    (args.out / "advise.md").write_text(frame.to_markdown(index=False) + "\n")
    print(frame.to_markdown(index=False))


if __name__ == "__main__":
    main()
