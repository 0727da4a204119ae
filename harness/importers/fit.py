"""A machine fitted from a profile: the host costs and device front-end gaps a trace measured, as the
values of a hardware preset (`python -m harness.profile TRACE --fit NAME`).

What a trace shows of its machine, and the preset key each becomes (every value with what it was
fitted from: how many calls, and their spread):

* `host.<stage>_us` for framework, infer_shape, tiling, alloc, launch, free: the host time of that
  stage per framework op that launched kernels (a card's op; per launch where the trace holds no
  framework ops, `cpu_op` events, to name each launch's), the trace's total over those ops. A PyTorch-profiler trace
  folds shape inference, allocation and freeing into the framework op (`framework_us` is then all of
  a kernel's host work before its launch call: the Python of an `nn.Module` forward included, unless
  the trace holds the module calls, below); torch_npu traces split them. A device memory allocation
  the runtime shows (cudaMalloc: the caching allocator growing its pool) is a one-off: where most
  launches have none (the median is 0; AlexNet's five cudaMalloc calls, 32.8 ms, came before 4 of its 40
  launches), `host.alloc_us` is that median, 0, and its comment gives the total, the calls it came
  from, and that it was left out as one-off.
* `host.module_us`: the own time of an nn.Module call (`with_modules=True`: the call's time outside the
  framework ops and module calls it holds), which `framework_us` then leaves out (the kernels=unfused
  op sequences pay it per module call); 0 where the trace holds none, their Python being in `framework_us`;
* `host.sync_us`: the host time of a synchronisation call, its wait for the device left out;
* `device.kernel_gap_us`: the device's front end between kernels launched one by one, from kernels
  queued before the previous one ended (`front_end_gaps_us`);
* `graph.task_dispatch_us`: the device gap between the tasks of one graph launch, when the trace
  replays graphs;
* `graph.exit_gap_us`: what a queued kernel launched on its own waits beyond `kernel_gap_us` when a
  graph's tasks ran before it on its stream (`front_end_gaps_us`: the eager attention between
  piecewise graphs); the whole gap where the trace has no kernel-to-kernel gap to take off.

Where the trace was recorded with shapes (`record_shapes=True`: each framework op's input sizes and
types), the kernels a framework op launched are priced by its shapes, and the device's preset values
follow from their measured times and the base preset's datasheet peaks (`device_fits`):

* `device.vector_fixed_us`: the median time of element-wise kernels on tiny tensors (256 KiB or less
  moved: 0.2 µs of memory traffic or less), the fixed cost of a small kernel in the device model;
* `device.matmul_efficiency`: the FLOPs of GEMMs that are compute-bound and hold every core in the
  harness's device model, over their time less `matmul_fixed_us`, as a fraction of the matmul peak;
* `device.hbm_efficiency`: the bytes of memory-bound GEMMs moving 8 MB or more (a decode step's weight
  reads), over their time less `matmul_fixed_us`, as a fraction of the HBM bandwidth. Element-wise ops
  do not set it: a forward's read what the op before wrote, much of it from the last-level cache (an
  MI300X's 256 MB Infinity Cache: the adds of `tl_qwen05b_mi300` move 5.6 TB/s, above its 5.3 TB/s HBM
  peak), where a step's weights, read once, come from HBM.

Each needs five ops or more. Peaks, links and graph capture costs stay the base preset's (a preset of the
same device, named in the file).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.config.schema import DeviceConfig
from harness.importers.events import CALL_ALLOC, CALL_LAUNCH, TASK_KERNEL, ProfileError
from harness.importers.steps import Imported
from harness.model.device import KIND_CUBE, block_dim, core_peak_flop_per_us
from harness.model.ops import HOST_COSTS

# Host stages of a kernel's launch, as the op list (ops.csv) holds them: <stage>_us per op.
LAUNCH_STAGES = HOST_COSTS[: HOST_COSTS.index("own")]
# Host stages whose time most launches do not pay is a one-off, not a cost of each op: device memory
# allocation (a caching allocator calls cudaMalloc only while its pool grows).
ONE_OFF_STAGES = ("alloc",)
# The hardware preset a device name belongs to (case-insensitive substrings, first match).
PRESET_OF_DEVICE = (("mi300", "mi300x"), ("a100", "a100"), ("h200", "h200"), ("h100", "h100"), ("b200", "b200"), ("ascend", "atlas_a2"), ("910b", "atlas_a2"))


@dataclass(frozen=True)
class Fitted:
    key: str  # the preset key (host.framework_us ...)
    value: float
    note: str  # what it was fitted from
    samples: int = 0  # measurements it is a mean or median of (0: not measured, such as host.speed)


# A value fitted from fewer measurements than this is said to rest on too few (the step p99's rule).
MIN_FIT_SAMPLES = 20
# The preset keys a trace's host costs go to, whatever device ran it: a graph's launch call is the host's.
HOST_COST_KEYS = ("host.", "graph.replay_launch_us")


def thin_fits(fitted: list[Fitted]) -> str:
    """A caveat naming the fitted values that rest on fewer than MIN_FIT_SAMPLES measurements ('' for none):
    a mean of 6 launches (one of them 9.4 ms of Python) predicted every op of another model at 3.2 ms."""
    thin = [f for f in fitted if 0 < f.samples < MIN_FIT_SAMPLES]
    if not thin:
        return ""
    named = ", ".join(f"{f.key} ({f.samples})" for f in thin)
    return (f"{len(thin)} fitted value{'s rest' if len(thin) > 1 else ' rests'} on fewer than {MIN_FIT_SAMPLES} measurements: {named};"
            " a prediction from them is as uncertain as their spread (each value's comment): record more steps")


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


def front_end_gaps_us(imported: Imported) -> tuple[np.ndarray, np.ndarray]:
    """Device-side gaps between a kernel launched on its own and the task before it on its stream, over
    the pairs where it was launched before that one ended (queued: the gap is the device front end's,
    not the host's), in one pass: those behind a task that was not a graph's (`kernel_gap_us`), and those
    right after a graph's tasks (leaving a graph: `kernel_gap_us` plus the graph's `exit_gap_us`)."""
    gaps, after_graph = [], []
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
                after_graph.append(bool(previous["in_graph"]))
    gaps_us, after = np.array(gaps, dtype=np.float64), np.array(after_graph, dtype=bool)
    return gaps_us[~after], gaps_us[after]


def kernel_and_exit_gap_us(eager_gaps: np.ndarray, exit_gaps: np.ndarray) -> tuple[float, float]:
    """`device.kernel_gap_us` and `graph.exit_gap_us` from front_end_gaps_us' two sets: the mean gap
    behind a kernel, and what leaving a graph adds to it (the whole gap after a graph where no kernel
    queued behind another was measured); 0 where nothing was measured."""
    kernel_gap_us = float(eager_gaps.mean()) if eager_gaps.size else 0.0
    exit_gap_us = max(0.0, float(exit_gaps.mean()) - kernel_gap_us) if exit_gaps.size else 0.0
    return kernel_gap_us, exit_gap_us


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


def module_own_us(imported: Imported) -> np.ndarray:
    """Own time (µs) of the nn.Module calls that began in the replayed steps on their issuing threads (a
    trace recorded `with_modules`; empty otherwise)."""
    calls = imported.profile.module_calls
    if calls is None:
        return np.zeros(0)
    threads = set(imported.profile.issuing_threads)
    chosen = np.zeros(len(calls), dtype=bool)
    for i in imported.kept:
        window = imported.found[i].window
        chosen |= (calls["start_us"] >= window.start_us).to_numpy() & (calls["start_us"] < window.end_us).to_numpy()
    chosen &= calls["thread"].isin(threads).to_numpy()
    return calls["own_us"].to_numpy()[chosen]


def repeat_launches(imported: Imported) -> int:
    """Kernel launches of the replayed steps made by a framework op that had launched one already
    (cuBLAS's split-K GEMM and its reduction kernel, cuDNN attention's two kernels), counted over launches
    whose kernel the trace holds; 0 where the trace names no launch's op (no `cpu_op` events)."""
    if not imported.kept:
        return 0
    calls = pd.concat([imported.found[i].calls for i in imported.kept], ignore_index=True)
    tasks = imported.profile.tasks
    kernels = tasks.loc[tasks["kind"] == TASK_KERNEL, "key"]
    named = calls[(calls["kind"] == CALL_LAUNCH) & (calls["op_id"] >= 0) & calls["key"].isin(kernels)]
    return int(len(named) - named["op_id"].nunique())


def allocation_calls(imported: Imported) -> int:
    """The device memory allocation calls (cudaMalloc, aclrtMalloc...) of the replayed steps."""
    return int(sum((imported.found[i].calls["kind"] == CALL_ALLOC).sum() for i in imported.kept))


def fit_machine(
    ops: pd.DataFrame, steps: int, sync_host_ms: float, eager_gaps: np.ndarray, graph_gaps: np.ndarray, module_us: np.ndarray | None = None,
    exit_gaps: np.ndarray | None = None, repeats: int = 0, alloc_calls: int | None = None,
) -> list[Fitted]:
    """The fitted values from the replayed steps (`ops`: their op list, ops.csv's rows, `steps` of them),
    the host time of their synchronisation calls per step (measured without their wait for the device),
    the device gaps measured between them (front_end_gaps_us, graph_task_gaps_us) and the own time of
    their nn.Module calls (module_own_us): that part of the host time before launches becomes
    `host.module_us` a call, and is left out of `host.framework_us`. The host stages are per framework op
    that launched (`repeats`: the launches of an op beyond its first, repeat_launches), as a card's op is
    a framework op and one launch in the model: an op's extra launches are part of its cost. A graph's
    launch (one call for many tasks, and the host work before it) is no op's: it is fitted as
    `graph.replay_launch_us` (counted as a launch, a graph-only trace's 882 µs cudaGraphLaunch became
    every eager kernel's launch cost); a trace of graph launches alone fits no per-op host stage. A stage
    of ONE_OFF_STAGES that most launches do not pay is fitted as its median, 0, and commented with its total
    and `alloc_calls` (allocation_calls: the calls it came from) as left out."""
    graph_launch = (ops["launch_us"].fillna(0) > 0) & ops["in_graph"].fillna(0).astype(bool)
    graph_rows, per_op = ops[graph_launch], ops[~graph_launch]
    launched = per_op[per_op["launch_us"].fillna(0) > 0]
    fitted = []
    if not graph_rows.empty:
        note = f"host time of {len(graph_rows)} graph launch calls, {len(graph_rows) / steps:.3g} a step; {_spread(graph_rows['launch_us'].to_numpy())}"
        fitted.append(Fitted("graph.replay_launch_us", float(graph_rows["launch_us"].mean()), note, len(graph_rows)))
    if launched.empty and graph_rows.empty:
        return []
    repeats = repeats if repeats < len(launched) else 0  # counted from other rows than these: never all of them
    n = len(launched) - repeats
    module_us = np.zeros(0) if module_us is None else module_us
    for stage in LAUNCH_STAGES if n > 0 else ():
        column = per_op[f"{stage}_us"].fillna(0.0)
        total_us = float(column.sum())
        note = f"{total_us / 1e3 / steps:.4g} ms a step over {n / steps:.0f} " + (
            f"framework ops a step ({len(launched) / steps:.0f} launches)" if repeats else "launches a step"
        )
        if stage == "framework" and module_us.size:
            note += f", less {module_us.sum() / 1e3 / steps:.4g} ms of nn.Module calls' own Python (host.module_us)"
            total_us = max(0.0, total_us - float(module_us.sum()))
        value = total_us / n
        per_launch = launched[f"{stage}_us"].fillna(0.0).to_numpy()
        if stage in ONE_OFF_STAGES and total_us > 0 and np.median(per_launch) == 0:
            # A mean would charge every op a share of a few calls' time (AlexNet: 32.8 ms of cudaMalloc over 27
            # ops, 1215 us an op): in a prediction of other models and batch sizes it is no op's cost.
            calls = f"{alloc_calls} call{'s' if alloc_calls != 1 else ''}" if alloc_calls else "its calls"
            note = (f"{total_us / 1e3 / steps:.4g} ms a step in {calls} before {int((per_launch > 0).sum())} of {len(per_launch)} launches,"
                    " left out as one-off: most launches have none (the median)")
            value = float(np.median(per_launch))
        if total_us > 0:
            included = ", module calls' Python included" if stage == "framework" and module_us.size else ""
            note += f"; per launch{included} {_spread(per_launch)}"
        fitted.append(Fitted(f"host.{stage}_us", value, note, len(per_launch) if total_us > 0 else 0))
    if n > 0 and module_us.size:
        note = f"own time of {module_us.size / steps:.0f} nn.Module calls a step (outside the ops and modules they hold); {_spread(module_us)}"
        fitted.append(Fitted("host.module_us", float(module_us.mean()), note, module_us.size))
    elif n > 0:  # not the base preset's: this trace's framework_us holds whatever module Python there was
        fitted.append(Fitted("host.module_us", 0.0, "the trace holds no nn.Module calls (with_modules): their Python is in framework_us"))
    if n > 0:
        fitted.append(Fitted("host.speed", 1.0, "the costs above are this host's own (the base preset's speed does not apply)"))
    syncs = int((ops["kind"] == "sync").sum())
    if syncs:
        fitted.append(Fitted("host.sync_us", sync_host_ms * 1e3 * steps / syncs, f"{syncs} synchronisation calls, their wait for the device left out", syncs))
    if eager_gaps.size:
        note = f"mean device gap before {eager_gaps.size} kernels launched alone and queued behind the one before; {_spread(eager_gaps)}"
        fitted.append(Fitted("device.kernel_gap_us", float(eager_gaps.mean()), note, eager_gaps.size))
    if graph_gaps.size:
        note = f"mean device gap between consecutive tasks of a graph launch, {graph_gaps.size} pairs; {_spread(graph_gaps)}"
        fitted.append(Fitted("graph.task_dispatch_us", float(graph_gaps.mean()), note, graph_gaps.size))
    if exit_gaps is not None and exit_gaps.size:
        note = f"mean device gap before {exit_gaps.size} kernels launched alone right after a graph's tasks, {exit_gaps.mean():.3g} us ({_spread(exit_gaps)})"
        if eager_gaps.size:
            note += ", less kernel_gap_us"
        else:  # the base's kernel gap would be paid on top: at most that much too long, not silently the base's exit
            note += "; the whole gap: the trace has no kernel queued behind another launched alone"
        fitted.append(Fitted("graph.exit_gap_us", kernel_and_exit_gap_us(eager_gaps, exit_gaps)[1], note, exit_gaps.size))
    return fitted


def without_profiler(
    fitted: list[Fitted], ops: pd.DataFrame, steps: int, traced_step_ms: float, unprofiled_step_ms: float, bound: str = "host",
) -> tuple[list[Fitted], float]:
    """The fitted host costs with the profiler's own work taken off, and the factor they were scaled by.

    A profiler adds host work to every op it records (for PyTorch's, with CUDA activity and shapes: about
    12 µs a launch on the host of tests/data/traces/h200_*, docs/validation.md). Where the traced steps
    are host-bound, the step measured without the profiler (same program, same inputs) says how much: the
    traced step less that one. It is taken off the host's work before its launches (`ops`' host stages,
    `steps` steps), each stage and the module calls scaled alike (how the profiler's work splits between
    them is not measured). Refused (ProfileError) where the steps are not host-bound (`bound`, the
    measured verdict) or the two steps cannot both be this program's."""
    if bound != "host":
        raise ProfileError(f"--unprofiled-step-ms {unprofiled_step_ms:.12g}: the traced steps are {bound}-bound, so their time does not"
                           " show the profiler's host work; fit without it")
    host_ms = float(ops[[f"{stage}_us" for stage in LAUNCH_STAGES]].fillna(0.0).to_numpy().sum()) / 1e3 / steps
    profiler_ms = traced_step_ms - unprofiled_step_ms
    if profiler_ms <= 0:
        raise ProfileError(f"--unprofiled-step-ms {unprofiled_step_ms:.12g}: not below the traced step ({traced_step_ms:.4g} ms): nothing to take off")
    if profiler_ms >= host_ms:
        raise ProfileError(
            f"--unprofiled-step-ms {unprofiled_step_ms:.12g}: {profiler_ms:.4g} ms less than the traced step, more than the host's whole work"
            f" before its launches ({host_ms:.4g} ms a step): not the same program, or not host-bound"
        )
    factor = 1.0 - profiler_ms / host_ms
    scaled_keys = {f"host.{stage}_us" for stage in LAUNCH_STAGES} | {"host.module_us"}
    note = f"; x {factor:.3g} for the profiler's own work (step {traced_step_ms:.4g} ms traced, {unprofiled_step_ms:.12g} without the profiler)"
    return [
        dataclasses.replace(f, value=f.value * factor, note=f.note + note) if f.key in scaled_keys and f.value > 0 else f for f in fitted
    ], factor


def preset_yaml(name: str, base: str, fitted: list[Fitted], origin: str, caveats: list[str] | tuple[str, ...] = ()) -> str:
    """The hardware preset: the base preset's values, the fitted ones over them, each commented (`caveats`:
    what the reader of the values should know first, e.g. the profiler options the trace was recorded with)."""
    lines = [
        f"# Fitted by `python -m harness.profile {origin} --fit {name}` (harness/importers/fit.py).",
        f"# The values below are the trace's; everything else is conf/hardware/{base}.yaml's (device peaks, links,",
        "# graph capture, and the device efficiencies the trace's shapes did not show), as the trace does not show them.",
        *(f"# Note: {caveat}." for caveat in caveats),
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


# Bytes per element of the profiler's "Input type" names; a scalar or an unknown type moves nothing.
DTYPE_BYTES = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
# The dtypes whose GEMMs a preset's matmul peak (cube_tflops: BF16 / FP16) prices.
MATMUL_DTYPES = ("c10::BFloat16", "c10::Half")
# GEMMs: where their two operands are among the op's inputs (addmm's first input is the bias).
MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
# Element-wise ops: one output the size of their largest input (copy_ writes its first input).
POINTWISE_OPS = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::neg", "aten::silu", "aten::silu_", "aten::rsqrt", "aten::pow", "aten::sigmoid", "aten::exp", "aten::tanh",
    "aten::gelu", "aten::relu", "aten::relu_", "aten::fill_", "aten::zero_", "aten::copy_",
})
TINY_BYTES = 256 * 1024  # element-wise ops this small show the kernel floor (≤ 0.2 µs of HBM traffic on any preset)
LARGE_BYTES = 8e6  # memory-bound GEMMs this large show the HBM bandwidth (traffic ≫ the floor)
MIN_OPS = 5  # fewer ops than this fit nothing
BYTES_PER_US_PER_GBPS = 1e3  # 1 GB/s = 1e3 bytes/µs
FLOP_PER_US_PER_TFLOPS = 1e6


def shaped_ops(imported: Imported) -> pd.DataFrame:
    """The framework ops of the replayed steps that launched kernels, with their recorded shapes and the
    device time of those kernels: columns name, dims, types, device_us, kernels. Empty when the trace has
    no shapes."""
    profile = imported.profile
    columns = ["name", "dims", "types", "device_us", "kernels"]
    if profile.framework_ops is None or profile.framework_ops.empty:
        return pd.DataFrame(columns=columns)
    calls = pd.concat([imported.found[i].calls for i in imported.kept], ignore_index=True) if imported.kept else profile.calls.iloc[:0]
    launches = calls[(calls["kind"] == CALL_LAUNCH) & (calls["op_id"] >= 0) & (calls["key"] >= 0)]
    kernels = profile.tasks[profile.tasks["kind"] == TASK_KERNEL]
    timed = launches.merge(kernels.assign(device_us=kernels["end_us"] - kernels["start_us"])[["key", "device_us"]], on="key")
    if timed.empty:
        return pd.DataFrame(columns=columns)
    per_op = timed.groupby("op_id").agg(device_us=("device_us", "sum"), kernels=("device_us", "size"))
    ops = profile.framework_ops.loc[per_op.index]
    return pd.DataFrame({"name": ops["name"].to_numpy(), "dims": ops["dims"].to_numpy(), "types": ops["types"].to_numpy(),
                         "device_us": per_op["device_us"].to_numpy(), "kernels": per_op["kernels"].to_numpy()})


def _tensors(dims: list, types: list) -> list[tuple[int, int]]:
    """(elements, bytes per element) of each tensor input (sizes a list of whole numbers, type known)."""
    found = []
    for size, dtype in zip(dims, types):
        if isinstance(size, list) and size and all(type(d) is int and d >= 0 for d in size) and dtype in DTYPE_BYTES:
            found.append((int(np.prod(size, dtype=np.float64)), DTYPE_BYTES[dtype]))
    return found


def matmul_work(name: str, dims: list, types: list) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a 16-bit GEMM from its operands' shapes (the bytes: both operands, the output and
    addmm's / baddbmm's added input), None when they are not a (batched) GEMM's or not BF16 / FP16, the
    matmul peak a preset holds."""
    a_at, b_at = MATMUL_OPERANDS[name]
    if len(dims) <= b_at or len(types) <= b_at or types[a_at] not in MATMUL_DTYPES or types[b_at] not in MATMUL_DTYPES:
        return None
    a, b = dims[a_at], dims[b_at]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and len(a) in (2, 3)):
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k = a[-2], a[-1]
    k2, n = b[-2], b[-1]
    if k != k2 or (len(a) == 3 and b[0] != batch):
        return None
    size = DTYPE_BYTES[types[a_at]]
    added = sum(count * width for count, width in _tensors(dims[:a_at], types[:a_at]))  # the bias / input of addmm, baddbmm
    return 2.0 * batch * m * n * k, float(size * batch * (m * k + k * n + m * n) + added)


def pointwise_bytes(name: str, dims: list, types: list) -> float | None:
    """Bytes an element-wise op moves: its tensor inputs read, one output the size of the largest written
    (copy_ and fill_ write their first input and read the rest)."""
    tensors = _tensors(dims, types)
    if not tensors:
        return None
    if name in ("aten::copy_", "aten::fill_", "aten::zero_"):
        return float(sum(n * b for n, b in tensors))
    return float(sum(n * b for n, b in tensors) + max(n * b for n, b in tensors))


def _ratio_spread(values: np.ndarray) -> str:
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"per op p10 {p10:.3g}, p50 {p50:.3g}, p90 {p90:.3g}"


def device_fits(shaped: pd.DataFrame, base: DeviceConfig) -> list[Fitted]:
    """The device values the shaped ops' measured times give, against the base preset's peaks."""
    fitted: list[Fitted] = []
    one_kernel = shaped[shaped["kernels"] == 1]
    pointwise = [(pointwise_bytes(r.name, r.dims, r.types), r.device_us, r.name) for r in one_kernel.itertuples() if r.name in POINTWISE_OPS]
    pointwise = [(b, us, name) for b, us, name in pointwise if b is not None and us > 0]
    floor_us = base.vector_fixed_us
    tiny = np.array([us for b, us, _ in pointwise if b <= TINY_BYTES])
    if tiny.size >= MIN_OPS:
        floor_us = float(np.median(tiny))
        names = ", ".join(sorted({name.removeprefix("aten::") for b, _, name in pointwise if b <= TINY_BYTES}))
        fitted.append(Fitted("device.vector_fixed_us", floor_us, f"median time of {tiny.size} element-wise kernels moving 256 KiB or less ({names}); {_spread(tiny)}", tiny.size))
    gemms = [(matmul_work(r.name, r.dims, r.types), r.device_us) for r in shaped.itertuples() if r.name in MATMUL_OPERANDS]
    gemms = [(w[0], w[1], us) for w, us in gemms if w is not None and us > base.matmul_fixed_us]
    if gemms:
        flops = np.array([g[0] for g in gemms])
        moved = np.array([g[1] for g in gemms])
        busy_us = np.array([g[2] for g in gemms]) - base.matmul_fixed_us
        kind = np.full(flops.shape, KIND_CUBE)
        peak = float(core_peak_flop_per_us(kind[:1], base)[0]) * base.ai_cores  # every core of this device
        bandwidth = base.hbm_gbps * BYTES_PER_US_PER_GBPS
        cores = block_dim(flops, kind, base)
        # Which bound the device model puts each GEMM under at the base preset's rates (model/device.py).
        compute_us = flops / (core_peak_flop_per_us(kind, base) * cores * base.matmul_efficiency)
        memory_us = moved / (bandwidth * base.hbm_efficiency)
        chosen = (compute_us > memory_us) & (cores >= base.ai_cores)  # what matmul_efficiency prices
        if chosen.sum() >= MIN_OPS:
            value = float(flops[chosen].sum() / busy_us[chosen].sum() / peak)
            note = (f"{int(chosen.sum())} compute-bound GEMMs on all cores: {flops[chosen].sum() / 1e12:.3g} TFLOP in {busy_us[chosen].sum() / 1e3:.3g} ms,"
                    f" {value * base.cube_tflops:.4g} of {base.cube_tflops:.5g} TFLOPS; {_ratio_spread(flops[chosen] / busy_us[chosen] / peak)}")
            fitted.append(Fitted("device.matmul_efficiency", min(value, 1.0), note, int(chosen.sum())))
        # Memory-bound GEMMs that large read their weights from HBM (a decode step's GEMVs): what hbm_efficiency prices.
        reads = (memory_us > compute_us) & (moved >= LARGE_BYTES)
        if reads.sum() >= MIN_OPS:
            value = float(moved[reads].sum() / busy_us[reads].sum() / bandwidth)
            note = (f"{int(reads.sum())} memory-bound GEMMs of 8 MB or more: {moved[reads].sum() / 1e9:.3g} GB in {busy_us[reads].sum() / 1e3:.3g} ms,"
                    f" {value * base.hbm_gbps / 1e3:.3g} of {base.hbm_gbps / 1e3:.3g} TB/s; {_ratio_spread(moved[reads] / busy_us[reads] / bandwidth)}")
            fitted.append(Fitted("device.hbm_efficiency", min(value, 1.0), note, int(reads.sum())))
    return fitted
