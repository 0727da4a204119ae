"""`python -m harness.profile TRACE --out DIR` — import a real profiler trace, and replay it.

Reads a PyTorch-profiler (Kineto) trace (`.json` / `.json.gz`, CUDA or HIP) or a torch_npu
`trace_view.json`, and writes into DIR:

* `profile.json` — what the trace measured, under summary.json's key names (step_ms_*, device_busy,
  bubble_ratio, host_busy_max, bound, launches_per_step, breakdown_*), plus host time per category,
  launch-to-start delays, device idle split into host wait / device wait, linkage counts, the steps
  found and the peer analyser's (HolisticTraceAnalysis) figures recomputed on the same file;
* `ops.csv` — the replayed steps as an op list (harness/model/ops_csv.py columns) with measured device
  times, streams, host costs per op, syncs, dependencies and graph membership;
* `replay.txt` — the one `python -m harness …` line that replays it (also printed).

`--what-if` then simulates the replay and the alternatives (async dispatch, the host pipeline,
graph capture/replay, a tiling cache, fusion) on the same op list and hardware, and writes
`whatif.csv` / `whatif.md`. A bad file stops with one line naming it and what is missing (exit 2)
before anything is written.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from harness.base.errors import HarnessError, fail
from harness.importers import load_profile
from harness.importers.steps import Imported, import_profile, ops_table
from harness.model.ops_csv import write_ops_table
from harness.importers.measure import linkage, measured_summary, peer_breakdown, step_table
from harness.base.files import atomic_write, write_json, write_text

PROFILE_FILE, OPS_FILE, REPLAY_FILE = "profile.json", "ops.csv", "replay.txt"
WHATIF_CSV, WHATIF_MD = "whatif.csv", "whatif.md"
# torch_npu's task queue holds 4096 entries (kQueueCapacity, torch_npu/csrc/core/npu/NPUQueue.cpp).
TORCH_NPU_QUEUE = 4096
# Hardware presets whose platform costs (graph launch, capture) fit the trace's runtime; the op
# list carries the measured device and host times, so nothing else of the preset prices a replay.
HARDWARE_OF_SOURCE = {"kineto": "h100", "torch_npu": "atlas_a2"}
# The graph capture/replay preset by the name the platform's users look for (CUDA/HIP graphs refresh
# arguments before the replay, vllm-ascend's ACL graphs after launching it).
GRAPH_OF_SOURCE = {"kineto": "cuda_graph", "torch_npu": "acl_graph"}


def replay_overrides(imported: Imported, ops_path: Path) -> list[str]:
    """Overrides of `python -m harness` that replay the op list as the trace ran it."""
    profile = imported.profile
    overrides = [
        "workload=trace",
        f"workload.path={ops_path}",
        f"hardware={HARDWARE_OF_SOURCE[profile.source]}",
    ]
    if profile.dispatch == "async":
        overrides += ["strategy=async", f"strategy.queue_capacity={TORCH_NPU_QUEUE}"]
    else:
        overrides.append("strategy=eager")
    gap = graph_dispatch_us(imported)
    if gap is not None:
        overrides.append(f"hardware.graph.task_dispatch_us={gap:.6g}")
    # The op list holds the kernels' measured durations; the simulator counts a front-end gap in a kernel's
    # device time, which a profiler shows idle: a replay leaves it out (profile.json says what the trace
    # measured, `kernel_gap_us`, for a machine fitted from it).
    overrides.append("hardware.device.kernel_gap_us=0")
    return overrides


def graph_dispatch_us(imported: Imported) -> Optional[float]:
    """Mean device-side gap between consecutive tasks of a graph launch (the per-task dispatch a
    replay adds to graph tasks), or None when no replayed step launched a graph."""
    gaps = []
    for i in imported.kept:
        ops = imported.found[i].ops
        for leader in {op["group"] for op in ops if op["in_graph"] and op["group"] >= 0}:
            members = sorted((op["start_us"], op["end_us"]) for op in ops if op["group"] == leader)
            gaps += [max(0.0, b[0] - a[1]) for a, b in zip(members, members[1:])]
    return float(np.mean(gaps)) if gaps else None


def eager_gap_us(imported: Imported) -> float:
    """Mean device-side gap between a kernel launched on its own and the one before it on its stream,
    over the pairs where it was launched before that one ended (queued: the gap is the device front
    end's, not the host's); 0 when no kernel was queued."""
    gaps = []
    for i in imported.kept:
        last_on_stream: dict[int, dict] = {}
        for op in imported.found[i].ops:
            if not np.isfinite(op["start_us"]):
                continue
            previous = last_on_stream.get(op["trace_stream"])
            last_on_stream[op["trace_stream"]] = op
            alone = not op["in_graph"] and op["group"] < 0 and not op["carried_in"]
            if previous is not None and alone and op.get("ready_us", np.inf) <= previous["end_us"]:  # when the device could first see it
                gaps.append(max(0.0, op["start_us"] - previous["end_us"]))
    return float(np.mean(gaps)) if gaps else 0.0


def command_line(overrides: list[str]) -> str:
    return "python -m harness " + " ".join(shlex.quote(o) for o in overrides)


def what_if(imported: Imported, overrides: list[str], measured: dict) -> pd.DataFrame:
    """The replay and each alternative strategy on the op list: step time, speed-up over the
    measured step, device busy, bound verdict."""
    from harness.config.compose import compose_run
    from harness.sim.simulate import simulate_run

    base = [o for o in overrides if not o.startswith("strategy")]
    traced = [o for o in overrides if o.startswith("strategy")]
    queue = [f"strategy.queue_capacity={TORCH_NPU_QUEUE}"] if imported.profile.dispatch == "async" else []
    # Policies that need a first pass (a graph to capture, a cache to fill) play the steps twice and
    # measure the second time.
    second_pass = ["workload.repeat=2", f"workload.warmup_steps={len(imported.kept)}"]
    scenarios = [
        ("replay (as traced)", traced),
        ("eager: one host thread", ["strategy=eager"]),
        ("async: launch thread", ["strategy=async", *queue]),
        ("pipeline: 3 host threads", ["strategy=pipeline", *queue]),
        ("graph capture/replay", [f"strategy={GRAPH_OF_SOURCE[imported.profile.source]}", *second_pass]),
        ("tiling cache", [*traced, "strategy.tiling_cache=true", *second_pass]),
        ("fusion of vector ops", [*traced, "strategy.fusion=true"]),
    ]
    rows = [
        {
            "scenario": "measured (trace)", "overrides": "", "step_ms": measured["step_ms_mean"], "speedup": 1.0,
            "device_busy": measured["device_busy"], "bubble": measured["bubble_ratio"], "bound": measured["bound"],
            "bound_reason": measured["bound_reason"], "note": "",
        }
    ]
    seen: set[tuple] = set()
    for name, extra in scenarios:
        key = tuple(sorted(extra))
        if key in seen:
            continue
        seen.add(key)
        summary = simulate_run(compose_run([*base, *extra, "tracking.enabled=false"])).summary
        notes = []
        if summary.get("graph_captures"):
            notes.append(f"{summary['graph_captures']} capture ({summary.get('capture_ms', 0.0):.1f} ms, not in the step)")
        if "graph_note" in summary:
            notes.append(summary["graph_note"])
        if "tiling_cache_hit_rate" in summary:
            notes.append(f"hit rate {summary['tiling_cache_hit_rate']:.2f} over both passes; {measured.get('host_ms_tiling', 0.0):.3f} ms/step of tiling measured")
        note = "; ".join(notes)
        rows.append(
            {
                "scenario": name, "overrides": " ".join(extra), "step_ms": summary["step_ms_mean"],
                "speedup": measured["step_ms_mean"] / summary["step_ms_mean"], "device_busy": summary["device_busy"],
                "bubble": summary["bubble_ratio"], "bound": summary["bound"], "bound_reason": summary["bound_reason"], "note": note,
            }
        )
    return pd.DataFrame(rows)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.profile", description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="Kineto trace (.json/.json.gz) or torch_npu trace_view.json")
    parser.add_argument("--out", type=Path, required=True, help="directory to write profile.json, ops.csv, replay.txt")
    parser.add_argument("--rank", type=int, default=None, help="rank (or device) to import from a trace holding several")
    parser.add_argument(
        "--steps", default="auto",
        help="how to split steps: auto, profiler, graph, sync, mark=NAME, from=NAME, whole (see harness/importers/steps.py)",
    )
    parser.add_argument("--keep", default=None, metavar="A:B", help="keep only steps A..B-1 of those found (Python slice)")
    parser.add_argument("--what-if", action="store_true", help="also simulate the replay and the alternative strategies")
    args = parser.parse_args(argv)
    keep = None
    if args.keep is not None:
        try:
            keep = slice(*[int(p) if p else None for p in args.keep.split(":")])
        except (TypeError, ValueError):
            fail(f"--keep {args.keep!r}: not a slice A:B of step numbers")
    try:
        profile = load_profile(args.trace, args.rank)
        imported = import_profile(profile, args.steps, keep)
        links = linkage(imported)
        if links["device_tasks_linked"] == 0:
            fail(f"{args.trace}: no device task is linked to a launch call (no shared correlation ids or flows): nothing to replay")
        table = ops_table(imported)
        summary = measured_summary(imported)
        overrides = replay_overrides(imported, args.out / OPS_FILE)
    except HarnessError as exc:
        fail(str(exc))
    if links["device_tasks_linked"] < links["device_tasks"]:
        unlinked = links["device_tasks"] - links["device_tasks_linked"]
        print(
            f"hostbound: warning: {args.trace}: {links['device_tasks_linked']} of {links['device_tasks']} device tasks linked to"
            f" their launch; {unlinked} launched before the trace or by calls it does not hold are replayed as device work"
            " with no host cost",
            file=sys.stderr,
        )
    replay = command_line(overrides)
    record = {
        "trace": str(args.trace),
        "source": profile.source,
        "device": profile.device,
        "rank": profile.rank,
        "device_index": profile.device_index,
        "dispatch": profile.dispatch,
        "steps_rule": imported.rule,
        "steps_found": len(imported.found),
        "steps_replayed": imported.kept,
        **summary,
        "kernel_gap_us": eager_gap_us(imported),  # the device front end between queued kernels launched alone
        "linkage": links,
        "peer": peer_breakdown(imported),
        "steps": step_table(imported),
        "notes": profile.notes,
        "replay": replay,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / PROFILE_FILE, record)
    write_ops_table(table, args.out / OPS_FILE)
    write_text(args.out / REPLAY_FILE, replay + "\n")
    print(describe(record))
    print(replay)
    if args.what_if:
        try:
            results = what_if(imported, overrides, summary)
        except HarnessError as exc:
            fail(str(exc))
        atomic_write(args.out / WHATIF_CSV, lambda tmp: results.to_csv(tmp, index=False))
        shown = results.drop(columns=["bound_reason"]).round({"step_ms": 3, "speedup": 2, "device_busy": 3, "bubble": 3})
        write_text(args.out / WHATIF_MD, shown.to_markdown(index=False) + "\n")
        print(shown.to_markdown(index=False))


def describe(record: dict) -> str:
    """A few lines on what the trace measured."""
    steps = record["steps_replayed"]
    lines = [
        f"hostbound: {Path(record['trace']).name} ({record['source']}, {record['device'] or 'device name not recorded'}, {record['dispatch']} dispatch)",
        f"  steps        {len(steps)} replayed of {record['steps_found']} found ({record['steps_rule']})",
        f"  step         mean {record['step_ms_mean']:.3f} ms, p50 {record['step_ms_p50']:.3f} ms",
        f"  device busy  {record['device_busy']:.1%}   idle: host wait {record['idle_host_wait_ms']:.3f} ms, device wait {record['idle_device_wait_ms']:.3f} ms per step",
        f"  bound        {record['bound']}: {record['bound_reason']}",
        f"  {record['ops_per_step']:.0f} device ops/step, {record['launches_per_step']:.0f} launches/step;"
        f" linked {record['linkage']['device_tasks_linked']}/{record['linkage']['device_tasks']} device tasks",
    ]
    return "\n".join(lines)
