"""The run schema: the dataclasses Hydra composes conf/ into (RunConfig and its parts), their enums,
and each part's own checks (ranges from limits.py)."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional

import numpy as np

from harness.base.errors import ConfigError
from harness.config.limits import LIMITS, check_field, check_limits, check_number
from harness.config.paths import WORKLOADS_DIR, card_preset_names


# How the host issues ops: one thread (eager), two (async launch queue), three (pipeline). Built
# with the functional API because `async` is a keyword and OmegaConf matches enum members by name.
Dispatch = enum.Enum("Dispatch", {"eager": "eager", "async": "async", "pipeline": "pipeline"})


class Phase(enum.Enum):
    decode = "decode"
    prefill = "prefill"


class Kernels(enum.Enum):
    """How a card's ops are issued: as a serving engine's fused kernels, or as HF transformers eager
    issues them (unfused RMSNorm, RoPE and activation: several kernels each)."""

    fused = "fused"
    unfused = "unfused"


class KvCache(enum.Enum):
    """How HF transformers / plain PyTorch code (kernels=unfused) keeps the KV cache: `dynamic` grows it by
    torch.cat of the whole cache every step (HF's DynamicCache), `static` writes the new tokens in place
    (HF's StaticCache, gpt-fast); `auto` as HF does it: static when the strategy captures or sinks
    graphs, which need fixed shapes, dynamic otherwise. One cache serves the whole generation, so a phase
    left out of strategy.graph.phases keeps it too. Fused (serving-engine) op lists and op-list CSVs have
    their own KV update and ignore it."""

    auto = "auto"
    dynamic = "dynamic"
    static = "static"


class KvCacheDtype(enum.Enum):
    """What a model card's KV cache holds: `auto` the model's own dtype, `fp8` one byte a value (vLLM's
    --kv-cache-dtype fp8, TensorRT-LLM's FP8 KV cache): half the cache's memory and the bytes decode
    attention reads, and a cast where the new tokens are written."""

    auto = "auto"
    fp8 = "fp8"


class DecodeKvReads(enum.Enum):
    """How often decode attention moves a KV head from memory when several query heads share it (GQA):
    `shared`, once for its group of query heads (FlashAttention's and FlashInfer's GQA decode, TensorRT-LLM's
    XQA), or `per_query_head`, once for each query head: a kernel with one thread block per query head
    (TensorRT-LLM's masked MHA, "a single CUDA thread-block per head" in its gpt_attention doc), with no
    reuse of a KV head in L2 by its query heads' blocks: an upper bound. TensorRT-LLM v0.6.1 had no XQA, so
    the experiments of its GQA throughput rows use it (docs/validation.md, "TensorRT-LLM's GQA decode").
    MHA models read the same either way."""

    shared = "shared"
    per_query_head = "per_query_head"


class Quant(enum.Enum):
    """Weight/activation precision of the linear layers: bf16, or int8 weights and activations (W8A8)."""

    bf16 = "bf16"
    w8a8 = "w8a8"


class OpKind(enum.Enum):
    """Which unit bounds an op's compute: cube (matmul), vector (element-wise), comm (collective), copy
    (a DMA copy or memset on a stream); host: front-end work on the host thread with no kernel (e.g. a
    layer's Python code in eager mode); sync: the host blocks until the ops it names have run (a
    stream or device sync of an imported profile)."""

    cube = "cube"
    vector = "vector"
    comm = "comm"
    host = "host"
    sync = "sync"
    copy = "copy"


# The most capture sizes (strategy.graph.buckets) a run may list; it lists one at least.
MAX_GRAPH_SIZES = 10_000


class Platform(enum.Enum):
    """The software stack a hardware preset runs, or a strategy needs."""

    any = "any"
    ascend = "ascend"  # CANN / torch_npu / MindSpore
    cuda = "cuda"  # CUDA / PyTorch

    def runs_on(self, hardware: "Platform") -> bool:
        """Whether what needs this stack (a strategy, an engine) runs on hardware of that one."""
        return Platform.any in (self, hardware) or self == hardware


class ScaleupTopology(enum.Enum):
    """How a node's devices are wired (hardware.link.scaleup_topology)."""

    switch = "switch"  # through a switch (NVSwitch): every device reaches any peer at scaleup_gbps
    # Direct links to every peer (Ascend's HCCS mesh, AMD's Infinity Fabric): scaleup_gbps is a device's total
    # over its devices_per_node - 1 links, so a group of p ranks in a node uses p - 1 of them.
    full_mesh = "full_mesh"


# The graph capture/replay preset of each platform: where a strategy of the other platform points to.
GRAPH_STRATEGY_OF = {Platform.ascend: "acl_graph", Platform.cuda: "cuda_graph"}


@dataclass
class HostConfig:
    """The host CPU as the runtime sees it, and what each host stage of one op costs (µs)."""

    _key: ClassVar[str] = "hardware.host"
    threads: int = 8  # CPU cores available to the dispatching process (a pool shared by host lanes)
    framework_us: float = 10.0  # framework dispatch of one op (Python/C++ front end)
    # Python of one nn.Module call beyond the ops it runs (__call__, hooks, forward's own lines): paid per
    # module call by HF transformers / plain PyTorch model code (workload.kernels=unfused; a card's
    # unfused_*_modules); a serving engine's model code has engine.layer_overhead_us instead
    module_us: float = 0.0
    infer_shape_us: float = 5.0  # InferShape: output shapes and attributes
    tiling_us: float = 10.0  # Tiling / Resize: tiling data, workspace and output sizes
    alloc_us: float = 4.0  # device memory allocation (pool hit) for outputs and workspace
    launch_us: float = 12.0  # kernel launch call (one AscendCL / CUDA runtime call)
    free_us: float = 4.0  # returning inputs/workspace to the pool
    sync_us: float = 12.0  # a blocking synchronisation call (stream/event sync) once its wait is over
    jitter_cv: float = 0.0  # coefficient of variation of host stage durations (lognormal, seeded)
    kernel_params: int = 10  # parameters of a typical kernel; launch_us includes writing them
    param_write_us: float = 1.0  # writing one kernel parameter (unpacked)
    packed_params_us: float = 5.0  # writing all of a kernel's parameters at once (parameter packing)
    driver_alloc_us: float = 50.0  # allocation from the driver when the memory pool cannot serve it
    stream_pool_speedup: float = 0.2  # a stream-local pool's alloc/free is this much cheaper than the global pool's
    tiling_lookup_us: float = 1.0  # a tiling-cache hit: hash the run-time parameters and look up
    cpu_gflops: float = 50.0  # host compute rate for ops run on the CPU (heterogeneous execution)
    # Per-thread speed of this host's CPU against the one its costs were measured on (1: that one). Every
    # task on a host thread (the stages above, syncs, the engine's work, graph calls, CPU ops, a card's
    # or a trace's host time) takes its cost / speed: sim/lowering.py applies it with the jitter.
    speed: float = 1.0

    def __post_init__(self) -> None:
        check_limits(self)
        # launch_us covers a kernel's own parameters written one by one: the call itself cannot be negative.
        check_field(
            self,
            self.launch_us >= self.kernel_params * self.param_write_us,
            "launch_us",
            f"must be >= kernel_params × param_write_us = {self.kernel_params * self.param_write_us:g}",
        )


@dataclass
class DeviceConfig:
    """The accelerator: AI cores, peaks, HBM, and the fixed cost every kernel pays.

    The peaks are the datasheet's for `rated_cores` cores: one core's peak is a hardware number, and a
    device with `ai_cores` cores has `ai_cores` of them (fewer cores, slower). Kernels reach
    `matmul_efficiency` of the matmul peak (what a framework's GEMMs reach on model shapes) and
    `hbm_efficiency` of the HBM bandwidth (at best: a streaming kernel's)."""

    _key: ClassVar[str] = "hardware.device"
    ai_cores: int = 24
    cube_tflops: float = 353.9  # BF16/FP16 dense matmul peak of `rated_cores` cores
    cube_int8_tflops: float = 0.0  # INT8 (W8A8) dense matmul peak, TOPS; 0: as cube_tflops (no faster int8 path)
    vector_tflops: float = 22.0
    rated_cores: int = 0  # cores the peaks above are for; 0: ai_cores
    matmul_efficiency: float = 1.0  # fraction of the matmul peak a framework's compute-bound GEMMs reach
    hbm_efficiency: float = 1.0  # best fraction of the HBM bandwidth a kernel reaches (streaming)
    hbm_gb: float = 68.72  # GB of 1e9 bytes (the Atlas A2's 64 GiB)
    hbm_gbps: float = 1600.0
    matmul_fixed_us: float = 5.0
    vector_fixed_us: float = 2.0
    comm_fixed_us: float = 10.0
    block_quantum_us: float = 10.0  # time base of "one core's capacity" in the block-split rule
    # A grouped matmul's cost for each expert it multiplies (a group: its own weights, offsets and tiling),
    # beyond its FLOPs and bytes; 0: not measured
    grouped_matmul_group_us: float = 0.0
    # The device front end's time for each kernel launched on its own (eager), before its work starts:
    # behind the previous kernel when it was queued (where a trace measures it, docs/profiles.md), and on
    # an idle stream as well (there it stands for the launch's own latency to the device). Graph tasks
    # pay hardware.graph.task_dispatch_us instead.
    kernel_gap_us: float = 0.0

    def __post_init__(self) -> None:
        check_limits(self)

    @property
    def cores_rated(self) -> int:
        return self.rated_cores or self.ai_cores


@dataclass
class LinkConfig:
    """Host link (PCIe) and the scale-up link between devices."""

    _key: ClassVar[str] = "hardware.link"
    pcie_gbps: float = 32.0
    pcie_latency_us: float = 2.0
    scaleup_gbps: float = 196.0  # between devices of one node: one device's, per direction
    scaleup_latency_us: float = 0.5
    scaleup_topology: ScaleupTopology = ScaleupTopology.switch
    devices_per_node: int = 8
    internode_gbps: float = 25.0  # between nodes (collectives spanning nodes run at this speed)
    internode_latency_us: float = 1.5
    # How the serving stack moves a MoE layer's tokens here: an expert-parallel group of at least this many
    # ranks splits its tokens over TP and exchanges them all-to-all (dispatch, combine); a smaller one
    # all-gathers (every rank routes all its DP group's tokens to its own experts, the outputs all-reduced).
    # 4096 (never all-to-all) as the GPU engines do by default: vLLM's all2all backend is
    # allgather_reducescatter (vllm-project/vllm#33728, restored as the portable default by #53952), SGLang's
    # --moe-a2a-backend is none ("Uses All-Reduce or All-Gather for token dispatch", its expert-parallelism
    # docs); DeepEP and the like are opted into (hardware.link.moe_all_to_all_min_ep=2). atlas_a2: 16.
    moe_all_to_all_min_ep: int = 4096

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class GraphCostConfig:
    """What graph execution costs on this platform (capture/replay and graph sink)."""

    _key: ClassVar[str] = "hardware.graph"
    capture_ms: float = 50.0  # capturing one graph (on top of the eager step that records it)
    graph_mem_mib: float = 26.0  # device memory one captured graph holds
    replay_launch_us: float = 10.0  # one launch of a whole captured graph
    task_dispatch_us: float = 0.6  # device-side scheduling of each task of a graph (replay or sink)
    # Leaving a graph: the device's extra gap, beyond device.kernel_gap_us, before a task launched on its
    # own that follows a graph launch's tasks on the same stream (the eager attention between vLLM's
    # piecewise graph pieces, the eager sampling after a whole-forward graph).
    exit_gap_us: float = 0.0
    param_update_us: float = 50.0  # host refresh of one dynamic task's arguments before a replay
    sink_load_ms: float = 100.0  # loading a whole graph to the device once (graph sink)
    sink_trigger_us: float = 10.0  # one execution trigger of a sunk graph
    address_update_us: float = 5.0  # updating input/output addresses of a sunk graph per execution
    max_graphs: int = 1800  # graph resources (streams) available; a graph of L layers uses L + 1
    # Communication groups (TP, DP of more than one rank) take streams too: each holds
    # `comm_group_reserved_streams` apart and multiplies a graph's use by 1 + `comm_group_streams`
    # (sim/policies.py: graph_budget).
    comm_group_streams: int = 0
    comm_group_reserved_streams: int = 0

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class HardwareConfig:
    _key: ClassVar[str] = "hardware"
    name: str = "custom"
    platform: Platform = Platform.any
    host: HostConfig = field(default_factory=HostConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    graph: GraphCostConfig = field(default_factory=GraphCostConfig)

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class OpSpec:
    """One op of an explicit op list (`workload.ops`), for hand-made or trace-like workloads."""

    _key: ClassVar[str] = "workload.ops[]"
    name: str = "op"
    kind: OpKind = OpKind.vector
    flops: float = 0.0
    bytes: float = 0.0
    device_us: Optional[float] = None  # fixed device time; replaces the roofline when given
    host_us: float = 0.0  # host time of a kind=host op
    stream: int = -1  # device stream: 0 compute, 1 communication, 2.. more compute streams; -1: by kind
    after: List[int] = field(default_factory=list)  # earlier ops (indices) it waits for; empty: the previous op
    dynamic: bool = False  # shape changes between steps
    cpu_eligible: bool = False  # may run on the host CPU (heterogeneous execution)
    value_dependent: bool = False  # InferShape needs a value of the previous op's output (D2H + sync)
    compute_dependent: bool = False  # output shape known only after it ran (drain, D2H + sync)

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class ServingConfig:
    """A seeded request stream under continuous batching (decode): the batch changes step by step.

    Requests arrive as a Poisson process, already prefilled (prefill runs elsewhere); before each step
    the scheduler admits arrived requests, oldest first, up to `max_batch`; a request leaves after
    generating its output length. Prompt and output lengths are lognormal with the given means and cv.
    """

    _key: ClassVar[str] = "workload.serving"
    enabled: bool = False
    arrival_rate_rps: float = 20.0
    prompt_len_mean: float = 1024.0
    output_len_mean: float = 128.0
    len_cv: float = 0.5
    max_batch: int = 32
    initial_requests: int = 0  # requests already waiting at t = 0

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class WorkloadConfig:
    _key: ClassVar[str] = "workload"
    name: str = "custom"
    card: Optional[str] = "llama2_7b"  # model card in workloads/ (file name without .yaml); null: use ops/path
    path: Optional[str] = None  # op-list CSV (a trace workload); used when card is null
    phase: Phase = Phase.decode
    quant: Quant = Quant.bf16
    kernels: Kernels = Kernels.fused  # fused (serving engine) or unfused (HF transformers eager) op sequences
    kv_cache: KvCache = KvCache.auto  # kernels=unfused: the KV update (dynamic: torch.cat, static: in place; auto: static under graphs)
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto  # auto: the model's dtype; fp8: one byte a cached value (fused kernels only)
    decode_kv_reads: DecodeKvReads = DecodeKvReads.shared  # GQA decode attention: a KV head read once for its query heads, or once per query head
    tp: int = 1  # tensor-parallel degree (attention heads, MLP columns)
    dp: int = 1  # data-parallel attention groups; devices = tp × dp
    ep: int = 0  # expert-parallel degree for MoE layers; 0: all devices
    batch_size: int = 1
    context_len: int = 1024  # prompt length (prefill) / tokens already in the KV cache (decode)
    steps: int = 32  # simulated steps (decode iterations, or prefill batches)
    warmup_steps: int = 0  # first steps left out of the measured window
    repeat: int = 1  # trace workloads: play the CSV's steps this many times (a graph what-if needs a step to capture in)
    ops: List[OpSpec] = field(default_factory=list)  # explicit op list, used when card is not set
    # Card fields replaced for this run (e.g. +workload.card_overrides.layer_overhead_us=2000): sweeps
    # and calibration vary a card's numbers without editing workloads/.
    card_overrides: Dict[str, Any] = field(default_factory=dict)
    serving: ServingConfig = field(default_factory=ServingConfig)

    def __post_init__(self) -> None:
        if self.serving.enabled:
            check_field(self, self.phase == Phase.decode, "phase", "serving batches need phase=decode")
            check_field(self, self.card is not None, "card", "serving batches need a model card (sizes follow the batch)")
        check_limits(self)
        if self.kv_cache_dtype == KvCacheDtype.fp8:
            check_field(self, self.kernels == Kernels.fused, "kv_cache_dtype", "fp8 needs kernels=fused (HF transformers' caches hold the model's dtype)")
            check_field(self, self.card is not None, "kv_cache_dtype", "fp8 prices a model card's KV cache; an op list or CSV carries its own bytes")
        # Read by nothing else: a value that changes nothing would run as if it had not been given.
        check_field(self, self.repeat == 1 or self.path is not None, "repeat",
                    "plays an op-list file's steps again (workload.path); a card's or an op list's run is workload.steps long")
        check_field(self, self.kv_cache == KvCache.auto or (self.kernels == Kernels.unfused and self.card is not None), "kv_cache",
                    "is how a card's unfused (HF transformers / plain PyTorch) code updates its cache (workload.kernels=unfused):"
                    " fused kernels write it in place (kv_cache_write), an op list or CSV has its own ops")
        if self.decode_kv_reads == DecodeKvReads.per_query_head:
            check_field(self, self.card is not None, "decode_kv_reads", "per_query_head prices a model card's attention; an op list or CSV carries its own bytes")
        check_field(self, self.warmup_steps < self.steps, "warmup_steps", f"must be < workload.steps={self.steps}")
        check_field(self, self.ep in (0, 1, self.devices), "ep",
                    f"must be 0 or {self.devices} (experts spread over every device, tp × dp, as vLLM's expert parallelism) or 1"
                    " (none: every device holds its slice of every expert)" if self.devices > 1 else
                    "must be 0 or 1 on one device (tp × dp = 1): expert parallelism spreads experts over several")
        # One source of ops a run: a second one given beside it was read by nobody, while the header named
        # it ("path=ok.csv" over a run of the default card).
        if self.card is not None:
            check_field(self, self.path is None, "path",
                        f"not read while workload.card={self.card} is set: workload=trace (or workload.card=null) runs the file")
            check_field(self, not self.ops, "card", "is read instead of workload.ops: set workload.card=null to run the op list")
        elif self.path is not None:
            check_field(self, not self.ops, "path", "is read instead of workload.ops: give one of them")
        if self.card is None and self.name in card_preset_names():
            # workload.card=null over a card's preset: the preset's name (llama2_7b_decode) named an op list
            # in the header, summary.json, the reports and MLflow; named as workload=trace names a file.
            self.name = "trace" if self.path is not None else "ops"
        if self.card is None and self.path is None:
            check_field(self, len(self.ops) > 0, "ops", "empty op list: set workload.card, workload.path or workload.ops")
        elif self.card is None:
            check_field(self, Path(self.path).is_file(), "path", "no such file")
        elif not (WORKLOADS_DIR / f"{self.card}.yaml").is_file():
            known = sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))
            check_field(self, False, "card", f"no such model card in workloads/ (known: {', '.join(known)})")

    @property
    def devices(self) -> int:
        return self.tp * self.dp


class GraphMode(enum.Enum):
    none = "none"  # host scheduling of every op
    sink = "sink"  # graph sink: load once per static shape set, then one trigger per execution
    capture = "capture"  # capture/replay (ACL graph, CUDA graph) with batch buckets


class Fallback(enum.Enum):
    host = "host"  # run with host scheduling and say why
    error = "error"  # stop with the reason


def vllm_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max_size + 1, 16)."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))


@dataclass
class GraphStrategyConfig:
    _key: ClassVar[str] = "strategy.graph"
    mode: GraphMode = GraphMode.none
    buckets: List[int] = field(default_factory=vllm_capture_sizes)  # capture sizes (batch buckets)
    phases: List[Phase] = field(default_factory=lambda: [Phase.decode])  # prefill stays eager by default
    dynamic_fallback: Fallback = Fallback.host  # when graph mode cannot apply (dynamic shapes, too many graphs)
    # Capture mode: dynamic tasks' arguments are refreshed after the replay is launched, each task waiting
    # for its own refresh (an event), so the host refreshes layer i + 1 while the device runs layer i;
    # false: all of them before the launch.
    refresh_after_launch: bool = False
    # Capture mode: op types that run eagerly between captured pieces instead of inside one graph (vLLM
    # V1's piecewise CUDA graphs, `compilation_config.splitting_ops`: attention); empty: one graph a step.
    splitting_ops: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_limits(self)
        check_field(self, 0 < len(self.buckets) <= MAX_GRAPH_SIZES, "buckets", f"must be a list of 1..{MAX_GRAPH_SIZES} sizes")
        check_field(self, len(self.splitting_ops) <= 64, "splitting_ops", "must name at most 64 op types")
        check_field(
            self, not self.splitting_ops or self.mode == GraphMode.capture, "splitting_ops",
            f"splits a captured graph into pieces: it needs strategy.graph.mode=capture (here {self.mode.value})",
        )


@dataclass
class StrategyConfig:
    _key: ClassVar[str] = "strategy"
    name: str = "custom"
    platform: Platform = Platform.any  # a stack-specific preset (GE graph sink, MindSpore, CUDA graphs)
    dispatch: Dispatch = Dispatch.eager
    queue_capacity: int = 64  # bounded queue between host threads (async / pipeline), in ops
    graph: GraphStrategyConfig = field(default_factory=GraphStrategyConfig)
    shape_buckets: bool = False  # decode: pad KV to kv_block, routed MoE rows to a power of 2, batch to graph.buckets
    kv_block: int = 256  # KV-length bucket when shape_buckets is on
    tiling_cache: bool = False  # cache tiling results under (op, shapes) keys
    tiling_cache_entries: int = 4096
    fusion: bool = False  # schedule runs of consecutive fusible vector ops as one kernel
    fusion_max_ops: int = 4
    param_packing: bool = False  # write a kernel's parameters at once
    memory_pool: bool = True  # allocations come from a pool (False: every one from the driver)
    free_on_main: bool = False  # async/pipeline: frees go back to the main thread (later) instead of the allocating one
    stream_local_pool: bool = False  # per-stream pools: no lock, cheaper alloc/free
    heterogeneous: List[str] = field(default_factory=list)  # op types run on host CPU cores (e.g. [sampling]); "flagged": cpu_eligible ops

    def __post_init__(self) -> None:
        check_limits(self)


@dataclass
class EngineStageConfig:
    """Host time of one stage of the serving engine's per-step loop: a fixed part, plus per sequence
    in the batch, plus per token through the model (decode: one per sequence)."""

    per_step_us: float = 0.0
    per_request_us: float = 0.0
    per_token_us: float = 0.0

    def cost_us(self, sequences: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.per_step_us + self.per_request_us * sequences + self.per_token_us * tokens


ENGINE_STAGES = ("schedule", "prepare", "sample", "output", "api")


@dataclass
class EngineConfig:
    """The serving engine's own host work around the model, every step (conf/engine/*.yaml).

    Stages: `schedule` (admit requests, allocate KV blocks), `prepare` (build the model inputs: block
    tables, positions, attention metadata), `sample` (host side of sampling and logits processing, once
    the sampled tokens are back), `output` (process outputs, detokenize), `api` (the HTTP server: stream
    the new tokens). Where they run decides what they cost: on the engine's main thread they
    serialise with the model's dispatch; `api_process` / `output_process` move them to processes of
    their own (their own host cores); `async_output` processes a step's outputs on another thread while
    the next step runs (with `output_process` too, the process takes them); `async_scheduling` schedules and prepares the next step while this one's device
    work runs; `multi_step` N schedules and prepares once per N steps and processes their outputs together.
    `layer_overhead_us` is the engine's own model code per decoder layer in eager mode (attention
    metadata, custom-op wrappers), which a graph replay skips."""

    _key: ClassVar[str] = "engine"
    name: str = "none"
    platform: Platform = Platform.any  # an engine of one stack (vllm-ascend: Ascend NPUs)
    layer_overhead_us: float = 0.0
    schedule: EngineStageConfig = field(default_factory=EngineStageConfig)
    prepare: EngineStageConfig = field(default_factory=EngineStageConfig)
    sample: EngineStageConfig = field(default_factory=EngineStageConfig)
    output: EngineStageConfig = field(default_factory=EngineStageConfig)
    api: EngineStageConfig = field(default_factory=EngineStageConfig)
    multi_step: int = 1
    async_output: bool = False
    async_scheduling: bool = False
    api_process: bool = False
    output_process: bool = False
    # The capture sizes it captures at start-up, from the strategy's list: every size up to the first that
    # holds the largest batch (vLLM V0 pads max_num_seqs up to a capture size), or, with
    # `graph_twice_max_batch`, every size up to min(2 x the largest batch, graph_max_batch) (vLLM >= 0.11.1:
    # max_cudagraph_capture_size = min(2 x max_num_seqs, 512)); never above `graph_max_batch` (0: no cap;
    # SGLang's cuda_graph_max_bs): larger batches run eagerly.
    graph_twice_max_batch: bool = False
    graph_max_batch: int = 0
    # The engine turns `async_output` off when the model runs eagerly (vLLM 0.6: enforce_eager on CUDA).
    async_output_needs_graphs: bool = False

    def __post_init__(self) -> None:
        check_limits(self)
        for stage in ENGINE_STAGES:
            check_limits(getattr(self, stage), f"engine.{stage}")

    @property
    def active(self) -> bool:
        return self.layer_overhead_us > 0 or any(
            getattr(self, stage).per_step_us or getattr(self, stage).per_request_us or getattr(self, stage).per_token_us
            for stage in ENGINE_STAGES
        )


class ArtifactPolicy(enum.Enum):
    """Which of a run directory's files MLflow stores as well (the folder keeps them all)."""

    small = "small"  # all but trace.json (megabytes per run); the run_dir tag points to the folder
    all = "all"  # everything: for a shared server, where the folder is on another machine
    none = "none"  # nothing: params, metrics and tags only


@dataclass
class TrackingConfig:
    _key: ClassVar[str] = "tracking"
    enabled: bool = True
    uri: Optional[str] = None  # default: sqlite file outputs/mlflow.db under the launch directory
    experiment: str = "hostbound"
    artifacts: ArtifactPolicy = ArtifactPolicy.small
    # How long logging may wait on an unreachable store before the run gives up on it (its files stay):
    # the HTTP timeout of each request, with no retries (MLflow's MLFLOW_HTTP_REQUEST_* variables win when set).
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        check_limits(self)
        check_field(self, bool(self.experiment.strip()), "experiment", "must name an experiment")
        if self.uri is not None:
            if credentials_in(self.uri):  # every record of the run would keep it: summary, .hydra/, logs, MLflow
                what = "a password (in its query)" if password_in_query(self.uri) else "a user name and password"
                raise ConfigError(
                    f"tracking.uri={redacted(self.uri)!r}: holds {what}, which every record of the run would keep;"
                    " give them to MLflow as MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (a database: its own"
                    " password file or environment, e.g. PGPASSFILE) and write the URI without them"
                )
            scheme = tracking_scheme(self.uri)
            check_field(
                self, scheme not in FOLDER_STORES, "uri",
                "a folder store, which MLflow 3 no longer writes to (its filesystem backend is in maintenance mode):"
                " use a database, e.g. sqlite:///PATH/mlflow.db",
            )
            check_field(
                self, scheme in TRACKING_SCHEMES, "uri",
                f"unknown scheme {scheme!r} (use sqlite:///PATH, http(s)://HOST:PORT, postgresql://…, mysql://…)",
            )
            # An in-memory database is gone when the process ends: the run said "logged" and nothing was kept.
            check_field(self, not in_memory(self.uri), "uri", "an in-memory sqlite database keeps nothing once the run ends: use sqlite:///PATH/mlflow.db")
            database = sqlite_path(self.uri)
            # MLflow retries a folder for minutes, whatever tracking.timeout_s says: refused before the run.
            check_field(self, database is None or not database.is_dir(), "uri", "names a folder: a sqlite store is a file, e.g. sqlite:///PATH/mlflow.db")


# Stores MLflow logs to: its SQLAlchemy databases, a tracking server.
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
# A local folder (file:PATH, or a plain path): MLflow 3.17 refuses to log there.
FOLDER_STORES = ("file", "")


# Query keys a database driver takes a password from (`postgresql://u@h/db?password=…`): as secret as
# `user:password@`, and kept by the same records.
PASSWORD_QUERY_KEYS = ("password", "passwd")


def password_in_query(uri: str) -> bool:
    """Whether a URI's query names a password (PASSWORD_QUERY_KEYS, any case)."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        query = urlsplit(uri).query
    except ValueError:
        return False
    return any(key.strip().lower() in PASSWORD_QUERY_KEYS for key, _ in parse_qsl(query, keep_blank_values=True))


def credentials_in(uri: str) -> bool:
    """Whether a URI carries a password (`scheme://user:password@host…`, or `?password=…`)."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(uri).password is not None or password_in_query(uri)
    except ValueError:  # not a URL (a folder): nothing to hide
        return False


def in_memory(uri: str) -> bool:
    """Whether a sqlite URI names an in-memory database (`sqlite://`, `sqlite:///:memory:`, `?mode=memory`),
    which MLflow writes to and forgets when the process ends."""
    if tracking_scheme(uri) != "sqlite":
        return False
    from urllib.parse import parse_qsl, unquote

    rest, _, query = uri.split(":", 1)[1].partition("?")
    path = unquote(rest.removeprefix("///")) if rest.startswith("///") else None  # sqlite:// (no path): in memory
    memory_mode = any(k.lower() == "mode" and v.lower() == "memory" for k, v in parse_qsl(query, keep_blank_values=True))
    return path in (None, "", ":memory:", "file::memory:") or memory_mode


def redacted(uri: str) -> str:
    """The URI with its password as `***` (to name it in a message), in its user info and its query."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    parts = urlsplit(uri)
    if password_in_query(uri):
        query = [(k, "***" if k.strip().lower() in PASSWORD_QUERY_KEYS else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        parts = parts._replace(query=urlencode(query, safe="*"))
    if parts.password is None:
        return parts.geturl()
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"{parts.username}:***@{host}{port}").geturl()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (percent-escapes decoded, as SQLAlchemy does), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    from urllib.parse import unquote

    return Path(unquote(uri.removeprefix("sqlite:///").split("?", 1)[0]))


def tracking_scheme(uri: str) -> str:
    """`postgresql+psycopg2://…` → `postgresql`; a plain path → ''."""
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if not match or len(match[1]) == 1:  # no scheme, or a Windows drive letter
        return ""
    return match[1].split("+", 1)[0].lower()


@dataclass
class OutputConfig:
    _key: ClassVar[str] = "output"
    trace_steps: int = 2  # steps of the measured window written to trace.json (0: no trace)
    # Steps drawn in timeline.png (0: no picture). null: 1 in a single run, none in a sweep's jobs, where
    # drawing one per job cost more than simulating it (the sweep's report compares the runs instead).
    timeline_steps: Optional[int] = None
    print_summary: bool = True

    def __post_init__(self) -> None:
        check_limits(self)

    def steps_drawn(self, in_sweep: bool = False) -> int:
        """timeline_steps, null resolved for a single run or a sweep's job."""
        if self.timeline_steps is None:
            return 0 if in_sweep else 1
        return self.timeline_steps


@dataclass
class RunConfig:
    """The whole run: what `python -m harness` composes."""

    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    resume: bool = False  # reuse a finished run of the same configuration instead of simulating it (harness.results.resume)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    _key: ClassVar[str] = "run"

    def __post_init__(self) -> None:
        check_number("seed", self.seed, LIMITS["seed"], integer=True)
        needs, has = self.strategy.platform, self.hardware.platform
        if not needs.runs_on(has):
            nearest = GRAPH_STRATEGY_OF[has]
            raise ConfigError(
                f"strategy={self.strategy.name}: runs on {needs.value} hardware, hardware={self.hardware.name} is"
                f" {has.value} (graph capture/replay there: strategy={nearest})"
            )
        needs = self.engine.platform
        if not needs.runs_on(has):
            raise ConfigError(f"engine={self.engine.name}: serves on {needs.value} hardware, hardware={self.hardware.name} is {has.value}")

    @property
    def names(self) -> dict[str, str]:
        """What ran, by preset name: summary.json's first keys, MLflow tags, the terminal header."""
        return {"hardware": self.hardware.name, "workload": self.workload.name, "strategy": self.strategy.name, "engine": self.engine.name}


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a nested dict/list config into dotted keys (lists of scalars stay one value)."""
    out: dict[str, Any] = {}
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(cfg, list) and any(isinstance(v, (dict, list)) for v in cfg):
        for i, value in enumerate(cfg):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = cfg
    return out


def unflatten(flat: Mapping[str, Any]) -> Any:
    """The nested config `flatten` made `flat` from (a mapping whose keys are 0, 1, … is the list it was)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return _lists_back(nested)


def _lists_back(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {key: _lists_back(value) for key, value in node.items()}
    if items and list(items) == [str(i) for i in range(len(items))]:
        return list(items.values())
    return items
