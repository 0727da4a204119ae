"""What a trace measured, under summary.json's key names, and the peer analyser's figures.

`measured_summary` reduces the steps the op list replays to the numbers a replay's summary.json
holds (step_ms_*, device_busy, bubble_ratio, host_busy_max, bound, launches_per_step, breakdown_*),
with the same definitions (harness/sim/metrics.py), plus what only a trace shows: the launch-to-start
delay of each issue and the device's idle time split into *host wait* (nothing had been launched
yet: the device waited for the host) and *device wait* (launched, but not started: launch latency,
an event, or unseen work on the stream).

The breakdown is the step's critical path as a trace shows it: while the device runs, the path is on
the device (by task category); while it waits for the host, on the host thread (by what the thread
was doing: framework code, a launch call, an allocation, a sync; under async dispatch the launch
thread first, where it was launching, then the Python threads); while launched work has not
started, on the device's front end (`front_end`: launch latency, a kernel's gap behind the one before
it, and also a wait for an event of another stream, which a trace does not tell apart; `external` when
the stream was busy with work the trace does not hold).

`peer_breakdown` recomputes HolisticTraceAnalysis 0.5's temporal breakdown and idle-time breakdown
with HTA's own definitions (window, event set, name-based categories, whole-µs rounding), so the
two tools can be compared on the same file (tests pin the figures HTA gives).
"""
from __future__ import annotations

import re

import numpy as np

from harness.sim.task_graph import CATEGORIES
from harness.importers.steps import Imported, StepOps
from harness.importers.events import CALL_GRAPH, ISSUING
from harness.sim.metrics import MIN_SAMPLES_FOR_P99, occupancy, p99_note

US_PER_MS = 1e3
DEVICE_CATEGORY = {"copy": "copy", "comm": "comm"}  # other device ops are compute
SEGMENT_CATEGORY = {"framework": "framework", "alloc": "alloc", "tiling": "tiling", "launch": "launch", "copy": "copy", "sync": "sync", "sync_wait": "sync"}


def union(intervals: np.ndarray) -> np.ndarray:
    """Disjoint, sorted (start, end) pieces covering the given intervals (n, 2)."""
    if len(intervals) == 0:
        return np.zeros((0, 2))
    order = np.argsort(intervals[:, 0], kind="stable")
    s, e = intervals[order, 0], intervals[order, 1]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    starts = s[new]
    ends = np.maximum.reduceat(e, np.flatnonzero(new))
    return np.stack([starts, ends], axis=1)


def _step_measures(step: StepOps) -> dict:
    """One step's numbers (µs): latency, device busy, idle split, critical path by category, host time."""
    a, b = step.start_us, step.end_us
    device = [op for op in step.ops if not np.isnan(op["start_us"])]
    spans = np.array([[max(op["start_us"], a), min(op["end_us"], b)] for op in device] or np.zeros((0, 2)))
    keep = spans[:, 1] > spans[:, 0] if len(spans) else np.zeros(0, dtype=bool)
    busy_pieces = union(spans[keep])
    busy = float((busy_pieces[:, 1] - busy_pieces[:, 0]).sum()) if len(busy_pieces) else 0.0
    path = dict.fromkeys(CATEGORIES, 0.0)
    # Device time by category (pieces run by ops of several categories share it in proportion).
    by_category = {}
    for name in ("compute", "copy", "comm"):
        mine = [k for k, op in enumerate(device) if keep[k] and DEVICE_CATEGORY.get(op["kind"], "compute") == name]
        pieces = union(spans[mine]) if mine else np.zeros((0, 2))
        by_category[name] = float((pieces[:, 1] - pieces[:, 0]).sum()) if len(pieces) else 0.0
    total = sum(by_category.values())
    for name, time_us in by_category.items():
        path[name] += busy * time_us / total if total > 0 else 0.0
    # Idle pieces between a and b, each split by what the task that ends it waited for.
    edges = np.concatenate([[a], busy_pieces.ravel(), [b]]).reshape(-1, 2) if len(busy_pieces) else np.array([[a, b]])
    clipped = spans[:, 0] if len(spans) else np.zeros(0)
    order = np.argsort(clipped, kind="stable")
    host_wait = device_wait = 0.0
    segments = np.array([(s, e) for s, e, _ in step.main_segments] or np.zeros((0, 2)))
    segment_category = [SEGMENT_CATEGORY[c] for _, _, c in step.main_segments]
    # Segments are in start order (step_ops); the furthest end reached so far is sorted even where two
    # threads' segments overlap, so a search over it finds the first segment that can reach a time.
    segment_reach = np.maximum.accumulate(segments[:, 1]) if len(segments) else np.zeros(0)
    launching = union(np.array(step.launch_segments)) if step.launch_segments else np.zeros((0, 2))
    for gap_start, gap_end in edges:
        if gap_end <= gap_start:
            continue
        nxt = -1
        if gap_end < b and order.size:  # the task whose start ends the gap
            k = int(np.searchsorted(clipped[order], gap_end - 1e-6))
            while k < order.size and clipped[order[k]] <= gap_end + 1e-6:
                if keep[order[k]]:
                    nxt = int(order[k])
                    break
                k += 1
        if nxt >= 0:
            op = device[nxt]
            waited_host = float(np.clip(op.get("ready_us", gap_start) - gap_start, 0.0, gap_end - gap_start))
            external = not np.isnan(op.get("not_before_us", np.nan))
        else:  # after the last device task: the step waits for its host to finish
            waited_host, external = gap_end - gap_start, False
        rest = gap_end - gap_start - waited_host
        host_wait += waited_host
        device_wait += rest
        path["external" if external else "front_end"] += rest
        if waited_host > 0:  # on the host: what the issuing threads did meanwhile (segments in start order)
            lo, hi = gap_start, gap_start + waited_host
            # Async dispatch: the device waits for the launch thread; where it was launching, that is the
            # path (the replay's launch lane), and only where it was not, what the Python threads did.
            covered = _within(launching, lo, hi)
            path["launch"] += covered
            k = int(np.searchsorted(segment_reach, lo, side="right"))
            while k < len(segments) and segments[k, 0] < hi:
                a_k, b_k = max(segments[k, 0], lo), min(segments[k, 1], hi)
                part = max(0.0, b_k - a_k) - (_within(launching, a_k, b_k) if b_k > a_k else 0.0)
                path[segment_category[k]] += part
                covered += part
                k += 1
            path["framework"] += max(0.0, waited_host - covered)
    main_busy = max(0.0, min(step.window.end_us, b) - max(step.window.start_us, a) - step.sync_wait_us)
    host_ms = {}
    for (s, e), category in zip(segments, [c for _, _, c in step.main_segments]):
        host_ms[category] = host_ms.get(category, 0.0) + (e - s)
    issued = step.calls[step.calls["kind"].isin(ISSUING)]
    delays = [op["start_us"] - op["ready_us"] for op in device if not op["carried_in"] and op["launch_us"] > 0]
    return {
        "latency": b - a, "busy": busy, "host_wait": host_wait, "device_wait": device_wait, "path": path,
        "main_busy": main_busy, "launch_lane": step.launch_lane_us, "host": host_ms, "launches": len(issued),
        "ops": len(device), "delays": delays,
        "graph_launches": int((issued["kind"] == CALL_GRAPH).sum()), "graph_ops": sum(1 for op in device if op["in_graph"]),
    }


def _within(pieces: np.ndarray, lo: float, hi: float) -> float:
    """Time the disjoint, sorted `pieces` cover between lo and hi."""
    if not len(pieces):
        return 0.0
    return float(np.clip(np.minimum(pieces[:, 1], hi) - np.maximum(pieces[:, 0], lo), 0.0, None).sum())


def measured_summary(imported: Imported) -> dict:
    """profile.json's numbers for the steps the op list replays (module docstring)."""
    profile = imported.profile
    steps = [imported.found[i] for i in imported.kept]
    parts = [_step_measures(step) for step in steps]
    latency = np.array([p["latency"] for p in parts])
    window = float(latency.sum())
    busy = sum(p["busy"] for p in parts)
    path = {c: sum(p["path"][c] for p in parts) for c in CATEGORIES}
    path_total = sum(path.values())
    breakdown = np.array([path[c] / path_total if path_total > 0 else 0.0 for c in CATEGORIES])
    lanes = {"main": sum(p["main_busy"] for p in parts), "launch": sum(p["launch_lane"] for p in parts)}
    idle = sum(p["host_wait"] + p["device_wait"] for p in parts)
    delays = np.concatenate([np.asarray(p["delays"], dtype=float) for p in parts]) if parts else np.zeros(0)
    n = len(parts)
    summary: dict = {
        "step_ms_mean": float(latency.mean()) / US_PER_MS,
        "step_ms_p50": float(np.percentile(latency, 50)) / US_PER_MS,
        "step_ms_p99": float(np.percentile(latency, 99)) / US_PER_MS,
        **occupancy(breakdown, busy, lanes, window),
        "ops_per_step": float(np.mean([p["ops"] for p in parts])),
        "launches_per_step": float(np.mean([p["launches"] for p in parts])),
        # Graph launches and the device ops they replay: one launch holding every op is a whole-step
        # graph; several launches with ops between them are piecewise graphs (vLLM V1's default).
        "graph_launches_per_step": float(np.mean([p["graph_launches"] for p in parts])),
        "graph_ops_per_step": float(np.mean([p["graph_ops"] for p in parts])),
        "window_ms": window / US_PER_MS,
        # The device's own work a step (union of its tasks): what a prediction of the step's device time
        # compares with when the step also waited for work outside the trace (breakdown_external).
        "device_work_ms": busy / n / US_PER_MS,
        "steps_measured": n,
        **({"steps_note": p99_note(n, "a trace of more steps for a tail")} if n < MIN_SAMPLES_FOR_P99 else {}),
        **{f"breakdown_{c}": float(breakdown[i]) for i, c in enumerate(CATEGORIES)},
        "idle_host_wait_ms": sum(p["host_wait"] for p in parts) / n / US_PER_MS,
        "idle_device_wait_ms": sum(p["device_wait"] for p in parts) / n / US_PER_MS,
        "idle_host_wait_share": sum(p["host_wait"] for p in parts) / idle if idle > 0 else 0.0,
    }
    for category in ("framework", "launch", "alloc", "tiling", "copy", "sync", "sync_wait"):
        summary[f"host_ms_{category}"] = sum(p["host"].get(category, 0.0) for p in parts) / n / US_PER_MS
    if profile.dispatch == "async":
        summary["host_ms_launch_thread"] = lanes["launch"] / n / US_PER_MS
    if delays.size:
        summary.update(
            {
                "launch_to_start_us_mean": float(delays.mean()),
                "launch_to_start_us_p50": float(np.percentile(delays, 50)),
                "launch_to_start_us_p90": float(np.percentile(delays, 90)),
                "launch_to_start_us_p99": float(np.percentile(delays, 99)),
                "launch_to_start_us_max": float(delays.max()),
            }
        )
    return summary


def linkage(imported: Imported) -> dict:
    """How many device tasks the trace links to the host call that launched them."""
    profile = imported.profile
    issued = profile.calls[profile.calls["kind"].isin(ISSUING) & (profile.calls["key"] >= 0)]
    linked = profile.tasks["key"].isin(set(issued["key"].tolist()))
    launches = profile.calls["kind"].isin(ISSUING)
    return {
        "device_tasks": int(len(profile.tasks)),
        "device_tasks_linked": int(linked.sum()),
        "launch_calls": int(launches.sum()),
        "launch_calls_linked": int(profile.calls.loc[launches, "key"].isin(set(profile.tasks["key"].tolist())).sum()),
    }


def step_table(imported: Imported) -> list[dict]:
    """One record per step found: where it is, what it holds, whether the op list replays it."""
    rows = []
    for i, step in enumerate(imported.found):
        rows.append(
            {
                "step": i,
                "label": step.window.label,
                "start_ms": step.start_us / US_PER_MS,
                "end_ms": step.end_us / US_PER_MS,
                "latency_ms": (step.end_us - step.start_us) / US_PER_MS,
                "ops": int(np.sum(step.task_ids >= 0)),
                "replayed": i in imported.kept,
                "left_out": imported.left_out.get(i, ""),
            }
        )
    return rows


# ---------------------------------------------------------------- the peer analyser's figures

HTA_COMM = re.compile(r"^nccl.*Kernel")
HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
HTA_IDLE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "mtia_ccp_events"}
HTA_CONSECUTIVE_KERNEL_DELAY_US = 30.0


def _hta_is_compute(name: str) -> bool:
    return not HTA_COMM.match(name) and not HTA_MEMORY.match(name) and not HTA_NOT_COMPUTE.match(name)


def peer_breakdown(imported: Imported) -> dict | None:
    """HolisticTraceAnalysis 0.5's `get_temporal_breakdown` (idle / compute / non-compute % of its
    window: first start to last end of every event with a stream, whole-µs times) and
    `get_idle_time_breakdown` (per stream, gaps between consecutive device tasks: host wait when the
    next task's launch call started after the previous task ended, kernel wait when the gap is under
    30 µs, other otherwise; summed over streams), recomputed on the same file. None when HTA does not
    read the format (torch_npu's list-form trace_view.json); the percentages are None when the window
    is empty (every device event rounds to the same whole µs: nothing to take a share of)."""
    rows = imported.profile.peer_rows
    if rows is None or rows.empty:
        return None
    spans = rows[["start_us", "end_us"]].to_numpy()
    pieces = union(spans)
    window = float(pieces[-1, 1] - pieces[0, 0])
    busy = float((pieces[:, 1] - pieces[:, 0]).sum())
    compute_rows = rows[[_hta_is_compute(n) for n in rows["name"]]]
    compute_pieces = union(compute_rows[["start_us", "end_us"]].to_numpy())
    compute = float((compute_pieces[:, 1] - compute_pieces[:, 0]).sum()) if len(compute_pieces) else 0.0
    idle = window - busy
    waits = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    device_rows = rows[rows["cat"].isin(HTA_IDLE_CATS)]
    for _, stream_rows in device_rows.groupby("stream", sort=False):
        stream_rows = stream_rows.sort_values("start_us", kind="stable")
        previous_end = stream_rows["end_us"].to_numpy()[:-1]
        start = stream_rows["start_us"].to_numpy()[1:]
        launched = stream_rows["runtime_start_us"].to_numpy()[1:]
        gap = start - previous_end
        host = launched > previous_end  # NaN (no launch call) compares False
        kernel = ~host & (gap < HTA_CONSECUTIVE_KERNEL_DELAY_US)
        waits["host_wait"] += float(gap[host].sum())
        waits["kernel_wait"] += float(gap[kernel].sum())
        waits["other"] += float(gap[~host & ~kernel].sum())

    def share(part: float) -> float | None:
        return float(np.round(100.0 * part / window, 2)) if window > 0 else None

    return {
        "tool": "HolisticTraceAnalysis 0.5 definitions, recomputed",
        "window_ms": window / US_PER_MS,
        "idle_pct": share(idle),
        "compute_pct": share(compute),
        "non_compute_pct": share(window - compute - idle),
        "idle_host_wait_us": waits["host_wait"],
        "idle_kernel_wait_us": waits["kernel_wait"],
        "idle_other_us": waits["other"],
    }

