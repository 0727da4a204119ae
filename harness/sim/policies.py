"""Strategy policies decided before the event loop, in program order: buckets, graph modes, caches, fusion.

None of these decisions depends on simulated time, so they are taken in a pass over the steps and
ops before lowering (the serving loop calls it again for each prefix of steps, which is causal):

* **Shape bucketing** (decode, `strategy.shape_buckets`): KV lengths padded up to a multiple of
  `strategy.kv_block`, the rows routed to a rank's experts up to a power of two and the batch up to the smallest
  bucket (`strategy.graph.buckets`) that holds it, so dynamic ops keep their shapes for many steps.
  Graph modes pad the batch to its bucket in any case. Padded work
  is real device work; `padding_waste` is the share of device time spent on padding.
* **Graph modes** (decode by default, `strategy.graph.phases`): each step runs EAGER (host
  scheduling), BUILD (host scheduling plus the one-time capture or sink load of its graph) or REPLAY.
  Capture keys a graph by its batch bucket (dynamic arguments such as the KV length are refreshed in
  place); a batch above the largest bucket runs eagerly; the bucket list is trimmed evenly to the
  graphs the platform's stream resources allow (`graph_budget`: `hardware.graph.max_graphs` / (layers + 1),
  less what communication groups take where the platform counts them). Sink keys a
  graph by all its shapes: it refuses dynamic ops unless shape bucketing makes them static, and
  falls back to host scheduling or stops (`strategy.graph.dynamic_fallback`), saying which ops are
  dynamic. Graphs are built in program order while the budget lasts (a step whose new graph would
  exceed it runs eagerly), so the plan of a step never depends on later steps. A compute-dependent op
  cannot be in a graph at all.
* **Tiling cache**: an LRU cache of `tiling_cache_entries` keyed by node and run-time shapes (the
  node's shape key: op, shapes, dtype), looked up in program order on host-scheduled steps; a hit
  replaces Tiling by a lookup.
* **Fusion**: runs of consecutive fusible vector ops (plain data chain, no syncs) become one kernel.
* **Heterogeneous**: ops of the types in `strategy.heterogeneous` run on host CPU cores.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from harness.config.schema import EngineConfig, Fallback, GraphCostConfig, GraphMode, OpKind, RunConfig, WorkloadConfig
from harness.sim.kernel import lru_hits
from harness.model.device import device_times
from harness.base.errors import ConfigError
from harness.model.ops import (
    FLAG_CARRIED_IN,
    FLAG_COMPUTE_DEPENDENT,
    FLAG_CPU_ELIGIBLE,
    FLAG_DYNAMIC,
    FLAG_ROUTED,
    FLAG_IN_GRAPH,
    FLAG_VALUE_DEPENDENT,
    HOST_COSTS,
    HOST_ONLY_KINDS,
    KIND_CODE,
    KIND_COPY,
    KIND_SYNC,
    STREAM_COMPUTE,
    Workload,
    mix_keys,
)
from harness.model.workload import MOE_ALL_TO_ALL, OP_FORMULAS, build_workload, moe_exchange, run_build_options

EAGER, BUILD, REPLAY = 0, 1, 2
MIB = 2**20
MODE_NAMES = {EAGER: "eager", BUILD: "build", REPLAY: "replay"}


def measured_mask(warmup_steps: int, mode: np.ndarray) -> np.ndarray:
    """Which steps a run's figures are measured on: after the warm-up, and not building a graph (every step
    builds one: those, rather than nothing)."""
    index = np.arange(mode.shape[0])
    measured = (index >= warmup_steps) & (mode != BUILD)
    if not measured.any():
        measured = index >= warmup_steps
    return measured
VECTOR = KIND_CODE[OpKind.vector]


@dataclass
class StepPlan:
    mode: np.ndarray  # int8 per step: EAGER / BUILD / REPLAY
    tiling_hit: np.ndarray  # bool (steps, ops)
    cpu_ops: np.ndarray  # bool per op
    info: dict = field(default_factory=dict)  # summary keys the policies report
    split_ops: np.ndarray | None = None  # bool per op: run eagerly between the pieces of a captured graph

    @staticmethod
    def host_only(workload: Workload) -> "StepPlan":
        return StepPlan(
            mode=np.zeros(workload.steps, dtype=np.int8),
            tiling_hit=np.zeros((workload.steps, workload.n_ops), dtype=bool),
            cpu_ops=np.zeros(workload.n_ops, dtype=bool),
        )


def pad_up(values: np.ndarray, block: int) -> np.ndarray:
    return np.ceil(values / block) * block if block > 0 else values


def trim_buckets(buckets: list[int], max_graphs: int) -> list[int]:
    """At most `max_graphs` buckets, evenly spread over the sorted list (the smallest and the largest
    kept when two or more fit; the largest alone otherwise)."""
    sizes = sorted(set(buckets))
    if len(sizes) <= max_graphs:
        return sizes
    if max_graphs <= 1:
        return [sizes[-1]]
    picks = np.unique(np.rint(np.linspace(0, len(sizes) - 1, max_graphs)).astype(int))
    return [sizes[i] for i in picks]


def bucket_batch(batch: np.ndarray, buckets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(batch padded to the smallest bucket holding it, whether one does); too large stays as is."""
    slot = np.searchsorted(buckets, batch)
    fits = slot < len(buckets)
    return np.where(fits, np.array(buckets)[np.minimum(slot, len(buckets) - 1)], batch), fits


def startup_sizes(buckets: list[int], max_batch: int, engine: EngineConfig | None = None) -> list[int]:
    """The capture sizes a serving engine captures at start-up: every size up to the first that holds
    max_batch (vLLM V0 pads max_num_seqs up to a capture size), or, for an engine that captures up to twice
    its largest batch (vLLM >= 0.11.1), every size up to min(2 x max_batch, its cap); never above the
    engine's own cap (`engine.graph_max_batch`: SGLang's cuda_graph_max_bs, V1's 512)."""
    ordered = sorted(set(buckets))
    cap = engine.graph_max_batch if engine is not None and engine.graph_max_batch > 0 else None
    if engine is not None and engine.graph_twice_max_batch:
        limit = 2 * max_batch if cap is None else min(2 * max_batch, cap)
        return [b for b in ordered if b <= limit]
    sizes = [b for b in ordered if b < max_batch] + [b for b in ordered if b >= max_batch][:1]
    return sizes if cap is None else [b for b in sizes if b <= cap]


def graph_budget(costs: GraphCostConfig, layers: int, workload: WorkloadConfig) -> int:
    """How many graphs (capture sizes) the platform's stream resources hold, as vllm-ascend counts them
    (vllm_ascend/utils.py update_aclgraph_sizes, v0.10.2rc1 to v0.20.2rc1, HCCL's default FFTS+ mode on
    A2): a graph of L layers takes L + 1 streams, each communication group with more than one rank (TP,
    DP) multiplies that by 1 + `comm_group_streams` and holds `comm_group_reserved_streams` apart:
    floor((max_graphs − G × reserved) / (L + 1) / (1 + G × comm_group_streams)), at least 1."""
    groups = int(workload.tp > 1) + int(workload.dp > 1)
    streams = costs.max_graphs - groups * costs.comm_group_reserved_streams
    return max(1, streams // (layers + 1) // (1 + groups * costs.comm_group_streams))


def asked_sizes(buckets: list[int], serving_max_batch: int | None = None, engine: EngineConfig | None = None) -> list[int]:
    """The capture sizes a run asks for before the budget: the list, or for a serving engine those it
    captures at start-up (`startup_sizes`: the engine limits its list by its largest batch first, as vLLM
    does before vllm-ascend trims it)."""
    return sorted(set(buckets)) if serving_max_batch is None else startup_sizes(buckets, serving_max_batch, engine)


def kept_sizes(buckets: list[int], max_graphs: int, serving_max_batch: int | None = None, engine: EngineConfig | None = None) -> list[int]:
    """The capture sizes a run keeps: those it asks for, trimmed evenly to the budget as vllm-ascend's
    update_aclgraph_sizes samples them (the first and last kept)."""
    return trim_buckets(asked_sizes(buckets, serving_max_batch, engine), max_graphs)


def trim_note(asked: list[int], kept: list[int], costs: GraphCostConfig, layers: int, workload: WorkloadConfig) -> str:
    """What trimming to the budget did to the size list and why ('' when it kept every size): the streams
    a graph takes, those the platform has, and what communication groups take where it counts them."""
    asked = sorted(set(asked))
    if len(kept) >= len(asked):
        return ""
    shown = ", ".join(str(b) for b in kept) if len(kept) <= 12 else ", ".join(str(b) for b in kept[:6]) + ", …, " + str(kept[-1])
    groups = int(workload.tp > 1) + int(workload.dp > 1)
    comm = (f", with {groups} communication group{'s' if groups > 1 else ''} taking {costs.comm_group_reserved_streams} streams"
            f" each and multiplying a graph's by 1 + {groups} × {costs.comm_group_streams}"
            if groups and (costs.comm_group_streams or costs.comm_group_reserved_streams) else "")
    return (f"{len(kept)} of {len(asked)} capture sizes kept ({shown}), trimmed evenly as vllm-ascend does: {costs.max_graphs:,} streams"
            f" (hardware.graph.max_graphs) hold {len(kept)} graphs of {layers} layers + 1 = {layers + 1} streams{comm}")


def layer_count(workload: Workload) -> int:
    layers = {name.split(".")[1] for name in workload.op_names if name.startswith("layers.")}
    return max(1, len(layers))


def graphs_memory_gb(run: RunConfig, step: Workload) -> float:
    """Device memory of the graphs a run keeps, from one step of it built alone (`step`), without planning
    it: captured graphs, one for its batch (a serving engine: every size it captures at start-up) if a
    kept size holds it; a sunk graph, at least one. What `prepare` charges as `graphs_gb`, known before it."""
    graph, cfg = run.strategy.graph, run.workload
    if graph.mode == GraphMode.none or cfg.phase not in graph.phases:
        return 0.0
    count = 1
    if graph.mode == GraphMode.capture:
        engine = run.engine if run.engine is not None and run.engine.active else None
        max_batch = cfg.serving.max_batch if cfg.serving.enabled else None
        sizes = kept_sizes(list(graph.buckets), graph_budget(run.hardware.graph, layer_count(step), cfg), max_batch, engine)
        count = len(sizes) if max_batch is not None else int(any(size >= cfg.batch_size for size in sizes))
    return count * run.hardware.graph.graph_mem_mib * MIB / 1e9


def moe_exchange_note(cfg: WorkloadConfig, all_to_all_from: int) -> str:
    """How the run's MoE layers move their tokens (workload.moe_exchange), said once: the op names are the
    same either way."""
    devices = cfg.tp * cfg.dp
    ep = cfg.ep or devices
    if moe_exchange(ep, all_to_all_from) == MOE_ALL_TO_ALL:
        return f"MoE: tokens split over TP and exchanged all-to-all over EP {ep} (dispatch, combine)"
    if ep == 1:
        return (f"MoE: experts split over the {devices} devices (ep=1): every rank multiplies every token (gathered over DP) by its"
                " slice of each expert, the partial outputs summed back (reduce-scattered over DP, all-reduced over TP)")
    return (f"MoE: all-gather method (EP {ep} below hardware.link.moe_all_to_all_min_ep={all_to_all_from}): each rank routes all"
            " its tokens (gathered over DP) to its own experts, the outputs summed back (reduce-scattered over DP, all-reduced over TP)")


def prepare(run: RunConfig, batch: np.ndarray, kv_len: np.ndarray | None) -> tuple[Workload, StepPlan]:
    """The workload as the strategy runs it (padded, fused) and the plan of every step."""
    cfg, strategy, hardware = run.workload, run.strategy, run.hardware
    dpn = hardware.link.devices_per_node
    build_options = run_build_options(run)
    real = build_workload(cfg, dpn, batch=batch, kv_len=kv_len, **build_options)

    def padded_workload(batch: np.ndarray, kv_len: np.ndarray, moe_pad: bool) -> Workload:
        """The workload at padded sizes; `real` itself when nothing is padded (an op list from a file or
        the config has no sizes to pad: it is the same list whatever the batch; a dense model has no
        routed token counts to pad)."""
        moe_pad = np.asarray(moe_pad, dtype=bool) & bool(np.any(real.flags & FLAG_ROUTED))
        if cfg.card is None or (not np.any(moe_pad) and np.array_equal(batch, real.batch) and np.array_equal(kv_len, real.kv_len)):
            return real
        return build_workload(cfg, dpn, batch=batch, kv_len=kv_len, moe_pad=moe_pad, kv_rows=real.batch, **build_options)

    buckets_on = strategy.shape_buckets and cfg.phase.value == "decode"
    kv_padded = pad_up(real.kv_len, strategy.kv_block) if buckets_on else real.kv_len
    steps = real.steps
    mode = np.zeros(steps, dtype=np.int8)
    graph = strategy.graph
    # Host scheduling with shape buckets pads the batch too (seed 001: dynamic batch → fixed buckets).
    host_padded = bucket_batch(real.batch, sorted(set(graph.buckets)))[0] if buckets_on else real.batch.copy()
    padded = host_padded
    info: dict = {}
    if cfg.card is not None and np.any(real.flags & FLAG_ROUTED):
        info["moe_note"] = moe_exchange_note(cfg, hardware.link.moe_all_to_all_min_ep)
    graph_on = graph.mode != GraphMode.none and cfg.phase in graph.phases
    max_graphs = graph_budget(hardware.graph, layer_count(real), cfg)
    fallback = ""
    on_cpu = _cpu_ops(real, strategy.heterogeneous) if graph_on and strategy.heterogeneous else np.zeros(0, dtype=bool)
    if graph_on and np.any(real.flags & FLAG_COMPUTE_DEPENDENT):
        names = [real.op_names[j] for j in np.flatnonzero(real.flags & FLAG_COMPUTE_DEPENDENT)[:3]]
        fallback = f"compute-dependent ops cannot be in a graph ({', '.join(names)})"
    elif np.any(on_cpu):
        # A graph holds device work only: its replays ran these ops as device kernels, unsaid.
        names = [real.op_names[j] for j in np.flatnonzero(on_cpu)[:3]]
        fallback = f"ops run on host cores (strategy.heterogeneous) cannot be in a graph ({', '.join(names)})"
    elif graph_on:
        startup = cfg.serving.enabled and graph.mode == GraphMode.capture
        startup_batch = cfg.serving.max_batch if startup else None
        engine = run.engine if run.engine is not None and run.engine.active else None
        buckets = kept_sizes(list(graph.buckets), max_graphs, startup_batch, engine)
        info["graph_buckets"] = len(buckets)
        trimmed = trim_note(asked_sizes(list(graph.buckets), startup_batch, engine), buckets, hardware.graph, layer_count(real), cfg)
        if trimmed:
            info["graph_note"] = trimmed
        padded, fits = bucket_batch(real.batch, buckets)
        if graph.mode == GraphMode.capture:
            keys = np.where(fits, padded, -1)
        else:
            dynamic = (real.flags & FLAG_DYNAMIC) > 0
            if np.any(dynamic) and not buckets_on:
                names = [real.op_names[j] for j in np.flatnonzero(dynamic)[:3]]
                fallback = (
                    f"dynamic shapes ({', '.join(names)}, ...) change every step: a sunk graph needs static shapes;"
                    " bucket them (strategy.shape_buckets=true) or use capture"
                )
            probe = padded_workload(padded, kv_padded, moe_pad=buckets_on)
            keys = np.where(fits, _row_keys(probe.shape_key), -1)
        if startup and not fallback:
            # A serving engine captures its graphs at start-up, before the first request (startup_sizes):
            # the request stream only replays them.
            mode[np.isin(keys, buckets)] = REPLAY
            info["graph_captures"] = len(buckets)
            info["capture_ms"] = len(buckets) * hardware.graph.capture_ms / hardware.host.speed  # as a simulated capture (host work)
            startup_note = f"{len(buckets)} graphs captured at start-up, before the first request (not in the request times)"
            info["graph_note"] = f"{startup_note}; {trimmed}" if trimmed else startup_note
        elif not fallback:
            # In program order: a new shape set builds a graph while the budget lasts, else runs eagerly.
            seen: set[int] = set()
            for s in range(steps):
                if keys[s] == -1:
                    continue
                if keys[s] in seen:
                    mode[s] = REPLAY
                elif len(seen) < max_graphs:
                    mode[s] = BUILD
                    seen.add(int(keys[s]))
        if not fallback and not fits.all():
            # Said: a graph run whose batches outgrow its sizes ran them eagerly, "1 capture" and nothing more.
            largest = f"the largest graph size ({max(buckets)})" if buckets else "no graph size"
            above = (f"{int(np.count_nonzero(~fits))} of {steps} steps run eagerly: batch {int(real.batch[~fits].max())}"
                     f" is above {largest} (strategy.graph.buckets)")
            info["graph_note"] = f"{info['graph_note']}; {above}" if info.get("graph_note") else above
    if graph.mode != GraphMode.none and not graph_on:
        phases = ",".join(p.value for p in graph.phases)
        info["graph_note"] = (f"{cfg.phase.value} runs eagerly: strategy.graph.phases=[{phases}]"
                              f" (add {cfg.phase.value} to run it as a graph)")
    if fallback:
        if graph.dynamic_fallback == Fallback.error:
            raise ConfigError(f"strategy.graph.mode={graph.mode.value}: {fallback}")
        info["graph_note"] = f"{graph.mode.value} falls back to host scheduling: {fallback}"
        padded = host_padded
    if graph_on:
        info.setdefault("graph_captures", int(np.count_nonzero(mode == BUILD)))
        syncs = int(np.count_nonzero(real.kind == KIND_SYNC))
        if syncs and np.any(mode == REPLAY):
            # An imported profile's blocking syncs cannot sit inside a captured graph: a replay drops
            # them, which assumes the step can be restructured to do without them.
            info["graph_syncs_dropped"] = syncs
            info.setdefault("graph_note", f"{syncs} blocking sync(s) per step dropped inside the graph (assumed removable)")

    # Routed (MoE) ops multiply the rows their tokens route, in a graph too: a grouped matmul takes the
    # per-expert counts as a device tensor (vllm-ascend's npu_grouped_matmul group_list; vLLM's fused_moe
    # pads each expert to its tile eagerly and replayed alike), so only shape bucketing pads them.
    workload = probe if graph_on and not fallback and graph.mode != GraphMode.capture else padded_workload(padded, kv_padded, buckets_on)
    workload.real_batch = real.batch
    # Padding rows hold no KV cache (vLLM gives a graph's padding rows a dummy slot, no blocks): the cache
    # is the real sequences' at their real lengths; padding adds only compute and workspace.
    workload.memory = dataclasses.replace(workload.memory, kv_cache_gb=real.memory.kv_cache_gb,
                                          graphs_gb=info.get("graph_captures", 0) * hardware.graph.graph_mem_mib * MIB / 1e9)
    workload.real_kv_len = real.kv_len
    if graph_on or buckets_on:
        info["padding_waste"] = _padding_waste(workload, real, run)
    cpu_ops = _cpu_ops(workload, strategy.heterogeneous)
    if strategy.fusion:
        workload, cpu_ops = fuse(workload, strategy.fusion_max_ops, cpu_ops)
    split_ops = _split_ops(workload, graph.splitting_ops) if graph.mode == GraphMode.capture and graph.splitting_ops else None
    if split_ops is not None and np.any(mode == REPLAY):
        pieces = int(graph_piece_of(workload, split_ops).max()) + 1
        info["graph_pieces"] = pieces
        piecewise = f"piecewise: {pieces} graph pieces a step, {int(split_ops.sum())} ops run eagerly between them"
        info["graph_note"] = f"{info['graph_note']}; {piecewise}" if info.get("graph_note") else piecewise
    tiling_hit = np.zeros((steps, workload.n_ops), dtype=bool)
    if strategy.tiling_cache:
        # Ops that run a Tiling stage: kernels with host scheduling of their own (not CPU ops, copies,
        # host-only ops, work carried in from before the step, or followers of a launch group), on
        # host-scheduled steps, and the ops a piecewise replay launches eagerly on replayed ones.
        leads = (workload.group < 0) | (workload.group == np.arange(workload.n_ops))
        looked_up = ~cpu_ops & ~np.isin(workload.kind, (*HOST_ONLY_KINDS, KIND_COPY)) & ((workload.flags & FLAG_CARRIED_IN) == 0) & leads
        replayed = (mode == REPLAY)[:, None]
        lookups = looked_up[None, :] & ~replayed
        if split_ops is not None:
            lookups |= (looked_up & split_ops)[None, :] & replayed
        # Each node caches its own results: the key is the node and its run-time shapes, looked up in
        # program order, step by step and op by op (a boolean mask reads row-major).
        node_keys = mix_keys(workload.shape_key, np.arange(workload.n_ops, dtype=np.int64)[None, :])
        hits = lru_hits(node_keys[lookups], strategy.tiling_cache_entries)
        tiling_hit[lookups] = hits
        counted = lookups & measured_mask(workload.warmup_steps, mode)[:, None]  # as the run's figures are
        if counted.any():
            info["tiling_cache_hit_rate"] = float(tiling_hit[counted].mean())
            if counted[0].any():  # 0.0 at one step, 0.47 at two, 0.90 at 32: the warm-up decides the figure
                info["tiling_note"] = ("tiling hit rate counts the first step, whose lookups find the cache cold;"
                                       " workload.warmup_steps=1 measures a warm one"
                                       + (" (with workload.steps of 2 or more)" if steps == 1 else ""))
        else:  # a rate of 0 would read as a cache that always missed
            info["tiling_note"] = "tiling cache: no lookups in the measured steps, so no hit rate (a graph replay looks up split ops only)"
    return workload, StepPlan(mode=mode, tiling_hit=tiling_hit, cpu_ops=cpu_ops, info=info, split_ops=split_ops)


def _op_types(workload: Workload) -> np.ndarray:
    return np.array([name.rsplit(".", 1)[-1] for name in workload.op_names])


def _split_ops(workload: Workload, op_types: list[str]) -> np.ndarray:
    """Ops of the `strategy.graph.splitting_ops` types: kernels launched eagerly between graph pieces."""
    types = _op_types(workload)
    # A list may name attention of every kind (vLLM splits at its attention op, whichever backend, MLA
    # included: the preset names attention and mla_attention); a type no card has is a typo, and a list of
    # which this workload has none would split nothing.
    unknown = sorted(set(op_types) - set(types.tolist()))
    if [t for t in unknown if t not in OP_FORMULAS] or len(unknown) == len(set(op_types)):
        raise ConfigError(
            f"strategy.graph.splitting_ops={list(op_types)}: no op of type {', '.join(unknown)} in this workload"
            f" (types: {', '.join(sorted(set(types.tolist())))})"
        )
    chosen = np.isin(types, list(op_types))
    misplaced = chosen & (np.isin(workload.kind, HOST_ONLY_KINDS) | ((workload.flags & FLAG_CARRIED_IN) > 0) | (workload.group >= 0))
    if misplaced.any():
        raise ConfigError(
            f"strategy.graph.splitting_ops={list(op_types)}: {workload.op_names[int(np.argmax(misplaced))]} is a host-only op,"
            " work carried in from before the step or part of a launch group: only a kernel of its own can run between pieces"
        )
    return chosen


def graph_piece_of(workload: Workload, split_ops: np.ndarray) -> np.ndarray:
    """The graph launch (0, 1, …) each op of a replayed step runs in: one per run of graph ops between the
    split ops, which run eagerly (-1); host-only ops, which a replay skips, do not split a piece, and work
    carried in from before the step is in none (-1 both)."""
    piece = np.full(workload.n_ops, -1, dtype=np.int64)
    launched = ~np.isin(workload.kind, HOST_ONLY_KINDS) & ((workload.flags & FLAG_CARRIED_IN) == 0)
    current, open_piece = -1, False
    for j in np.flatnonzero(launched):
        if split_ops[j]:
            open_piece = False
            continue
        if not open_piece:
            current, open_piece = current + 1, True
        piece[j] = current
    return piece


def _row_keys(shape_key: np.ndarray) -> np.ndarray:
    """One int64 per step that changes when any op's shape key does."""
    key = np.zeros(shape_key.shape[0], dtype=np.int64)
    for column in shape_key.T:
        key = mix_keys(key, column)
    return key


def _padding_waste(padded: Workload, real: Workload, run: RunConfig) -> float:
    """Share of device time spent on padding (batch to bucket, KV to block) over the whole run."""
    padded_us = device_times(padded, run.hardware)[0].sum()
    real_us = device_times(real, run.hardware)[0].sum()
    return float(max(0.0, padded_us - real_us) / padded_us) if padded_us > 0 else 0.0


FLAGGED = "flagged"  # strategy.heterogeneous entry selecting the ops flagged cpu_eligible


def _cpu_ops(workload: Workload, op_types: list[str]) -> np.ndarray:
    """Ops run on the CPU: those of the listed types, plus the ops flagged cpu_eligible with `flagged`."""
    types = _op_types(workload)
    unknown = sorted(set(op_types) - set(types.tolist()) - {FLAGGED})
    if unknown:
        raise ConfigError(
            f"strategy.heterogeneous={list(op_types)}: no op of type {', '.join(unknown)} in this workload"
            f" (types: {', '.join(sorted(set(types.tolist())))}, or '{FLAGGED}' for ops flagged cpu_eligible)"
        )
    chosen = np.isin(types, list(op_types))
    if FLAGGED in op_types:
        chosen |= (workload.flags & FLAG_CPU_ELIGIBLE) > 0
    misplaced = chosen & (
        np.isin(workload.kind, (KIND_CODE[OpKind.comm], KIND_COPY, *HOST_ONLY_KINDS))
        | ((workload.flags & (FLAG_CARRIED_IN | FLAG_IN_GRAPH)) > 0)
        | (workload.group >= 0)
    )
    if misplaced.any():
        raise ConfigError(
            f"strategy.heterogeneous={list(op_types)}: {workload.op_names[int(np.argmax(misplaced))]} is a collective, a copy,"
            " a host-only op or part of a graph or launch group, and cannot run as a CPU kernel"
        )
    return chosen


def fuse(workload: Workload, max_ops: int, cpu_ops: np.ndarray) -> tuple[Workload, np.ndarray]:
    """Merge runs of consecutive fusible vector ops into single kernels (seed 004 task fusion)."""
    n = workload.n_ops
    referenced_later = np.zeros(n, dtype=bool)  # read by an op other than the next one
    for j, deps in enumerate(workload.after):
        for d in deps:
            if d != j - 1:
                referenced_later[d] = True
    fusible = (
        (workload.kind == VECTOR)
        & (workload.stream == STREAM_COMPUTE)
        & ((workload.flags & (FLAG_VALUE_DEPENDENT | FLAG_COMPUTE_DEPENDENT | FLAG_CARRIED_IN | FLAG_IN_GRAPH)) == 0)
        & (workload.group < 0)
        & ~cpu_ops
    )
    if workload.not_before_us is not None:  # an op waiting for unseen work keeps its own kernel
        fusible &= ~np.any(~np.isnan(workload.not_before_us), axis=0)
    group_of = np.empty(n, dtype=np.int64)
    groups: list[list[int]] = []
    for j in range(n):
        joins = (
            groups
            and fusible[j]
            and fusible[groups[-1][-1]]
            and workload.after[j] == [j - 1]
            and not referenced_later[j - 1]
            and len(groups[-1]) < max_ops
        )
        if joins:
            groups[-1].append(j)
        else:
            groups.append([j])
        group_of[j] = len(groups) - 1
    if len(groups) == n:
        return workload, cpu_ops
    starts = np.array([g[0] for g in groups])
    firsts = starts

    def summed(matrix: np.ndarray) -> np.ndarray:
        return np.add.reduceat(matrix, starts, axis=1)

    fixed_given = ~np.isnan(workload.device_us)
    all_given = np.logical_and.reduceat(fixed_given, starts, axis=1)
    device_us = np.where(all_given, summed(np.nan_to_num(workload.device_us)), np.nan)
    shape_key = workload.shape_key[:, starts].copy()
    for g, members in enumerate(groups):
        for j in members[1:]:
            shape_key[:, g] = mix_keys(shape_key[:, g], workload.shape_key[:, j])
    names = [
        workload.op_names[g[0]] if len(g) == 1 else f"{workload.op_names[g[0]]}+{'+'.join(workload.op_names[j].rsplit('.', 1)[-1] for j in g[1:])}"
        for g in groups
    ]
    fused = Workload(
        name=workload.name,
        phase=workload.phase,
        op_names=names,
        kind=workload.kind[firsts],
        stream=workload.stream[firsts],
        flags=np.bitwise_or.reduceat(workload.flags, starts),
        after=[sorted({int(group_of[d]) for d in workload.after[g[0]]}) for g in groups],
        comm=workload.comm[firsts],
        comm_ranks=workload.comm_ranks[firsts],
        comm_stride=workload.comm_stride[firsts],
        devices=workload.devices,
        flops=summed(workload.flops),
        bytes=summed(workload.bytes),
        device_us=device_us,
        shape_key=shape_key,
        batch=workload.batch,
        kv_len=workload.kv_len,
        tokens=workload.tokens,
        warmup_steps=workload.warmup_steps,
        memory=workload.memory,
        n_kernels=np.add.reduceat(workload.n_kernels, starts),
        host_us=np.add.reduceat(workload.host_us, starts),
        weight_bytes=np.add.reduceat(workload.weight_bytes, starts),
        cache_bytes=summed(workload.cache_bytes),
        step_weight_bytes=summed(workload.step_weight_bytes) if workload.step_weight_bytes is not None else None,
        expert_groups=summed(workload.expert_groups) if workload.expert_groups is not None else None,
        real_batch=workload.real_batch,
        real_kv_len=workload.real_kv_len,
        host_cost_us=_fused_costs(workload.host_cost_us, starts),
        group=workload.group[firsts],  # fusible ops belong to no group: unchanged
        not_before_us=workload.not_before_us[:, starts] if workload.not_before_us is not None else None,
        step_io=workload.step_io,
    )
    return fused, cpu_ops[firsts]


LAUNCH_COST = HOST_COSTS.index("launch")


def _fused_costs(costs: np.ndarray | None, starts: np.ndarray) -> np.ndarray | None:
    """Measured host costs of fused ops: every member's framework work still runs (summed; NaN, the
    preset's price, stays NaN), but there is one launch call: the dearest member's."""
    if costs is None:
        return None
    summed = np.add.reduceat(costs, starts, axis=1)
    summed[:, :, LAUNCH_COST] = np.fmax.reduceat(costs[:, :, LAUNCH_COST], starts, axis=1)
    return summed
