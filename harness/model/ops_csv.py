"""Op lists as CSV: read a trace workload (`workload=trace workload.path=ops.csv`), write one from a preset.

Columns (one row per op, in issue order; header names as below):

| column | required | meaning |
|---|---|---|
| `name` | yes | op name |
| `kind` | yes | `cube`, `vector`, `comm`, `copy` (memcpy/memset on a stream), `host` (front-end work with no kernel) or `sync` (the host waits for the ops in `after`) |
| `host_us` | no | host time of a `host` op; of a `sync` op, its own time after the wait |
| `weight_bytes` | no | resident weights the op reads (the rest of `bytes` is activations) |
| `cache_bytes` | no | resident KV cache the op reads in this step (decode attention): not activations either |
| `step_weight_bytes` | no | weights the op reads in this step where fewer than `weight_bytes` (a routed expert matmul reads only the experts hit; empty: `weight_bytes`) |
| `expert_groups` | no | experts a grouped matmul multiplies in this step, each with the device's per-group cost (`hardware.device.grouped_matmul_group_us`; empty: none) |
| `device_us` | no | device time in µs; overrides the cost model when given |
| `flops`, `bytes` | no | work and bytes moved (cost model, AI-core block rule) |
| `shape_key` | no | integer that changes when the op's shapes change |
| `dynamic`, `value_dependent`, `compute_dependent`, `cpu_eligible`, `routed` | no | flags: 1/0, true/false (`routed`: shapes follow MoE routing; static, not refreshed, inside graphs) |
| `stream` | no | device stream: 0 compute, 1 communication, 2..15 more streams (default: by kind) |
| `after` | no | earlier ops (0-based indices within the step, space separated) it waits for; empty: the previous op; `-`: none |
| `framework_us`, `infer_shape_us`, `tiling_us`, `alloc_us`, `launch_us`, `free_us` | no | measured host stage costs of the op in this step (empty: the hardware preset's); with any of them the file describes whole measured steps: its own copies and syncs, no token copies or end-of-step sync added |
| `group` | no | index of the op whose host call also issued this one (a graph launch and its kernels): no host work of its own; the leader launches a kernel (not `host` or `sync`), and if it is carried in, so is its group (the reader marks it) |
| `in_graph`, `carried_in` | no | flags: ran inside a captured graph (device-side dispatch per task); launched before the step (device work only) |
| `int8` | no | flag: an INT8 (W8A8) matmul, priced at the device's INT8 peak |
| `not_before_us` | no | the op's stream was busy with work the file does not hold until this long after the step started |
| `kernel`, `trace_stream` | no | the profiled kernel's full name and stream (for reading; not simulated) |
| `comm`, `ranks` | no | collective (`all_reduce`, `all_gather`, `all_to_all`) and group size, to price a comm op without `device_us` |
| `rank_stride`, `devices` | no | where a collective's ranks sit: members `rank_stride` apart (1: consecutive; a DP group: tp apart) among the deployment's `devices` (one value for the file, empty cells saying nothing; 0 or absent: not known, every alignment with the nodes, the worst counting) |
| `step`, `batch`, `tokens`, `kv_len` | no | with `step`, rows are per step (every step lists the same ops) and may carry that step's sizes |

A bad file stops the run with one line naming the row (the CSV line number) and the column. Numbers have
the same finite ranges as the config's keys (`COLUMN_LIMITS`, listed in docs/reliability.md); a file may have
up to 5,000,000 rows and 2 GB, and its ops × steps must fit in memory like a preset's run.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from harness.config.limits import LIMITS, MAX_STREAMS, Limit
from harness.config.messages import one_line
from harness.config.schema import OpKind, WorkloadConfig
from harness.base.errors import ConfigError
from harness.base.files import atomic_write
from harness.base.progress import Progress
from harness.model.ops import (
    COMM_ALL_GATHER,
    COMM_ALL_REDUCE,
    COMM_ALL_TO_ALL,
    COMM_NONE,
    FLAG_CARRIED_IN,
    FLAG_COMPUTE_DEPENDENT,
    FLAG_CPU_ELIGIBLE,
    FLAG_DYNAMIC,
    FLAG_IN_GRAPH,
    FLAG_INT8,
    FLAG_ROUTED,
    FLAG_VALUE_DEPENDENT,
    HOST_COSTS,
    HOST_ONLY_KINDS,
    KIND_CODE,
    Workload,
    from_op_arrays,
)

KIND_NAMES = {code: kind.value for kind, code in KIND_CODE.items()}
COMM_NAMES = {COMM_NONE: "", COMM_ALL_REDUCE: "all_reduce", COMM_ALL_GATHER: "all_gather", COMM_ALL_TO_ALL: "all_to_all"}
COMM_CODES = {name: code for code, name in COMM_NAMES.items() if name}
FLAG_COLUMNS = {
    "dynamic": FLAG_DYNAMIC,
    "value_dependent": FLAG_VALUE_DEPENDENT,
    "compute_dependent": FLAG_COMPUTE_DEPENDENT,
    "cpu_eligible": FLAG_CPU_ELIGIBLE,
    "routed": FLAG_ROUTED,
    "in_graph": FLAG_IN_GRAPH,
    "carried_in": FLAG_CARRIED_IN,
    "int8": FLAG_INT8,
}
COST_COLUMNS = tuple(f"{stage}_us" for stage in HOST_COSTS[:-1])  # measured host stages
NUMBER_COLUMNS = ("device_us", "host_us", "weight_bytes", "step_weight_bytes", "expert_groups", "cache_bytes", "flops", "bytes", "not_before_us", *COST_COLUMNS)
NO_DEPENDENCY = "-"
MAX_STEPS = 1_000_000
MAX_ROWS = 5_000_000  # rows of one file; the run's memory is then checked like a preset's (ops/step × steps)
MAX_FILE_BYTES = 2e9  # refused before reading (pandas holds several times a file's size while parsing)
US_LIMIT = LIMITS["workload.ops[].device_us"]
# The same ranges as the config's keys: a trace is input like any other.
COLUMN_LIMITS = {
    "device_us": US_LIMIT, "host_us": LIMITS["workload.ops[].host_us"], **{c: US_LIMIT for c in COST_COLUMNS},
    "flops": LIMITS["workload.ops[].flops"], "bytes": LIMITS["workload.ops[].bytes"], "weight_bytes": LIMITS["workload.ops[].bytes"], "step_weight_bytes": LIMITS["workload.ops[].bytes"], "cache_bytes": LIMITS["workload.ops[].bytes"],
    "expert_groups": Limit(0, 1 << 20, "experts"),
    "not_before_us": Limit(0, 1e9, "µs"),
    "stream": Limit(0, MAX_STREAMS - 1, "(0 compute, 1 communication)"),
    "ranks": LIMITS["workload.tp"], "rank_stride": LIMITS["workload.tp"], "devices": Limit(0, LIMITS["workload.tp"].high * LIMITS["workload.dp"].high, "devices (tp × dp)"),
    "step": Limit(0, MAX_STEPS - 1), "group": Limit(0, MAX_ROWS - 1),
    "batch": LIMITS["workload.batch_size"], "tokens": Limit(1, 1 << 30, "tokens"), "kv_len": Limit(0, LIMITS["workload.context_len"].high, "tokens"),
}
INT_COLUMNS = ("stream", "ranks", "rank_stride", "devices", "step", "batch", "tokens", "kv_len", "group")
INFO_COLUMNS = ("kernel", "trace_stream")  # for reading the file; not simulated
KNOWN_COLUMNS = {"name", "kind", "after", "comm", "shape_key", *NUMBER_COLUMNS, *INT_COLUMNS, *FLAG_COLUMNS, *INFO_COLUMNS}
TRUE, FALSE = {"1", "true", "yes"}, {"0", "false", "no", ""}

# The columns of an op list imported from a profile (harness/importers/steps.py: ops_table), in order:
# measured costs per op, the trace's own kernel and stream for reading the file (not simulated).
IMPORTED_OP_COLUMNS = [
    "step", "name", "kind", "stream", "device_us", "after", "group", "in_graph", "carried_in", "not_before_us",
    "framework_us", "infer_shape_us", "tiling_us", "alloc_us", "launch_us", "free_us", "host_us", "kernel", "trace_stream",
]


def _first_bad(broken: np.ndarray, error) -> None:
    """Raise error(i) for the first row where `broken` holds."""
    if broken.any():
        raise error(int(np.flatnonzero(broken)[0]))


def _check_placement(numbers: dict, first: np.ndarray, workload: Workload, bad) -> None:
    """The deployment's `devices`: one value for the whole file, and tiled whole by every collective's
    groups (ranks x rank_stride devices a block); a group cut off at the end would be priced as crossing
    nodes it does not cross."""
    values = numbers["devices"]
    given = ~np.isnan(values)  # empty cells say nothing; the rows that give it must agree
    known = int(values[given][0]) if given.any() else 0
    _first_bad(given & (values != known), lambda i: bad(i, "devices", str(int(values[i])), f"differs from the {known} of the rows before it: one deployment a file"))
    workload.devices = known
    if known > 0:
        block = np.maximum(workload.comm_ranks, 1) * np.maximum(workload.comm_stride, 1)
        uneven = (workload.comm_ranks > 1) & (known % block != 0)
        _first_bad(uneven, lambda j: bad(int(first[j]), "devices", str(known),
                                         f"cannot hold whole groups of {workload.comm_ranks[j]} ranks {workload.comm_stride[j]} apart ({block[j]} devices a group)"))


def write_ops_csv(workload: Workload, path: Path, device_us: np.ndarray | None = None) -> None:
    """One row per (step, op), with the step's sizes: reading it back reproduces the workload."""
    import pandas as pd  # not on a preset run's path: ~0.25 s to import

    steps, n = workload.flops.shape
    frame = pd.DataFrame(
        {
            "step": np.repeat(np.arange(steps), n),
            "name": np.tile(np.array(workload.op_names, dtype=object), steps),
            "kind": np.tile(np.array([KIND_NAMES[int(k)] for k in workload.kind], dtype=object), steps),
            "stream": np.tile(workload.stream, steps),
            "device_us": (device_us if device_us is not None else workload.device_us).ravel(),
            "host_us": np.tile(workload.host_us, steps),
            "weight_bytes": np.tile(workload.weight_bytes, steps),
            "cache_bytes": workload.cache_bytes.ravel(),
            "flops": workload.flops.ravel(),
            "bytes": workload.bytes.ravel(),
            "shape_key": workload.shape_key.ravel(),
            "after": np.tile(np.array([" ".join(map(str, a)) if a else NO_DEPENDENCY for a in workload.after], dtype=object), steps),
            "comm": np.tile(np.array([COMM_NAMES[int(c)] for c in workload.comm], dtype=object), steps),
            "ranks": np.tile(workload.comm_ranks, steps),
            "rank_stride": np.tile(workload.comm_stride, steps),
            "devices": np.full(steps * n, workload.devices),
            "batch": np.repeat(workload.batch, n),
            "tokens": np.repeat(workload.tokens, n),
            "kv_len": np.repeat(workload.kv_len, n),
        }
    )
    if workload.step_weight_bytes is not None:
        frame.insert(frame.columns.get_loc("weight_bytes") + 1, "step_weight_bytes", workload.step_weight_bytes.ravel())
    if workload.expert_groups is not None:
        frame.insert(frame.columns.get_loc("device_us"), "expert_groups", workload.expert_groups.ravel())
    for column, bit in FLAG_COLUMNS.items():
        frame[column] = np.tile((workload.flags & bit) > 0, steps).astype(int)
    atomic_write(Path(path), lambda tmp: frame.to_csv(tmp, index=False, float_format="%.17g"))


def read_ops_csv(path: str | Path, cfg: WorkloadConfig) -> Workload:
    """Read and check an op-list CSV; see the module docstring for the columns."""
    import pandas as pd  # not on a preset run's path: ~0.25 s to import

    where = f"workload.path={str(path)!r}"
    try:
        size_bytes = Path(path).stat().st_size
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from exc
    if size_bytes > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: {size_bytes / 1e9:.1f} GB, over the {MAX_FILE_BYTES / 1e9:.0f} GB a trace file may have")
    progress = Progress("hostbound")
    progress.update(f"reading {Path(path).name} ({size_bytes / 1e6:.1f} MB)", force=True)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot read as CSV ({one_line(exc)})") from exc
    if len(frame) > MAX_ROWS:
        raise ConfigError(f"{where}: {len(frame):,} rows, over the {MAX_ROWS:,} a trace file may have")
    progress.update(f"checking {len(frame):,} rows of {Path(path).name}", force=True)
    for column in ("name", "kind"):
        if column not in frame.columns:
            raise ConfigError(f"{where}: missing column {column!r} (columns: {', '.join(frame.columns)})")
    unknown = set(frame.columns) - KNOWN_COLUMNS
    if unknown:
        raise ConfigError(f"{where}: unknown column(s) {', '.join(sorted(unknown))}")
    if frame.empty:
        raise ConfigError(f"{where}: no rows (an empty op list)")
    line = lambda i: i + 2  # header is line 1  # noqa: E731

    def bad(i: int, column: str, value: str, why: str) -> ConfigError:
        return ConfigError(f"{where} line {line(i)} column {column!r}: {value!r} {why}")

    kinds = {k.value for k in OpKind}
    kind_text = frame["kind"].to_numpy(dtype=object)
    _first_bad(~np.isin(kind_text, list(kinds)), lambda i: bad(i, "kind", kind_text[i], f"is not a kind ({', '.join(sorted(kinds))})"))
    numbers: dict[str, np.ndarray] = {}
    for column in NUMBER_COLUMNS + INT_COLUMNS:
        if column not in frame.columns:
            continue
        text = frame[column].str.strip()
        values = pd.to_numeric(text.replace("", np.nan), errors="coerce").to_numpy(dtype=np.float64)
        text = text.to_numpy(dtype=object)
        _first_bad(np.isnan(values) & (text != ""), lambda i: bad(i, column, text[i], "is not a number"))
        limit = COLUMN_LIMITS[column]
        _first_bad(np.isinf(values), lambda i: bad(i, column, text[i], f"must be a finite number in {limit.text()}"))
        _first_bad((values < limit.low) | (values > limit.high), lambda i: bad(i, column, text[i], f"must be in {limit.text()}"))
        if column in INT_COLUMNS:
            _first_bad(~np.isnan(values) & (values != np.floor(values)), lambda i: bad(i, column, text[i], "must be a whole number"))
        if column == "step":
            _first_bad(np.isnan(values), lambda i: bad(i, column, "", "is empty: every row needs its step"))
        numbers[column] = values
    shape_key = None
    if "shape_key" in frame.columns:  # any 64-bit integer, parsed exactly (not through float)
        keys = frame["shape_key"].str.strip().to_numpy(dtype=object)
        try:
            shape_key = np.array([int(value) if value else 0 for value in keys], dtype=np.int64)
        except (ValueError, OverflowError):
            for i, value in enumerate(keys):
                try:
                    np.int64(int(value) if value else 0)
                except (ValueError, OverflowError):
                    raise bad(i, "shape_key", value, "is not a 64-bit integer") from None
    flags = np.zeros(len(frame), dtype=np.uint8)
    for column, bit in FLAG_COLUMNS.items():
        if column not in frame.columns:
            continue
        values = frame[column].str.strip().str.lower().to_numpy(dtype=object)
        _first_bad(~np.isin(values, list(TRUE | FALSE)), lambda i: bad(i, column, values[i], "is not a flag (1/0, true/false)"))
        flags |= np.where(np.isin(values, list(TRUE)), bit, 0).astype(np.uint8)
    comm = np.zeros(len(frame), dtype=np.int8)
    if "comm" in frame.columns:
        values = frame["comm"].str.strip().to_numpy(dtype=object)
        _first_bad(~np.isin(values, ["", *COMM_CODES]), lambda i: bad(i, "comm", values[i], f"is not a collective ({', '.join(COMM_CODES)})"))
        for name, code in COMM_CODES.items():
            comm[values == name] = code

    step = numbers.get("step")
    if step is None:
        steps, n = cfg.steps, len(frame)
        order = np.arange(n)
    else:
        step = step.astype(np.int64)
        counts = np.bincount(step)
        steps, n = len(counts), int(counts[0])
        if np.any(counts != n):
            s = int(np.flatnonzero(counts != n)[0])
            raise ConfigError(f"{where} column 'step': step {s} has {counts[s]} ops, step 0 has {n}")
        order = np.argsort(step, kind="stable")
        names = frame["name"].to_numpy()[order].reshape(steps, n)
        if np.any(names != names[0]):
            s, j = map(int, np.argwhere(names != names[0])[0])
            raise ConfigError(f"{where} column 'name': step {s} op {j} is {names[s, j]!r}, step 0 has {names[0, j]!r}")
    first = order[:n]

    # Whole columns at once: indexing a DataFrame row by row took minutes for a million rows.
    after: list = [None] * n
    if "after" in frame.columns:
        after_texts = frame["after"].str.strip().to_numpy(dtype=object)[first]
        for j in np.flatnonzero(after_texts != "").tolist():
            text, i = after_texts[j], int(first[j])
            try:
                after[j] = [] if text == NO_DEPENDENCY else [int(a) for a in text.split()]
            except ValueError:
                raise bad(i, "after", text, "is not a list of op indices") from None
            if any(not 0 <= a < j for a in after[j]):
                raise bad(i, "after", text, f"must name earlier ops (0..{j - 1})")
    kind_code = {k.value: KIND_CODE[k] for k in OpKind}
    op_kinds = np.zeros(n, dtype=np.int8)
    for value, code in kind_code.items():
        op_kinds[kind_text[first] == value] = code

    def grid(column: str, default: float) -> np.ndarray:
        values = numbers.get(column)
        if values is None:
            return np.full((steps, n), default)
        values = np.where(np.isnan(values), default, values)[order]
        return np.tile(values, (steps, 1)) if step is None else values.reshape(steps, n)

    per_step = {"flops": grid("flops", 0.0), "bytes": grid("bytes", 0.0), "device_us": grid("device_us", np.nan), "cache_bytes": grid("cache_bytes", 0.0)}
    if shape_key is not None:
        ordered = shape_key[order]
        per_step["shape_key"] = np.tile(ordered, (steps, 1)) if step is None else ordered.reshape(steps, n)
    group = numbers.get("group")
    if group is not None:
        group = np.where(np.isnan(group[first]), -1, group[first]).astype(np.int64)
        for j, leader in enumerate(group):
            if leader >= 0 and not (leader <= j and group[leader] == leader):
                raise bad(int(first[j]), "group", str(leader), f"must name this op or an earlier op that leads its own group (0..{j})")
            if 0 <= leader < j and op_kinds[leader] in HOST_ONLY_KINDS:
                raise bad(int(first[j]), "group", str(leader),
                          f"names a {kind_text[first[leader]]} op, which launches nothing: ops of a group are issued by their leader's launch")
        # One call issued the group: launched before the step, all of it was (every step builder then
        # treats its ops as carried in).
        led = group >= 0
        carried_leader = np.zeros(n, dtype=bool)
        carried_leader[led] = (flags[first][group[led]] & FLAG_CARRIED_IN) > 0
        flags[first[carried_leader]] |= FLAG_CARRIED_IN
    measured = [c for c in COST_COLUMNS if c in numbers]
    if measured:
        host_cost = np.stack([grid(c, np.nan) for c in COST_COLUMNS] + [grid("host_us", np.nan)], axis=-1)
    waits = grid("not_before_us", np.nan) if "not_before_us" in numbers else None
    copies = max(1, cfg.repeat)
    if cfg.warmup_steps >= steps * copies:
        # As workload.steps' own limit does: refused, not cut to what fits (a 4-step CSV with warmup_steps=8
        # measured 1 step of 4 while its summary.json said warmup 8).
        played = f"{steps} step(s) of {where}" + (f" played workload.repeat={copies} times" if copies > 1 else "")
        raise ConfigError(f"workload.warmup_steps={cfg.warmup_steps}: must be < the {played}, or no step is measured")
    run_cfg = dataclasses.replace(cfg, steps=steps * copies)
    if copies > 1:  # the file's steps played `repeat` times
        per_step = {key: np.tile(value, (copies, 1)) for key, value in per_step.items()}
    workload = from_op_arrays(
        run_cfg,
        names=frame["name"].to_numpy(dtype=object)[first].tolist(),
        kind=op_kinds,
        stream=np.nan_to_num(numbers["stream"][first], nan=-1).astype(np.int8) if "stream" in numbers else np.full(n, -1, np.int8),
        flags=flags[first],  # every flag column, the simulator's and the profile's
        after=after,
        host_us=np.nan_to_num(numbers["host_us"][first]) if "host_us" in numbers else np.zeros(n),
        per_step=per_step,
    )
    if measured:
        workload.host_cost_us = np.ascontiguousarray(np.tile(host_cost, (copies, 1, 1)))
        workload.step_io = False
    if waits is not None:
        workload.not_before_us = np.ascontiguousarray(np.tile(waits, (copies, 1)))
    if group is not None:
        workload.group = group
    workload.comm = comm[first]
    if "weight_bytes" in numbers:
        workload.weight_bytes = np.nan_to_num(numbers["weight_bytes"][first])
    if "step_weight_bytes" in numbers:
        step_weights = grid("step_weight_bytes", np.nan)
        step_weights = np.where(np.isnan(step_weights), workload.weight_bytes[None, :], step_weights)
        workload.step_weight_bytes = np.ascontiguousarray(np.tile(step_weights, (copies, 1)))
    if "expert_groups" in numbers:
        workload.expert_groups = np.ascontiguousarray(np.tile(grid("expert_groups", 0.0), (copies, 1)))
    if "ranks" in numbers:
        workload.comm_ranks = np.nan_to_num(numbers["ranks"][first], nan=1).astype(np.int32)
    if "rank_stride" in numbers:
        workload.comm_stride = np.nan_to_num(numbers["rank_stride"][first], nan=1).astype(np.int32)
    if "devices" in numbers:
        _check_placement(numbers, first, workload, bad)
    if step is not None:
        # A batch column without a tokens one: each sequence keeps the config's tokens (a prefill's
        # context_len), or a prefill of 2 and 3 prompts counted 7 prompts' tokens each step (batch_size 7).
        tokens_per_sequence = int(workload.tokens[0]) // max(int(workload.batch[0]), 1)
        for column in ("batch", "tokens", "kv_len"):
            if column in numbers:
                values = np.tile(numbers[column][order].reshape(steps, n)[:, 0], copies)
                setattr(workload, column, values if column == "kv_len" else values.astype(np.int64))
        if "batch" in numbers and "tokens" not in numbers:
            workload.tokens = workload.batch * tokens_per_sequence
        workload.real_batch, workload.real_kv_len = workload.batch, workload.kv_len
    return workload


def write_ops_table(table: pd.DataFrame, path: Path) -> None:
    """An imported op list (IMPORTED_OP_COLUMNS) as ops.csv, written through Arrow's CSV writer (pandas
    formats 25k rows in ~0.3 s, Arrow in ~0.04 s); times to the nanosecond; written to a temporary name and renamed."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rounded = table.round({c: 3 for c in IMPORTED_OP_COLUMNS if c.endswith("_us")})
    frame = pa.Table.from_pandas(rounded, preserve_index=False)
    atomic_write(Path(path), lambda tmp: pacsv.write_csv(frame, str(tmp), pacsv.WriteOptions(quoting_style="needed")))
