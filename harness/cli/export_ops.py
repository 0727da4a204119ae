"""`python -m harness.export_ops [overrides] --out ops.csv` — write a preset's op list as a trace CSV.

Composes the configuration like `python -m harness` (same overrides), builds the workload and writes
one row per (step, op) with FLOPs, bytes, the device time the cost model gives on the chosen hardware,
shape keys, flags, dependencies and collectives (columns: harness/model/ops_csv.py). Reading the file back
with the command it prints (`workload=trace workload.path=ops.csv` with the phase, batch, context and
layout the file does not hold, on the same hardware and strategy) reproduces the run.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import numpy as np

from harness.config.compose import compose_run
from harness.config.messages import one_line
from harness.config.schema import WorkloadConfig
from harness.model.device import device_times
from harness.model.ops import HOST_ONLY_KINDS
from harness.base.commands import CommandParser
from harness.base.errors import HarnessError, fail
from harness.base.files import check_folder
from harness.model.ops_csv import write_ops_csv
from harness.model.workload import build_workload, run_build_options


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m harness.export_ops", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=qwen3_30b_decode workload.steps=8")
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--no-device-us", action="store_true", help="leave device_us empty: the cost model prices the ops when read")
    args = parser.parse_args(argv)
    if args.out.is_dir():
        fail(f"--out={args.out}: is a folder; give the CSV file to write")
    check_folder("--out", args.out.parent)
    try:
        run = compose_run(args.overrides)
        workload = build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node, **run_build_options(run))
        device_us = None if args.no_device_us else device_times(workload, run.hardware)[0]
        write_ops_csv(workload, args.out, device_us)
    except HarnessError as exc:
        fail(str(exc))
    except Exception as exc:  # composition errors: unknown key, wrong type
        fail(one_line(exc))
    host_only = int(np.isin(workload.kind, HOST_ONLY_KINDS).sum())  # a run's ops/step counts kernels only
    rows = f"{workload.n_ops} ops" + (f" ({workload.n_ops - host_only} kernels + {host_only} host ops)" if host_only else "")
    print(f"wrote {workload.steps} step{'s' if workload.steps != 1 else ''} × {rows} of {run.workload.name} to {args.out}", file=sys.stderr)
    print(f"read it back: {read_back_command(run.workload, workload.steps, args.out, args.overrides)}", file=sys.stderr)


def read_back_command(workload: WorkloadConfig, steps: int, path: Path, overrides: list[str]) -> str:
    """The run of the exported file: what the CSV does not hold (phase, batch, context, layout: the
    throughput, TTFT and per-device figures depend on them; its steps, so the run records them) and the
    command's other choices."""
    w = workload
    held = [f"workload.phase={w.phase.value}", f"workload.batch_size={w.batch_size}", f"workload.context_len={w.context_len}",
            f"workload.steps={steps}", f"workload.warmup_steps={w.warmup_steps}", f"workload.tp={w.tp}", f"workload.dp={w.dp}", f"workload.ep={w.ep}"]
    others = [o for o in overrides if not o.lstrip("+~").startswith("workload")]
    return shlex.join(["python", "-m", "harness", "workload=trace", f"workload.path={path}", *held, *others])
