"""Strategy lowering: the ops of a step → host tasks, device tasks and copies with their edges.

Every op passes through the host stages framework → InferShape → Tiling → alloc → launch → free.
The dispatch mode decides which host lane (thread) runs each stage:

* eager:    all stages on one thread, op after op (kernel by kernel).
* async:    the main thread does framework + InferShape + Tiling; alloc + launch + free go through a
            bounded launch queue to a second thread, so alloc and free stay on one thread (seed 000).
* pipeline: InferShape | Tiling (Resize) | alloc + launch + free on three threads with bounded queues.

The device task of an op runs on its stream (compute, or communication for collectives) once the op
is launched and the ops it reads from have finished (an event when they ran on another stream). Per step: the host
issues an H2D copy of the input tokens before the first op, and the sampled tokens come back by D2H
and a blocking sync before the next step can start (decode steps depend on each other). A
value-dependent op's InferShape waits for the previous op's output (device end + D2H + sync); a
compute-dependent op drains the pipeline: nothing after it is issued before its output shape is
back on the host.

A bounded queue of capacity C between two threads is a dependency edge: the producer's first task
for item i waits for the consumer's first task of item i − C to end (the slot is taken by then).

The graph for one step is built once as a template, then tiled over the steps with numpy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.config import Dispatch, HardwareConfig, StrategyConfig
from harness.device import copy_time_us, device_times
from harness.graph import CATEGORY, LANE_COPY, LANE_DEVICE, LANE_HOST, NO_POOL, TASK_DTYPE, TaskGraph, csr_from_edges
from harness.workload import FLAG_COMPUTE_DEPENDENT, FLAG_VALUE_DEPENDENT, STREAM_COMM, STREAM_COMPUTE, TOKEN_ID_BYTES, Workload

HOST_STAGES = ("framework", "infer_shape", "tiling", "alloc", "launch", "free")
# Host costs by index: the stages, then the blocking sync (hardware.host.<name>_us each).
HOST_COSTS = (*HOST_STAGES, "sync")
SYNC_COST = HOST_COSTS.index("sync")
# Breakdown category of each stage: freeing is memory management, like allocation.
STAGE_CATEGORY = {"framework": "framework", "infer_shape": "infer_shape", "tiling": "tiling", "alloc": "alloc", "launch": "launch", "free": "alloc"}

# Host lanes of each dispatch mode, and the lane (index into them) that runs each stage.
HOST_LAYOUT: dict[Dispatch, tuple[tuple[str, ...], tuple[int, ...]]] = {
    Dispatch.eager: (("host.main",), (0, 0, 0, 0, 0, 0)),
    Dispatch["async"]: (("host.main", "host.launch"), (0, 0, 0, 1, 1, 1)),
    Dispatch.pipeline: (("host.infer", "host.tiling", "host.launch"), (0, 0, 1, 2, 2, 2)),
}

POOL_HOST, POOL_AI_CORES = 0, 1
VALUE_READ_BYTES = 64  # a value-dependent InferShape reads a small tensor (a shape, a count) back
SHAPE_READ_BYTES = 64  # a compute-dependent op's output shape copied back to the host

# Template duration sources: a host stage's cost, a device op's per-step time, a fixed copy time.
_FROM_HOST, _FROM_DEVICE, _FIXED = 0, 1, 2


class _StepTemplate:
    """The tasks and edges of one step, in local ids; lanes are FIFO in id order."""

    def __init__(self) -> None:
        self.lane: list[int] = []
        self.category: list[int] = []
        self.op: list[int] = []
        self.source: list[int] = []
        self.value: list[float] = []  # host stage index, op index or fixed duration, by source
        self.src: list[int] = []
        self.dst: list[int] = []

    def add(self, lane: int, category: str, op: int, source: int, value: float) -> int:
        self.lane.append(lane)
        self.category.append(CATEGORY[category])
        self.op.append(op)
        self.source.append(source)
        self.value.append(value)
        return len(self.lane) - 1

    def edge(self, src: int, dst: int) -> None:
        self.src.append(src)
        self.dst.append(dst)


@dataclass
class LoweredStep:
    """The task template of one step, with what tiling it over steps needs."""

    tpl: _StepTemplate
    lane_names: list[str]
    lane_kinds: np.ndarray
    queue_items: dict[tuple[int, int], tuple[list[int], list[int]]]
    h2d_copy: int
    token_back: int


def lower(
    workload: Workload,
    hardware: HardwareConfig,
    strategy: StrategyConfig,
    seed: int,
    step_release_us: np.ndarray | None = None,
) -> TaskGraph:
    """Build the task graph of the whole run (see `tile` for the arguments)."""
    return tile(build_template(workload, hardware, strategy), workload, hardware, strategy, seed, step_release_us=step_release_us)


def build_template(workload: Workload, hardware: HardwareConfig, strategy: StrategyConfig) -> LoweredStep:
    """Tasks and edges of one step: depends on the op list and the strategy, not on per-step sizes."""
    host_lanes, stage_lane = HOST_LAYOUT[strategy.dispatch]
    n_host = len(host_lanes)
    # Device streams follow the host lanes (compute, communication), then the two copy engines.
    stream_lane = {STREAM_COMPUTE: n_host, STREAM_COMM: n_host + 1}
    h2d, d2h = n_host + 2, n_host + 3
    lane_names = [*host_lanes, "device.stream0", "device.comm", "copy.h2d", "copy.d2h"]
    lane_kinds = np.array([LANE_HOST] * n_host + [LANE_DEVICE, LANE_DEVICE, LANE_COPY, LANE_COPY], dtype=np.int8)
    launch_stage = HOST_STAGES.index("launch")

    tpl = _StepTemplate()
    # queue_items[(a, b)] = (producer's first task on lane a, consumer's first task on lane b) per op.
    queue_items: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    issue_h2d = tpl.add(0, "launch", -1, _FROM_HOST, launch_stage)
    h2d_copy = tpl.add(h2d, "copy", -1, _FIXED, 0.0)  # per-step duration set below
    tpl.edge(issue_h2d, h2d_copy)
    device_task = np.full(workload.n_ops, -1, dtype=np.int64)
    for j in range(workload.n_ops):
        producers = [int(device_task[d]) for d in workload.after[j]]
        if workload.flags[j] & FLAG_VALUE_DEPENDENT and producers:
            _read_back(tpl, producers, d2h, j, copy_time_us(VALUE_READ_BYTES, hardware.link))
        first_on_lane: dict[int, int] = {}
        previous = -1
        for k, stage in enumerate(HOST_STAGES):
            lane = stage_lane[k]
            task = tpl.add(lane, STAGE_CATEGORY[stage], j, _FROM_HOST, k)
            if lane not in first_on_lane:
                first_on_lane[lane] = task
                if previous >= 0:
                    tpl.edge(previous, task)
                    producer_lane = tpl.lane[previous]
                    items = queue_items.setdefault((producer_lane, lane), ([], []))
                    items[0].append(first_on_lane[producer_lane])
                    items[1].append(task)
            if k == launch_stage:
                on_comm = workload.stream[j] == STREAM_COMM
                device_task[j] = tpl.add(stream_lane[int(workload.stream[j])], "comm" if on_comm else "compute", j, _FROM_DEVICE, j)
                tpl.edge(task, int(device_task[j]))
                for producer in producers:  # events between streams (redundant on one stream, harmless)
                    tpl.edge(producer, int(device_task[j]))
                if not producers:
                    tpl.edge(h2d_copy, int(device_task[j]))
            previous = task
        if workload.flags[j] & FLAG_COMPUTE_DEPENDENT:
            _read_back(tpl, [int(device_task[j])], d2h, j, copy_time_us(SHAPE_READ_BYTES, hardware.link))
    # The sampled tokens return to the host; the next step's inputs are built from them.
    token_back = _read_back(tpl, [int(device_task[-1])], d2h, -1, 0.0)
    return LoweredStep(tpl, lane_names, lane_kinds, queue_items, h2d_copy, token_back)


def tile(
    step: LoweredStep,
    workload: Workload,
    hardware: HardwareConfig,
    strategy: StrategyConfig,
    seed: int,
    first_step: int = 0,
    step_release_us: np.ndarray | None = None,
) -> TaskGraph:
    """The template repeated over the workload's steps, with each step's durations and AI cores.

    Step s may not start before step_release_us[s] (requests not yet arrived), nor before every task
    of step s − 1 has ended: steps are separated by a barrier, so a step's timing depends only on
    its own sizes and its start. Host jitter of step s is drawn from a generator seeded with
    (seed, first_step + s), so simulating steps one at a time or all at once gives the same numbers.
    """
    tpl, h2d_copy, token_back = step.tpl, step.h2d_copy, step.token_back
    host = hardware.host
    host_cost_us = np.array([getattr(host, f"{name}_us") for name in HOST_COSTS], dtype=np.float64)
    steps = workload.steps
    m = len(tpl.lane)
    offsets = (np.arange(steps, dtype=np.int64) * m)[:, None]
    source = np.array(tpl.source, dtype=np.int8)
    value = np.array(tpl.value, dtype=np.float64)
    tasks = np.zeros(steps * m, dtype=TASK_DTYPE)
    tasks["lane"] = np.tile(np.array(tpl.lane, dtype=np.int32), steps)
    tasks["category"] = np.tile(np.array(tpl.category, dtype=np.int8), steps)
    tasks["op"] = np.tile(np.array(tpl.op, dtype=np.int32), steps)
    tasks["step"] = np.repeat(np.arange(steps, dtype=np.int32), m)

    is_host = source == _FROM_HOST
    is_device = source == _FROM_DEVICE
    duration = np.empty((steps, m), dtype=np.float64)
    duration[:, source == _FIXED] = value[source == _FIXED]
    host_us = host_cost_us[value[is_host].astype(np.int64)]
    duration[:, is_host] = host_us * _jitter(seed, first_step, host.jitter_cv, (steps, int(is_host.sum())))
    device_ops = value[is_device].astype(np.int64)
    device_us, device_cores = device_times(workload, hardware)
    duration[:, is_device] = device_us[:, device_ops]
    duration[:, h2d_copy] = [copy_time_us(t * 2 * TOKEN_ID_BYTES, hardware.link) for t in workload.tokens]
    duration[:, token_back] = [copy_time_us(t * TOKEN_ID_BYTES, hardware.link) for t in workload.tokens_out]
    tasks["duration_us"] = duration.ravel()
    if step_release_us is not None:
        tasks["release_us"][offsets[:, 0]] = step_release_us  # the step's first task

    pool = np.full((steps, m), NO_POOL, dtype=np.int32)
    units = np.zeros((steps, m), dtype=np.int32)
    pool[:, is_host] = POOL_HOST
    units[:, is_host] = 1
    units[:, is_device] = device_cores[:, device_ops]
    pool[:, is_device] = np.where(units[:, is_device] > 0, POOL_AI_CORES, NO_POOL)  # collectives hold no AI core
    tasks["pool"] = pool.ravel()
    tasks["units"] = units.ravel()

    src = [(np.array(tpl.src, dtype=np.int64)[None, :] + offsets).ravel()]
    dst = [(np.array(tpl.dst, dtype=np.int64)[None, :] + offsets).ravel()]
    # Barrier: the first task of step s + 1 waits for the last task of every lane in step s.
    lanes = np.array(tpl.lane)
    last_on_lane = np.array([np.flatnonzero(lanes == lane).max() for lane in np.unique(lanes) if lane != 0], dtype=np.int64)
    src.append((last_on_lane[None, :] + offsets[:-1]).ravel())
    dst.append(np.repeat(offsets[1:, 0], last_on_lane.size))
    capacity = strategy.queue_capacity
    for producers, consumers in step.queue_items.values():
        producer_ids = (np.array(producers, dtype=np.int64)[None, :] + offsets).ravel()
        consumer_ids = (np.array(consumers, dtype=np.int64)[None, :] + offsets).ravel()
        if producer_ids.size > capacity:
            src.append(consumer_ids[:-capacity])
            dst.append(producer_ids[capacity:])
    dep_ptr, dep_idx = csr_from_edges(steps * m, np.concatenate(src), np.concatenate(dst))
    return TaskGraph(
        tasks=tasks,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        lane_names=step.lane_names,
        lane_kinds=step.lane_kinds,
        pool_names=["host_cores", "ai_cores"],
        pool_capacity=np.array([host.threads, hardware.device.ai_cores], dtype=np.int64),
        op_names=list(workload.op_names),
    )


def _read_back(tpl: _StepTemplate, device_tasks: list[int], d2h_lane: int, op: int, copy_us: float) -> int:
    """D2H copy after `device_tasks`, then a blocking sync on the first host lane; returns the copy."""
    copy = tpl.add(d2h_lane, "copy", op, _FIXED, copy_us)
    for task in device_tasks:
        tpl.edge(task, copy)
    sync = tpl.add(0, "sync", op, _FROM_HOST, SYNC_COST)
    tpl.edge(copy, sync)
    return copy


def _jitter(seed: int, first_step: int, cv: float, shape: tuple[int, int]) -> np.ndarray:
    """Lognormal multipliers with mean 1 and coefficient of variation cv, one generator per step."""
    if cv == 0:
        return np.ones(shape)
    sigma2 = np.log1p(cv * cv)
    return np.stack(
        [
            np.random.default_rng([seed, first_step + s]).lognormal(mean=-sigma2 / 2, sigma=np.sqrt(sigma2), size=shape[1])
            for s in range(shape[0])
        ]
    )
