"""Read a torch_npu profiler `trace_view.json` (Ascend): Python, CANN and Ascend Hardware lanes.

Processes are named by metadata: "Python" (framework ops, `Enqueue` / `Dequeue@<op>` of torch_npu's
task queue), "CANN" (AscendCL calls, per thread) and "Ascend Hardware" (device tasks, one thread per
stream). Flows link them: `HostToDevice` from the AscendCL call that launched a task to the task,
`async_task_queue` from an Enqueue on a Python thread to its Dequeue on the launch thread (the two
also share `args.correlation_id`).

With the task queue (torch_npu's default), an op's host work is split in two: the Python thread runs
the framework, asks aclnn for the workspace size (tiling) and enqueues; the launch thread dequeues
and calls AscendCL, which tiles and launches. So each launch becomes a call whose issuing extent is
its Enqueue on the Python thread and whose `launch_us` is its Dequeue on the launch thread: the
harness's `async` dispatch.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from harness.importers.events import (
    ALL_STREAMS,
    CALL_ALLOC,
    CALL_COLUMNS,
    CALL_COPY,
    CALL_COPY_SYNC,
    CALL_LAUNCH,
    CALL_OTHER,
    CALL_SYNC,
    CALL_TILING,
    MARK_COLUMNS,
    TASK_COLUMNS,
    TASK_COMM,
    TASK_COPY,
    TASK_KERNEL,
    Clock,
    Profile,
    ProfileError,
    checked_stamp,
    frame,
    innermost,
    nesting_parents,
)

HARDWARE_LANE, CANN_LANE, PYTHON_LANE = "Ascend Hardware", "CANN", "Python"
API_PREFIX = "AscendCL@"


def is_torch_npu(events: Any) -> bool:
    """A trace_view.json is a list of events naming an "Ascend Hardware" process (Kineto writes an
    object with `traceEvents`: not scanned)."""
    if not isinstance(events, list):
        return False
    return any(
        isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name" and (e.get("args") or {}).get("name") == HARDWARE_LANE
        for e in events
    )


def api_kind(api: str) -> int:
    """What an AscendCL call does, from its name (without the `AscendCL@` prefix)."""
    if api.startswith("aclrtSynchronize"):
        return CALL_SYNC
    if api.startswith("aclrtMemcpy"):
        return CALL_COPY if "Async" in api else CALL_COPY_SYNC
    if api.startswith(("aclrtMalloc", "aclrtFree", "aclMallocMem", "aclFreeMem")):
        return CALL_ALLOC
    if api.endswith("GetWorkspaceSize"):
        return CALL_TILING
    return CALL_OTHER


def task_kind(name: str) -> int:
    upper = name.upper()
    if "MEMCPY" in upper:
        return TASK_COPY
    if "HCCL" in upper or "HCOM" in upper:
        return TASK_COMM
    return TASK_KERNEL


def _whole(path: Path, event: dict, key: str, default: Any) -> int:
    """An event's integer field (a thread or stream id; a number or a numeric string), or one line."""
    value = event.get(key, default) if key != "Stream Id" else (event.get("args") or {}).get(key, default)
    try:
        if type(value) is not bool and (type(value) is int or float(value) == int(float(value))):
            return int(float(value)) if type(value) is not int else value
    except (TypeError, ValueError, OverflowError):
        pass
    raise ProfileError(f"{path}: event {str(event.get('name', '?'))[:60]!r} has {key}={str(value)[:40]!r}: not an integer id")


def _checked_events(path: Path, data: Any) -> list[dict]:
    """The events of a trace_view.json, each field the reader uses checked (a time, an integer id, an
    object of arguments, a hashable flow id): one line naming the file and the event otherwise."""
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"{path}: not a profiler trace (no list of events)")
    kept = []
    for e in events:
        if type(e) is not dict:
            continue
        args = e.get("args")
        if args is not None and type(args) is not dict:
            raise ProfileError(f"{path}: event {str(e.get('name', '?'))[:60]!r} has args={str(args)[:40]!r}: not an object")
        if e.get("ph") in ("X", "s", "f"):
            if e.get("ph") != "X":
                e = {**e, "dur": 0}
            checked_stamp(path, e)
            e["tid"] = _whole(path, e, "tid", 0)
            if e.get("ph") == "X" and args and "Stream Id" in args:
                args["Stream Id"] = _whole(path, e, "Stream Id", -1)
            if isinstance(e.get("id"), (list, dict)):
                raise ProfileError(f"{path}: event {str(e.get('name', '?'))[:60]!r} has id={str(e['id'])[:40]!r}: not a flow id")
        elif e.get("ph") == "M" and args and not isinstance(args.get("name"), (str, type(None))):
            args["name"] = str(args["name"])
        kept.append(e)
    return kept


def _slices(events: list[dict], pid: Any, clock: Clock) -> dict[int, dict[str, np.ndarray]]:
    """X events of one process, per thread, as arrays (start, end, name, args index)."""
    by_thread: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("pid") == pid:
            by_thread[int(e.get("tid", 0))].append(e)
    out = {}
    for tid, items in by_thread.items():
        start = np.array([clock(e["ts"]) for e in items])
        out[tid] = {
            "start": start,
            "end": start + np.array([float(e.get("dur", 0.0)) for e in items]),
            "name": np.array([str(e.get("name", "")) for e in items], dtype=object),
            "cat": np.array([str(e.get("cat", "")) for e in items], dtype=object),
            "args": items,
        }
    return out


def _only(lane: dict, keep: np.ndarray) -> dict:
    """The slices of one thread's arrays where `keep` holds."""
    return {name: (values[keep] if isinstance(values, np.ndarray) else [v for v, k in zip(values, keep) if k]) for name, values in lane.items()}


def _at(lanes: dict, tid: int, when: float) -> int:
    """Index of the innermost slice of `lanes[tid]` containing time `when`, or -1."""
    lane = lanes.get(tid)
    if lane is None:
        return -1
    return int(innermost(lane["start"], lane["end"], np.array([when]))[0])


def read_torch_npu(path: Path, data: Any, rank: Optional[int]) -> Profile:
    events = _checked_events(path, data)
    if rank not in (None, 0):
        raise ProfileError(f"{path}: rank {rank} is not there (a trace_view.json holds one device: rank 0)")
    role = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            role[(e.get("args") or {}).get("name")] = e.get("pid")
    stamped = [e for e in events if e.get("ph") in ("X", "s", "f")]
    if not stamped:
        raise ProfileError(f"{path}: no timed events (ph X, s or f): nothing ran")
    clock = Clock(min(Clock.whole_part(e["ts"]) for e in stamped))
    hardware = _slices(events, role.get(HARDWARE_LANE), clock)
    if not any(lane["start"].size for lane in hardware.values()):
        raise ProfileError(f"{path}: no device events on the '{HARDWARE_LANE}' lane: nothing ran on the NPU")
    cann = _slices(events, role.get(CANN_LANE), clock)
    python = _slices(events, role.get(PYTHON_LANE), clock)

    # Device tasks, one lane per stream; each takes the key of the launch its HostToDevice flow names.
    task_rows: list[tuple] = []
    task_at: dict[tuple[int, float], int] = {}
    for tid, lane in hardware.items():
        order = np.argsort(lane["start"], kind="stable")
        for k in order:
            args = lane["args"][k].get("args") or {}
            task_at[(tid, round(float(lane["start"][k]), 3))] = len(task_rows)
            task_rows.append([int(args.get("Stream Id", tid)), lane["start"][k], lane["end"][k], task_kind(lane["name"][k]), lane["name"][k], -1])

    # Top-level AscendCL calls per thread (tiling calls nest inside launches: the launch holds them).
    calls: list[dict] = []
    top_of: dict[int, np.ndarray] = {}  # per CANN thread: slice index -> index of its top-level call
    for tid, lane in cann.items():
        order, parent = nesting_parents(lane["start"], lane["end"])
        top = np.empty(order.size, dtype=np.int64)
        for position, k in enumerate(order):
            if parent[position] >= 0:
                top[k] = top[order[parent[position]]]
                continue
            api = lane["name"][k].removeprefix(API_PREFIX)
            top[k] = len(calls)
            calls.append(
                {"thread": tid, "start_us": lane["start"][k], "end_us": lane["end"][k], "launch_us": lane["end"][k] - lane["start"][k],
                 "ready_us": lane["end"][k], "kind": api_kind(api), "name": api, "op": "", "op_id": -1, "key": -1,
                 "stream": ALL_STREAMS, "wait_stream": -1, "wait_key": -1}
            )
        top_of[tid] = top

    flow_start, flow_end = {}, {}
    for e in events:
        if e.get("cat") != "HostToDevice" or e.get("ph") not in ("s", "f"):
            continue
        (flow_start if e["ph"] == "s" else flow_end)[e.get("id")] = (int(e.get("tid", 0)), clock(e["ts"]))
    linked_flows = 0
    for flow, (tid, when) in flow_start.items():
        k = _at(cann, tid, when)
        target = flow_end.get(flow)
        task = task_at.get((target[0], round(target[1], 3))) if target else None
        if k < 0 or task is None:
            continue
        call = int(top_of[tid][k])
        calls[call]["kind"] = CALL_LAUNCH
        calls[call]["key"] = call
        task_rows[task][5] = call
        linked_flows += 1

    # The task queue: a launch inside a Dequeue on the launch thread was enqueued on a Python thread.
    enqueue_of = {}
    for tid, lane in python.items():
        for k in np.flatnonzero(lane["cat"] == "enqueue"):
            args = lane["args"][k].get("args") or {}
            enqueue_of[args.get("correlation_id")] = (tid, float(lane["start"][k]), float(lane["end"][k]))
    dequeues = {tid: _only(lane, lane["cat"] == "dequeue") for tid, lane in python.items() if np.any(lane["cat"] == "dequeue")}
    kept = []
    for call in calls:
        tid = call["thread"]
        if tid in dequeues:
            if call["kind"] != CALL_LAUNCH:
                continue  # launch-thread work outside a launch: inside its Dequeue, or not the model's
            k = _at(dequeues, tid, call["start_us"])
            if k >= 0:
                lane = dequeues[tid]
                queued = enqueue_of.get((lane["args"][k].get("args") or {}).get("correlation_id"))
                call["launch_us"] = float(lane["end"][k] - lane["start"][k])
                if queued is not None:
                    call["thread"], call["start_us"], call["end_us"] = queued
        kept.append(call)
    # The framework op each call belongs to: the innermost Python op around its issue.
    framework_ops = {tid: _only(lane, lane["cat"] == "cpu_op") for tid, lane in python.items()}
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, call in enumerate(kept):
        by_thread[call["thread"]].append(i)
    for tid, members in by_thread.items():
        lane = framework_ops.get(tid)
        if lane is None:
            continue
        found = innermost(lane["start"], lane["end"], np.array([kept[i]["start_us"] for i in members]))
        for i, k in zip(members, found):
            if k >= 0:
                kept[i]["op"] = lane["name"][k]

    marks = [
        (tid, lane["start"][k], lane["end"][k], lane["name"][k])
        for tid, lane in python.items()
        for k in np.flatnonzero((lane["cat"] == "cpu_op") & np.array(["#" in n for n in lane["name"]], dtype=bool))
    ]
    call_table = frame(kept or None, CALL_COLUMNS).sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)
    tasks = frame([dict(zip(TASK_COLUMNS, row)) for row in task_rows], TASK_COLUMNS)
    mark_table = frame([dict(zip(MARK_COLUMNS, m)) for m in marks] or None, MARK_COLUMNS)
    lanes = [*hardware.values(), *cann.values(), *python.values()]
    first = min(float(lane["start"].min()) for lane in lanes if lane["start"].size)
    last = max(float(lane["end"].max()) for lane in lanes if lane["start"].size)
    for table in (call_table, tasks, mark_table):
        for column in ("start_us", "end_us", "ready_us"):
            if column in table:
                table[column] -= first
    notes = []
    if len(flow_start) > linked_flows:
        notes.append(f"{len(flow_start) - linked_flows} HostToDevice flows name no call or task")
    return Profile(
        path=str(path),
        source="torch_npu",
        device="Ascend NPU",
        rank=None,
        dispatch="async" if dequeues else "eager",
        calls=call_table,
        tasks=tasks,
        marks=mark_table,
        span_us=(0.0, last - first),
        peer_rows=None,
        notes=notes,
    )
