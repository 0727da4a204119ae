"""Import speed: `python -m harness.profile` on synthetic 100k-event Kineto traces.

Goal (issue 11): a 100k-event trace imports in under 2 s on the 2-core development machine. Two
traces of 100k events are written (tests/synthetic_trace.py): one with what a PyTorch-profiler
trace of an HF-transformers model holds around each kernel (framework ops, Python frames, flow
pairs, memory events: ~8 events per kernel) and the densest possible one (3 events per kernel: op,
launch, kernel). Each is imported in-process (read JSON, link, split steps, measure, write
profile.json, ops.csv, replay.txt) `--repeat` times; the best and median wall times are printed,
with the share of the JSON parse (the standard library's json; orjson measured 1.4x faster on the
parse alone here, not enough to add a dependency).

    python benchmarks/bench_import.py [--events 100000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness.cli.profile import main as profile_main  # noqa: E402
from synthetic_trace import Layout, kineto_trace  # noqa: E402

OPS_PER_STEP = 500


def trace_of(events: int, companions: bool) -> dict:
    per_kernel = 8 if companions else 3
    steps = max(1, round(events / (per_kernel * OPS_PER_STEP + 3)))
    return kineto_trace(Layout(steps=steps, ops=OPS_PER_STEP, companions=companions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, companions in (("PyTorch-profiler mix (~8 events/kernel)", True), ("densest (3 events/kernel)", False)):
            data = trace_of(args.events, companions)
            path = Path(tmp) / "trace.json"
            raw = json.dumps(data)
            path.write_text(raw)
            kernels = sum(1 for e in data["traceEvents"] if e.get("cat") == "kernel")
            parse = min(_time(lambda: json.loads(raw)) for _ in range(args.repeat))
            times = []
            for k in range(args.repeat):
                out = Path(tmp) / f"out{k}"
                with contextlib.redirect_stdout(io.StringIO()):
                    times.append(_time(lambda: profile_main([str(path), "--out", str(out)])))
            rows.append((label, len(data["traceEvents"]), kernels, min(times), statistics.median(times), parse))
    print("| trace | events | kernels | import best s | import median s | of which JSON parse s |")
    print("|---|---|---|---|---|---|")
    for label, events, kernels, best, median, parse in rows:
        print(f"| {label} | {events} | {kernels} | {best:.2f} | {median:.2f} | {parse:.2f} |")


def _time(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
