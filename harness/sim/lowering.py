"""Strategy lowering: the ops of a step → host tasks, device tasks and copies with their edges.

Host scheduling (a step in EAGER or BUILD mode): every op passes through the host stages
framework → InferShape → Tiling → alloc → launch → free. The dispatch mode decides which host lane
(thread) runs each stage:

* eager:    all stages on one thread, op after op (kernel by kernel).
* async:    the main thread does framework + InferShape + Tiling; alloc + launch + free go through a
            bounded launch queue to a second thread, so alloc and free stay on one thread (seed 000).
* pipeline: InferShape | Tiling (Resize) | alloc + launch + free on three threads with bounded queues.

The device task of an op runs on its stream (compute, or communication for collectives) once the op
is launched and the ops it reads from have finished (an event when they ran on another stream).
Per step: the host issues an H2D copy of the input tokens before the first op, and the sampled
tokens come back by D2H and a blocking sync. A value-dependent op's InferShape waits for its
producer's output (device end + D2H + sync); a compute-dependent op drains the pipeline: nothing
after it is issued before its output shape is back on the host. An op run on the CPU
(heterogeneous execution) is dispatched (framework + InferShape), computes on a host CPU lane
between a D2H of its input and an H2D of its result, and holds a host core like the dispatch threads.

Ops of an imported profile carry measured host costs per step (a (step, op, cost) table replaces the
preset's), and may be: a `sync` op (its framework time, then a blocking wait for the ops it names,
then its own time); a follower in a launch group (no host work: its device task waits for the
group's launch, e.g. the kernels of a graph launch, which also pay the device-side dispatch); carried
in (device work launched before the step: no host work); or waiting for unseen device work (a task
on the external lane holds its start until `not_before_us` after the step starts). Such op lists hold
their own copies and syncs: no token copies are added around the step (`Workload.step_io`).

Policies change host costs: a tiling-cache hit replaces Tiling by a lookup; parameter packing writes
a kernel's parameters at once; without a memory pool every alloc/free goes to the driver, and
stream-local pools make them cheaper.

Graph steps (policies.py decides the mode of each step): BUILD = host scheduling plus the one-time
capture (or sink load) on the main thread; REPLAY = the host refreshes the arguments of dynamic tasks
(capture) or the graph's addresses (sink), then issues one launch; the device schedules every task
itself at `task_dispatch_us` each, keeping streams and events (so communication still overlaps). A
kernel launched on its own pays the device front end's `kernel_gap_us` instead, and the graph's
`exit_gap_us` on top when it follows a graph's tasks on its stream (leaving a graph: the eager attention
between piecewise graphs). Like a graph task's dispatch, the gap is the task's `lead_us`: its stream is
held, the device idle (busy time counts from the work's start, as a profiler shows it).

A bounded queue of capacity C between two threads is a dependency edge: the producer's first task
for item i waits for the consumer's first task of item i − C to end (the slot is taken by then).
Steps are separated by a barrier: the first task of step s + 1 waits for every lane's last task of
step s (and for its release time), so a step's timing depends only on its own sizes and its start.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from harness.config.schema import Dispatch, EngineConfig, GraphMode, HardwareConfig, RunConfig, StrategyConfig
from harness.model.device import copy_time_us, device_times
from harness.sim.task_graph import CATEGORY, LANE_COPY, LANE_DEVICE, LANE_EXTERNAL, LANE_HOST, NO_POOL, TASK_DTYPE, TaskGraph, csr_from_edges
from harness.sim.policies import BUILD, REPLAY, StepPlan, graph_piece_of
from harness.model.ops import (
    FLAG_CARRIED_IN,
    FLAG_COMPUTE_DEPENDENT,
    FLAG_DYNAMIC,
    FLAG_IN_GRAPH,
    FLAG_ROUTED,
    FLAG_VALUE_DEPENDENT,
    HOST_COSTS,
    KIND_COPY,
    KIND_HOST,
    KIND_SYNC,
    STREAM_COMM,
    TOKEN_ID_BYTES,
    Workload,
)

HOST_STAGES = ("framework", "infer_shape", "tiling", "alloc", "launch", "free")
assert HOST_COSTS[: len(HOST_STAGES)] == HOST_STAGES
OWN = HOST_COSTS.index("own")  # the host time of a host or sync op, after the stages in a cost table
# Breakdown category of each stage: freeing is memory management, like allocation.
STAGE_CATEGORY = {"framework": "framework", "infer_shape": "infer_shape", "tiling": "tiling", "alloc": "alloc", "launch": "launch", "free": "alloc"}
CPU_OP_STAGES = ("framework", "infer_shape")  # an op run on the CPU is dispatched, not launched

# Host lanes of each dispatch mode, and the lane (index into them) that runs each stage.
HOST_LAYOUT: dict[Dispatch, tuple[tuple[str, ...], tuple[int, ...]]] = {
    Dispatch.eager: (("host.main",), (0, 0, 0, 0, 0, 0)),
    Dispatch["async"]: (("host.main", "host.launch"), (0, 0, 0, 1, 1, 1)),
    Dispatch.pipeline: (("host.infer", "host.tiling", "host.launch"), (0, 0, 1, 2, 2, 2)),
}

POOL_HOST, POOL_AI_CORES = 0, 1
JITTER_STREAM = 0  # generator streams: (seed, 0, step) host jitter; (seed, 1) serving requests
VALUE_READ_BYTES = 64  # a value-dependent InferShape reads a small tensor (a shape, a count) back
SHAPE_READ_BYTES = 64  # a compute-dependent op's output shape copied back to the host

# Where a template task's duration comes from: a fixed value; the op's device time (plus the
# device-side dispatch of a graph task); its tiling (after the cache); a host stage or the own time
# of a host/sync op from the (step, op) cost table; the token copies; a CPU op's compute or copy; the
# wait for device work outside the simulation (an imported profile's `not_before_us`); a kernel launched
# on its own right after a graph's tasks on its stream (its device time plus the graph's exit gap).
_FIXED, _DEVICE, _TILING, _H2D_TOKENS, _D2H_TOKENS, _CPU_COMPUTE, _CPU_COPY = 0, 1, 2, 3, 4, 5, 6
_STAGE, _OWN, _GATE, _DEVICE_GRAPH, _ENGINE, _DEVICE_AFTER_GRAPH = 7, 8, 9, 10, 11, 12

# The serving engine's work in a step (harness.config.schema.EngineConfig), as slots of a (steps, slots) cost
# table: schedule + prepare before the model (`pre`) or, with async scheduling, the next step's while
# this one's device work runs (`ahead`); host-side sampling; output processing and the API server,
# on the engine's main thread after the step (`*_inline`) or on lanes of their own, processing the
# previous step's outputs while this one runs (`*_side`).
ENGINE_SLOTS = ("pre", "ahead", "sample", "output_inline", "output_side", "api_inline", "api_side")
ENGINE_SLOT = {name: k for k, name in enumerate(ENGINE_SLOTS)}


@dataclass
class StepTemplate:
    """The tasks and edges of one step, in local ids; lanes are FIFO in id order."""

    lane: list[int] = field(default_factory=list)
    category: list[int] = field(default_factory=list)
    op: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)  # duration (fixed), op index (device / tiling)
    host: list[bool] = field(default_factory=list)  # host work: gets host jitter and the host's speed
    # holds one of the dispatching process's cores (hardware.host.threads): host work but an engine process's own
    pooled: list[bool] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    # (producer lane, consumer lane) → (producer's first task, consumer's first task) per op
    queue_items: dict = field(default_factory=dict)

    stage: list[int] = field(default_factory=list)

    def add(self, lane: int, category: str, op: int, source: int, value: float, host: bool = False, stage: int = 0,
            own_process: bool = False) -> int:
        self.stage.append(stage)
        self.pooled.append(host and not own_process)
        self.lane.append(lane)
        self.category.append(CATEGORY[category])
        self.op.append(op)
        self.source.append(source)
        self.value.append(value)
        self.host.append(host)
        return len(self.lane) - 1

    def edge(self, src: int, dst: int) -> None:
        self.src.append(src)
        self.dst.append(dst)


@dataclass
class Lanes:
    names: list[str]
    kinds: np.ndarray
    stage_lane: tuple[int, ...]
    stream: dict[int, int]
    cpu: int
    h2d: int
    d2h: int
    external: int = -1  # waits for device work outside the simulation (-1: none in this workload)
    engine_output: int = -1  # the engine's output processing thread or process (-1: on the main thread)
    engine_api: int = -1  # the engine's API server process (-1: on the main thread)


def lanes_for(strategy: StrategyConfig, workload: Workload | None = None, engine: EngineConfig | None = None) -> Lanes:
    """Host threads of the dispatch mode, the CPU-op lane, one lane per device stream the workload
    uses (at least compute and communication), the copy engines, and the external-wait lane when the
    workload has waits for unseen device work."""
    host_lanes, stage_lane = HOST_LAYOUT[strategy.dispatch]
    n = len(host_lanes)
    n_streams = max(2, int(workload.stream.max()) + 1) if workload is not None and workload.n_ops else 2
    streams = ["device.stream0", "device.comm", *(f"device.stream{k}" for k in range(2, n_streams))]
    names = [*host_lanes, "host.cpu_ops", *streams, "copy.h2d", "copy.d2h"]
    kinds = [LANE_HOST] * (n + 1) + [LANE_DEVICE] * n_streams + [LANE_COPY, LANE_COPY]
    external = -1
    if workload is not None and workload.not_before_us is not None and np.any(~np.isnan(workload.not_before_us)):
        external = len(names)
        names.append("device.unseen")
        kinds.append(LANE_EXTERNAL)
    engine_output = engine_api = -1
    if engine is not None and engine.active:
        if engine.async_output or engine.output_process:
            engine_output = len(names)
            names.append("engine.output")
            kinds.append(LANE_HOST)
        if engine.api_process:
            engine_api = len(names)
            names.append("engine.api")
            kinds.append(LANE_HOST)
    first_stream = n + 1
    return Lanes(
        names, np.array(kinds, dtype=np.int8), stage_lane, {k: first_stream + k for k in range(n_streams)},
        n, first_stream + n_streams, first_stream + n_streams + 1, external, engine_output, engine_api,
    )


def host_stage_costs(workload: Workload, hardware: HardwareConfig, strategy: StrategyConfig) -> dict[str, np.ndarray]:
    """Cost (µs) of each host stage for each op, with the launch and memory policies applied."""
    host = hardware.host
    n = workload.n_ops
    costs = {stage: np.full(n, float(getattr(host, f"{stage}_us"))) for stage in HOST_STAGES}
    # launch_us covers a kernel with `kernel_params` parameters written one by one.
    base_launch = host.launch_us - host.kernel_params * host.param_write_us
    if strategy.param_packing:
        costs["launch"] = np.full(n, base_launch + host.packed_params_us)
    else:
        costs["launch"] = base_launch + workload.n_kernels * host.kernel_params * host.param_write_us
    memory_scale = 1.0 - host.stream_pool_speedup if strategy.stream_local_pool else 1.0
    for stage in ("alloc", "free"):
        cost = costs[stage] if strategy.memory_pool else np.full(n, host.driver_alloc_us)
        costs[stage] = cost * memory_scale
    # A copy (aclrtMemcpyAsync, cudaMemcpyAsync) has no kernel to tile: no Tiling stage, and so nothing
    # for the tiling cache to look up (policies.prepare leaves copies out of its lookups).
    costs["tiling"][workload.kind == KIND_COPY] = 0.0
    return costs


def engine_in_effect(run: RunConfig) -> tuple[RunConfig, str]:
    """The run with the engine as it runs under the run's strategy, and what that changed ('' if nothing):
    an engine whose asynchronous output processing needs graphs (vLLM 0.6 turns it off with enforce_eager
    on CUDA: vllm/config.py ModelConfig.verify_async_output_proc, v0.6.3) processes outputs inline when
    the run's phase is not replayed from captured graphs."""
    engine, graph = run.engine, run.strategy.graph
    graphs = graph.mode == GraphMode.capture and run.workload.phase in graph.phases
    if engine is None or not engine.active or not engine.async_output or not engine.async_output_needs_graphs or graphs:
        return run, ""
    note = f"engine {engine.name} runs eagerly here, which turns its asynchronous output processing off (vLLM 0.6: enforce_eager)"
    return dataclasses.replace(run, engine=dataclasses.replace(engine, async_output=False)), note


def engine_cost_table(workload: Workload, engine: EngineConfig | None) -> np.ndarray:
    """(steps, ENGINE_SLOTS) µs of the serving engine's work in each step of `workload` (engine_costs)."""
    return engine_costs(workload.real_batch, workload.tokens, engine)


def engine_costs(real_batch: np.ndarray, step_tokens: np.ndarray, engine: EngineConfig | None, first_step: int = 0,
                 idle_us: np.ndarray | None = None, scheduled_here: np.ndarray | None = None) -> np.ndarray:
    """(steps, ENGINE_SLOTS) µs of the serving engine's work in each step (see ENGINE_SLOTS), from each
    step's sequences and tokens. `first_step`: the run's number of the first step given (it must start a
    multi-step block); a row needs only its own block and the one before (serving asks for one row at a
    time).

    Costs follow each step's sequences and tokens. With `multi_step` N, scheduling and preparation
    happen on the first step of every N, and outputs (and their API streaming) are processed together
    on the last, in one call (its fixed part paid once); off the main thread (`async_output`,
    `output_process`, `api_process`), that call's work is shared by the next block's N steps. Work a
    step does for its neighbour is priced at batches already known: the previous block's outputs at that
    block's, the next step's scheduling (`async_scheduling`) at this step's, so a step's cost never
    depends on later steps. `idle_us`: how long a serving engine sat idle, waiting for a request, before
    each step (None: never); the side work left from before a wait was done during it, as far as the wait
    lasted. `scheduled_here`: with async scheduling, the steps that scheduled themselves, nobody having
    done it ahead (the run's first, one after a wait, one whose batch was empty when the step before
    scheduled it; None: the first)."""
    steps = len(step_tokens)
    table = np.zeros((steps, len(ENGINE_SLOTS)))
    if engine is None or not engine.active:
        return table
    sequences = np.asarray(real_batch, dtype=np.float64)
    tokens = np.asarray(step_tokens, dtype=np.float64)
    index = first_step + np.arange(steps)
    n = engine.multi_step
    assert first_step % n == 0, "engine_costs starts at a multi-step block"
    # Blocks by step number alone (a step's work never depends on how long the run is: serving plans
    # a run one step at a time); a run that ends inside a block leaves its outputs to later.
    starts_block, ends_block = index % n == 0, index % n == n - 1
    scheduling = engine.schedule.cost_us(sequences, tokens) + engine.prepare.cost_us(sequences, tokens)
    idle = np.zeros(steps) if idle_us is None else np.asarray(idle_us, dtype=np.float64)

    def per_block(stage) -> np.ndarray:
        """What the steps of a block produced, handled at its last step in one call: the fixed part
        once, the per-sequence and per-token parts for every step of the block."""
        variable = stage.cost_us(sequences, tokens) - stage.per_step_us
        totals = np.zeros(steps)
        for end in np.flatnonzero(ends_block):  # local positions; blocks start at global multiples of n
            totals[end] = stage.per_step_us + variable[end - index[end] % n : end + 1].sum()
        return totals

    def over_next_block(totals: np.ndarray) -> np.ndarray:
        """A block's outputs handled off the main thread (a thread or process of their own) while the
        next block runs: its work shared evenly by that block's steps, so a side lane slower than the
        engine slows every step of it, and one that keeps up never holds a step (with N = 1: the
        previous step's outputs in this step)."""
        shared = np.zeros(steps)
        for end in np.flatnonzero(ends_block):
            if end + 1 < steps:
                shared[end + 1 : end + 1 + n] = max(0.0, totals[end] - idle[end + 1]) / n
        return shared

    output = per_block(engine.output)
    api = per_block(engine.api)
    if engine.async_scheduling:  # step 0 schedules itself; later steps were scheduled during the one before
        here = index == 0 if scheduled_here is None else np.asarray(scheduled_here, dtype=bool)
        table[:, ENGINE_SLOT["pre"]] = np.where(here, scheduling, 0.0)
        next_starts = (index + 1) % n == 0
        table[:, ENGINE_SLOT["ahead"]] = np.where(next_starts, scheduling, 0.0)
    else:
        table[:, ENGINE_SLOT["pre"]] = np.where(starts_block, scheduling, 0.0)
    table[:, ENGINE_SLOT["sample"]] = engine.sample.cost_us(sequences, tokens)
    if engine.async_output or engine.output_process:
        table[:, ENGINE_SLOT["output_side"]] = over_next_block(output)
    else:
        table[:, ENGINE_SLOT["output_inline"]] = output
    if engine.api_process:
        table[:, ENGINE_SLOT["api_side"]] = over_next_block(api)
    else:
        table[:, ENGINE_SLOT["api_inline"]] = api
    return table


def host_cost_table(workload: Workload, hardware: HardwareConfig, strategy: StrategyConfig) -> np.ndarray:
    """(steps or 1, ops, HOST_COSTS) µs: each op's host stages and own time. Measured costs of an
    imported profile are taken as they are; the preset (with the strategy's launch and memory
    policies) prices the rest. One row serves every step unless costs were measured per step."""
    preset = host_stage_costs(workload, hardware, strategy)
    table = np.stack([preset[stage] for stage in HOST_STAGES] + [np.asarray(workload.host_us, dtype=np.float64)], axis=-1)[None]
    if workload.host_cost_us is not None:
        table = np.where(np.isnan(workload.host_cost_us), table, workload.host_cost_us)
    return np.ascontiguousarray(table, dtype=np.float64)


def build_template(
    workload: Workload, hardware: HardwareConfig, strategy: StrategyConfig, mode: int, cpu_ops: np.ndarray, engine: EngineConfig | None = None,
    split_ops: np.ndarray | None = None,
) -> StepTemplate:
    """Tasks and edges of one step in the given mode (EAGER, BUILD or REPLAY); `split_ops`: ops a replay
    launches eagerly between the pieces of its graph."""
    lanes = lanes_for(strategy, workload, engine)
    host = hardware.host
    tpl = StepTemplate()
    serving = engine is not None and engine.active
    if serving:  # the engine schedules the step and prepares its inputs before the model runs
        # No host core, no jitter draw: it takes no time, and must not wait for a core the side processes hold.
        step_begins = tpl.add(0, "engine", -1, _FIXED, 0.0)
        first = tpl.add(0, "engine", -1, _ENGINE, ENGINE_SLOT["pre"], host=True)
        tpl.edge(step_begins, first)
        for lane, slot in ((lanes.engine_output, "output_side"), (lanes.engine_api, "api_side")):
            if lane >= 0:  # the previous step's outputs, on their own thread or process, while this step runs:
                # a process of its own from the step's start, the engine's own output thread once the step is scheduled
                own_process = slot == "api_side" or engine.output_process
                # A process of its own runs on a core of its own, not one of the dispatching process's threads
                tpl.edge(step_begins if own_process else first,
                         tpl.add(lane, "engine", -1, _ENGINE, ENGINE_SLOT[slot], host=True, own_process=own_process))
    if workload.step_io:
        launch_us = host_stage_costs(workload, hardware, strategy)["launch"]
        issue_h2d = tpl.add(0, "launch", -1, _FIXED, float(np.median(launch_us)) if launch_us.size else host.launch_us, host=True)
        start = tpl.add(lanes.h2d, "copy", -1, _H2D_TOKENS, 0.0)
        tpl.edge(issue_h2d, start)
    else:  # the op list holds its own copies and syncs: the step starts with its first op
        start = tpl.add(0, "framework", -1, _FIXED, 0.0)
    gated = np.zeros(workload.n_ops, dtype=bool)
    if workload.not_before_us is not None:
        gated = np.any(~np.isnan(workload.not_before_us), axis=0)
    body = _Body(tpl, workload, hardware, strategy, lanes, start, gated)
    if mode != REPLAY:
        last_device = body.host_scheduled(cpu_ops)
    elif split_ops is not None and split_ops.any():
        last_device = body.replay_pieces(split_ops)
    else:
        last_device = body.replay()
    if serving:  # with async scheduling, the next step is scheduled while this one's device work runs
        tpl.add(0, "engine", -1, _ENGINE, ENGINE_SLOT["ahead"], host=True)
    if workload.step_io:
        # The sampled tokens return to the host; the next step's inputs are built from them.
        _read_back(tpl, last_device, lanes.d2h, -1, _D2H_TOKENS, 0.0, host.sync_us)
    if serving:  # then the engine samples, processes outputs and streams them (where they run inline)
        for slot in ("sample", "output_inline", "api_inline"):
            tpl.add(0, "engine", -1, _ENGINE, ENGINE_SLOT[slot], host=True)
    if mode == BUILD:
        g = hardware.graph
        build_us = (g.sink_load_ms if strategy.graph.mode == GraphMode.sink else g.capture_ms) * 1e3
        tpl.add(0, "graph", -1, _FIXED, build_us, host=True)
    return tpl


class _Results:
    """Where each op's result becomes available: its device task, or, for an op with no kernel of its own
    (front-end work, a sync, host code a graph skips), every task its own inputs came from: its results
    pass through, all of them (the one with the highest id is not the one that ends last: a collective on
    its own stream may end after a later kernel on the compute stream)."""

    def __init__(self, n_ops: int, start: int):
        self.task = np.full(n_ops, -1, dtype=np.int64)
        self.through: dict[int, list[int]] = {}
        self.start = start

    def of(self, ops) -> list[int]:
        """The tasks whose results the ops `ops` hand on, each once, in order."""
        tasks: list[int] = []
        for d in ops:
            tasks.extend(self.through.get(int(d), (int(self.task[d]),)))
        return list(dict.fromkeys(tasks))

    def pass_through(self, j: int, producers: list[int]) -> None:
        self.through[j] = producers if producers else [self.start]

    def last(self) -> list[int]:
        return self.of([self.task.size - 1])


@dataclass
class _Body:
    """Builds the body of a step template: the ops' host and device tasks."""

    tpl: StepTemplate
    workload: Workload
    hardware: HardwareConfig
    strategy: StrategyConfig
    lanes: Lanes
    start: int  # the step's first task: ops with nothing else to wait for follow it
    gated: np.ndarray  # per op: waits for device work outside the simulation in some step
    # Per device lane, whether its last task so far came from a graph (a stream runs in template order).
    graph_last: dict[int, bool] = field(default_factory=dict)

    def device_task(self, j: int, producers: list[int], launch: int, in_graph: bool) -> int:
        tpl, workload = self.tpl, self.workload
        stream = int(workload.stream[j])
        lane = self.lanes.stream[stream]
        category = "comm" if stream == STREAM_COMM else "copy" if workload.kind[j] == KIND_COPY else "compute"
        gate = -1
        if self.gated[j]:  # the stream was busy with work the simulation does not hold
            gate = tpl.add(self.lanes.external, "external", j, _GATE, j)
            tpl.edge(self.start, gate)
        source = _DEVICE_GRAPH if in_graph else _DEVICE_AFTER_GRAPH if self.graph_last.get(lane, False) else _DEVICE
        self.graph_last[lane] = in_graph
        task = tpl.add(lane, category, j, source, j)
        tpl.edge(launch, task)
        if gate >= 0:
            tpl.edge(gate, task)
        for producer in producers:  # events between streams; on the same stream FIFO order suffices
            if tpl.lane[producer] != tpl.lane[task]:
                tpl.edge(producer, task)
        if not producers:
            tpl.edge(self.start, task)
        return task

    def host_scheduled(self, cpu_ops: np.ndarray) -> list[int]:
        tpl, workload, hardware, strategy, lanes = self.tpl, self.workload, self.hardware, self.strategy, self.lanes
        host = hardware.host
        free_stage = HOST_STAGES.index("free")
        # Frees handed back to the main thread run there one queue length later (seed 000: frees delayed,
        # peak memory up) instead of on the allocating thread right after the launch.
        deferred = strategy.free_on_main and lanes.stage_lane[free_stage] != 0
        pending: list[tuple[int, int]] = []  # (op, its launch task) whose free waits for the main thread
        launch_of = np.full(workload.n_ops, -1, dtype=np.int64)
        results = _Results(workload.n_ops, self.start)
        device_task = results.task
        flags = workload.flags
        for j in range(workload.n_ops):
            while deferred and pending and pending[0][0] <= j - strategy.queue_capacity:
                _deferred_free(tpl, *pending.pop(0))
            producers = results.of(workload.after[j])
            kind = workload.kind[j]
            if kind == KIND_HOST:  # front-end work only: no kernel, results pass through
                tpl.add(0, "framework", j, _OWN, j, host=True)
                results.pass_through(j, producers)
                continue
            if kind == KIND_SYNC:  # host work, then a blocking wait for the ops it names
                tpl.add(0, "framework", j, _STAGE, j, host=True, stage=HOST_STAGES.index("framework") + 1)
                sync = tpl.add(0, "sync", j, _OWN, j, host=True)
                for producer in producers:
                    tpl.edge(producer, sync)
                results.pass_through(j, producers)
                continue
            in_graph = bool(flags[j] & FLAG_IN_GRAPH)
            if flags[j] & FLAG_CARRIED_IN:  # launched before the step: device work only
                device_task[j] = self.device_task(j, producers, self.start, in_graph)
                continue
            leader = int(workload.group[j])
            if 0 <= leader < j:  # issued by the host call that launched op `leader` (in the step: a carried-in
                # leader's group is carried in too, ops_csv)
                device_task[j] = self.device_task(j, producers, int(launch_of[leader]), in_graph)
                continue
            if flags[j] & FLAG_VALUE_DEPENDENT and producers:
                _read_back(tpl, producers, lanes.d2h, j, _FIXED, copy_time_us(VALUE_READ_BYTES, hardware.link), host.sync_us)
            stages = CPU_OP_STAGES if cpu_ops[j] else HOST_STAGES
            previous = self.host_stages(j, stages, producers, launch_of, device_task, in_graph, pending if deferred else None)
            if cpu_ops[j]:
                device_task[j] = _cpu_op(tpl, lanes, j, producers, previous, self.start)
            if flags[j] & FLAG_COMPUTE_DEPENDENT:
                _read_back(tpl, [int(device_task[j])], lanes.d2h, j, _FIXED, copy_time_us(SHAPE_READ_BYTES, hardware.link), host.sync_us)
        for op, launch in pending:
            _deferred_free(tpl, op, launch)
        return results.last()

    def host_stages(
        self, j: int, stages, producers: list[int], launch_of: np.ndarray, device_task: np.ndarray, in_graph: bool,
        pending: list[tuple[int, int]] | None = None,
    ) -> int:
        """Op j's host stages on their lanes, its device task after the launch stage; returns the last
        stage's task. `pending`: frees handed back to the main thread are queued there, not added."""
        tpl, lanes = self.tpl, self.lanes
        launch_stage, free_stage = HOST_STAGES.index("launch"), HOST_STAGES.index("free")
        first_on_lane: dict[int, int] = {}
        previous = -1
        for stage in stages:
            k = HOST_STAGES.index(stage)
            if pending is not None and k == free_stage:
                pending.append((j, int(launch_of[j])))
                continue
            lane = lanes.stage_lane[k]
            source = _TILING if stage == "tiling" else _STAGE
            task = tpl.add(lane, STAGE_CATEGORY[stage], j, source, j, host=True, stage=k + 1)
            if lane not in first_on_lane:
                first_on_lane[lane] = task
                if previous >= 0:
                    tpl.edge(previous, task)
                    producer_lane = tpl.lane[previous]
                    items = tpl.queue_items.setdefault((producer_lane, lane), ([], []))
                    items[0].append(first_on_lane[producer_lane])
                    items[1].append(task)
            if k == launch_stage:
                launch_of[j] = task
                device_task[j] = self.device_task(j, producers, task, in_graph)
            previous = task
        return previous

    def replay_pieces(self, split_ops: np.ndarray) -> list[int]:
        """A replay of captured graphs, split into pieces (vLLM V1's piecewise CUDA graphs; nothing split:
        one launch for the step): each run of graph ops is one graph launch (policies.graph_piece_of), and
        the split ops between runs (attention) are launched eagerly with their host stages; the next piece
        is launched after them on the host, as the model's forward reaches it.
        The arguments of the dynamic ops a replay launches (attention's KV length; routed MoE ops read
        their per-expert counts from device tensors and have none) are refreshed in place, the split ops' too (the step's
        attention metadata is built whichever way attention runs): all before the first launch, or, when
        `refresh_after_launch`, each after its piece's launch (a split op's before its own stages).
        Host-only ops and work carried in from before the step are not launched, and not refreshed."""
        tpl, workload, strategy = self.tpl, self.workload, self.strategy
        g = self.hardware.graph
        dynamic = ((workload.flags & FLAG_DYNAMIC) > 0) & ((workload.flags & FLAG_ROUTED) == 0)
        after_launch = strategy.graph.refresh_after_launch
        launch_stage = HOST_STAGES.index("launch") + 1
        host_only = np.isin(workload.kind, (KIND_HOST, KIND_SYNC))
        launch_of = np.full(workload.n_ops, -1, dtype=np.int64)
        results = _Results(workload.n_ops, self.start)
        device_task = results.task
        # Frees handed back to the main thread, as in host_scheduled (the split ops' own allocations).
        deferred = strategy.free_on_main and self.lanes.stage_lane[HOST_STAGES.index("free")] != 0
        pending: list[tuple[int, int]] = []
        piece_of = graph_piece_of(workload, split_ops)
        trigger = -1
        refreshes: dict[int, int] = {}
        if not after_launch:
            for j in np.flatnonzero(dynamic & ((piece_of >= 0) | split_ops)):
                tpl.add(0, "graph", int(j), _FIXED, g.param_update_us, host=True)
        for j in range(workload.n_ops):
            producers = results.of(workload.after[j])
            if host_only[j]:  # the graph skips front-end code and host waits
                results.pass_through(j, producers)
                continue
            if workload.flags[j] & FLAG_CARRIED_IN:
                device_task[j] = self.device_task(j, producers, self.start, True)
                continue
            if split_ops[j]:
                while deferred and pending and pending[0][0] <= j - strategy.queue_capacity:
                    _deferred_free(tpl, *pending.pop(0))
                if after_launch and dynamic[j]:
                    tpl.add(0, "graph", int(j), _FIXED, g.param_update_us, host=True)
                self.host_stages(j, HOST_STAGES, producers, launch_of, device_task, False, pending if deferred else None)
                trigger = -1  # the next graph op opens a new piece
                continue
            if trigger < 0:
                trigger = tpl.add(0, "launch", -1, _FIXED, g.replay_launch_us, host=True, stage=launch_stage)
                if after_launch:
                    for k in np.flatnonzero((piece_of == piece_of[j]) & dynamic):
                        refreshes[int(k)] = tpl.add(0, "graph", int(k), _FIXED, g.param_update_us, host=True)
            device_task[j] = self.device_task(j, producers, trigger, True)
            if j in refreshes:
                tpl.edge(refreshes[j], int(device_task[j]))
        for op, launch in pending:
            _deferred_free(tpl, op, launch)
        return results.last()

    def replay(self) -> list[int]:
        """A whole step from one graph: captured (`replay_pieces` with nothing split off: one launch, the
        arguments refreshed), or sunk (graph sink: the addresses updated, one trigger, no refresh)."""
        tpl, workload = self.tpl, self.workload
        if self.strategy.graph.mode == GraphMode.capture:
            return self.replay_pieces(np.zeros(workload.n_ops, dtype=bool))
        g = self.hardware.graph
        tpl.add(0, "graph", -1, _FIXED, g.address_update_us, host=True)
        trigger = tpl.add(0, "launch", -1, _FIXED, g.sink_trigger_us, host=True, stage=HOST_STAGES.index("launch") + 1)
        results = _Results(workload.n_ops, self.start)
        for j in range(workload.n_ops):
            producers = results.of(workload.after[j])
            if workload.kind[j] in (KIND_HOST, KIND_SYNC):  # the graph skips front-end code and host waits
                results.pass_through(j, producers)
                continue
            launch = self.start if workload.flags[j] & FLAG_CARRIED_IN else trigger
            results.task[j] = self.device_task(j, producers, launch, True)
        return results.last()


def _deferred_free(tpl: StepTemplate, op: int, launch: int) -> None:
    free = tpl.add(0, "alloc", op, _STAGE, op, host=True, stage=HOST_STAGES.index("free") + 1)
    tpl.edge(launch, free)


def _cpu_op(tpl, lanes, j, producers, dispatched, start) -> int:
    """Input D2H → compute on a host core → result H2D; returns the H2D (where consumers find it). Its input
    is its producers' output, or with none the step's own input (`start`), as a device op's would be: the
    copy must not run in the step before."""
    fetch = tpl.add(lanes.d2h, "copy", j, _CPU_COPY, j)  # per-step sizes: half the op's traffic each way
    for producer in producers:
        tpl.edge(producer, fetch)
    if not producers:
        tpl.edge(start, fetch)
    compute = tpl.add(lanes.cpu, "cpu", j, _CPU_COMPUTE, j, host=True)
    tpl.edge(fetch, compute)
    tpl.edge(dispatched, compute)
    put = tpl.add(lanes.h2d, "copy", j, _CPU_COPY, j)
    tpl.edge(compute, put)
    return put


def _read_back(tpl, device_tasks: list[int], d2h_lane: int, op: int, source: int, copy_us: float, sync_us: float) -> int:
    """D2H copy after `device_tasks`, then a blocking sync on the first host lane; returns the copy."""
    copy = tpl.add(d2h_lane, "copy", op, source, copy_us)
    for task in device_tasks:
        tpl.edge(task, copy)
    sync = tpl.add(0, "sync", op, _FIXED, sync_us, host=True)
    tpl.edge(copy, sync)
    return copy


@njit(cache=True, nogil=True)
def _fill_records(
    out, steps, lane, category, op, stage, source, value, host_slot, pooled,
    device_us, device_cores, eager_gap_us, graph_dispatch_us, graph_exit_us, tiling_us, stage_us, not_before_us, engine_us, h2d_us, d2h_us, cpu_flops_per_us, flops,
    cpu_copy_latency_us, cpu_copy_bytes_per_us, op_bytes, jitter,
):
    """Write the records of `steps` (template repeated) into `out`, in one pass.

    One pass matters: records are 48 bytes apart, so a numpy expression per field re-reads them all.
    `stage_us` (steps or 1, ops, costs) and `not_before_us` (steps or 1, ops) have one row per step, or
    one row for all steps.
    """
    m = lane.shape[0]
    per_step_costs = stage_us.shape[0] > 1
    per_step_waits = not_before_us.shape[0] > 1
    for c in range(steps.shape[0]):
        s = steps[c]
        cost_row = s if per_step_costs else 0
        wait_row = s if per_step_waits else 0
        for j in range(m):
            rec = out[c * m + j]
            rec["lane"] = lane[j]
            rec["category"] = category[j]
            rec["op"] = op[j]
            rec["stage"] = stage[j]
            rec["step"] = s
            rec["release_us"] = 0.0
            src = source[j]
            pool = NO_POOL
            units = 0
            lead = 0.0
            if src == _DEVICE or src == _DEVICE_GRAPH or src == _DEVICE_AFTER_GRAPH:
                k = np.int64(value[j])
                # The device front end's time per task: a graph's own scheduling, or a kernel launched alone
                # (after a graph's tasks, plus leaving the graph).
                lead = graph_dispatch_us if src == _DEVICE_GRAPH else eager_gap_us
                if src == _DEVICE_AFTER_GRAPH:
                    lead += graph_exit_us
                duration = device_us[s, k] + lead
                units = device_cores[s, k]
                if units > 0:  # collectives and copies hold no AI core
                    pool = POOL_AI_CORES
            elif src == _STAGE:
                duration = stage_us[cost_row, np.int64(value[j]), stage[j] - 1]
            elif src == _OWN:
                duration = stage_us[cost_row, np.int64(value[j]), stage_us.shape[2] - 1]
            elif src == _ENGINE:
                duration = engine_us[s, np.int64(value[j])]
            elif src == _GATE:
                duration = not_before_us[wait_row, np.int64(value[j])]
                if np.isnan(duration):
                    duration = 0.0
            elif src == _TILING:
                duration = tiling_us[s, np.int64(value[j])]
            elif src == _H2D_TOKENS:
                duration = h2d_us[c]
            elif src == _D2H_TOKENS:
                duration = d2h_us[c]
            elif src == _CPU_COMPUTE:
                duration = flops[s, np.int64(value[j])] / cpu_flops_per_us
            elif src == _CPU_COPY:
                duration = cpu_copy_latency_us + op_bytes[s, np.int64(value[j])] / 2 / cpu_copy_bytes_per_us
            else:
                duration = value[j]
            if host_slot[j] >= 0:
                duration *= jitter[c, host_slot[j]]
                if pooled[j]:
                    pool = POOL_HOST
                    units = 1
            rec["duration_us"] = duration
            rec["lead_us"] = lead
            rec["pool"] = pool
            rec["units"] = units


@dataclass
class _Piece:
    src: np.ndarray
    dst: np.ndarray
    last_on_lane: np.ndarray  # local ids (in the piece) of each lane's last task of the last step


class Lowering:
    """Lowers steps of one run: what all steps share (device times, host costs, step templates) is
    computed once, so a long run can be lowered chunk by chunk."""

    def __init__(
        self, workload: Workload, hardware: HardwareConfig, strategy: StrategyConfig, seed: int, plan: StepPlan | None = None,
        engine: EngineConfig | None = None, first_step: int = 0, engine_us: np.ndarray | None = None,
    ):
        """`first_step`: the run's number of the workload's first step (a workload of one step of a longer
        run, as serving prepares them): host jitter is drawn per step of the run. `engine_us`: the
        engine's costs of these steps when they depend on steps the workload does not hold (the
        previous step's outputs, multi-step blocks): engine_costs of the run so far, its last rows."""
        self.workload, self.hardware, self.strategy, self.seed, self.engine = workload, hardware, strategy, seed, engine
        self.first_step = first_step
        self.plan = plan or StepPlan.host_only(workload)
        self.lanes = lanes_for(strategy, workload, engine)
        self.engine_us = np.ascontiguousarray(engine_cost_table(workload, engine) if engine_us is None else engine_us)
        device_us, device_cores = device_times(workload, hardware)
        self.stage_us = host_cost_table(workload, hardware, strategy)
        tiling = np.broadcast_to(self.stage_us[:, :, HOST_STAGES.index("tiling")], (workload.steps, workload.n_ops))
        tiling_us = np.where(self.plan.tiling_hit, hardware.host.tiling_lookup_us, tiling)
        waits = workload.not_before_us
        self.not_before_us = np.ascontiguousarray(waits if waits is not None else np.full((1, max(1, workload.n_ops)), np.nan), dtype=np.float64)
        # (steps, ops) tables as the jitted fill reads them: C order, fixed dtypes (converted once).
        self.device_us = np.ascontiguousarray(device_us, dtype=np.float64)
        self.device_cores = np.ascontiguousarray(device_cores, dtype=np.int32)
        self.tiling_us = np.ascontiguousarray(tiling_us, dtype=np.float64)
        self.flops = np.ascontiguousarray(workload.flops, dtype=np.float64)
        self.bytes = np.ascontiguousarray(workload.bytes, dtype=np.float64)
        self.templates: dict[int, StepTemplate] = {}

    def _tile(
        self,
        out: np.ndarray,
        tpl: StepTemplate,
        steps: np.ndarray,
        step_release_us: np.ndarray | None,
    ) -> _Piece:
        """The template repeated over consecutive `steps` (records written into `out`), with each step's
        durations and AI cores; returns the piece's edges in local ids."""
        count = steps.size
        m = len(tpl.lane)
        offsets = (np.arange(count, dtype=np.int64) * m)[:, None]
        is_host = np.array(tpl.host, dtype=bool)
        host_slot = np.where(is_host, np.cumsum(is_host) - 1, -1).astype(np.int64)
        workload, hardware, link = self.workload, self.hardware, self.hardware.link
        _fill_records(
            out,
            steps.astype(np.int64),
            np.array(tpl.lane, dtype=np.int32),
            np.array(tpl.category, dtype=np.int8),
            np.array(tpl.op, dtype=np.int32),
            np.array(tpl.stage, dtype=np.int8),
            np.array(tpl.source, dtype=np.int8),
            np.array(tpl.value, dtype=np.float64),
            host_slot,
            np.array(tpl.pooled, dtype=np.bool_),
            self.device_us,
            self.device_cores,
            float(hardware.device.kernel_gap_us),
            float(hardware.graph.task_dispatch_us),
            float(hardware.graph.exit_gap_us),
            self.tiling_us,
            self.stage_us,
            self.not_before_us,
            self.engine_us,
            np.array([copy_time_us(t * 2 * TOKEN_ID_BYTES, link) for t in workload.tokens[steps]], dtype=np.float64),
            # Every real row's sampled token comes back, a multi-step block's finished rows' too (sampled,
            # then thrown away): not the tokens the step counts as produced.
            np.array([copy_time_us(t * TOKEN_ID_BYTES, link) for t in workload.real_batch[steps]], dtype=np.float64),
            hardware.host.cpu_gflops * 1e3,
            self.flops,
            float(link.pcie_latency_us),
            link.pcie_gbps * 1e3,
            self.bytes,
            # A task on a host thread takes its cost × its jitter / the host's speed: the one place the
            # host CPU's speed applies, to every kind of host work alike.
            _jitter(self.seed, steps + self.first_step, hardware.host.jitter_cv, int(is_host.sum())) / hardware.host.speed,
        )
        if step_release_us is not None:
            out["release_us"][offsets[:, 0]] = step_release_us[steps]

        src = [(np.array(tpl.src, dtype=np.int64)[None, :] + offsets).ravel()]
        dst = [(np.array(tpl.dst, dtype=np.int64)[None, :] + offsets).ravel()]
        lanes = np.array(tpl.lane)
        last_on_lane = np.array([np.flatnonzero(lanes == lane).max() for lane in np.unique(lanes)], dtype=np.int64)
        not_first_lane = last_on_lane[lanes[last_on_lane] != lanes[0]]
        src.append((not_first_lane[None, :] + offsets[:-1]).ravel())  # barrier between the piece's steps
        dst.append(np.repeat(offsets[1:, 0], not_first_lane.size))
        capacity = self.strategy.queue_capacity
        for producers, consumers in tpl.queue_items.values():
            producer_ids = (np.array(producers, dtype=np.int64)[None, :] + offsets).ravel()
            consumer_ids = (np.array(consumers, dtype=np.int64)[None, :] + offsets).ravel()
            if producer_ids.size > capacity:
                src.append(consumer_ids[:-capacity])
                dst.append(producer_ids[capacity:])
        return _Piece(np.concatenate(src), np.concatenate(dst), last_on_lane + (count - 1) * m)

    def graph(self, steps: np.ndarray, step_release_us: np.ndarray | None = None) -> TaskGraph:
        """The task graph of consecutive `steps` (global step numbers)."""
        workload, hardware, strategy, plan = self.workload, self.hardware, self.strategy, self.plan
        mode = plan.mode[steps]
        breaks = np.flatnonzero(np.diff(mode)) + 1
        runs = np.split(np.arange(steps.size), breaks)
        for run in runs:
            m = int(mode[run[0]])
            if m not in self.templates:
                self.templates[m] = build_template(workload, hardware, strategy, m, plan.cpu_ops, self.engine, plan.split_ops)
        sizes = [run.size * len(self.templates[int(mode[run[0]])].lane) for run in runs]
        all_tasks = np.empty(sum(sizes), dtype=TASK_DTYPE)
        # Tile each run of equal-mode steps in place; a barrier joins each piece's last step to the
        # next piece's first.
        offset = 0
        src, dst = [], []
        previous_last: np.ndarray | None = None
        for run, size in zip(runs, sizes):
            m = int(mode[run[0]])
            piece = self._tile(all_tasks[offset : offset + size], self.templates[m], steps[run], step_release_us)
            src.append(piece.src + offset)
            dst.append(piece.dst + offset)
            if previous_last is not None:
                src.append(previous_last)
                dst.append(np.full(previous_last.size, offset, dtype=np.int64))
            previous_last = piece.last_on_lane + offset
            offset += size
        dep_ptr, dep_idx = csr_from_edges(offset, np.concatenate(src), np.concatenate(dst))
        return TaskGraph(
            tasks=all_tasks,
            dep_ptr=dep_ptr,
            dep_idx=dep_idx,
            lane_names=self.lanes.names,
            lane_kinds=self.lanes.kinds,
            pool_names=["host_cores", "ai_cores"],
            pool_capacity=np.array([hardware.host.threads, hardware.device.ai_cores], dtype=np.int64),
            op_names=list(workload.op_names),
        )


def lower(
    workload: Workload,
    hardware: HardwareConfig,
    strategy: StrategyConfig,
    seed: int,
    plan: StepPlan | None = None,
    step_release_us: np.ndarray | None = None,
    only_steps: np.ndarray | None = None,
    engine: EngineConfig | None = None,
    first_step: int = 0,
) -> TaskGraph:
    """The task graph of the run (or of `only_steps`), step modes and policies from `plan`.

    Host jitter of step s is drawn from a generator seeded with (seed, JITTER_STREAM, s), so simulating
    steps one at a time or all at once gives the same numbers.
    """
    steps = np.arange(workload.steps) if only_steps is None else np.asarray(only_steps, dtype=np.int64)
    return Lowering(workload, hardware, strategy, seed, plan, engine, first_step).graph(steps, step_release_us)


def _jitter(seed: int, steps: np.ndarray, cv: float, count: int) -> np.ndarray:
    """Lognormal multipliers with mean 1 and coefficient of variation cv, one generator per step."""
    if cv == 0:
        return np.ones((steps.size, count))
    sigma2 = np.log1p(cv * cv)
    return np.stack(
        [np.random.default_rng([seed, JITTER_STREAM, int(s)]).lognormal(mean=-sigma2 / 2, sigma=np.sqrt(sigma2), size=count) for s in steps]
    ).reshape(steps.size, count)
