"""Read a PyTorch-profiler (Kineto) Chrome trace: CUDA and HIP runtime calls, kernels, copies, syncs.

Event categories used (`cat`, case-insensitive; older Kineto writes `Kernel`, `Memcpy`, `Runtime`):
`cuda_runtime` / `cuda_driver` (host calls, `args.correlation`), `kernel` / `gpu_memcpy` /
`gpu_memset` (device tasks, `args.correlation`, `args.stream`, `args.device`), `cuda_sync` (what a
sync or stream-wait waited for: `wait_on_stream`, `wait_on_cuda_event_record_corr_id`),
`user_annotation` and `ProfilerStep#N` (step marks), `cpu_op` (the framework op a call ran in).
A task and its launch share `args.correlation` (a graph launch shares it with all its kernels).

Driver calls nested in a runtime call on the same thread (cuLaunchKernel inside cudaLaunchKernel)
are the same host time seen twice: only the outer call is kept (a driver call timed exactly like a
runtime call is inside it, whichever the file lists first).

A field of the wrong type where the reader needs it (`cat` or `name` not text or a number,
`distributedInfo` not an object, `deviceProperties` not a list) stops the import with one line naming it.
"""
from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from harness.importers.events import (
    ALL_STREAMS,
    CALL_ALLOC,
    CALL_COLUMNS,
    CALL_COPY,
    CALL_COPY_SYNC,
    CALL_GRAPH,
    CALL_LAUNCH,
    CALL_OTHER,
    CALL_RECORD,
    CALL_SET,
    CALL_SYNC,
    CALL_WAIT,
    MARK_COLUMNS,
    MODULE_COLUMNS,
    TASK_COLUMNS,
    TASK_COMM,
    TASK_COPY,
    TASK_KERNEL,
    TASK_SET,
    Clock,
    Profile,
    ProfileError,
    checked_stamp,
    frame,
    innermost,
    top_level,
)

RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
DRIVER_CATS = {"cuda_driver", "driver"}
TASK_CATS = {"kernel": TASK_KERNEL, "gpu_memcpy": TASK_COPY, "memcpy": TASK_COPY, "gpu_memset": TASK_SET, "memset": TASK_SET}
COMM_NAME = re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all", re.IGNORECASE)
STEP_MARK = "ProfilerStep#"
MODULE_CALL = "nn.Module: "  # a python_function event of an nn.Module call (with_modules=True)
PEER_SKIP_CATS = {"Trace"}  # the profiler's own span is not device work
DEVICE_SIDE_SYNCS = {"Event Sync", "Context Sync"}  # cuda_sync rows HTA counts as device side
# Options of torch.profiler.profile a Kineto trace records at its top level when they were on.
PROFILER_OPTIONS = ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")


@functools.lru_cache(maxsize=4096)
def call_kind(name: str) -> int:
    """What a CUDA/HIP runtime or driver call does, from its name."""
    if "GraphLaunch" in name:
        return CALL_GRAPH
    if "LaunchKernel" in name or "LaunchCooperativeKernel" in name or name.startswith(("cuLaunch", "cudaLaunch", "hipLaunch")):
        return CALL_LAUNCH
    if "Memcpy" in name or "MemcpyPeer" in name:
        return CALL_COPY if "Async" in name else CALL_COPY_SYNC
    if "Memset" in name:
        return CALL_SET if "Async" in name else CALL_COPY_SYNC
    if name.endswith(("StreamSynchronize", "DeviceSynchronize", "EventSynchronize", "CtxSynchronize")):
        return CALL_SYNC
    if name.endswith("StreamWaitEvent"):
        return CALL_WAIT
    if name.endswith("EventRecord") or name.endswith("EventRecordWithFlags"):
        return CALL_RECORD
    if re.search(r"(Malloc|Free)(Host|Async|Managed|Pitch)?$|HostAlloc$|MemAlloc|MemFree", name):
        return CALL_ALLOC
    return CALL_OTHER


def task_kind(cat: str, name: str) -> int:
    kind = TASK_CATS[cat]
    if kind == TASK_KERNEL and COMM_NAME.search(name):
        return TASK_COMM
    return kind


def _int(value: Any, default: int = -1) -> int:
    """An id field (thread, stream, correlation) as an int64, or `default` where it is none (text, NaN,
    infinite, beyond 64 bits): such an event still counts, on an unknown thread or stream."""
    if type(value) is int and -(1 << 63) <= value < 1 << 63:
        return value
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return whole if -(1 << 63) <= whole < 1 << 63 else default


def _times(values: list, origin: int) -> np.ndarray:
    """µs since `origin` for a list of timestamps (numbers, or strings longer than a float holds)."""
    if any(isinstance(v, str) for v in values):
        clock = Clock(origin)
        return np.array([clock(v) for v in values], dtype=np.float64)
    return np.asarray(values, dtype=np.float64) - origin


def _shown(value: Any) -> str:
    """A field's value for a one-line message (at most 40 characters of it)."""
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def _check_scalar(path: Path, event: dict, field: str) -> None:
    """Refuses (one line naming the file, the event and the field) a `cat` or `name` that is not text
    or a number; None (no name) passes, as an empty name."""
    value = event.get(field)
    if value is None or type(value) in (str, int, float, bool):
        return
    raise ProfileError(f"{path}: event at ts={_shown(event.get('ts'))} has {field}={_shown(value)}: not text or a number")


class _Group(list):
    """The events of one kind, gathered in the single pass over the trace; columns on demand."""

    def column(self, key: str, default: Any = None) -> list:
        return [e.get(key, default) for e in self]

    def args(self) -> list[dict]:
        return [a if isinstance(a, dict) else {} for a in self.column("args")]

    def names(self) -> list[str]:
        return [str(n) for n in self.column("name", "")]


def read_kineto(path: Path, data: Any, rank: Optional[int]) -> Profile:
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"{path}: not a profiler trace (no 'traceEvents' list of duration events)")
    device, calls, syncs, marks, ops, modules = _Group(), _Group(), _Group(), _Group(), _Group(), _Group()
    peer_rows: list[tuple] = []  # what HolisticTraceAnalysis reads (see _peer_rows)
    host_start: dict[int, Any] = {}
    stamps_fractional = stamps_missing = stamps_text = False
    first = None
    route = {**{c: device for c in TASK_CATS}, **{c: calls for c in RUNTIME_CATS}, "cuda_sync": syncs, "user_annotation": marks, "cpu_op": ops}
    for e in events:
        if type(e) is not dict:
            continue
        ts = e.get("ts")
        kind = type(ts)
        if kind is float:
            stamps_fractional = True
        elif ts is None:
            stamps_missing = True
            continue
        elif kind is str:
            stamps_text = True
        if e.get("ph") != "X":
            continue
        whole = checked_stamp(path, e)
        if first is None or whole < first:
            first = whole
        cat = e.get("cat")
        if cat is None:
            continue
        if type(cat) is not str:
            _check_scalar(path, e, "cat")  # a list or an object cannot name a category (nor be looked up)
        if type(e.get("name")) not in (str, int, float):
            _check_scalar(path, e, "name")
        group = route.get(cat) or route.get(str(cat).lower())
        if group is ops and str(e.get("name", "")).startswith(STEP_MARK):
            group = marks
        elif group is None and cat == "python_function" and str(e.get("name", "")).startswith(MODULE_CALL):
            group = modules
        if group is not None:
            group.append(e)
        args = e.get("args")
        if "dur" not in e or cat in PEER_SKIP_CATS or type(args) is not dict:
            continue
        stream = args.get("stream", -1)
        if stream != -1:
            stream = _int(stream)
            if stream != -1:
                peer_rows.append((str(e.get("name", "")), cat, ts, e["dur"], stream, _int(args.get("correlation", -1))))
                continue
        correlation = args.get("correlation", -1)
        if correlation != -1 and e.get("name") not in DEVICE_SIDE_SYNCS:
            host_start[_int(correlation)] = ts
    if first is None:
        raise ProfileError(f"{path}: not a profiler trace (no 'traceEvents' list of duration events)")
    if not device:
        raise ProfileError(f"{path}: no device events (kernel, gpu_memcpy, gpu_memset): nothing ran on an accelerator")

    device_args = device.args()
    device_of = np.array([_int(a.get("device"), _int(p, 0)) for a, p in zip(device_args, device.column("pid"))], dtype=np.int64)
    counts = Counter(device_of.tolist())
    distributed = (data.get("distributedInfo") or {}) if isinstance(data, dict) else {}
    if not isinstance(distributed, dict):
        raise ProfileError(f"{path}: distributedInfo is {_shown(distributed)}: not an object (Kineto writes {{\"rank\": R, ...}})")
    file_rank = _int(distributed.get("rank"), default=None)
    if rank is None or rank == file_rank:
        chosen_device = counts.most_common(1)[0][0]
    elif rank in counts:
        chosen_device = rank
    else:
        held = f"rank {file_rank}" if file_rank is not None else "no rank"
        raise ProfileError(f"{path}: rank {rank} is not there (the trace holds {held}, devices {', '.join(map(str, sorted(counts)))})")
    mine = [device[i] for i in np.flatnonzero(device_of == chosen_device)]
    mine_args = [device_args[i] for i in np.flatnonzero(device_of == chosen_device)]
    names = [str(e.get("name", "")) for e in mine]
    task_start = _times([e["ts"] for e in mine], first)
    tasks = frame(
        {
            "stream": [_int(a.get("stream"), _int(e.get("tid"), 0)) for a, e in zip(mine_args, mine)],
            "start_us": task_start,
            "end_us": task_start + np.array([e.get("dur", 0.0) for e in mine], dtype=np.float64),
            "kind": [task_kind(str(e["cat"]).lower(), n) for e, n in zip(mine, names)],
            "name": names,
            "key": [_int(a.get("correlation")) for a in mine_args],
        },
        TASK_COLUMNS,
    )
    op_start = _times(ops.column("ts"), first)
    op_end = op_start + np.asarray(ops.column("dur", 0.0), dtype=np.float64)
    call_table = _calls(calls, ops, op_start, op_end, syncs, first)
    framework_ops = _framework_ops(ops)
    mark_start = _times(marks.column("ts"), first)
    mark_table = frame(
        {
            "thread": [_int(t, 0) for t in marks.column("tid")],
            "start_us": mark_start,
            "end_us": mark_start + np.asarray(marks.column("dur", 0.0), dtype=np.float64),
            "name": marks.names(),
        },
        MARK_COLUMNS,
    )
    # This rank's events: the host (calls, marks, framework ops) and the chosen device.
    starts = np.concatenate([tasks["start_us"], call_table["start_us"], mark_table["start_us"], op_start])
    ends = np.concatenate([tasks["end_us"], call_table["end_us"], mark_table["end_us"], op_end])
    shift = float(starts.min())
    module_table = _module_calls(modules, ops, op_start, op_end, first)
    for table in (tasks, call_table, mark_table, module_table):
        for column in ("start_us", "end_us", "ready_us"):
            if column in table:
                table[column] -= shift
    names = (data.get("deviceProperties") or [{}]) if isinstance(data, dict) else [{}]
    if not isinstance(names, list):
        raise ProfileError(f"{path}: deviceProperties is {_shown(names)}: not a list (Kineto writes one object per device)")
    described = [p for p in names if isinstance(p, dict)]
    device_name = next((str(p.get("name", "")) for p in described if _int(p.get("id")) == chosen_device), "")
    if not device_name and len(described) == 1:
        # One device described under another index than its kernels' (a process that saw only that GPU,
        # e.g. HIP_VISIBLE_DEVICES=2 numbers it 0 in the properties, 2 on the kernels): that one.
        device_name = str(described[0].get("name", ""))
    rounding = (stamps_fractional or stamps_missing) and not stamps_text
    return Profile(
        path=str(path),
        source="kineto",
        device=device_name,
        rank=file_rank,
        device_index=chosen_device,
        dispatch="eager",
        calls=call_table,
        tasks=tasks,
        marks=mark_table,
        span_us=(0.0, float(ends.max()) - shift),
        peer_rows=_peer_rows(peer_rows, host_start, first, shift, rounding) if isinstance(data, dict) else None,
        framework_ops=framework_ops,
        module_calls=module_table if len(module_table) else None,
        recorded_with=tuple(o for o in PROFILER_OPTIONS if isinstance(data, dict) and data.get(o) in (1, True)),
    )


def _module_calls(modules: _Group, ops: _Group, op_start: np.ndarray, op_end: np.ndarray, origin: int) -> pd.DataFrame:
    """The nn.Module calls (`with_modules=True`): thread, start, end and own time, the call's time outside
    the framework ops and module calls it holds (its Python: `__call__`, hooks, forward's own lines)."""
    start = _times(modules.column("ts"), origin)
    end = start + np.asarray(modules.column("dur", 0.0), dtype=np.float64)
    threads = [_int(t, 0) for t in modules.column("tid")]
    n = len(modules)
    # Modules and ops of a thread in start order, an enclosing one before what it holds: each one's
    # parent is the innermost still open; a module's own time is its time less its direct children's.
    rows = sorted(
        [(threads[i], start[i], -end[i], i) for i in range(n)]
        + [(_int(t, 0), s, -e, n + j) for j, (t, s, e) in enumerate(zip(ops.column("tid"), op_start, op_end))]
    )
    held = np.zeros(n)
    open_rows: list[tuple[int, float, int]] = []  # (thread, end, row)
    for thread, s, negative_end, row in rows:
        while open_rows and (open_rows[-1][0] != thread or open_rows[-1][1] <= s):
            open_rows.pop()
        if open_rows and open_rows[-1][2] < n:
            held[open_rows[-1][2]] += -negative_end - s
        open_rows.append((thread, -negative_end, row))
    return frame({"thread": threads, "start_us": start, "end_us": end, "own_us": np.maximum(0.0, end - start - held)}, MODULE_COLUMNS)


def _calls(calls: _Group, ops: _Group, op_start: np.ndarray, op_end: np.ndarray, syncs: _Group, origin: int) -> pd.DataFrame:
    """Host calls with their kind, the framework op around them and what their syncs waited for."""
    if not calls:
        return frame(None, CALL_COLUMNS)
    thread = np.array([_int(t, 0) for t in calls.column("tid")], dtype=np.int64)
    start = _times(calls.column("ts"), origin)
    end = start + np.asarray(calls.column("dur", 0.0), dtype=np.float64)
    keep = np.ones(len(calls), dtype=bool)
    driver = np.array([str(c).lower() in DRIVER_CATS for c in calls.column("cat")])
    if driver.any():
        for tid in np.unique(thread[driver]):
            on = np.flatnonzero(thread == tid)
            keep[on] = top_level(start[on], end[on], inner=driver[on]) | ~driver[on]
    op = np.full(len(calls), "", dtype=object)
    op_id = np.full(len(calls), -1, dtype=np.int64)
    if ops:
        op_thread = np.array([_int(t, 0) for t in ops.column("tid")], dtype=np.int64)
        op_name = np.array(ops.names(), dtype=object)
        for tid in np.unique(thread):
            on = np.flatnonzero(thread == tid)
            theirs = np.flatnonzero(op_thread == tid)
            found = innermost(op_start[theirs], op_end[theirs], start[on])
            op[on[found >= 0]] = op_name[theirs[found[found >= 0]]]
            op_id[on[found >= 0]] = theirs[found[found >= 0]]
    name = calls.names()
    key = np.array([_int(a.get("correlation")) for a in calls.args()], dtype=np.int64)
    # What each sync or stream-wait waited for, recorded on the device side under its correlation.
    waited = {}
    for args in syncs.args():
        stream = _int(args.get("stream"))
        waited[_int(args.get("correlation"))] = (
            ALL_STREAMS if stream in (-1, 4294967295) or args.get("cuda_sync_kind") == "Context Sync" else stream,
            _int(args.get("wait_on_stream")),
            _int(args.get("wait_on_cuda_event_record_corr_id")),
        )
    info = np.array([waited.get(k, (ALL_STREAMS, -1, -1)) for k in key.tolist()], dtype=np.int64).reshape(-1, 3)
    table = frame(
        {
            "thread": thread,
            "start_us": start,
            "end_us": end,
            "launch_us": end - start,
            "ready_us": end,
            "kind": [call_kind(n) for n in name],
            "name": name,
            "op": op,
            "op_id": op_id,
            "key": key,
            "stream": info[:, 0],
            "wait_stream": info[:, 1],
            "wait_key": info[:, 2],
        },
        CALL_COLUMNS,
    )
    return table[keep].sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)


def _framework_ops(ops: _Group) -> pd.DataFrame:
    """The framework ops' names and recorded shapes (`args["Input Dims"]`, `args["Input type"]`; empty
    lists where the trace was recorded without shapes or an entry is not a list)."""
    args = ops.args()
    dims = [a.get("Input Dims") if isinstance(a.get("Input Dims"), list) else [] for a in args]
    types = [a.get("Input type") if isinstance(a.get("Input type"), list) else [] for a in args]
    return pd.DataFrame({"name": ops.names(), "dims": pd.Series(dims, dtype=object), "types": pd.Series(types, dtype=object)})


def _peer_rows(rows: list[tuple], host_start: dict, origin: int, shift: float, rounding: bool) -> pd.DataFrame:
    """Device-side rows as HolisticTraceAnalysis 0.5 reads them (for `measure.peer_breakdown`): every
    duration event with a `stream` arg; times rounded to whole µs (start up, end down) when the file
    has fractional (or missing) timestamps, as HTA does, except that an event within one µs (1000.2 to
    1000.7: HTA makes it end at 1000, before it starts at 1001) lasts 0 µs at its rounded start; each
    row's runtime start is that of the host event sharing its correlation (any host event: HTA links
    graph launches and copies too)."""
    table = pd.DataFrame(rows, columns=["name", "cat", "ts", "dur", "stream", "correlation"])
    ts = table["ts"].astype(np.float64).to_numpy()
    dur = table["dur"].astype(np.float64).to_numpy()
    end = ts + dur
    if rounding:
        ts = np.ceil(ts)
        # Not before its start: a negative duration would take time off the busy union and push the
        # window below zero (percentages over 100).
        end = np.maximum(np.floor(end), ts)
    table["start_us"] = ts - origin - shift
    table["end_us"] = end - origin - shift
    launched = {k: float(v) - origin - shift for k, v in host_start.items()}
    table["runtime_start_us"] = table["correlation"].map(launched).astype(np.float64)
    return table.drop(columns=["ts", "dur"])
