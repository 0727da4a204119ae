"""Metrics: pure functions of the engine's result → the summary.json numbers and the per-step table.

The measured steps are those after the warm-up that do not build a graph. "Device busy" is the union
of device-stream task intervals within them (the device is idle only when no stream runs anything),
each from where its work begins: the front end's gap before a kernel is idle, as a profiler shows it;
the bubble ratio is its complement over the window. The breakdown splits the critical path of each
measured step by task category; it sums to 1 because a step's path covers it without gaps.

`StepMeasures.of` reduces a simulated span of steps (a chunk of a long run) to per-step numbers;
`summarize` turns the joined measures of a run into the summary and the steps table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from harness.config.schema import Phase
from harness.sim.outcome import ALL_BUILDS_NOTE
from harness.sim.busy import BusyTime
from harness.sim.kernel import SimulationResult
from harness.sim.task_graph import CATEGORIES, CATEGORY, LANE_DEVICE, LANE_HOST
from harness.sim.lowering import HOST_STAGES
from harness.sim.policies import BUILD, MODE_NAMES, StepPlan, measured_mask
from harness.model.ops import HOST_ONLY_KINDS, Workload

# Fewer samples than this and a p99 is little more than their maximum: the summary says so (steps here,
# finished requests in a serving run).
MIN_SAMPLES_FOR_P99 = 20

US_PER_MS = 1e3
HOST_CATEGORIES = ("framework", "infer_shape", "tiling", "alloc", "launch", "sync", "graph", "cpu", "engine")


@njit(cache=True, nogil=True)
def _merge_lanes(lane, take, key, n_lanes):
    """Ids of the taken tasks in increasing `key`, for a key that increases along each lane (start or
    end times: lanes are FIFO). A merge of the lanes: O(tasks × lanes), no sort."""
    ptr = np.zeros(n_lanes + 1, np.int64)
    for i in range(lane.shape[0]):
        if take[i]:
            ptr[lane[i] + 1] += 1
    for k in range(n_lanes):
        ptr[k + 1] += ptr[k]
    fill = ptr[:-1].copy()
    by_lane = np.empty(ptr[n_lanes], np.int64)
    for i in range(lane.shape[0]):
        if take[i]:
            by_lane[fill[lane[i]]] = i
            fill[lane[i]] += 1
    head = ptr[:-1].copy()
    order = np.empty(ptr[n_lanes], np.int64)
    for e in range(order.shape[0]):
        best = -1
        for k in range(n_lanes):
            if head[k] < ptr[k + 1] and (best < 0 or key[by_lane[head[k]]] < key[by_lane[head[best]]]):
                best = k
        order[e] = by_lane[head[best]]
        head[best] += 1
    return order


@njit(cache=True, nogil=True)
def _lanes_union(start, end, lane, selected):
    """The union of the intervals of the tasks on the selected lanes, as disjoint groups in order."""
    if np.sum(selected) == 1:  # one FIFO lane: its tasks in id order are already in start order
        order = np.flatnonzero(lane == np.argmax(selected))
    else:
        take = np.empty(lane.shape[0], np.bool_)
        for i in range(lane.shape[0]):
            take[i] = selected[lane[i]]
        order = _merge_lanes(lane, take, start, selected.shape[0])
    group_start = np.empty(order.shape[0], np.float64)
    group_end = np.empty(order.shape[0], np.float64)
    g = -1
    for i in order:
        if g < 0 or start[i] > group_end[g]:
            g += 1
            group_start[g] = start[i]
            group_end[g] = end[i]
        elif end[i] > group_end[g]:
            group_end[g] = end[i]
    return group_start[: g + 1], group_end[: g + 1]


def busy_of_lanes(result: SimulationResult, lanes, held: bool = False) -> BusyTime:
    """Busy time of the tasks on `lanes` (lane ids) of a simulated graph, without sorting them: their work,
    or (`held`) the whole time each holds its lane, the device front end's lead included."""
    selected = np.zeros(len(result.graph.lane_names), dtype=np.bool_)
    selected[np.asarray(lanes, dtype=np.int64)] = True
    start = result.start_us if held else result.work_start_us
    return BusyTime.of_groups(*_lanes_union(start, result.end_us, result.column("lane"), selected))


def step_bounds(result: SimulationResult) -> tuple[np.ndarray, np.ndarray]:
    """(start_us, end_us) of each step: it ends when its last task ends; it starts when the previous
    step ended, or at its release if the server was idle until then (waiting for requests)."""
    step = result.column("step")
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    end = np.maximum.reduceat(result.end_us, first)
    start = np.maximum(np.r_[0.0, end[:-1]], result.graph.tasks["release_us"][first])
    return start, end


@dataclass
class StepMeasures:
    """Per-step numbers of the steps a simulation result holds (µs). A long run is simulated in chunks
    of steps; their measures are joined with `concat` and summarised once."""

    start_us: np.ndarray
    end_us: np.ndarray
    device_busy_us: np.ndarray
    front_end_idle_us: np.ndarray  # device idle while a stream's next kernel is in its front-end gap
    host_busy_us: dict[str, np.ndarray]  # per host thread that ran anything
    path_us: np.ndarray  # (steps, categories): the step's critical path by category
    task_us: np.ndarray  # (steps, categories): all the step's task time by category
    launches: np.ndarray
    peak_activation_bytes: float  # live activations are freed within their step (steps end in a barrier)
    tasks: int

    @staticmethod
    def of(result: SimulationResult, workload: Workload) -> "StepMeasures":
        graph = result.graph
        step_start, step_end = step_bounds(result)
        device_lanes = np.flatnonzero(graph.lane_kinds == LANE_DEVICE)
        device_busy = busy_of_lanes(result, device_lanes).between(step_start, step_end)
        # Idle only because a stream's next kernel is in its front end (no stream works, one is held).
        front_end_idle = busy_of_lanes(result, device_lanes, held=True).between(step_start, step_end) - device_busy
        used_lanes = np.bincount(result.column("lane"), minlength=len(graph.lane_names)) > 0
        host_busy = {
            graph.lane_names[lane]: busy_of_lanes(result, [lane]).between(step_start, step_end)
            for lane in np.flatnonzero((graph.lane_kinds == LANE_HOST) & used_lanes)
        }
        step = result.column("step")
        # Kernel launches and graph triggers (the launch stage); the per-step H2D issue of the input
        # tokens is a copy call and does not count.
        launches = np.bincount(step[result.column("stage") == LAUNCH_STAGE] - step.min(), minlength=step_start.size)
        path_us, task_us = result.step_category_us()
        return StepMeasures(
            start_us=step_start,
            end_us=step_end,
            device_busy_us=device_busy,
            front_end_idle_us=front_end_idle,
            host_busy_us=host_busy,
            path_us=path_us,
            task_us=task_us,
            launches=launches,
            peak_activation_bytes=peak_activation_bytes(result, workload),
            tasks=result.graph.n_tasks,
        )

    @staticmethod
    def concat(parts: list["StepMeasures"]) -> "StepMeasures":
        lanes = list(dict.fromkeys(name for p in parts for name in p.host_busy_us))
        return StepMeasures(
            start_us=np.concatenate([p.start_us for p in parts]),
            end_us=np.concatenate([p.end_us for p in parts]),
            device_busy_us=np.concatenate([p.device_busy_us for p in parts]),
            front_end_idle_us=np.concatenate([p.front_end_idle_us for p in parts]),
            host_busy_us={
                name: np.concatenate([p.host_busy_us.get(name, np.zeros(p.start_us.size)) for p in parts]) for name in lanes
            },
            path_us=np.concatenate([p.path_us for p in parts]),
            task_us=np.concatenate([p.task_us for p in parts]),
            launches=np.concatenate([p.launches for p in parts]),
            peak_activation_bytes=max(p.peak_activation_bytes for p in parts),
            tasks=sum(p.tasks for p in parts),
        )


def p99_note(steps: int, remedy: str) -> str:
    """What a step p99 over fewer than MIN_SAMPLES_FOR_P99 steps is (a run's, a profile's)."""
    return f"step p99 over {steps} measured step(s), fewer than {MIN_SAMPLES_FOR_P99}: about their maximum ({remedy})"


def measured_steps(workload: Workload, plan: StepPlan | None = None) -> np.ndarray:
    """Which steps the summary measures (policies.measured_mask)."""
    mode = plan.mode if plan is not None else np.zeros(workload.steps, dtype=np.int8)
    return measured_mask(workload.warmup_steps, mode)


def summarize(measures: StepMeasures, workload: Workload, plan: StepPlan | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """The summary (flat dict) and one row per step (the steps table's columns: RunResult.step_columns).

    Measured steps: those after the warm-up that do not build a graph (capture or sink load are
    reported apart, as `capture_ms`). The window runs from the first measured step's start to the
    last one's end, less the build steps inside it; idle time waiting for requests stays in it.
    """
    step_start, step_end = measures.start_us, measures.end_us
    latency_us = step_end - step_start
    mode = plan.mode if plan is not None else np.zeros(workload.steps, dtype=np.int8)
    index = np.arange(workload.steps)
    measured = measured_steps(workload, plan)
    first, last = np.flatnonzero(measured)[[0, -1]]
    inside = (index > first) & (index < last) & ~measured
    window_us = float(step_end[last] - step_start[first] - latency_us[inside].sum())

    device_step_us = measures.device_busy_us
    device_busy_us = float(device_step_us[measured].sum())
    host_step_us = measures.host_busy_us
    host_busy_us = {name: float(v[measured].sum()) for name, v in host_step_us.items()}

    per_category = measures.path_us[measured].sum(axis=0)
    path_us = float(per_category.sum())
    breakdown = per_category / path_us if path_us > 0 else per_category

    tokens_per_step = workload.tokens_out if workload.phase == Phase.decode else workload.prompt_tokens
    launches_per_step = measures.launches
    latency_ms = latency_us / US_PER_MS
    summary: dict = {
        "throughput_tok_s": float(tokens_per_step[measured].sum()) / (window_us / 1e6) if window_us > 0 else 0.0,
        "step_ms_mean": float(latency_ms[measured].mean()),
        "step_ms_p50": float(np.percentile(latency_ms[measured], 50)),
        "step_ms_p99": float(np.percentile(latency_ms[measured], 99)),
    }
    if workload.phase == Phase.prefill:
        summary["ttft_ms"] = float(latency_ms[measured].mean())  # each prefill step yields its batch's first token
    summary.update(occupancy(breakdown, device_busy_us, host_busy_us, window_us))
    # The part of the bubble the device front end makes (gaps before queued kernels, graph nodes'
    # dispatch); the rest is the device waiting for work: the host, a copy, a sync, a request.
    front_end_idle_us = float(measures.front_end_idle_us[measured].sum())
    summary["bubble_front_end"] = front_end_idle_us / window_us if window_us > 0 else 0.0
    summary.update(
        {
            # Ops on host cores (heterogeneous execution) are no kernels: mindspore's sampling ran on the CPU and counted.
            "ops_per_step": workload.n_kernels_per_step - (int(np.count_nonzero(plan.cpu_ops & ~np.isin(workload.kind, HOST_ONLY_KINDS)))
                                                            if plan is not None else 0),
            "launches_per_step": float(launches_per_step[measured].mean()),
            "tasks_simulated": measures.tasks,
            "window_ms": window_us / US_PER_MS,
            "steps_measured": int(measured.sum()),
        }
    )
    notes = []
    if np.all(mode[measured] == BUILD):  # nothing but graph builds to measure (measured_steps' fallback)
        notes.append(ALL_BUILDS_NOTE)
    if measured.sum() < MIN_SAMPLES_FOR_P99:
        notes.append(p99_note(int(measured.sum()), "raise workload.steps for a tail"))
    if notes:
        summary["steps_note"] = "; ".join(notes)
    if plan is not None and np.any(mode == BUILD):
        summary["capture_ms"] = float(latency_ms[mode == BUILD].sum())
    summary["peak_activation_gb"] = measures.peak_activation_bytes / 1e9
    summary.update({f"breakdown_{name}": float(breakdown[i]) for i, name in enumerate(CATEGORIES)})
    # Where all the time goes, overlapped or not (a profiler's "time by category" table).
    task_us = measures.task_us[measured].sum(axis=0)
    task_total_us = float(task_us.sum())
    # No task's work is a front-end gap: the shares of task time leave that category out.
    summary.update({f"time_share_{name}": float(task_us[i] / task_total_us) if task_total_us > 0 else 0.0
                    for i, name in enumerate(CATEGORIES) if name != "front_end"})
    summary["task_ms_per_step"] = task_total_us / US_PER_MS / max(int(measured.sum()), 1)

    steps_table: dict[str, np.ndarray] = {
        "step": index,
        "measured": measured,
        "mode": np.array([MODE_NAMES[int(m)] for m in mode], dtype=object),
        "start_ms": step_start / US_PER_MS,
        "end_ms": step_end / US_PER_MS,
        "latency_ms": latency_ms,
        "kv_len": workload.real_kv_len,
        "padded_kv_len": workload.kv_len,
        "batch": workload.real_batch,
        "padded_batch": workload.batch,
        "tokens": tokens_per_step,
        "device_busy_ms": device_step_us / US_PER_MS,
        "front_end_idle_ms": measures.front_end_idle_us / US_PER_MS,
    }
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero-length step: inf or NaN, as a table shows it
        steps_table["bubble_ratio"] = 1.0 - steps_table["device_busy_ms"] / steps_table["latency_ms"]
    for name, busy_us in host_step_us.items():
        steps_table[f"{name}_busy_ms"] = busy_us / US_PER_MS
    steps_table["launches"] = launches_per_step
    return summary, steps_table


# Values of the tasks' `stage` field (HOST_STAGES index + 1).
ALLOC_STAGE, LAUNCH_STAGE, FREE_STAGE = (HOST_STAGES.index(s) + 1 for s in ("alloc", "launch", "free"))


@njit(cache=True, nogil=True)
def _peak_live_bytes(end, lane, stage, step, op, size, n_lanes, alloc_stage, free_stage):
    """Most bytes live at once, given alloc/free tasks (an op's outputs live from its alloc's end to its
    free's end); events at one time count together, frees before allocs."""
    take = np.empty(end.shape[0], np.bool_)
    for i in range(end.shape[0]):
        take[i] = stage[i] == alloc_stage or stage[i] == free_stage
    order = _merge_lanes(lane, take, end, n_lanes)
    live = 0.0
    peak = 0.0
    for e in range(order.shape[0]):
        i = order[e]
        if stage[i] == free_stage:
            live -= size[step[i], op[i]]
        else:
            live += size[step[i], op[i]]
        if e == order.shape[0] - 1 or end[order[e + 1]] > end[i]:  # the level after the time's last event
            peak = max(peak, live)
    return peak


def peak_activation_bytes(result: SimulationResult, workload: Workload) -> float:
    """Most activation memory live at once: an op's outputs count from its alloc's end to its free's end
    (at equal times memory is released before it is taken)."""
    return float(
        _peak_live_bytes(
            result.end_us, result.column("lane"), result.column("stage"), result.column("step"), result.column("op"),
            workload.activation_bytes(), len(result.graph.lane_names), ALLOC_STAGE, FREE_STAGE,
        )
    )


def occupancy(breakdown: np.ndarray, device_busy_us: float, host_busy_us: dict, window_us: float) -> dict:
    """Bubble, device and host busy, and the bound verdict of a window of steps: one rule for simulated
    steps and for a profile's measured ones (`breakdown`: critical-path shares by CATEGORIES)."""
    host_share = float(sum(breakdown[CATEGORY[c]] for c in HOST_CATEGORIES))
    bubble = 1.0 - device_busy_us / window_us if window_us > 0 else 0.0
    return {
        "bubble_ratio": bubble,
        "device_busy": 1.0 - bubble,
        "host_busy_max": max(host_busy_us.values()) / window_us if window_us > 0 else 0.0,
        "host_cpu_load": sum(host_busy_us.values()) / window_us if window_us > 0 else 0.0,
        "bound": "host" if host_share > 0.5 else "device",
        "bound_reason": bound_reason(host_share, breakdown, bubble),
    }


def bound_reason(host_share: float, breakdown: np.ndarray, bubble: float) -> str:
    host_side = host_share > 0.5
    names = HOST_CATEGORIES if host_side else tuple(c for c in CATEGORIES if c not in HOST_CATEGORIES)
    top = sorted(names, key=lambda c: -breakdown[CATEGORY[c]])[:3]
    parts = ", ".join(f"{c} {breakdown[CATEGORY[c]]:.0%}" for c in top if breakdown[CATEGORY[c]] > 0)
    # The device side holds more than the kernels' work: their front-end gaps, a wait for work outside a trace.
    side = "host work" if host_side else "device time"
    share = host_share if host_side else 1.0 - host_share
    reason = f"{side} is {share:.0%} of the critical path ({parts}); device idle {bubble:.0%} of the window"
    external = breakdown[CATEGORY["external"]]
    if external > 0.5:  # neither this host nor this device's own work: say so rather than "device-bound"
        reason += f"; {external:.0%} is the device waiting for work outside the trace (another stream, process or step)"
    return reason
