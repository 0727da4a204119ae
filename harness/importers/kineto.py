"""Read a PyTorch-profiler (Kineto) Chrome trace: CUDA and HIP runtime calls, kernels, copies, syncs.

Event categories used (`cat`, case-insensitive; older Kineto writes `Kernel`, `Memcpy`, `Runtime`):
`cuda_runtime` / `cuda_driver` (host calls, `args.correlation`), `kernel` / `gpu_memcpy` /
`gpu_memset` (device tasks, `args.correlation`, `args.stream`, `args.device`), `cuda_sync` (what a
sync or stream-wait waited for: `wait_on_stream`, `wait_on_cuda_event_record_corr_id`),
`user_annotation` and `ProfilerStep#N` (step marks), `cpu_op` (the framework op a call ran in).
A task and its launch share `args.correlation` (a graph launch shares it with all its kernels).

Driver calls nested in a runtime call on the same thread (cuLaunchKernel inside cudaLaunchKernel)
are the same host time seen twice: only the outer call is kept.
"""
from __future__ import annotations

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
    TASK_COLUMNS,
    TASK_COMM,
    TASK_COPY,
    TASK_KERNEL,
    TASK_SET,
    Clock,
    Profile,
    ProfileError,
    frame,
    innermost,
    top_level,
)

RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
DRIVER_CATS = {"cuda_driver", "driver"}
TASK_CATS = {"kernel": TASK_KERNEL, "gpu_memcpy": TASK_COPY, "memcpy": TASK_COPY, "gpu_memset": TASK_SET, "memset": TASK_SET}
COMM_NAME = re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all", re.IGNORECASE)
STEP_MARK = "ProfilerStep#"
PEER_SKIP_CATS = {"Trace"}  # the profiler's own span is not device work
DEVICE_SIDE_SYNCS = {"Event Sync", "Context Sync"}  # cuda_sync rows HTA counts as device side


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
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def read_kineto(path: Path, data: Any, rank: Optional[int]) -> Profile:
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list) or not any(isinstance(e, dict) and e.get("ph") == "X" for e in events[:100000]):
        raise ProfileError(f"{path}: not a profiler trace (no 'traceEvents' list of duration events)")
    slices = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    origin = min(Clock.whole_part(e["ts"]) for e in slices)
    clock = Clock(origin)

    device_events, host_calls, marks, cpu_ops, syncs, peer = [], [], [], [], [], []
    thread_names: dict[int, str] = {}
    for e in events:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tid = _int(e.get("tid"), default=None)
            if tid is not None:
                thread_names[tid] = str((e.get("args") or {}).get("name", ""))
    for e in slices:
        cat = str(e.get("cat", ""))
        low = cat.lower()
        if low in TASK_CATS:
            device_events.append(e)
        elif low in RUNTIME_CATS:
            host_calls.append(e)
        elif low == "cuda_sync":
            syncs.append(e)
        elif low == "user_annotation" or (low == "cpu_op" and str(e.get("name", "")).startswith(STEP_MARK)):
            marks.append(e)
        elif low == "cpu_op":
            cpu_ops.append(e)
    if not device_events:
        raise ProfileError(f"{path}: no device events (kernel, gpu_memcpy, gpu_memset): nothing ran on an accelerator")

    device_of = [_int((e.get("args") or {}).get("device"), _int(e.get("pid"), 0)) for e in device_events]
    counts = Counter(device_of)
    file_rank = _int((data.get("distributedInfo") or {}).get("rank") if isinstance(data, dict) else None, default=None)
    busiest = counts.most_common(1)[0][0]
    if rank is None or rank == file_rank:
        device = busiest
    elif rank in counts:
        device = rank
    else:
        held = f"rank {file_rank}" if file_rank is not None else "no rank"
        raise ProfileError(
            f"{path}: rank {rank} is not there (the trace holds {held}, devices {', '.join(map(str, sorted(counts)))})"
        )
    chosen = [e for e, d in zip(device_events, device_of) if d == device]

    tasks = frame(
        {
            "stream": [_int((e.get("args") or {}).get("stream"), _int(e.get("tid"), 0)) for e in chosen],
            "start_us": [clock(e["ts"]) for e in chosen],
            "end_us": [clock(e["ts"]) + float(e.get("dur", 0.0)) for e in chosen],
            "kind": [task_kind(str(e["cat"]).lower(), str(e.get("name", ""))) for e in chosen],
            "name": [str(e.get("name", "")) for e in chosen],
            "key": [_int((e.get("args") or {}).get("correlation")) for e in chosen],
        },
        TASK_COLUMNS,
    )

    calls = _calls(host_calls, cpu_ops, syncs, clock)
    mark_table = frame(
        {
            "thread": [_int(e.get("tid"), 0) for e in marks],
            "start_us": [clock(e["ts"]) for e in marks],
            "end_us": [clock(e["ts"]) + float(e.get("dur", 0.0)) for e in marks],
            "name": [str(e.get("name", "")) for e in marks],
        },
        MARK_COLUMNS,
    )
    # This rank's events: the host (calls, marks, framework ops) and the chosen device.
    starts = np.concatenate([tasks["start_us"], calls["start_us"], mark_table["start_us"], [clock(e["ts"]) for e in cpu_ops]])
    ends = np.concatenate([tasks["end_us"], calls["end_us"], mark_table["end_us"], [clock(e["ts"]) + float(e.get("dur", 0.0)) for e in cpu_ops]])
    shift = float(starts.min())
    for table in (tasks, calls, mark_table):
        for column in ("start_us", "end_us", "ready_us"):
            if column in table:
                table[column] -= shift
    names = (data.get("deviceProperties") or [{}]) if isinstance(data, dict) else [{}]
    device_name = next((str(p.get("name", "")) for p in names if isinstance(p, dict) and _int(p.get("id")) == device), "")
    profile = Profile(
        path=str(path),
        source="kineto",
        device=device_name,
        rank=file_rank if file_rank is not None else device,
        dispatch="eager",
        calls=calls,
        tasks=tasks,
        marks=mark_table,
        span_us=(0.0, float(ends.max()) - shift),
        thread_names=thread_names,
        peer_rows=_peer_rows(events, origin, shift) if isinstance(data, dict) else None,
    )
    return profile


def _calls(host_calls: list[dict], cpu_ops: list[dict], syncs: list[dict], clock: Clock) -> pd.DataFrame:
    """Host calls with their kind, the framework op around them and what their syncs waited for."""
    if not host_calls:
        return frame(None, CALL_COLUMNS)
    thread = np.array([_int(e.get("tid"), 0) for e in host_calls], dtype=np.int64)
    start = np.array([clock(e["ts"]) for e in host_calls])
    end = start + np.array([float(e.get("dur", 0.0)) for e in host_calls])
    keep = np.ones(len(host_calls), dtype=bool)
    driver = np.array([str(e.get("cat", "")).lower() in DRIVER_CATS for e in host_calls])
    if driver.any():
        for tid in np.unique(thread[driver]):
            on = np.flatnonzero(thread == tid)
            keep[on] = top_level(start[on], end[on]) | ~driver[on]
    name = [str(e.get("name", "")) for e in host_calls]
    op = np.full(len(host_calls), "", dtype=object)
    if cpu_ops:
        op_thread = np.array([_int(e.get("tid"), 0) for e in cpu_ops], dtype=np.int64)
        op_start = np.array([clock(e["ts"]) for e in cpu_ops])
        op_end = op_start + np.array([float(e.get("dur", 0.0)) for e in cpu_ops])
        op_name = np.array([str(e.get("name", "")) for e in cpu_ops], dtype=object)
        for tid in np.unique(thread):
            on = np.flatnonzero(thread == tid)
            mine = np.flatnonzero(op_thread == tid)
            found = innermost(op_start[mine], op_end[mine], start[on])
            op[on[found >= 0]] = op_name[mine[found[found >= 0]]]
    key = np.array([_int((e.get("args") or {}).get("correlation")) for e in host_calls], dtype=np.int64)
    # What each sync or stream-wait waited for, recorded on the device side under its correlation.
    waited = {}
    for e in syncs:
        args = e.get("args") or {}
        stream = _int(args.get("stream"))
        waited[_int(args.get("correlation"))] = (
            ALL_STREAMS if stream in (-1, 4294967295) or args.get("cuda_sync_kind") == "Context Sync" else stream,
            _int(args.get("wait_on_stream")),
            _int(args.get("wait_on_cuda_event_record_corr_id")),
        )
    info = np.array([waited.get(k, (ALL_STREAMS, -1, -1)) for k in key], dtype=np.int64).reshape(-1, 3)
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
            "key": key,
            "stream": info[:, 0],
            "wait_stream": info[:, 1],
            "wait_key": info[:, 2],
        },
        CALL_COLUMNS,
    )
    return table[keep].sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)


def _peer_rows(events: list, origin: int, shift: float) -> pd.DataFrame:
    """Device-side rows as HolisticTraceAnalysis 0.5 reads them (for `core.peer_breakdown`): every
    duration event with a `stream` arg; times rounded to whole µs (start up, end down) when the file
    has fractional timestamps, as HTA does; each row's runtime start is that of the host event
    sharing its correlation (any host event: HTA links graph launches and copies too)."""
    stamps = [e.get("ts") for e in events if isinstance(e, dict)]
    fractional = any(t is None or isinstance(t, float) for t in stamps) and not any(isinstance(t, str) for t in stamps)
    rows, host_start = [], {}
    for e in events:
        if not isinstance(e, dict) or "dur" not in e or "cat" not in e or "ts" not in e or e.get("cat") in PEER_SKIP_CATS:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        ts, dur = e["ts"], e["dur"]
        if fractional:
            stop = np.floor(float(ts) + float(dur))
            ts = float(np.ceil(float(ts)))
            dur = stop - ts
        start = float(ts) - origin - shift
        stream = _int(args.get("stream"))
        correlation = _int(args.get("correlation"))
        if stream != -1:
            rows.append((str(e.get("name", "")), str(e["cat"]), start, start + float(dur), stream, correlation))
        elif correlation != -1 and e.get("name") not in DEVICE_SIDE_SYNCS:
            host_start[correlation] = start
    table = pd.DataFrame(rows, columns=["name", "cat", "start_us", "end_us", "stream", "correlation"])
    table["runtime_start_us"] = table["correlation"].map(host_start).astype(np.float64)
    return table
