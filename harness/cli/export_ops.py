"""`python -m harness.export_ops [overrides] --out ops.csv` — write a preset's op list as a trace CSV.

Composes the configuration like `python -m harness` (same overrides), builds the workload and writes
one row per (step, op) with FLOPs, bytes, the device time the cost model gives on the chosen hardware,
shape keys, flags, dependencies and collectives (columns: harness/model/ops_csv.py). Reading the file back
with the command it prints (`workload=trace workload.path=ops.csv` with the phase, batch, context and
layout the file does not hold, on the same hardware and strategy) reproduces the run, except where the
strategy pads a model card's sizes (graph capture sizes, shape buckets), which an op list's are not, or
fuses kernels whose device times the file holds (strategy.fusion): it then says so in a note. A serving
run is refused: its batches come from its request stream.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import numpy as np

from harness.config.compose import compose_run
from harness.config.messages import one_line
from harness.config.schema import DecodeKvReads, GraphMode, KvCache, KvCacheDtype, Phase, RunConfig, WorkloadConfig
from harness.model.device import device_times
from harness.base.commands import CommandParser
from harness.base.errors import HarnessError, fail
from harness.base.files import check_folder
from harness.model.ops_csv import write_ops_csv
from harness.model.ops import HOST_ONLY_KINDS, Workload
from harness.model.workload import build_workload, run_build_options
from harness.base.overrides import override_key


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m harness.export_ops", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=qwen3_30b_decode workload.steps=8")
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write (its folder is made if missing)")
    parser.add_argument("--no-device-us", action="store_true", help="leave device_us empty: the cost model prices the ops when read")
    args = parser.parse_args(argv)
    if args.out.is_dir():
        fail(f"--out={args.out}: is a folder; give the CSV file to write")
    try:
        check_folder("--out", args.out.parent)
        run = compose_run(args.overrides)
        if run.workload.serving.enabled:
            fail("workload.serving.enabled=true: a serving run's batches come from its request stream, which an op list cannot hold;"
                 " export it with workload.serving.enabled=false")
        workload = build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node, **run_build_options(run))
        device_us = None if args.no_device_us else device_times(workload, run.hardware)[0]
        notes = read_back_differences(run, workload if device_us is not None else None)
    except HarnessError as exc:
        fail(str(exc))
    except Exception as exc:  # composition errors: unknown key, wrong type
        fail(one_line(exc, args.overrides))
    # check_folder removes the folder its probe made; the writer needs it (as `harness.profile --out` makes
    # its folder). A failed write is a WriteError, which run_command ends with its own exit status.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_ops_csv(workload, args.out, device_us)
    host_only = int(np.isin(workload.kind, HOST_ONLY_KINDS).sum())  # a run's ops/step counts kernels only
    rows = f"{workload.n_ops} ops" + (f" ({workload.n_ops - host_only} kernels + {host_only} host ops)" if host_only else "")
    print(f"wrote {workload.steps} step{'s' if workload.steps != 1 else ''} × {rows} of {run.workload.name} to {args.out}", file=sys.stderr)
    for note in notes:
        print(f"hostbound: note: {note}", file=sys.stderr)
    print(f"read it back: {read_back_command(run.workload, workload.steps, args.out, args.overrides)}", file=sys.stderr)


def read_back_differences(run: RunConfig, priced: Workload | None = None) -> list[str]:
    """Why the read-back's summary will not be the run's: the strategy pads a model card's sizes (batch to a
    graph's capture size, KV lengths and batches to shape buckets), and an op list's sizes are the file's,
    never padded (harness/sim/policies.py); and task fusion prices a card's fused kernel once, from its
    members' FLOPs and bytes, where a file's fused kernel is its members' device_us summed, each with its
    fixed cost (as a profile's measured kernels fuse). `priced`: the workload exported with its device_us
    (None: written without them, read back priced as the run prices them). Said only where this run pads
    something (its padding waste) or fuses kernels whose device_us the file holds."""
    strategy, phase = run.strategy, run.workload.phase
    graphs = strategy.graph.mode != GraphMode.none and phase in strategy.graph.phases
    buckets = strategy.shape_buckets and phase == Phase.decode
    fusion = strategy.fusion and priced is not None
    if not (graphs or buckets or fusion):
        return []
    from harness.sim.policies import prepare  # the run's own padding and fusion, as it plans them (not on a plain export's path)

    batch = np.full(run.workload.steps, run.workload.batch_size, dtype=np.int64)
    try:
        prepared, plan = prepare(run, batch, None)
    except HarnessError:  # the run itself stops (a sunk graph's dynamic_fallback=error): it has no summary to differ from
        return []
    notes = []
    if fusion and prepared.n_ops < priced.n_ops:
        notes.append(
            f"the read-back will differ: strategy.fusion=true fuses this run's {priced.n_ops} ops a step into {prepared.n_ops} and"
            " prices each fused kernel once, from its members' FLOPs and bytes, where an op list's fused kernel is its members'"
            " device_us summed, each with its own fixed cost (export with --no-device-us for a read-back that prices them as the run does)"
        )
    waste = plan.info.get("padding_waste", 0.0) if graphs or buckets else 0.0
    if waste <= 0:
        return notes
    if buckets:
        what = (f"strategy.shape_buckets=true pads KV lengths to strategy.kv_block={strategy.kv_block} and batches to"
                " strategy.graph.buckets")
    else:
        what = f"strategy.graph.mode={strategy.graph.mode.value} pads each batch to its graph's capture size"
    unpadded = "an op list's sizes are never padded"
    if graphs and strategy.graph.mode == GraphMode.sink:
        # A sunk graph is keyed by all its shapes: unpadded, each step's KV length is a new graph to load.
        unpadded += ", so each new KV length loads a sunk graph of its own"
    return [*notes, f"the read-back will differ: {what} ({waste:.1%} of this run's device time is padding), and {unpadded}"]


def read_back_command(workload: WorkloadConfig, steps: int, path: Path, overrides: list[str]) -> str:
    """The run of the exported file: what the CSV does not hold (phase, batch, context, layout: the
    throughput, TTFT and per-device figures depend on them; its steps, so the run records them) and the
    command's other choices."""
    w = workload
    held = [f"workload.phase={w.phase.value}", f"workload.batch_size={w.batch_size}", f"workload.context_len={w.context_len}",
            f"workload.steps={steps}", f"workload.warmup_steps={w.warmup_steps}", f"workload.tp={w.tp}", f"workload.dp={w.dp}", f"workload.ep={w.ep}"]
    others = [o for o in overrides if not override_key(o).startswith("workload")]
    if any(override_key(o) == "experiment" for o in others):
        # An experiment sets workload keys of its own, applied over workload=trace: its card (the run read the
        # card and ignored the file), and the ways a card's bytes are priced, which a file's rows already hold
        # (with no card they are refused). Keys on the command line come last and win.
        held.append("workload.card=null")
        if w.ops:  # an experiment's own op list (the GEMM rows) beside the file would be refused: one source of ops a run
            held.append("workload.ops=[]")
        if w.kv_cache_dtype != KvCacheDtype.auto:
            held.append(f"workload.kv_cache_dtype={KvCacheDtype.auto.value}")
        if w.decode_kv_reads != DecodeKvReads.shared:
            held.append(f"workload.decode_kv_reads={DecodeKvReads.shared.value}")
        if w.kv_cache != KvCache.auto:  # an unfused card's cache update (gpt-fast's static one): the file holds its ops
            held.append(f"workload.kv_cache={KvCache.auto.value}")
    return shlex.join(["python", "-m", "harness", "workload=trace", f"workload.path={path}", *held, *others])
