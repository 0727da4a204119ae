"""A machine fitted from a profile: the host costs and device front-end gaps a trace measured, as the
values of a hardware preset (`python -m harness.profile TRACE --fit NAME`).

What a trace shows of its machine, and the preset key each becomes (every value with what it was
fitted from: how many calls, and their spread):

* `host.<stage>_us` for framework, infer_shape, tiling, alloc, launch, free: the host time of that
  stage per launched kernel, the trace's total over the launches it holds. A PyTorch-profiler trace
  folds shape inference, allocation and freeing into the framework op (`framework_us` is then all of
  a kernel's host work before its launch call: the Python of an `nn.Module` forward included);
  torch_npu traces split them.
* `host.sync_us`: the host time of a synchronisation call, its wait for the device left out;
* `device.kernel_gap_us`: the device's front end between kernels launched one by one, from kernels
  queued before the previous one ended (`eager_kernel_gaps_us`);
* `graph.task_dispatch_us`: the device gap between the tasks of one graph launch, when the trace
  replays graphs.

Device peaks and efficiencies, links and graph capture costs are not in a trace without shapes: they
stay the base preset's (a preset of the same device, named in the file).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.importers.steps import Imported
from harness.model.ops import HOST_COSTS

# Host stages of a kernel's launch, as the op list (ops.csv) holds them: <stage>_us per op.
LAUNCH_STAGES = HOST_COSTS[: HOST_COSTS.index("own")]
# The hardware preset a device name belongs to (case-insensitive substrings, first match).
PRESET_OF_DEVICE = (("mi300", "mi300x"), ("a100", "a100"), ("h200", "h200"), ("h100", "h100"), ("b200", "b200"), ("ascend", "atlas_a2"), ("910b", "atlas_a2"))


@dataclass(frozen=True)
class Fitted:
    key: str  # the preset key (host.framework_us ...)
    value: float
    note: str  # what it was fitted from


def graph_task_gaps_us(imported: Imported) -> np.ndarray:
    """Device-side gaps between consecutive tasks of a graph launch (the per-task dispatch a replay
    adds to graph tasks), over the replayed steps; empty when no step launched a graph."""
    gaps = []
    for i in imported.kept:
        ops = imported.found[i].ops
        for leader in {op["group"] for op in ops if op["in_graph"] and op["group"] >= 0}:
            members = sorted((op["start_us"], op["end_us"]) for op in ops if op["group"] == leader)
            gaps += [max(0.0, b[0] - a[1]) for a, b in zip(members, members[1:])]
    return np.array(gaps, dtype=np.float64)


def eager_kernel_gaps_us(imported: Imported) -> np.ndarray:
    """Device-side gaps between a kernel launched on its own and the one before it on its stream, over
    the pairs where it was launched before that one ended (queued: the gap is the device front end's,
    not the host's)."""
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
    return np.array(gaps, dtype=np.float64)


def base_preset(device_name: str, source_default: str) -> tuple[str, bool]:
    """The shipped preset of the trace's device, and whether the name said so (else the source's default)."""
    lowered = device_name.lower()
    for part, preset in PRESET_OF_DEVICE:
        if part in lowered:
            return preset, True
    return source_default, False


def _spread(values: np.ndarray) -> str:
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"p10 {p10:.3g}, p50 {p50:.3g}, p90 {p90:.3g} us"


def fit_machine(ops: pd.DataFrame, steps: int, sync_host_ms: float, eager_gaps: np.ndarray, graph_gaps: np.ndarray) -> list[Fitted]:
    """The fitted values from the replayed steps (`ops`: their op list, ops.csv's rows, `steps` of them),
    the host time of their synchronisation calls per step (measured without their wait for the device),
    and the device gaps measured between them (eager_kernel_gaps_us, graph_task_gaps_us)."""
    launched = ops[ops["launch_us"].fillna(0) > 0]
    if launched.empty:
        return []
    n = len(launched)
    fitted = []
    for stage in LAUNCH_STAGES:
        column = ops[f"{stage}_us"].fillna(0.0)
        total_us = float(column.sum())
        value = total_us / n
        note = f"{total_us / 1e3 / steps:.4g} ms a step over {n / steps:.0f} launches a step"
        if total_us > 0:
            note += f"; per launch {_spread(launched[f'{stage}_us'].fillna(0.0).to_numpy())}"
        fitted.append(Fitted(f"host.{stage}_us", value, note))
    fitted.append(Fitted("host.speed", 1.0, "the costs above are this host's own (the base preset's speed does not apply)"))
    syncs = int((ops["kind"] == "sync").sum())
    if syncs:
        fitted.append(Fitted("host.sync_us", sync_host_ms * 1e3 * steps / syncs, f"{syncs} synchronisation calls, their wait for the device left out"))
    if eager_gaps.size:
        note = f"mean device gap before {eager_gaps.size} kernels launched alone and queued behind the one before; {_spread(eager_gaps)}"
        fitted.append(Fitted("device.kernel_gap_us", float(eager_gaps.mean()), note))
    if graph_gaps.size:
        note = f"mean device gap between consecutive tasks of a graph launch, {graph_gaps.size} pairs; {_spread(graph_gaps)}"
        fitted.append(Fitted("graph.task_dispatch_us", float(graph_gaps.mean()), note))
    return fitted


def preset_yaml(name: str, base: str, fitted: list[Fitted], origin: str) -> str:
    """The hardware preset: the base preset's values, the fitted ones over them, each commented."""
    lines = [
        f"# Fitted by `python -m harness.profile {origin} --fit {name}` (harness/importers/fit.py).",
        f"# The host costs and device gaps below are the trace's; everything else is conf/hardware/{base}.yaml's",
        "# (device peaks and efficiencies, links, graph capture), as the trace does not show them.",
        "defaults:",
        f"  - {base}",
        "  - _self_",
        "",
        f"name: {name}",
    ]
    for section in ("host", "device", "graph"):
        mine = [f for f in fitted if f.key.startswith(section + ".")]
        if mine:
            lines.append(f"{section}:")
            lines += [f"  {f.key.split('.', 1)[1]}: {f.value:.6g}  # {f.note}" for f in mine]
    return "\n".join(lines) + "\n"
