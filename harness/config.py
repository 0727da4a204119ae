"""Typed configuration: the dataclass schemas behind conf/, registered in Hydra's ConfigStore.

Composition (Hydra) checks key names and types against these schemas; `to_run_config` then builds
the dataclasses, whose `__post_init__` checks values and raises `ConfigError` naming the full key and
the value. Building a config has no side effects.
"""
from __future__ import annotations

import difflib
import enum
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Sequence

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
_PACKAGE = Path(__file__).resolve().parent
# A source checkout (or an editable install) keeps conf/ and workloads/ at the top level; a wheel ships
# them inside the package (pyproject.toml maps them to harness/conf, harness/workloads).
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else REPO_ROOT / "conf"
WORKLOADS_DIR = _PACKAGE / "workloads" if (_PACKAGE / "workloads").is_dir() else REPO_ROOT / "workloads"


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


MAX_STREAMS = 16  # device streams: 0 compute, 1 communication, 2.. further compute streams (traces)


def _check(obj: Any, condition: bool, field_name: str, requirement: str) -> None:
    if not condition:
        value = getattr(obj, field_name)
        raise ConfigError(f"{obj._key}.{field_name}={value!r}: {requirement}")


def _positive(obj: Any, *field_names: str) -> None:
    for name in field_names:
        _check(obj, getattr(obj, name) > 0, name, "must be > 0")


def _non_negative(obj: Any, *field_names: str) -> None:
    for name in field_names:
        _check(obj, getattr(obj, name) >= 0, name, "must be >= 0")


class Platform(enum.Enum):
    """The software stack a hardware preset runs, or a strategy needs."""

    any = "any"
    ascend = "ascend"  # CANN / torch_npu / MindSpore
    cuda = "cuda"  # CUDA / PyTorch


# The graph capture/replay preset of each platform: where a strategy of the other platform points to.
GRAPH_STRATEGY_OF = {Platform.ascend: "acl_graph", Platform.cuda: "cuda_graph"}


@dataclass
class HostConfig:
    """The host CPU as the runtime sees it, and what each host stage of one op costs (µs)."""

    _key: ClassVar[str] = "hardware.host"
    threads: int = 8  # CPU cores available to the dispatching process (a pool shared by host lanes)
    framework_us: float = 10.0  # framework dispatch of one op (Python/C++ front end)
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

    def __post_init__(self) -> None:
        _positive(self, "threads", "cpu_gflops")
        _non_negative(
            self, "framework_us", "infer_shape_us", "tiling_us", "alloc_us", "launch_us", "free_us", "sync_us", "jitter_cv",
            "kernel_params", "param_write_us", "packed_params_us", "driver_alloc_us", "stream_pool_speedup", "tiling_lookup_us",
        )
        _check(self, self.stream_pool_speedup < 1, "stream_pool_speedup", "must be < 1")
        # launch_us covers a kernel's own parameters written one by one: the call itself cannot be negative.
        _check(
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
    `matmul_efficiency` of the matmul peak and `hbm_efficiency` of the HBM bandwidth at best."""

    _key: ClassVar[str] = "hardware.device"
    ai_cores: int = 24
    cube_tflops: float = 353.9  # BF16/FP16 dense matmul peak of `rated_cores` cores
    cube_int8_tflops: float = 0.0  # INT8 (W8A8) dense matmul peak, TOPS; 0: as cube_tflops (no faster int8 path)
    vector_tflops: float = 22.0
    rated_cores: int = 0  # cores the peaks above are for; 0: ai_cores
    matmul_efficiency: float = 1.0  # best fraction of the matmul peak a kernel reaches (large GEMMs)
    hbm_efficiency: float = 1.0  # best fraction of the HBM bandwidth a kernel reaches (streaming)
    hbm_gb: float = 64.0
    hbm_gbps: float = 1600.0
    matmul_fixed_us: float = 5.0
    vector_fixed_us: float = 2.0
    comm_fixed_us: float = 10.0
    block_quantum_us: float = 10.0  # time base of "one core's capacity" in the block-split rule

    def __post_init__(self) -> None:
        _positive(self, "ai_cores", "cube_tflops", "vector_tflops", "hbm_gb", "hbm_gbps", "block_quantum_us")
        _non_negative(self, "matmul_fixed_us", "vector_fixed_us", "comm_fixed_us", "cube_int8_tflops", "rated_cores")
        for name in ("matmul_efficiency", "hbm_efficiency"):
            _check(self, 0 < getattr(self, name) <= 1, name, "must be in (0, 1]")

    @property
    def cores_rated(self) -> int:
        return self.rated_cores or self.ai_cores


@dataclass
class LinkConfig:
    """Host link (PCIe) and the scale-up link between devices."""

    _key: ClassVar[str] = "hardware.link"
    pcie_gbps: float = 32.0
    pcie_latency_us: float = 2.0
    scaleup_gbps: float = 196.0  # between devices of one node
    scaleup_latency_us: float = 0.5
    devices_per_node: int = 8
    internode_gbps: float = 25.0  # between nodes (collectives spanning nodes run at this speed)
    internode_latency_us: float = 1.5

    def __post_init__(self) -> None:
        _positive(self, "pcie_gbps", "scaleup_gbps", "devices_per_node", "internode_gbps")
        _non_negative(self, "pcie_latency_us", "scaleup_latency_us", "internode_latency_us")


@dataclass
class GraphCostConfig:
    """What graph execution costs on this platform (capture/replay and graph sink)."""

    _key: ClassVar[str] = "hardware.graph"
    capture_ms: float = 50.0  # capturing one graph (on top of the eager step that records it)
    graph_mem_mib: float = 26.0  # device memory one captured graph holds
    replay_launch_us: float = 10.0  # one launch of a whole captured graph
    task_dispatch_us: float = 0.6  # device-side scheduling of each task of a graph (replay or sink)
    param_update_us: float = 50.0  # host refresh of one dynamic task's arguments before a replay
    sink_load_ms: float = 100.0  # loading a whole graph to the device once (graph sink)
    sink_trigger_us: float = 10.0  # one execution trigger of a sunk graph
    address_update_us: float = 5.0  # updating input/output addresses of a sunk graph per execution
    max_graphs: int = 1800  # graph resources (streams) available; a graph of L layers uses L + 1

    def __post_init__(self) -> None:
        _non_negative(self, "capture_ms", "graph_mem_mib", "replay_launch_us", "task_dispatch_us", "param_update_us",
                      "sink_load_ms", "sink_trigger_us", "address_update_us")
        _positive(self, "max_graphs")


@dataclass
class HardwareConfig:
    _key: ClassVar[str] = "hardware"
    name: str = "custom"
    platform: Platform = Platform.any
    host: HostConfig = field(default_factory=HostConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    graph: GraphCostConfig = field(default_factory=GraphCostConfig)


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
        _non_negative(self, "flops", "bytes", "host_us")
        _check(self, -1 <= self.stream < MAX_STREAMS, "stream", f"must be -1 (by kind) or a stream 0..{MAX_STREAMS - 1} (0 compute, 1 communication)")
        if self.device_us is not None:
            _non_negative(self, "device_us")


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
        _positive(self, "arrival_rate_rps", "prompt_len_mean", "output_len_mean", "max_batch")
        _non_negative(self, "len_cv", "initial_requests")


@dataclass
class WorkloadConfig:
    _key: ClassVar[str] = "workload"
    name: str = "custom"
    card: Optional[str] = "llama2_7b"  # model card in workloads/ (file name without .yaml); null: use ops/path
    path: Optional[str] = None  # op-list CSV (a trace workload); used when card is null
    phase: Phase = Phase.decode
    quant: Quant = Quant.bf16
    kernels: Kernels = Kernels.fused  # fused (serving engine) or unfused (HF transformers eager) op sequences
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
            _check(self, self.phase == Phase.decode, "phase", "serving batches need phase=decode")
            _check(self, self.card is not None, "card", "serving batches need a model card (sizes follow the batch)")
        _positive(self, "batch_size", "context_len", "steps", "tp", "dp", "repeat")
        _non_negative(self, "warmup_steps", "ep")
        _check(self, self.warmup_steps < self.steps, "warmup_steps", f"must be < workload.steps={self.steps}")
        _check(self, self.ep <= self.devices, "ep", f"must be <= the devices (tp × dp = {self.devices})")
        if self.card is None and self.path is None:
            _check(self, len(self.ops) > 0, "ops", "empty op list: set workload.card, workload.path or workload.ops")
        elif self.card is None:
            _check(self, Path(self.path).is_file(), "path", "no such file")
        elif not (WORKLOADS_DIR / f"{self.card}.yaml").is_file():
            known = sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))
            _check(self, False, "card", f"no such model card in workloads/ (known: {', '.join(known)})")

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

    def __post_init__(self) -> None:
        _check(self, len(self.buckets) > 0 and min(self.buckets) > 0, "buckets", "must be a non-empty list of positive sizes")


@dataclass
class StrategyConfig:
    _key: ClassVar[str] = "strategy"
    name: str = "custom"
    platform: Platform = Platform.any  # a stack-specific preset (GE graph sink, MindSpore, CUDA graphs)
    dispatch: Dispatch = Dispatch.eager
    queue_capacity: int = 64  # bounded queue between host threads (async / pipeline), in ops
    graph: GraphStrategyConfig = field(default_factory=GraphStrategyConfig)
    shape_buckets: bool = False  # decode: pad KV to kv_block, per-expert tokens to powers of 2, batch to graph.buckets
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
        _positive(self, "queue_capacity", "tiling_cache_entries", "fusion_max_ops", "kv_block")


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
    the next step runs; `async_scheduling` schedules and prepares the next step while this one's device
    work runs; `multi_step` N schedules and prepares once per N steps and processes their outputs together.
    `layer_overhead_us` is the engine's own model code per decoder layer in eager mode (attention
    metadata, custom-op wrappers), which a graph replay skips."""

    _key: ClassVar[str] = "engine"
    name: str = "none"
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

    def __post_init__(self) -> None:
        _non_negative(self, "layer_overhead_us")
        _positive(self, "multi_step")
        for stage in ENGINE_STAGES:
            for name in ("per_step_us", "per_request_us", "per_token_us"):
                value = getattr(getattr(self, stage), name)
                if not value >= 0:
                    raise ConfigError(f"engine.{stage}.{name}={value!r}: must be >= 0")

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


@dataclass
class OutputConfig:
    _key: ClassVar[str] = "output"
    trace_steps: int = 2  # steps of the measured window written to trace.json (0: no trace)
    timeline_steps: int = 1  # steps drawn in timeline.png (0: no picture)
    print_summary: bool = True

    def __post_init__(self) -> None:
        _non_negative(self, "trace_steps", "timeline_steps")


@dataclass
class RunConfig:
    """The whole run: what `python -m harness` composes."""

    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    _key: ClassVar[str] = "run"

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed}: must be >= 0")
        needs, has = self.strategy.platform, self.hardware.platform
        if Platform.any not in (needs, has) and needs != has:
            nearest = GRAPH_STRATEGY_OF[has]
            raise ConfigError(
                f"strategy={self.strategy.name}: runs on {needs.value} hardware, hardware={self.hardware.name} is"
                f" {has.value} (graph capture/replay there: strategy={nearest})"
            )

    @property
    def names(self) -> dict[str, str]:
        """What ran, by preset name: summary.json's first keys, MLflow tags, the terminal header."""
        return {"hardware": self.hardware.name, "workload": self.workload.name, "strategy": self.strategy.name, "engine": self.engine.name}


_PROCESS_ID = f"{os.getpid()}{time.time_ns() // 1000 % 1000:03d}"  # unique among processes started together


def register_configs() -> None:
    """Register the schema so conf/config.yaml's defaults list starts from `run_schema`, and the
    `hostbound_id` resolver that makes run and sweep folders unique (two runs started in the same second
    used to share one)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    if not OmegaConf.has_resolver("hostbound_id"):
        OmegaConf.register_new_resolver("hostbound_id", lambda: _PROCESS_ID)


def compose_run(overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig `python -m harness <overrides>` would run (composed from conf/, values checked)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return to_run_config(cfg)


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Turn a composed config into dataclasses, running every value check (raises ConfigError)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(plain, dict):
        plain.pop("hydra", None)
    schema = OmegaConf.structured(RunConfig)
    try:
        merged = OmegaConf.merge(schema, plain)
        run = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf validation: unknown key or wrong type
        raise ConfigError(one_line(exc)) from exc
    assert isinstance(run, RunConfig)
    return run


def one_line(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """An OmegaConf/Hydra error as one line naming the key and the value the user wrote, with "did you
    mean" for a misspelt key or preset; errors it does not know are squeezed (causes included) as they are."""
    parts: list[str] = []
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for line in str(current).splitlines():
            line = line.strip()
            if not line or line.startswith(("object_type=", "Set the environment", "reference_type=")):
                continue
            if line not in parts:
                parts.append(line)
        current = current.__cause__ or current.__context__
    raw = "; ".join(parts) if parts else type(exc).__name__
    return _explain(raw, overrides) or raw


def _written(key: str, overrides: Sequence[str], fallback: str) -> str:
    """`key=value` as the command line wrote it (`+`/`++` prefixes dropped), else with `fallback`."""
    for override in overrides:
        name, _, value = override.partition("=")
        if name.lstrip("+~") == key:
            return f"{key}={value}"
    return f"{key}={fallback}"


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def config_keys() -> list[str]:
    """Every key of the run schema (dotted), and the config groups."""
    groups = [p.name for p in CONF_DIR.iterdir() if p.is_dir()]
    return sorted(set(flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig)))) | set(groups))


_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "text"}


def _explain(raw: str, overrides: Sequence[str]) -> Optional[str]:
    if m := re.search(r"Could not find '(?P<group>[\w/]+)/(?P<value>[^']+)'", raw):
        group, value = m["group"], m["value"]
        options = group_options(group)
        if not options:
            return None
        return f"{group}={value}: no such {group} preset{_did_you_mean(value, options)}; choose from {', '.join(options)}"
    if m := re.search(r"Key '[^']+' not in '\w+'; full_key: (?P<key>\S+)", raw):
        key = m["key"]
        return f"{_written(key, overrides, '...')}: no such key{_did_you_mean(key, config_keys())}"
    if m := re.search(r"Value '(?P<value>.*?)' of type '\w+' could not be converted to (?P<to>\w+); full_key: (?P<key>[^;\s]+)", raw):
        return f"{_written(m['key'], overrides, m['value'])}: must be {_TYPE_WORDS.get(m['to'], m['to'])}"
    if m := re.search(r"Value '(?P<value>.*?)' is not a valid bool \(type \w+\); full_key: (?P<key>[^;\s]+)", raw):
        return f"{_written(m['key'], overrides, m['value'])}: must be true or false"
    if m := re.search(r"Invalid value '(?P<value>.*?)', expected one of \[(?P<options>[^\]]*)\]; full_key: (?P<key>[^;\s]+)", raw):
        options = [o.strip() for o in m["options"].split(",")]
        return f"{_written(m['key'], overrides, m['value'])}: must be one of {', '.join(options)}{_did_you_mean(m['value'], options)}"
    if m := re.search(r"Could not override '(?P<key>[^']+)'\. No match in the defaults list", raw):
        key = m["key"]
        return f"{_written(key, overrides, '...')}: {key} is not in the defaults list; add it with +{_written(key, overrides, '...')}"
    return None


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
