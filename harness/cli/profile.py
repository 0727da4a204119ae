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

`--fit NAME` also writes a hardware preset of the traced machine, `conf/hardware/NAME.yaml` in the
folder the command starts in (searched after the shipped presets): its host costs per launch, device
front-end gaps and graph task gap are the trace's, and where it recorded shapes its kernel floor, GEMM
rate and weight-read bandwidth, each commented with what it was fitted from; the rest is the shipped
preset of the same device (`--base`). Onto another device's preset, or when the trace's device is no
preset's and `--base` does not say which it was, only the host costs are fitted. `python -m harness
hardware=NAME workload=… strategy=…` then predicts other models, batch sizes and strategies on that
machine (harness/importers/fit.py).

`--what-if` then simulates the replay and the alternatives (async dispatch, the host pipeline,
graph capture/replay, a tiling cache, fusion) on the same op list and hardware, and writes
`whatif.csv` / `whatif.md`; a run without it removes those an earlier run left in DIR (and says so), so
the folder holds one run's files. A bad file stops with one line naming it and what is missing (exit 2)
before anything is written.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from harness.base.commands import CommandParser
from harness.base.errors import EXIT_WRITE_FAILED, HarnessError, fail
from harness.base.files import check_folder
from harness.importers import READ_LIMIT_MB, load_profile
from harness.config.paths import CONF_DIR, LAUNCH_FOLDER_CONF
from harness.importers.fit import (
    HOST_COST_KEYS, allocation_calls, base_preset, device_fits, fit_machine, front_end_gaps_us, graph_task_gaps_us, kernel_and_exit_gap_us,
    module_own_us, preset_yaml, repeat_launches, shaped_ops, thin_fits, without_profiler,
)
from harness.importers.steps import Imported, import_profile, ops_table
from harness.model.ops_csv import write_ops_table
from harness.importers.measure import linkage, measured_summary, peer_breakdown, step_table
from harness.base.files import atomic_write, write_json, write_text
from harness.base.overrides import override_key

PROFILE_FILE, OPS_FILE, REPLAY_FILE = "profile.json", "ops.csv", "replay.txt"
WHATIF_CSV, WHATIF_MD = "whatif.csv", "whatif.md"
# torch_npu's task queue holds 4096 entries (kQueueCapacity, torch_npu/csrc/core/npu/NPUQueue.cpp).
TORCH_NPU_QUEUE = 4096
# Hardware presets whose platform costs (graph launch, capture) fit the trace's runtime, where the
# trace does not name a device a preset is for (base_preset); the op list carries the measured device
# and host times, so nothing else of the preset prices a replay.
HARDWARE_OF_SOURCE = {"kineto": "h100", "torch_npu": "atlas_a2"}
# The graph capture/replay preset by the name the platform's users look for (CUDA/HIP graphs refresh
# arguments before the replay, vllm-ascend's ACL graphs after launching it).
GRAPH_OF_SOURCE = {"kineto": "cuda_graph", "torch_npu": "acl_graph"}


def replay_overrides(
    imported: Imported, ops_path: Path, graph_gaps: Optional[np.ndarray] = None, front_end_gaps: Optional[tuple[np.ndarray, np.ndarray]] = None,
) -> list[str]:
    """Overrides of `python -m harness` that replay the op list as the trace ran it (`graph_gaps`,
    `front_end_gaps`: its graph_task_gaps_us and front_end_gaps_us, when measured already)."""
    profile = imported.profile
    overrides = [
        "workload=trace",
        f"workload.path={ops_path}",
        f"hardware={base_preset(profile.device, HARDWARE_OF_SOURCE[profile.source])[0]}",
    ]
    if profile.dispatch == "async":
        overrides += ["strategy=async", f"strategy.queue_capacity={TORCH_NPU_QUEUE}"]
    else:
        overrides.append("strategy=eager")
    # The op list holds the kernels' measured durations; the device front end's gaps between them, idle
    # in the trace as in the simulation, are the trace's own means.
    graph_gaps = graph_task_gaps_us(imported) if graph_gaps is None else graph_gaps
    kernel_gap_us, exit_gap_us = kernel_and_exit_gap_us(*(front_end_gaps_us(imported) if front_end_gaps is None else front_end_gaps))
    if graph_gaps.size:
        overrides.append(f"hardware.graph.task_dispatch_us={graph_gaps.mean():.6g}")
    if graph_gaps.size or exit_gap_us:  # a piecewise trace of one-task graphs has an exit gap and no pairs to dispatch
        overrides.append(f"hardware.graph.exit_gap_us={exit_gap_us:.6g}")
    overrides.append(f"hardware.device.kernel_gap_us={kernel_gap_us:.6g}")
    return overrides


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
            notes.append(f"hit rate {summary['tiling_cache_hit_rate']:.2f} in the second pass; {measured.get('host_ms_tiling', 0.0):.3f} ms/step of tiling measured")
        note = "; ".join(notes)
        rows.append(
            {
                "scenario": name, "overrides": " ".join(extra), "step_ms": summary["step_ms_mean"],
                "speedup": measured["step_ms_mean"] / summary["step_ms_mean"], "device_busy": summary["device_busy"],
                "bubble": summary["bubble_ratio"], "bound": summary["bound"], "bound_reason": summary["bound_reason"], "note": note,
            }
        )
    return pd.DataFrame(rows)


def _read_limit(text: str) -> int:
    """--max-read-mb: a whole number of MiB, 1 to 1,048,576 (1 TiB)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number of MiB") from None
    if not 1 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{text}: must be in 1..1048576 MiB")
    return value


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandParser(prog="python -m harness.profile", description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="Kineto trace (.json/.json.gz) or torch_npu trace_view.json")
    parser.add_argument("--out", type=Path, required=True, help="directory to write profile.json, ops.csv, replay.txt")
    parser.add_argument("--rank", type=int, default=None, help="rank (or device) to import from a trace holding several")
    parser.add_argument(
        "--steps", default="auto",
        help="how to split steps: auto, profiler, graph, sync, mark=NAME, from=NAME, whole (see harness/importers/steps.py)",
    )
    parser.add_argument("--keep", default=None, metavar="A:B", help="keep only steps A..B-1 of those found (Python slice)")
    parser.add_argument("--what-if", action="store_true", help="also simulate the replay and the alternative strategies")
    parser.add_argument("--fit", metavar="NAME", help="also write conf/hardware/NAME.yaml here: a hardware preset of the traced machine")
    parser.add_argument(
        "--max-read-mb", type=_read_limit, default=READ_LIMIT_MB, metavar="MB",
        help=f"refuse a trace that holds more than this, read or inflated (default {READ_LIMIT_MB}; parsing needs ~6× it in memory)",
    )
    parser.add_argument("--base", metavar="PRESET", help="with --fit: the shipped hardware preset it starts from (default: the trace's device)")
    parser.add_argument(
        "--unprofiled-step-ms", type=float, metavar="MS",
        help="with --fit: the mean step time of the same run measured without the profiler (compared with the traced steps' mean);"
             " the fitted host costs lose the profiler's own work",
    )
    args = parser.parse_args(argv)
    try:  # before anything is read: a long import must not end in an unusable folder
        check_folder("--out", args.out)
        fit_path = check_fit(args.fit, args.base, args.unprofiled_step_ms)
    except HarnessError as exc:
        fail(str(exc))
    keep = None
    if args.keep is not None:
        try:
            keep = slice(*[int(p) if p else None for p in args.keep.split(":")])
        except (TypeError, ValueError):
            fail(f"--keep {args.keep!r}: not a slice A:B of step numbers")
        if keep.step == 0:
            fail(f"--keep {args.keep!r}: a slice's step cannot be 0")
    try:
        profile = load_profile(args.trace, args.rank, args.max_read_mb)
        imported = import_profile(profile, args.steps, keep)
        links = linkage(imported)
        if links["device_tasks_linked"] == 0:
            fail(f"{args.trace}: no device task is linked to a launch call (no shared correlation ids or flows): nothing to replay")
        table = ops_table(imported)
        summary = measured_summary(imported)
        (eager_gaps, exit_gaps), graph_gaps = front_end_gaps_us(imported), graph_task_gaps_us(imported)
        overrides = replay_overrides(imported, args.out / OPS_FILE, graph_gaps, (eager_gaps, exit_gaps))
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
        "kernel_gap_us": float(np.mean(eager_gaps)) if eager_gaps.size else 0.0,  # the device front end between queued kernels launched alone
        "graph_exit_gap_us": float(np.mean(exit_gaps)) if exit_gaps.size else 0.0,  # the same right after a graph's tasks (not less kernel_gap_us)
        "linkage": links,
        "peer": peer_breakdown(imported),
        "steps": step_table(imported),
        "notes": profile.notes,
        "recorded_with": list(profile.recorded_with),
        "replay": replay,
    }
    # Everything that can refuse runs before anything is written: a refused what-if or fit left an earlier
    # run's --out half replaced (its what-if files removed, its profile.json the new trace's).
    results = None
    if args.what_if:  # on the op list written aside: --out holds the earlier run's until this one is sure
        with tempfile.TemporaryDirectory(prefix="hostbound-what-if-") as scratch:
            aside = Path(scratch) / OPS_FILE
            write_ops_table(table, aside)
            try:
                results = what_if(imported, [f"workload.path={aside}" if override_key(o) == "workload.path" else o for o in overrides], summary)
            except HarnessError as exc:
                fail(str(exc))
    fit = fitted_preset(args, imported, table, summary, eager_gaps, graph_gaps, exit_gaps) if fit_path is not None else None
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / PROFILE_FILE, record)
    write_ops_table(table, args.out / OPS_FILE)
    write_text(args.out / REPLAY_FILE, replay + "\n")
    print(describe(record))
    print(replay)
    if results is None:
        remove_stale_what_if(args.out)
    else:
        atomic_write(args.out / WHATIF_CSV, lambda tmp: results.to_csv(tmp, index=False))
        shown = results.drop(columns=["bound_reason"]).round({"step_ms": 3, "speedup": 2, "device_busy": 3, "bubble": 3})
        write_text(args.out / WHATIF_MD, shown.to_markdown(index=False) + "\n")
        print(shown.to_markdown(index=False))
    if fit is not None:
        text, caveats, base = fit
        for caveat in caveats:
            print(f"hostbound: warning: {caveat}", file=sys.stderr)
        fit_path.parent.mkdir(parents=True, exist_ok=True)
        write_text(fit_path, text)
        print(f"fitted machine {fit_path} (from {base}): python -m harness hardware={args.fit} workload=... strategy=...")


def remove_stale_what_if(out: Path) -> None:
    """Remove the what-if files an earlier `--what-if` run left in `out`: beside this run's profile.json they
    would read as its alternatives, simulated on another op list. Says so in one line when it removes any."""
    removed = []
    for name in (WHATIF_CSV, WHATIF_MD):
        try:
            (out / name).unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            fail(f"--out={out}: cannot remove {name} an earlier --what-if run left there ({exc.strerror or exc})", EXIT_WRITE_FAILED)
        removed.append(name)
    if removed:
        print(f"hostbound: note: removed {' and '.join(removed)} from {out}: an earlier --what-if run's, not this run's"
              " (add --what-if to simulate this one)", file=sys.stderr)


def check_fit(name: Optional[str], base: Optional[str], unprofiled_step_ms: Optional[float] = None) -> Optional[Path]:
    """Where --fit NAME writes, refused (before anything is written) when the name is not a preset name,
    is a shipped preset's, or is taken in the launch folder; --base must be a shipped preset, and
    --unprofiled-step-ms a positive time."""
    shipped = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
    if name is None:
        if base is not None:
            fail(f"--base {base}: only with --fit NAME")
        if unprofiled_step_ms is not None:
            fail(f"--unprofiled-step-ms {unprofiled_step_ms:.12g}: only with --fit NAME")
        return None
    if unprofiled_step_ms is not None and not (0 < unprofiled_step_ms < float("inf")):
        fail(f"--unprofiled-step-ms {unprofiled_step_ms:.12g}: must be a finite step time above 0 ms")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name):
        fail(f"--fit {name[:80]!r}: a preset name is a letter, then up to 63 letters, digits or _")
    if name in shipped:
        fail(f"--fit {name}: a shipped hardware preset has that name; choose another")
    if base is not None and base not in shipped:
        fail(f"--base {base}: no such hardware preset; choose from {', '.join(shipped)}")
    path = Path(LAUNCH_FOLDER_CONF) / "hardware" / f"{name}.yaml"
    if path.exists():
        fail(f"--fit {name}: {path} exists; remove it or choose another name")
    check_folder(f"--fit {name}: the presets' folder", path.parent)
    return path


def fitted_preset(
    args: argparse.Namespace, imported: Imported, table: pd.DataFrame, summary: dict, eager_gaps: np.ndarray, graph_gaps: np.ndarray,
    exit_gaps: np.ndarray,
) -> tuple[str, list[str], str]:
    """The hardware preset --fit NAME writes (its YAML), the warnings to print with it and the preset it is
    fitted over; refuses (exits) when the trace holds nothing to fit. Writes nothing."""
    profile = imported.profile
    base, named = base_preset(profile.device, HARDWARE_OF_SOURCE[profile.source])
    traced_device = base if named else None
    if args.base is not None:
        base = args.base
    fitted = fit_machine(
        table, len(imported.kept), summary.get("host_ms_sync", 0.0), eager_gaps, graph_gaps, module_own_us(imported), exit_gaps,
        repeat_launches(imported), allocation_calls(imported),
    )
    if not fitted:
        fail(f"{args.trace}: no kernel launch in the replayed steps: nothing to fit a machine from")
    origin_args = [args.trace.name]  # the command line the preset says it came from
    if args.steps != "auto":
        origin_args += ["--steps", args.steps]
    if args.keep:
        origin_args += ["--keep", args.keep]
    if args.unprofiled_step_ms is not None:
        origin_args += ["--unprofiled-step-ms", f"{args.unprofiled_step_ms:.12g}"]
    origin = " ".join(shlex.quote(a) for a in origin_args)
    caveats = []
    if args.unprofiled_step_ms is not None:
        try:
            fitted, factor = without_profiler(fitted, table, len(imported.kept), summary["step_ms_mean"], args.unprofiled_step_ms, summary["bound"])
        except HarnessError as exc:
            fail(str(exc))
        caveats.append(f"the host costs are the trace's x {factor:.3g}: its steps took {summary['step_ms_mean']:.4g} ms under the profiler and"
                       f" {args.unprofiled_step_ms:.12g} ms without it (--unprofiled-step-ms); the difference is the profiler's own work, taken off"
                       " every host stage before a launch alike (the synchronisation calls' own time is left as traced)")
    elif profile.recorded_with:
        caveats.append(f"the trace was recorded with {', '.join(profile.recorded_with)}: the profiler's own host work per op is in"
                       " the fitted host costs, an upper bound on what this host spends without the profiler")
    host_only = ""
    if traced_device is not None and traced_device != base:
        # The trace's device is not the base's: what it measured of its device says nothing of this one.
        host_only = f"the trace ran on another device ({profile.device}) than {base}: only its host costs are fitted, the device's are {base}'s"
    elif traced_device is None and args.base is None:
        # Nobody said which device ran it: its gaps, floor and rates would be priced against a guess.
        host_only = (
            f"the trace's device ({profile.device or 'not named'}) is no shipped preset's: only its host costs are fitted, the"
            f" device's are {base}'s; pass --base PRESET (the device it ran on) to fit the device's too"
        )
    if host_only:
        fitted = [f for f in fitted if f.key.startswith(HOST_COST_KEYS)]
        caveats.append(host_only)
    else:
        from harness.config.compose import compose_run

        fitted += device_fits(shaped_ops(imported), compose_run([f"hardware={base}"]).hardware.device)
    thin = thin_fits(fitted)
    if thin:
        caveats.append(thin)
    return preset_yaml(args.fit, base, fitted, origin, caveats), caveats, base


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
    if record.get("breakdown_external", 0.0) >= 0.1:
        lines.append(
            f"  device work  {record['device_work_ms']:.3f} ms a step; {record['breakdown_external']:.0%} of the critical path waits for"
            " work outside the trace (another stream, process or step): compare predictions of the device with this"
        )
    if record.get("graph_launches_per_step"):
        launches, in_graphs = record["graph_launches_per_step"], record["graph_ops_per_step"]
        kind = "one graph per step" if launches == 1 else f"piecewise: {launches:.0f} graph pieces per step"
        outside = record["ops_per_step"] - in_graphs
        lines.append(f"  graphs       {kind}, {in_graphs:.0f} device ops replayed from graphs, {outside:.0f} not (launched alone, copies)")
    return "\n".join(lines)
