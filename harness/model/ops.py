"""The op list a simulation runs: per-step arrays of every op's work (`Workload`), the op kinds, flags
and collectives, the memory plan of the simulated rank, and a workload from explicit op rows.

The lowest layer of the model: model cards (harness.model.workload) and op-list CSVs (harness.model.ops_csv)
both produce a `Workload`; policies, lowering and metrics read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from harness.config.schema import OpKind, Phase, Quant, WorkloadConfig
from harness.base.errors import ConfigError

KIND_CODE = {OpKind.cube: 0, OpKind.vector: 1, OpKind.comm: 2, OpKind.host: 3, OpKind.sync: 4, OpKind.copy: 5}
KIND_HOST, KIND_SYNC, KIND_COPY = KIND_CODE[OpKind.host], KIND_CODE[OpKind.sync], KIND_CODE[OpKind.copy]
HOST_ONLY_KINDS = (KIND_HOST, KIND_SYNC)  # no device task
STREAM_COMPUTE, STREAM_COMM = 0, 1

# Op flags (bit set per op).
FLAG_DYNAMIC = 1
FLAG_VALUE_DEPENDENT = 2
FLAG_COMPUTE_DEPENDENT = 4
FLAG_CPU_ELIGIBLE = 8
FLAG_ROUTED = 16  # shapes follow MoE routing (static inside graphs: padded to capacity)
FLAG_CARRIED_IN = 32  # launched before the step (an imported profile): device work, no host work
FLAG_IN_GRAPH = 64  # ran inside a captured graph (an imported profile): device-side dispatch per task
FLAG_INT8 = 128  # an INT8 matmul (W8A8 weights and activations): the device's INT8 peak applies

# Host costs an op may carry per step (an imported profile measured them): the host stages of
# harness.sim.lowering.HOST_STAGES, then `own`, the host time of a host or sync op.
HOST_COSTS = ("framework", "infer_shape", "tiling", "alloc", "launch", "free", "own")

# Collectives (how the device model prices a comm op).
COMM_NONE, COMM_ALL_REDUCE, COMM_ALL_GATHER, COMM_ALL_TO_ALL = 0, 1, 2, 3

TOKEN_ID_BYTES = 4  # int32 token ids (and positions) copied per token
BYTES_PER_GB = 1e9


@dataclass
class Workload:
    """Ops of a step (same list every step) and their per-step costs, for one simulated rank."""

    name: str
    phase: Phase
    op_names: list[str]
    kind: np.ndarray  # int8 per op: 0 cube, 1 vector, 2 comm, 3 host
    stream: np.ndarray  # int8 per op: 0 compute, 1 communication
    flags: np.ndarray  # uint8 per op
    after: list[list[int]]  # per op: earlier ops of the step it waits for (data dependencies)
    comm: np.ndarray  # int8 per op: collective type (COMM_*)
    comm_ranks: np.ndarray  # int32 per op: ranks taking part
    flops: np.ndarray  # float64 (steps, ops)
    bytes: np.ndarray  # float64 (steps, ops); for a collective: the bytes each rank contributes
    device_us: np.ndarray  # float64 (steps, ops): fixed device time, NaN = from the cost model
    shape_key: np.ndarray  # int64 (steps, ops): changes exactly when the op's shapes change
    batch: np.ndarray  # int64 per step: sequences in the simulated rank's batch
    kv_len: np.ndarray  # float64 per step: mean KV-cache length the step's sequences attend over
    tokens: np.ndarray  # int64 per step: tokens through the layers (batch in decode, batch × prompt in prefill)
    warmup_steps: int
    memory: "MemoryPlan"
    n_kernels: Optional[np.ndarray] = None  # int per op: original ops fused into it (1 unless fused)
    real_kv_len: Optional[np.ndarray] = None  # KV length per step before padding to a block
    host_us: Optional[np.ndarray] = None  # float per op: host time of kind=host ops (0 for kernels)
    weight_bytes: Optional[np.ndarray] = None  # float per op: resident weights it reads (not activations)
    cache_bytes: Optional[np.ndarray] = None  # float (steps, ops): resident KV cache it reads (not activations)
    # float (steps, ops): weights it reads in each step, where some ops read fewer than weight_bytes (routed
    # experts: the experts hit); None: weight_bytes every step
    step_weight_bytes: Optional[np.ndarray] = None
    # float (steps, ops): experts a grouped matmul multiplies in each step, each a group with the device's
    # per-group cost (grouped_matmul_group_us); None: no grouped matmul
    expert_groups: Optional[np.ndarray] = None
    real_batch: Optional[np.ndarray] = None  # sequences per step before padding to a bucket
    # Tokens each step produced where not every real sequence does (a multi-step block's finished rows).
    generated: Optional[np.ndarray] = None
    # Imported profiles: measured host costs (steps, ops, len(HOST_COSTS)), NaN where the hardware
    # preset prices it; the first op of the ops one host call issued together (-1: its own call);
    # a wait (µs after the step starts) for device work the profile does not hold, NaN for none.
    host_cost_us: Optional[np.ndarray] = None
    group: Optional[np.ndarray] = None
    not_before_us: Optional[np.ndarray] = None
    # Each step's input tokens are copied in and its sampled tokens read back with a blocking sync
    # (False: the op list holds its own copies and syncs, as an imported profile does).
    step_io: bool = True
    # Where a collective's ranks sit: the distance between a group's members (per op; 1: consecutive, a TP
    # group; tp for a DP group) and the devices of the deployment they tile (0: not known, an imported list).
    comm_stride: Optional[np.ndarray] = None
    devices: int = 0

    def __post_init__(self) -> None:
        self._activation_bytes: Optional[np.ndarray] = None  # not a field: dataclasses.replace() recomputes it
        if self.n_kernels is None:
            self.n_kernels = np.ones(len(self.op_names), dtype=np.int64)
        if self.real_batch is None:
            self.real_batch = self.batch
        if self.real_kv_len is None:
            self.real_kv_len = self.kv_len
        if self.host_us is None:
            self.host_us = np.zeros(len(self.op_names))
        if self.weight_bytes is None:
            self.weight_bytes = np.zeros(len(self.op_names))
        if self.cache_bytes is None:
            self.cache_bytes = np.zeros_like(self.bytes)
        if self.group is None:
            self.group = np.full(len(self.op_names), -1, dtype=np.int64)
        if self.comm_stride is None:
            self.comm_stride = np.ones(len(self.op_names), dtype=np.int32)

    def activation_bytes(self) -> np.ndarray:
        """(steps, ops) bytes an op allocates: its outputs, taken as half its traffic beyond the weights and
        the KV cache it reads.
        Computed once (a chunked run asks for every chunk); treat as read-only."""
        if self._activation_bytes is None:
            weights = self.weight_bytes[None, :] if self.step_weight_bytes is None else self.step_weight_bytes
            self._activation_bytes = np.ascontiguousarray(np.maximum(self.bytes - self.cache_bytes - weights, 0.0) / 2.0)
        return self._activation_bytes

    @property
    def n_kernels_per_step(self) -> int:
        """Ops that run on the device (host-only ops and syncs excluded)."""
        return int(np.count_nonzero(~np.isin(self.kind, HOST_ONLY_KINDS)))

    @property
    def n_ops(self) -> int:
        return len(self.op_names)

    @property
    def steps(self) -> int:
        return int(self.batch.shape[0])

    @property
    def tokens_out(self) -> np.ndarray:
        """Tokens generated per step (each real sequence samples one; padding slots do not count, nor do
        rows a multi-step block keeps after their sequence finished)."""
        return self.real_batch if self.generated is None else self.generated

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Prompt tokens of the real sequences per step (a prefill's; padding rows' tokens do not count)."""
        return self.tokens * self.real_batch // np.maximum(self.batch, 1)


@dataclass
class MemoryPlan:
    """What the simulated rank keeps in HBM (GB)."""

    weights_gb: float = 0.0
    kv_cache_gb: float = 0.0
    workspace_gb: float = 0.0
    graphs_gb: float = 0.0  # captured graphs (capture/replay)

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.kv_cache_gb + self.workspace_gb + self.graphs_gb


def default_kv_len(phase: Phase, context_len: int, steps: int) -> np.ndarray:
    """KV length per step of a fixed batch: decode step s attends over the prompt, s earlier tokens and itself."""
    if phase == Phase.decode:
        return context_len + np.arange(steps, dtype=np.float64) + 1
    return np.full(steps, float(context_len))


KEY_MULTIPLIER = np.int64(1_000_003)


def mix_keys(key, value):
    """Fold `value` into a 64-bit key (wrapping arithmetic): the one hash of shape keys in the harness."""
    with np.errstate(over="ignore"):
        return np.asarray(key, dtype=np.int64) * KEY_MULTIPLIER ^ np.asarray(value, dtype=np.int64)


def shape_keys(template_ids: np.ndarray, tokens: np.ndarray, varying: np.ndarray, batch: np.ndarray, dynamic: np.ndarray) -> np.ndarray:
    """(steps, templates) int64 keys: equal exactly when an op's input shapes are equal.

    `varying` (steps × 1 or steps × templates) is what a dynamic op's shapes follow besides the batch;
    `dynamic` (templates, or steps × templates where a step's padding makes an op static on it) which do.
    """
    varying = np.broadcast_to(np.asarray(varying, dtype=np.float64), (tokens.shape[0], template_ids.shape[0]))
    key = mix_keys(template_ids.astype(np.int64)[None, :] + 1, tokens.astype(np.int64)[:, None])
    key = mix_keys(key, batch.astype(np.int64)[:, None])
    dynamic = dynamic if dynamic.ndim == 2 else dynamic[None, :]
    return mix_keys(key, np.where(dynamic, varying.astype(np.int64), -1))


def from_static_ops(cfg: WorkloadConfig, rows: list[dict], per_step: Optional[dict] = None) -> Workload:
    """A workload from explicit ops (the same every step unless `per_step` gives (steps, ops) arrays)."""
    kinds = [r["kind"] for r in rows]
    flags = np.array(
        [
            r.get("dynamic", False) * FLAG_DYNAMIC
            | r.get("value_dependent", False) * FLAG_VALUE_DEPENDENT
            | r.get("compute_dependent", False) * FLAG_COMPUTE_DEPENDENT
            | r.get("cpu_eligible", False) * FLAG_CPU_ELIGIBLE
            | r.get("routed", False) * FLAG_ROUTED
            for r in rows
        ],
        dtype=np.uint8,
    )
    per_step = dict(per_step or {})
    for column, default in (("flops", 0.0), ("bytes", 0.0), ("device_us", None)):
        if column not in per_step:
            values = [np.nan if r.get(column, default) is None else r.get(column, default) for r in rows]
            per_step[column] = np.tile(np.array(values, dtype=np.float64), (cfg.steps, 1))
    return from_op_arrays(
        cfg,
        names=[r["name"] for r in rows],
        kind=np.array([KIND_CODE[k] for k in kinds], dtype=np.int8),
        stream=np.array([r.get("stream", -1) for r in rows], dtype=np.int8),
        flags=flags,
        after=[None if r.get("after") is None else list(r["after"]) for r in rows],
        host_us=np.array([r.get("host_us", 0.0) or 0.0 for r in rows], dtype=np.float64),
        per_step=per_step,
    )


def from_op_arrays(
    cfg: WorkloadConfig, names: list[str], kind: np.ndarray, stream: np.ndarray, flags: np.ndarray,
    after: list[Optional[list[int]]], host_us: np.ndarray, per_step: dict,
) -> Workload:
    """A workload from per-op arrays and (steps, ops) arrays of `flops`, `bytes`, `device_us` (and
    optionally `shape_key`). `stream` -1: by kind; `after` None: the previous op, []: no dependency."""
    steps = cfg.steps
    n = len(names)
    stream = np.where(stream >= 0, stream, np.where(kind == KIND_CODE[OpKind.comm], STREAM_COMM, STREAM_COMPUTE)).astype(np.int8)
    after = [deps if deps is not None else ([j - 1] if j > 0 else []) for j, deps in enumerate(after)]
    for j, deps in enumerate(after):
        for d in deps:
            if not 0 <= d < j:
                raise ConfigError(f"workload.ops[{j}].after={deps}: must name earlier ops (indices 0..{j - 1})")
    dynamic = (flags & FLAG_DYNAMIC) > 0
    shape_key = per_step.get("shape_key")
    if shape_key is None:
        step_ids = np.arange(steps, dtype=np.int64)
        shape_key = shape_keys(np.arange(n), np.ones(steps), step_ids[:, None], np.ones(steps), dynamic)
    batch = np.full(steps, cfg.batch_size, dtype=np.int64)
    decode = cfg.phase == Phase.decode
    return Workload(
        name=cfg.name,
        phase=cfg.phase,
        op_names=list(names),
        kind=kind,
        stream=stream,
        flags=flags,
        after=after,
        comm=np.full(n, COMM_NONE, dtype=np.int8),
        comm_ranks=np.ones(n, dtype=np.int32),
        flops=np.ascontiguousarray(per_step["flops"], dtype=np.float64),
        bytes=np.ascontiguousarray(per_step["bytes"], dtype=np.float64),
        device_us=np.ascontiguousarray(per_step["device_us"], dtype=np.float64),
        shape_key=np.ascontiguousarray(shape_key, dtype=np.int64),
        host_us=host_us,
        cache_bytes=np.ascontiguousarray(per_step["cache_bytes"], dtype=np.float64) if "cache_bytes" in per_step else None,
        batch=batch,
        kv_len=default_kv_len(cfg.phase, cfg.context_len, steps),
        tokens=batch if decode else batch * cfg.context_len,
        warmup_steps=cfg.warmup_steps,
        memory=MemoryPlan(),
    )


def check_memory(workload: Workload, hbm_gb: float, cfg: WorkloadConfig | None = None) -> None:
    """Fail with the sizes when the simulated rank's weights + KV cache + workspace + graphs exceed HBM;
    `cfg` (the run's workload config) names only the remedies that would shrink this rank."""
    m = workload.memory
    if m.total_gb > hbm_gb:
        remedies = ["raise workload.tp (an MoE's experts: workload.ep)"]  # dp replicates a rank; it shrinks nothing
        if cfg is None or cfg.quant != Quant.w8a8:
            remedies.append("use workload.quant=w8a8")
        if cfg is not None and cfg.serving.enabled:
            remedies.append("shrink workload.serving.max_batch or the requests' lengths (workload.serving.prompt_len_mean, output_len_mean)")
        else:
            remedies.append("shrink workload.batch_size or workload.context_len")
        raise ConfigError(
            f"hardware.device.hbm_gb={hbm_gb:g}: {workload.name} does not fit on one rank: weights {m.weights_gb:.2f} GB"
            f" + KV cache {m.kv_cache_gb:.2f} GB + workspace {m.workspace_gb:.2f} GB + graphs {m.graphs_gb:.2f} GB = {m.total_gb:.3f} GB"
            f" ({', '.join(remedies[:-1])} or {remedies[-1]})"
        )
