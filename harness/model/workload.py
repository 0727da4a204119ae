"""Workload builder: a model card, an explicit op list or a trace CSV → the ops of every step
(a `harness.model.ops.Workload`).

A card in workloads/ holds the architecture numbers of the official config.json and the sequence of
ops a serving framework issues per step: `pre_ops`, then `layer_groups` (each `count` layers running
the same `ops`), then `post_ops`. Each op name maps to a cost formula in `OP_FORMULAS`: FLOPs, bytes
moved and resident parameters of the simulated rank, from the shapes and the parallel layout. A
formula returns None for an op that is not issued in this configuration (an all-reduce at TP 1, a
quantisation op in bf16, a shared expert in a model without one).

The harness simulates one representative rank of `tp × dp` devices: attention heads and MLP columns
are split `tp` ways, each DP group holds its own `batch_size` sequences, MoE experts are split over
`ep` ranks with tokens routed evenly, and collectives run on a communication stream.

Everything that changes between steps (KV length, hence attention cost and shape) is an array over
steps, so every step gets its own cost and its own shape key.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from omegaconf import OmegaConf

from harness.config.limits import LIMITS, check_number
from harness.config.messages import did_you_mean
from harness.config.paths import WORKLOADS_DIR
from harness.config.schema import DecodeKvReads, GraphMode, KvCache, KvCacheDtype, OpKind, Phase, Quant, RunConfig, WorkloadConfig
from harness.base.errors import ConfigError
from harness.model.ops import (
    BYTES_PER_GB,
    COMM_ALL_GATHER,
    COMM_ALL_REDUCE,
    COMM_ALL_TO_ALL,
    COMM_NONE,
    FLAG_DYNAMIC,
    FLAG_INT8,
    FLAG_ROUTED,
    FLAG_VALUE_DEPENDENT,
    KIND_CODE,
    STREAM_COMM,
    STREAM_COMPUTE,
    TOKEN_ID_BYTES,
    MemoryPlan,
    Workload,
    default_kv_len,
    from_static_ops,
    shape_keys,
)
from harness.model.ops_csv import read_ops_csv

@dataclass
class Cost:
    """What one op costs on the simulated rank; arrays are per step."""

    kind: OpKind
    flops: object = 0.0
    bytes: object = 0.0
    params: float = 0.0  # parameters resident on this rank
    full_params: float = 0.0  # parameters of this op in the unsplit model (for the parameter count)
    weight_bytes: float = 0.0  # weights resident on this rank for this op (counted in weights_gb)
    weight_read_bytes: Optional[float] = None  # weights it reads a step, when not its own (None: weight_bytes)
    # Weights it reads in each step where that is fewer than the above (per step; routed experts: only the
    # experts hit are read); None: all of them every step
    step_weight_bytes: object = None
    # Experts a grouped matmul multiplies on this rank in each step (per step; the experts hit): each is a
    # group of its own, with the device's per-group cost (hardware.device.grouped_matmul_group_us)
    expert_groups: object = 0.0
    cache_bytes: object = 0.0  # resident KV cache it reads (per step): like weights, not activations
    dynamic: bool = False
    value_dependent: bool = False
    comm: int = COMM_NONE
    ranks: int = 1
    stride: int = 1  # between the group's members (a DP group: tp apart)
    routed: bool = False  # shapes follow the per-expert token counts: they change every step and layer
    host_us: float = 0.0  # kind=host: time on the host thread
    int8: bool = False  # an INT8 matmul (W8A8)
    # An INT8 matmul's input elements per step: what the dynamic_quant before it quantises (None: not one)
    quant_in: object = None


@dataclass
class Shapes:
    """Sizes of the simulated rank for one workload; `tokens`, `batch`, `kv` are arrays over steps."""

    card: dict
    tokens: np.ndarray
    batch: np.ndarray
    kv: np.ndarray  # KV-cache length per sequence
    context: int
    decode: bool
    tp: int
    dp: int
    ep: int
    quant: bool
    devices_per_node: int = 8
    moe_all_to_all_min_ep: int = 2  # hardware.link's: smaller EP groups take the all-gather method
    kv_fp8: bool = False  # workload.kv_cache_dtype=fp8
    kv_read_per_query_head: bool = False  # workload.decode_kv_reads=per_query_head
    # Rows with a KV cache per step: `batch` unless padded (to a graph's size, or a shape bucket), whose padding
    # rows attend over nothing (vLLM gives them sequence length 0 in V1, 1 in V0, and no cache blocks; an
    # attention kernel given each row's actual length, as Ascend's FusedInferAttentionScore is, skips them).
    kv_rows: Optional[np.ndarray] = None
    extra: dict = field(default_factory=dict)

    def __getattr__(self, name: str):  # card numbers by name: s.hidden_size, s.vocab_size, ...
        card = self.__dict__.get("card", {})
        if name in card:
            return card[name]
        raise AttributeError(name)

    @property
    def attended_kv_tokens(self) -> np.ndarray:
        """Cached tokens decode attention reads per step: each real sequence's KV length."""
        return (self.batch if self.kv_rows is None else self.kv_rows) * self.kv

    @property
    def act(self) -> int:
        """Bytes per activation element (int8 into quantised matmuls is counted at the matmul)."""
        return self.card["dtype_bytes"]

    @property
    def kv_width(self) -> int:
        """Bytes per cached K or V value."""
        return 1 if self.kv_fp8 else self.act

    @property
    def weight(self) -> int:
        return 1 if self.quant else self.card["dtype_bytes"]

    @property
    def heads(self) -> float:
        return self.num_attention_heads / self.tp

    @property
    def kv_heads(self) -> float:
        # KV heads are replicated when there are fewer of them than TP ranks.
        return max(1.0, self.num_key_value_heads / self.tp)

    @property
    def head_dim(self) -> int:
        return self.card.get("head_dim") or self.hidden_size // self.num_attention_heads

    @property
    def v_head_dim(self) -> int:
        return self.card.get("v_head_dim") or self.head_dim

    @property
    def devices(self) -> int:
        return self.tp * self.dp


# ---------------------------------------------------------------- op formulas


def _linear(
    s: Shapes, n_in: float, n_out: float, split: float = 1, tokens=None, quantised: bool = True, bias: bool = False, parallel: str = "column",
    heads: float = 1,
) -> Cost:
    """A (possibly sharded) linear layer: weights n_in × n_out (× `heads` for a per-head batched matmul)
    split `split` ways. What a rank reads and writes besides the weights follows the split:
    column-parallel (Megatron's ColumnParallelLinear: q/k/v, gate/up, the vocab-parallel head) reads the
    whole input and writes its slice of the output; row-parallel (o_proj, down_proj) reads its slice of
    the input and writes a whole partial output, summed by the all-reduce after it; `heads` (a per-head
    batched matmul, n_in × n_out a head) reads and writes its heads' slices. A quantised (W8A8) matmul
    reads int8 activations and writes them dequantised, at the model's dtype."""
    t = s.tokens if tokens is None else tokens
    full = heads * n_in * n_out + (n_out if bias else 0)
    params = full / split
    width = s.weight if quantised else s.act
    in_width = 1 if (quantised and s.quant) else s.act
    in_split, out_split = {"column": (1, split), "row": (split, 1), "heads": (split, split)}[parallel]
    return Cost(
        OpKind.cube,
        flops=2.0 * t * (heads * n_in * n_out / split),
        bytes=params * width + t * heads * (n_in / in_split * in_width + n_out / out_split * s.act),
        params=params,
        full_params=full,
        weight_bytes=params * width,
        int8=quantised and s.quant,
        quant_in=t * heads * n_in / in_split if (quantised and s.quant) else None,
    )


def _vector(s: Shapes, elements, flops_per_element: float, passes: float, params: float = 0.0, dynamic: bool = False) -> Cost:
    """An element-wise op over `elements` per step, reading/writing `passes` tensors of that size."""
    return Cost(
        OpKind.vector,
        flops=flops_per_element * elements,
        bytes=passes * elements * s.act + params * s.act,
        params=params,
        full_params=params,
        weight_bytes=params * s.act,
        dynamic=dynamic,
    )


def _elementwise(s: Shapes, elements, read_bytes: float, write_bytes: float, flops_per_element: float = 1.0, params: float = 0.0) -> Cost:
    """One unfused PyTorch element-wise or reduction kernel over `elements`, reading and writing the
    given bytes per element (HF transformers eager: RMSNorm in float32, RoPE, SiLU, casts)."""
    return Cost(
        OpKind.vector,
        flops=flops_per_element * elements,
        bytes=(read_bytes + write_bytes) * elements + params * s.act,
        params=params,
        full_params=params,
        weight_bytes=params * s.act,
    )


FP32 = 4  # bytes: HF's RMSNorm computes in float32


def _hf_kv_cat(s: Shapes) -> Cost:
    """DynamicCache.update: torch.cat of the whole K (or V) cache with the new token's: reads and writes
    the cache every step (its shape changes every step)."""
    cached = s.batch * s.kv * s.kv_heads * s.head_dim
    return Cost(OpKind.vector, flops=0.0, bytes=2.0 * cached * s.act, dynamic=True)


def _hf_kv_write(s: Shapes) -> Cost:
    """A static cache's update (HF StaticCache, gpt-fast): the new tokens' K (or V) written in place
    (index_copy_), reading them and writing their slots; the cache keeps its shape."""
    return _elementwise(s, s.tokens * s.kv_heads * s.head_dim, s.act, s.act, 0.0)


# An unfused sequence's KV update under workload.kv_cache=static (or auto with graphs).
STATIC_KV_UPDATE = {"kv_cat": "kv_write"}


def _norm(dim_attr: str, fused_add: bool = False):
    def formula(s: Shapes) -> Cost:
        dim = getattr(s, dim_attr)
        return _vector(s, s.tokens * dim, 5.0 if fused_add else 4.0, 4.0 if fused_add else 2.0, params=dim)

    return formula


def _collective(comm: int, ranks: int, nbytes, stride: int = 1) -> Optional[Cost]:
    if ranks <= 1:
        return None
    return Cost(OpKind.comm, bytes=nbytes, comm=comm, ranks=ranks, stride=stride)


def _attention(s: Shapes) -> Cost:
    """GQA/MHA attention of this rank's heads. Decode reads the whole KV cache of every real sequence (the
    padding rows of a graph or a shape bucket have none)."""
    d, dv = s.head_dim, s.v_head_dim
    if s.decode:
        kv_tokens = s.attended_kv_tokens
        kv_heads_read = max(s.heads, s.kv_heads) if s.kv_read_per_query_head else s.kv_heads
        cache_read = kv_tokens * kv_heads_read * (d + dv) * s.kv_width
        return Cost(
            OpKind.cube,
            flops=2.0 * s.heads * (d + dv) * kv_tokens,
            bytes=cache_read + s.tokens * s.heads * (d + dv) * s.act,
            cache_bytes=cache_read,
            dynamic=True,
        )
    causal = _causal_pairs(s)
    return Cost(
        OpKind.cube,
        flops=2.0 * s.heads * (d + dv) * causal,
        bytes=s.tokens * (s.heads * (d + dv) + s.kv_heads * (d + dv)) * s.act,  # K and V from the fresh QKV, not the cache
    )


def _causal_pairs(s: Shapes):
    """Query-key pairs of causal prefill attention: each of a prompt's L tokens attends to itself and the
    tokens before it, L (L + 1) / 2 a sequence."""
    return s.batch * s.context * (s.context + 1) / 2.0


def _mla_attention(s: Shapes) -> Cost:
    """MLA. Decode (absorbed weights, as vLLM and vllm-ascend run it): every head attends over the shared
    576-wide latent. Prefill expands the latent into each head's keys and values first (kv_b_proj: the same
    weights and work as the two absorb bmms, which stand for it) and attends over 192-wide keys and
    128-wide values, 3.4x fewer FLOPs a pair of tokens than attending over the latent."""
    latent = s.kv_lora_rank + s.qk_rope_head_dim
    per_token_flops = 2.0 * s.heads * (latent + s.kv_lora_rank)
    if s.decode:
        kv_tokens = s.attended_kv_tokens
        return Cost(
            OpKind.cube,
            flops=per_token_flops * kv_tokens,
            bytes=kv_tokens * latent * s.kv_width + s.tokens * s.heads * (latent + s.kv_lora_rank) * s.act,
            cache_bytes=kv_tokens * latent * s.kv_width,
            dynamic=True,
        )
    causal = _causal_pairs(s)
    qk, v = s.qk_nope_head_dim + s.qk_rope_head_dim, s.v_head_dim
    return Cost(OpKind.cube, flops=2.0 * s.heads * (qk + v) * causal, bytes=s.tokens * s.heads * (2 * qk + 2 * v) * s.act)


def _mla_cache_write(s: Shapes) -> Cost:
    """MLA's latent: normed, RoPE on its rotary part, written to the cache: reads the latent and writes it
    twice as activations (norm, rope), once more in the cache's dtype (kv_cache_dtype)."""
    cost = _vector(s, s.tokens * (s.kv_lora_rank + s.qk_rope_head_dim), 10.0, 2.0, params=s.kv_lora_rank)
    cost.bytes = cost.bytes + s.tokens * (s.kv_lora_rank + s.qk_rope_head_dim) * s.kv_width
    return cost


# How a MoE layer moves tokens, after vllm-ascend (v0.11.0, the release the project's claims cite; its main
# branch of 2026-08 keeps the same prepare/finalize), vllm_ascend/ops/moe/fused_moe_prepare_and_finalize.py
# (main: vllm_ascend/ops/fused_moe/prepare_finalize.py):
# - With expert parallelism (ep > 1), the MC2 / all-to-all methods (FusedMoEPrepareAndFinalizeWithMC2 and
#   ...WithAll2All): `prepare` pads a DP group's tokens and tensor_splits them over its TP ranks, each rank
#   routing and dispatching its ceil(T / tp) rows; `finalize` all-gathers the combined rows over the TP
#   group (dist.all_gather on tp_group), so that every TP rank holds all T tokens again for the next
#   layer's norm and attention. The TP all-reduce after the MoE is then skipped
#   (AscendFusedMoE.maybe_all_reduce_tensor_model_parallel, register_custom_ops.py
#   _maybe_all_reduce_tensor_model_parallel_impl: nothing for ALLTOALL / MC2).
# - Without it (ep == 1: vLLM's FusedMoE over tp x dp ranks, each holding its slice of every expert), the
#   all-gather method (FusedMoEPrepareAndFinalizeWithAllGather): `_prepare_with_dp_group` all-gathers the
#   hidden states and router logits over the DP group, the experts multiply every DP group's tokens, and
#   `_finalize_with_dp_group` reduce-scatters the outputs over the DP group; the partial sums of the TP
#   ranks are then all-reduced over TP (maybe_all_reduce_tensor_model_parallel: ALLGATHER reduces).
# Which method a run takes is the model runner's choice (v0.11.0 NPUModelRunner._select_moe_comm_method;
# main ascend_forward_context.select_moe_comm_method): ALLGATHER without EP; with EP on Atlas A2, MC2 when
# the EP group has 16 ranks or more and the step's tokens fit its capacity, otherwise ALLGATHER as well;
# on A3, MC2 or all-to-all. Here an EP group of hardware.link.moe_all_to_all_min_ep ranks or more takes the
# token split and all-to-all (MC2 / all2all; atlas_a2: 16), a smaller one the all-gather method, its
# experts whole on their EP ranks (the capacity condition is left out: decode steps fit it).
MOE_ALL_TO_ALL, MOE_ALL_GATHER = "all_to_all", "all_gather"


def moe_exchange(ep: int, all_to_all_from: int) -> str:
    """How an EP group of `ep` ranks moves a MoE layer's tokens (ep 1: no EP, the all-gather method too)."""
    return MOE_ALL_GATHER if ep < max(2, all_to_all_from) else MOE_ALL_TO_ALL


def _moe_comm(s: Shapes) -> str:
    return moe_exchange(s.ep, s.moe_all_to_all_min_ep)


def _moe(s: Shapes) -> dict:
    """Routing numbers of the simulated rank: tokens it routes (`sent`), rows its experts receive, experts
    hit, and `shard`, the ways each of its experts is split. The experts are spread over the EP ranks; with
    fewer EP ranks than devices each expert is split over the rest, as tensor parallelism splits a dense
    MLP (vLLM's FusedMoE without expert parallelism: every rank holds its TP slice of all experts)."""
    experts, k = s.n_routed_experts, s.num_experts_per_tok
    experts_local = experts / s.ep
    shard = s.devices / s.ep
    comm = _moe_comm(s)
    if comm == MOE_ALL_GATHER:
        # No dispatch: every rank multiplies every token of every DP group (all-gathered over DP) by its
        # slice of the experts.
        tokens_moe = s.tokens * s.dp
        pool = tokens_moe  # tokens whose picks land on this rank's experts
    else:
        tokens_moe = np.ceil(s.tokens / s.tp)  # a DP group's tokens are split among its TP ranks before dispatch
        pool = tokens_moe * s.devices  # every rank's slice is dispatched over the EP group
    # Each of the pool's tokens picks k distinct experts of `experts`: on average k L / E of them are among
    # the rank's L local ones, and a local expert is missed by a token with probability 1 - k / E. Under
    # uniform routing the rank's experts hit (their weights read once) are L (1 - (1 - k / E)^T) of T
    # tokens: a token's k picks are k distinct experts, so one token hits exactly k (k draws with
    # replacement, E (1 - (1 - 1/E)^k), would hit fewer).
    # Every token routes, a batch padded up to a graph's size included (its padding tokens are real
    # inputs to the gate): vllm-ascend#16049 measures a batch of 12 padded to 16 at +11.4 % a step on
    # Qwen3-30B-A3B.
    picks = pool * k * experts_local / experts
    active = experts_local * (1.0 - (1.0 - k / experts) ** pool)
    received = picks
    pad = s.extra.get("moe_pad")
    if pad is not None and np.any(pad):  # shape buckets: the rank's routed rows padded up to a power of two
        # Padding rows inside the experts already hit: more rows to multiply, no more weights to read.
        received = np.where(pad, 2.0 ** np.ceil(np.log2(np.maximum(picks, 1.0))), picks)
    # rows: what the rank's expert slices multiply, counted in whole experts' rows (received / shard)
    return {"local": experts_local, "sent": tokens_moe, "received": received, "active": active, "shard": shard,
            "rows": received / shard, "comm": comm}


def _grouped(s: Shapes, n_in: float, n_out: float, parallel: str = "column") -> Cost:
    """A grouped matmul of the rank's experts. With experts split over `shard` ranks, gate_up is split by
    columns (each slice reads a row's whole input) and down by rows (its slice of the input)."""
    m = _moe(s)
    width = s.weight
    in_width = 1 if s.quant else s.act  # int8 in, dequantised out (as `_linear`)
    matrix = n_in * n_out / m["shard"]  # this rank's slice of one expert
    params = m["local"] * matrix
    in_split = m["shard"] if parallel == "row" else 1
    out_split = 1 if parallel == "row" else m["shard"]  # a row slice writes a whole (partial) output row
    return Cost(
        OpKind.cube,
        flops=2.0 * m["received"] * matrix,
        bytes=m["active"] * matrix * width + m["received"] * (n_in / in_split * in_width + n_out / out_split * s.act),
        params=params,
        full_params=s.n_routed_experts * n_in * n_out,
        weight_bytes=params * width,
        step_weight_bytes=m["active"] * matrix * width,
        expert_groups=m["active"],
        dynamic=True,
        routed=True,
        int8=s.quant,
        quant_in=m["received"] * n_in / in_split if s.quant else None,
    )


def _dispatch(s: Shapes) -> Optional[Cost]:
    m = _moe(s)
    if m["comm"] == MOE_ALL_GATHER:
        # FusedMoEPrepareAndFinalizeWithAllGather._prepare_with_dp_group: the DP group's hidden states and
        # router logits all-gathered over DP (each rank's T rows; none at DP 1).
        return _collective(COMM_ALL_GATHER, s.dp, s.tokens * (s.hidden_size + s.n_routed_experts) * s.act, stride=s.tp)
    cost = _collective(COMM_ALL_TO_ALL, s.ep, m["sent"] * s.num_experts_per_tok * s.hidden_size * (1 if s.quant else s.act))
    if cost is not None:
        cost.value_dependent = True  # the per-expert token counts set the split sizes (host reads them)
        cost.dynamic = cost.routed = True
    return cost


def _combine(s: Shapes) -> Optional[Cost]:
    m = _moe(s)
    if m["comm"] == MOE_ALL_GATHER:
        # _finalize_with_dp_group: the outputs of every DP group's tokens reduce-scattered over DP, each rank
        # keeping its own T rows. A ring reduce-scatter moves what an all-gather of its output slice moves,
        # (dp - 1) hops of T x hidden: priced as that all-gather. None at DP 1.
        return _collective(COMM_ALL_GATHER, s.dp, s.tokens * s.hidden_size * s.act, stride=s.tp)
    cost = _collective(COMM_ALL_TO_ALL, s.ep, m["sent"] * s.num_experts_per_tok * s.hidden_size * s.act)
    if cost is not None:
        cost.dynamic = cost.routed = True
    return cost


def _moe_finalize_tp(s: Shapes) -> Optional[Cost]:
    """The TP group's collective after the MoE. All-to-all / MC2: every rank combined its ceil(T / tp) rows,
    all-gathered over TP (FusedMoEPrepareAndFinalizeWithMC2/All2All.finalize). All-gather method: each TP
    rank holds partial sums of its DP group's T rows (its slice of the experts), all-reduced over TP
    (maybe_all_reduce_tensor_model_parallel). None at TP 1."""
    m = _moe(s)
    if m["comm"] == MOE_ALL_GATHER:
        return _collective(COMM_ALL_REDUCE, s.tp, s.tokens * s.hidden_size * s.act)
    return _collective(COMM_ALL_GATHER, s.tp, m["sent"] * s.hidden_size * s.act)


def _shared_all_reduce(s: Shapes) -> Optional[Cost]:
    """The shared expert's output summed over TP. vllm-ascend keeps the shared expert tensor-parallel
    (v0.11.0 AscendSharedFusedMoE; main AscendSharedExperts.parallel_mode: TENSOR_PARALLEL unless
    enable_shared_expert_dp): gate_up column- and down row-split over TP on all T tokens of the DP group,
    so each rank holds a partial sum of every token. With MC2 / all-to-all the routed output is complete
    after the TP all-gather, so the shared one is all-reduced on its own (v0.11.0
    AscendSharedFusedMoE.forward_impl: tensor_model_parallel_all_reduce(shared_out) for ALLTOALL / MC2;
    main AscendMoERunner._reduce_shared_output_if_needed). With the all-gather method the two are added
    first and reduced together (moe_finalize_tp). None at TP 1."""
    if _shared(s) <= 0 or _moe_comm(s) != MOE_ALL_TO_ALL:
        return None
    return _collective(COMM_ALL_REDUCE, s.tp, s.tokens * s.hidden_size * s.act)


def _shared(s: Shapes) -> float:
    return (s.card.get("n_shared_experts") or 0) * s.moe_intermediate_size


def _if(condition: Callable[[Shapes], bool], formula: Callable[[Shapes], Optional[Cost]]):
    return lambda s: formula(s) if condition(s) else None


def _module_calls(part: str) -> Callable[[Shapes], Optional[Cost]]:
    def cost(s: Shapes) -> Optional[Cost]:
        host_us = (s.card.get(f"unfused_{part}_modules") or 0) * s.extra.get("module_us", 0.0)
        return Cost(OpKind.host, host_us=host_us) if host_us > 0 else None
    return cost


def _mlp_width(s: Shapes) -> int:
    return s.intermediate_size


OP_FORMULAS: dict[str, Callable[[Shapes], Optional[Cost]]] = {
    # front-end (Python) work of a decoder layer in eager mode, around its kernels; graphs skip it
    "layer_overhead": lambda s: Cost(OpKind.host, host_us=s.card["layer_overhead_us"]) if s.card.get("layer_overhead_us") else None,
    # HF transformers eager (workload.kernels=unfused): RMSNorm as float32 element-wise kernels, RoPE
    # (mul, rotate_half as neg + cat, mul, add) for q and k, the KV cache grown by torch.cat, SiLU and
    # mul, casts; per element: bytes read and written
    "rms_cast_up": lambda s: _elementwise(s, s.tokens * s.hidden_size, s.act, FP32),
    "rms_pow": lambda s: _elementwise(s, s.tokens * s.hidden_size, FP32, FP32),
    "rms_mean": lambda s: _elementwise(s, s.tokens * s.hidden_size, FP32, 0.0),
    "rms_add_eps": lambda s: _elementwise(s, s.tokens, FP32, FP32),
    "rms_rsqrt": lambda s: _elementwise(s, s.tokens, FP32, FP32, 4.0),
    "rms_mul": lambda s: _elementwise(s, s.tokens * s.hidden_size, FP32, FP32),
    "rms_cast_down": lambda s: _elementwise(s, s.tokens * s.hidden_size, FP32, s.act),
    "rms_weight": lambda s: _elementwise(s, s.tokens * s.hidden_size, s.act, s.act, params=s.hidden_size),
    "rope_q_mul": lambda s: _elementwise(s, s.tokens * s.heads * s.head_dim, 2 * s.act, s.act),
    "rope_q_neg": lambda s: _elementwise(s, s.tokens * s.heads * s.head_dim / 2, s.act, s.act),
    "rope_q_cat": lambda s: _elementwise(s, s.tokens * s.heads * s.head_dim, s.act, s.act, 0.0),
    "rope_q_add": lambda s: _elementwise(s, s.tokens * s.heads * s.head_dim, 2 * s.act, s.act),
    "rope_k_mul": lambda s: _elementwise(s, s.tokens * s.kv_heads * s.head_dim, 2 * s.act, s.act),
    "rope_k_neg": lambda s: _elementwise(s, s.tokens * s.kv_heads * s.head_dim / 2, s.act, s.act),
    "rope_k_cat": lambda s: _elementwise(s, s.tokens * s.kv_heads * s.head_dim, s.act, s.act, 0.0),
    "rope_k_add": lambda s: _elementwise(s, s.tokens * s.kv_heads * s.head_dim, 2 * s.act, s.act),
    "kv_cat": _hf_kv_cat,
    "kv_write": _hf_kv_write,
    "silu": lambda s: _elementwise(s, s.tokens * _mlp_width(s) / s.tp, s.act, s.act, 4.0),
    "mul": lambda s: _elementwise(s, s.tokens * _mlp_width(s) / s.tp, 2 * s.act, s.act),
    "rope_table": lambda s: _elementwise(s, s.tokens * s.head_dim, FP32, FP32),
    "logits_cast": lambda s: _elementwise(s, s.batch * s.vocab_size / s.tp, s.act, FP32),
    "argmax": lambda s: _elementwise(s, s.batch * s.vocab_size / s.tp, FP32, 0.0),
    "generate_bookkeeping": lambda s: _elementwise(s, s.batch, 8.0, 8.0),
    # the serving engine's own model code per layer in eager mode (engine.layer_overhead_us)
    "engine_overhead": lambda s: Cost(OpKind.host, host_us=s.extra["engine_layer_us"]) if s.extra.get("engine_layer_us") else None,
    # HF transformers / plain PyTorch eager (kernels=unfused): the Python of the nn.Module calls before the
    # layers, in each layer and after them (card unfused_*_modules x hardware.host.module_us)
    **{f"{part}_modules": _module_calls(part) for part in ("pre", "layer", "post")},
    # embeddings and heads (vocab-parallel over TP)
    "embedding": lambda s: Cost(
        OpKind.vector,
        bytes=2.0 * s.tokens * s.hidden_size * s.act + s.tokens * TOKEN_ID_BYTES,
        params=s.vocab_size * s.hidden_size / s.tp,
        full_params=s.vocab_size * s.hidden_size,
        weight_bytes=s.vocab_size * s.hidden_size / s.tp * s.act,
    ),
    "lm_head": lambda s: _linear(
        s, s.hidden_size, s.vocab_size, split=s.tp, tokens=s.batch, quantised=False
    ) if not s.card.get("tie_word_embeddings") else _tied_head(s),
    # The vocab-parallel head's logits gathered across the TP group before sampling (vLLM's
    # LogitsProcessor._gather_logits: a gather, or an all-gather where a platform needs every rank to
    # hold them; priced as an all-gather of each rank's slice). Nothing at TP 1.
    "logits_gather": lambda s: _collective(COMM_ALL_GATHER, s.tp, s.batch * s.vocab_size / s.tp * s.act),
    "sampling": lambda s: _vector(s, s.batch * s.vocab_size, 1.0, 1.0),
    # norms and residuals
    "input_norm": _norm("hidden_size"),
    "post_norm": _norm("hidden_size"),
    "final_norm": _norm("hidden_size"),
    "add_rms_norm": _norm("hidden_size", fused_add=True),
    "residual_add": lambda s: _vector(s, s.tokens * s.hidden_size, 1.0, 3.0),
    "qk_norm": lambda s: _vector(s, s.tokens * (s.heads + s.kv_heads) * s.head_dim, 4.0, 2.0, params=2 * s.head_dim),
    # W8A8's per-token quantisation of the next INT8 matmul's input: sized in _from_card by the matmul it
    # feeds (_dynamic_quant); nothing here (no matmul to size it by) and nothing in bf16
    "dynamic_quant": lambda s: None,
    # GQA / MHA attention
    "q_proj": lambda s: _linear(s, s.hidden_size, s.num_attention_heads * s.head_dim, s.tp, bias=bool(s.card.get("attention_bias"))),
    "k_proj": lambda s: _kv_linear(s, 0, 1),
    "v_proj": lambda s: _kv_linear(s, 0, 1),
    "qkv_proj": lambda s: _kv_linear(s, s.num_attention_heads, 2),
    "o_proj": lambda s: _linear(s, s.num_attention_heads * s.v_head_dim, s.hidden_size, s.tp, parallel="row"),
    # rotary on the first rotary_dim values of each head (GPT-J: 64 of 256), the whole head by default
    "rope": lambda s: _vector(s, s.tokens * (s.heads + s.kv_heads) * (s.card.get("rotary_dim") or s.head_dim), 6.0, 2.0),
    # the new tokens' K and V read as activations, written in the cache's dtype
    "kv_cache_write": lambda s: Cost(OpKind.vector, bytes=s.tokens * s.kv_heads * (s.head_dim + s.v_head_dim) * (s.act + s.kv_width)),
    "attention": _attention,
    # MLA (DeepSeek-V3), absorbed form as vllm-ascend issues it in decode
    "qkv_a_proj": lambda s: _linear(s, s.hidden_size, s.q_lora_rank + s.kv_lora_rank + s.qk_rope_head_dim),
    "q_a_norm": lambda s: _vector(s, s.tokens * s.q_lora_rank, 4.0, 2.0, params=s.q_lora_rank),
    "q_b_proj": lambda s: _linear(s, s.q_lora_rank, s.num_attention_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.tp),
    "q_absorb_bmm": lambda s: _linear(s, s.qk_nope_head_dim, s.kv_lora_rank, s.tp, quantised=False, parallel="heads", heads=s.num_attention_heads),
    "mla_rope": lambda s: _vector(s, s.tokens * (s.heads + 1) * s.qk_rope_head_dim, 6.0, 2.0),
    "kv_norm_rope_cache": _mla_cache_write,
    "mla_attention": _mla_attention,
    "v_absorb_bmm": lambda s: _linear(s, s.kv_lora_rank, s.v_head_dim, s.tp, quantised=False, parallel="heads", heads=s.num_attention_heads),
    "tp_all_reduce": lambda s: _collective(COMM_ALL_REDUCE, s.tp, s.tokens * s.hidden_size * s.act),
    # dense MLP
    "gate_proj": lambda s: _linear(s, s.hidden_size, _mlp_width(s), s.tp),
    "up_proj": lambda s: _linear(s, s.hidden_size, _mlp_width(s), s.tp),
    "gate_up_proj": lambda s: _linear(s, s.hidden_size, 2 * _mlp_width(s), s.tp),
    "act_mul": lambda s: _vector(s, s.tokens * _mlp_width(s) / s.tp, 5.0, 3.0),
    # an ungated MLP's activation (GPT-J, Falcon): reads the up projection, writes its input to the down one;
    # 8 flops an element for tanh-GELU is assumed (the op is memory-bound whatever the count)
    "gelu": lambda s: _vector(s, s.tokens * _mlp_width(s) / s.tp, 8.0, 2.0),
    "down_proj": lambda s: _linear(s, _mlp_width(s), s.hidden_size, s.tp, parallel="row"),
    # MoE (routed experts split over EP ranks; shared experts split over TP)
    "moe_gate": lambda s: _linear(s, s.hidden_size, s.n_routed_experts, quantised=False),
    # top-k over the tokens the rank routes (after prepare: its TP slice, or every DP group's tokens)
    "moe_topk": lambda s: _vector(s, _moe(s)["sent"] * s.n_routed_experts, 4.0, 1.0),
    "moe_dispatch": _dispatch,
    "grouped_gate_up": lambda s: _grouped(s, s.hidden_size, 2 * s.moe_intermediate_size),
    "moe_act": lambda s: _routed(_vector(s, _moe(s)["rows"] * s.moe_intermediate_size, 5.0, 3.0, dynamic=True)),
    "grouped_down": lambda s: _grouped(s, s.moe_intermediate_size, s.hidden_size, parallel="row"),
    "moe_combine": _combine,
    "moe_finalize_tp": _moe_finalize_tp,
    "shared_all_reduce": _shared_all_reduce,
    "shared_gate_up": _if(lambda s: _shared(s) > 0, lambda s: _linear(s, s.hidden_size, 2 * _shared(s), s.tp)),
    "shared_act": _if(lambda s: _shared(s) > 0, lambda s: _vector(s, s.tokens * _shared(s) / s.tp, 5.0, 3.0)),
    "shared_down": _if(lambda s: _shared(s) > 0, lambda s: _linear(s, _shared(s), s.hidden_size, s.tp, parallel="row")),
}


def _dynamic_quant(s: Shapes, feeds: Optional[Cost]) -> Optional[Cost]:
    """npu_dynamic_quant before an INT8 matmul: reads the matmul's input at the model's dtype and writes it
    as int8 (3 B an element at bf16), over that input's width, not the hidden size: tokens x intermediate / tp
    before down_proj, tokens x heads x head_dim / tp before o_proj, tokens x q_lora_rank before MLA's
    q_b_proj, the expert rows x moe_intermediate before grouped_down. `feeds`: the first INT8 matmul after
    it in its op list (a collective between them, as a dispatch, moves the quantised rows)."""
    if not s.quant:
        return None
    if feeds is None or feeds.quant_in is None:
        raise ConfigError(f"card {s.card.get('name')!r} dynamic_quant: no INT8 matmul after it in its op list to quantise the input of")
    return _vector(s, feeds.quant_in, 3.0, 1.5)


def _quant_target(entries: list, index: int, s: Shapes, static_kv: bool) -> Optional[Cost]:
    """The cost of the op a dynamic_quant at `index` of `entries` feeds: the first later op issued as an INT8
    matmul (None: none before the next dynamic_quant)."""
    for entry in entries[index + 1:]:
        op = _entry(entry)[0]
        op = STATIC_KV_UPDATE.get(op, op) if static_kv else op
        if op == "dynamic_quant":
            break
        cost = OP_FORMULAS[op](s)
        if cost is not None and cost.quant_in is not None:
            return cost
    return None


def _kv_linear(s: Shapes, q_heads: int, kv_sets: int) -> Cost:
    """A projection into `q_heads` query heads and `kv_sets` sets (K, V) of KV heads, split over TP. With
    fewer KV heads than TP ranks each rank keeps a whole KV head (vLLM replicates them), as the KV cache
    does: its weights and work are per replicated head; the model's own count stays unreplicated."""
    bias = bool(s.card.get("attention_bias"))
    cost = _linear(s, s.hidden_size, (q_heads + kv_sets * s.kv_heads * s.tp) * s.head_dim, s.tp, bias=bias)
    n_out = (q_heads + kv_sets * s.num_key_value_heads) * s.head_dim
    cost.full_params = s.hidden_size * n_out + (n_out if bias else 0)
    return cost


def _routed(cost: Cost) -> Cost:
    cost.routed = True
    return cost


def _tied_head(s: Shapes) -> Cost:
    cost = _linear(s, s.hidden_size, s.vocab_size, split=s.tp, tokens=s.batch, quantised=False)
    cost.params = cost.full_params = 0.0  # the embedding's weights, counted there
    cost.weight_read_bytes, cost.weight_bytes = cost.weight_bytes, 0.0  # read here all the same: not activations
    return cost


CARD_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "dtype_bytes")
CARD_NUMBERS = {key.removeprefix("card."): limit for key, limit in LIMITS.items() if key.startswith("card.")}
CARD_FLAGS = ("attention_bias", "tie_word_embeddings")
CARD_TEXT = ("name", "family")
CARD_OP_LISTS = ("pre_ops", "layer_ops", "post_ops", "unfused_pre_ops", "unfused_layer_ops", "unfused_post_ops", "layer_groups")
CARD_FIELDS = (*CARD_NUMBERS, *CARD_FLAGS, *CARD_TEXT, *CARD_OP_LISTS)


def _check_card_fields(card: dict, where: str, overridden: set) -> None:
    """Every field known, of its type and within its range (the same limits as the config's numbers);
    a field set by workload.card_overrides is named by that key, one from the file by the file."""
    for key, value in card.items():
        label = f"workload.card_overrides.{key}" if key in overridden else f"{where} {key}"
        if key not in CARD_FIELDS:
            raise ConfigError(f"{label}: not a card field{did_you_mean(key, CARD_FIELDS)}")
        if value is None and key not in CARD_REQUIRED:
            continue
        if key in CARD_NUMBERS:
            check_number(label, value, CARD_NUMBERS[key], integer=key != "layer_overhead_us")
        elif key in CARD_FLAGS and not isinstance(value, bool):
            raise ConfigError(f"{label}={value!r}: must be true or false")
        elif key in CARD_TEXT and not isinstance(value, str):
            raise ConfigError(f"{label}={value!r}: must be text")
        elif key in CARD_OP_LISTS and not isinstance(value, list):
            raise ConfigError(f"{label}={value!r}: must be a list of ops")
    for key in CARD_REQUIRED:
        if card.get(key) is None:
            raise ConfigError(f"{where} {key}: missing (every card needs {', '.join(CARD_REQUIRED)})")
    # Each KV head serves a whole group of query heads (MHA, GQA, MQA alike); checked only at TP > 1
    # before, so 64 KV heads for 32 query heads, or 5 for 32, ran at TP 1.
    heads, kv_heads = card["num_attention_heads"], card["num_key_value_heads"]
    if isinstance(heads, int) and isinstance(kv_heads, int) and (kv_heads > heads or heads % kv_heads):
        if "num_attention_heads" in overridden and "num_key_value_heads" not in overridden:  # blame what was changed
            raise ConfigError(f"workload.card_overrides.num_attention_heads={heads}: must be a multiple of num_key_value_heads={kv_heads}"
                              " (each KV head serves a whole group of query heads)")
        label = "workload.card_overrides.num_key_value_heads" if "num_key_value_heads" in overridden else f"{where} num_key_value_heads"
        raise ConfigError(f"{label}={kv_heads}: must divide num_attention_heads={heads} (each KV head serves a whole group of query heads)")
    for i, group in enumerate(card.get("layer_groups") or []):
        if not isinstance(group, dict) or set(group) - {"count", "ops"}:
            raise ConfigError(f"{where} layer_groups[{i}]={group!r}: must be {{count: N, ops: [...]}}")
        check_number(f"{where} layer_groups[{i}].count", group.get("count"), LIMITS["card.num_hidden_layers"], integer=True)


# ---------------------------------------------------------------- cards


def load_card(name: str, overrides: Optional[dict] = None) -> dict:
    """Read and check a model card, with `overrides` replacing its fields (any YAML values, op lists
    included); normalise `layer_ops` into one layer group. Cached by the file's path and modification
    time (a card edited on disk is read again): treat as read-only."""
    path = WORKLOADS_DIR / f"{name}.yaml"
    try:
        modified_ns = path.stat().st_mtime_ns if path.is_file() else None
    except OSError:
        modified_ns = None
    if modified_ns is None:
        raise ConfigError(f"workload.card={name!r}: no such model card in workloads/")
    return _load_card(str(path), modified_ns, name, json.dumps(sorted((overrides or {}).items()), default=str))


@functools.lru_cache(maxsize=32)
def _load_card(path_text: str, modified_ns: int, name: str, overrides_json: str) -> dict:
    """load_card's body; overrides as JSON, so that list values can key the cache."""
    overrides = [tuple(pair) for pair in json.loads(overrides_json)]
    path = Path(path_text)
    card = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert isinstance(card, dict)
    for key, value in overrides:
        if key not in card:
            raise ConfigError(f"workload.card_overrides.{key}={value!r}: card {name!r} has no such field (fields: {', '.join(sorted(card))})")
        card[key] = value
    where = f"workloads/{name}.yaml" + (" (with workload.card_overrides)" if overrides else "")
    _check_card_fields(card, where, {key for key, _ in overrides})
    if "layer_ops" in card:
        card["layer_groups"] = [{"count": card["num_hidden_layers"], "ops": card.pop("layer_ops")}]
    k, experts = card.get("num_experts_per_tok"), card.get("n_routed_experts")
    if k and experts is not None and k > experts:  # a token picks k distinct experts (of at least one)
        overridden = {o for o, _ in overrides}
        if "n_routed_experts" in overridden and "num_experts_per_tok" not in overridden:
            raise ConfigError(f"workload.card_overrides.n_routed_experts={experts}: fewer experts than a token picks (num_experts_per_tok={k})")
        label = "workload.card_overrides.num_experts_per_tok" if "num_experts_per_tok" in overridden else f"{where} num_experts_per_tok"
        raise ConfigError(f"{label}={k}: a token picks that many distinct experts, more than n_routed_experts={experts}")
    groups = card.get("layer_groups") or []
    if sum(g.get("count", 0) for g in groups) != card["num_hidden_layers"]:
        raise ConfigError(f"{where} layer_groups: counts add up to {sum(g.get('count', 0) for g in groups)}, not num_hidden_layers={card['num_hidden_layers']}")
    unfused = [(key, card.get(key) or []) for key in ("unfused_pre_ops", "unfused_layer_ops", "unfused_post_ops")]
    for key, ops in [("pre_ops", card.get("pre_ops") or []), ("post_ops", card.get("post_ops") or [])] + [
        (f"layer_groups[{i}].ops", g.get("ops") or []) for i, g in enumerate(groups)
    ] + unfused:
        if key.startswith("layer_groups") and not ops:
            raise ConfigError(f"{where} {key}=[]: empty op list")
        names = []
        for entry in ops:
            op, after = _entry(entry)
            if not isinstance(op, str) or op not in OP_FORMULAS:
                raise ConfigError(f"{where} {key} op {op!r}: unknown op (known: {', '.join(sorted(OP_FORMULAS))})")
            if after is not None and after not in names:
                raise ConfigError(f"{where} {key} op {op!r} after={after!r}: not an earlier op of the same list")
            names.append(op)
    return card


def _entry(entry) -> tuple[str, Optional[str]]:
    """A card op entry: a name, or {op: name, after: earlier op name}."""
    if isinstance(entry, dict):
        return entry.get("op"), entry.get("after")
    return entry, None


def card_parameter_count(card: dict) -> float:
    """Parameters of the unsplit model as the card's ops hold them (checks the cards against published totals)."""
    shapes = _shapes(card, Phase.decode, context_len=1, batch=np.ones(1), tp=1, dp=1, ep=1, quant=False, devices_per_node=8)
    total = 0.0
    for group, count in _op_sequence_groups(card):
        for entry in group:
            cost = OP_FORMULAS[_entry(entry)[0]](shapes)
            if cost is not None:
                total += cost.full_params * count
    return total


def _op_sequence_groups(card: dict, kernels: str = "fused") -> list[tuple[list, int]]:
    """(ops, count) of the embedding part, each layer group and the head, as the card issues them:
    `fused` (a serving engine's kernels) or `unfused` (HF transformers eager: `unfused_*` lists)."""
    if kernels == "unfused":
        layer_ops = card["unfused_layer_ops"]
        return [(card.get("unfused_pre_ops") or [], 1)] + [(layer_ops, g["count"]) for g in card["layer_groups"]] + [
            (card.get("unfused_post_ops") or [], 1)
        ]
    return [(card.get("pre_ops") or [], 1)] + [(g["ops"], g["count"]) for g in card["layer_groups"]] + [(card.get("post_ops") or [], 1)]


def _shapes(
    card: dict, phase: Phase, context_len: int, batch: np.ndarray, tp: int, dp: int, ep: int, quant: bool, devices_per_node: int,
    kv: Optional[np.ndarray] = None, moe_pad: bool | np.ndarray = False, kv_fp8: bool = False, kv_read_per_query_head: bool = False,
    kv_rows: Optional[np.ndarray] = None, moe_all_to_all_min_ep: int = 2,
) -> Shapes:
    decode = phase == Phase.decode
    if kv is None:
        kv = default_kv_len(phase, context_len, batch.shape[0])
    tokens = batch if decode else batch * context_len
    is_moe = bool(card.get("n_routed_experts"))
    return Shapes(
        card=card,
        tokens=tokens.astype(np.float64),
        batch=batch.astype(np.float64),
        kv=kv.astype(np.float64),
        context=context_len,
        decode=decode,
        tp=tp,
        dp=dp,
        ep=(ep or tp * dp) if is_moe else 1,
        quant=quant,
        devices_per_node=devices_per_node,
        moe_all_to_all_min_ep=moe_all_to_all_min_ep,
        kv_fp8=kv_fp8,
        kv_read_per_query_head=kv_read_per_query_head,
        kv_rows=None if kv_rows is None else np.asarray(kv_rows, dtype=np.float64),
        extra={"moe_pad": np.broadcast_to(np.asarray(moe_pad, dtype=bool), batch.shape)},
    )


# ---------------------------------------------------------------- building


def run_build_options(run: RunConfig) -> dict:
    """build_workload's options that the rest of the run decides: the host costs of the model code around
    the kernels (the serving engine's per layer in eager mode, one nn.Module call's for kernels=unfused),
    and whether the step's shapes are fixed by graph capture or sink (workload.kv_cache=auto)."""
    return {
        "engine_layer_us": run.engine.layer_overhead_us,
        "module_us": run.hardware.host.module_us,
        "graphs": run.strategy.graph.mode != GraphMode.none,
        "moe_all_to_all_min_ep": run.hardware.link.moe_all_to_all_min_ep,
    }


def build_workload(
    cfg: WorkloadConfig,
    devices_per_node: int = 8,
    batch: Optional[np.ndarray] = None,
    kv_len: Optional[np.ndarray] = None,
    moe_pad: bool | np.ndarray = False,
    engine_layer_us: float = 0.0,
    module_us: float = 0.0,
    graphs: bool = False,
    kv_rows: Optional[np.ndarray] = None,
    moe_all_to_all_min_ep: int = 2,
) -> Workload:
    """Ops of every step with their costs, for the simulated rank.

    `batch` and `kv_len` (per step; default: `batch_size` sequences whose KV grows by one per step)
    come from the serving loop when the batch changes step by step. `moe_pad` (shape bucketing) pads the
    rows routed to the rank's experts to a power of two, which makes routed ops' shapes static; without
    it (a graph's replay included) they multiply the rows their tokens route.
    `engine_layer_us` adds the serving engine's own model code per decoder layer (eager mode) as a
    host op at the start of every layer; `module_us` (hardware.host.module_us) prices the nn.Module calls
    of a card's unfused op sequence (kernels=unfused), a host op at the start of each part. `graphs`: the
    strategy captures or sinks the step as a graph, so an unfused sequence's KV cache is static under
    workload.kv_cache=auto (a graph needs fixed shapes; HF's DynamicCache changes them every step).
    `kv_rows` (per step): the rows of a padded `batch` that hold a KV cache, the real sequences; decode
    attention reads only theirs. `moe_all_to_all_min_ep` (hardware.link's): how a MoE layer moves tokens.
    """
    if batch is None:
        batch = np.full(cfg.steps, cfg.batch_size, dtype=np.int64)
    if cfg.card is not None:
        card = load_card(cfg.card, cfg.card_overrides)
        if cfg.kernels.value == "unfused" and not card.get("unfused_layer_ops"):
            raise ConfigError(f"workload.kernels=unfused: card {cfg.card!r} lists no unfused (HF transformers eager) op sequence")
        check_head_split(card, cfg.card, cfg.tp)
        static_kv = cfg.kv_cache == KvCache.static or (cfg.kv_cache == KvCache.auto and graphs)
        return _from_card(card, cfg, np.asarray(batch, dtype=np.int64), devices_per_node, kv_len, moe_pad, engine_layer_us, module_us, static_kv,
                          kv_rows, moe_all_to_all_min_ep)
    if cfg.path is not None:
        return read_ops_csv(cfg.path, cfg)
    return from_static_ops(cfg, [
        dict(name=op.name, kind=op.kind, flops=op.flops, bytes=op.bytes, device_us=op.device_us, stream=op.stream,
             after=list(op.after) or None, host_us=op.host_us, dynamic=op.dynamic, value_dependent=op.value_dependent,
             compute_dependent=op.compute_dependent, cpu_eligible=op.cpu_eligible)
        for op in cfg.ops
    ])


def check_head_split(card: dict, name: str, tp: int) -> None:
    """Refuse a TP degree the model's heads do not split over, as vLLM does: attention heads divisible by
    TP, and KV heads either divisible by TP or replicated a whole number of times (TP a multiple of them)."""
    heads, kv_heads = card["num_attention_heads"], card["num_key_value_heads"]
    if heads % tp:
        raise ConfigError(f"workload.tp={tp}: card {name!r} has {heads} attention heads, which do not split over {tp} ranks")
    if kv_heads % tp and tp % kv_heads:
        raise ConfigError(f"workload.tp={tp}: card {name!r} has {kv_heads} KV heads, which neither split over {tp} ranks nor replicate evenly")


def _from_card(
    card: dict, cfg: WorkloadConfig, batch: np.ndarray, devices_per_node: int, kv_len: Optional[np.ndarray], moe_pad: bool | np.ndarray,
    engine_layer_us: float = 0.0, module_us: float = 0.0, static_kv: bool = False, kv_rows: Optional[np.ndarray] = None,
    moe_all_to_all_min_ep: int = 2,
) -> Workload:
    s = _shapes(
        card, cfg.phase, cfg.context_len, batch, cfg.tp, cfg.dp, cfg.ep, cfg.quant == Quant.w8a8, devices_per_node, kv_len, moe_pad,
        kv_fp8=cfg.kv_cache_dtype == KvCacheDtype.fp8, kv_read_per_query_head=cfg.decode_kv_reads == DecodeKvReads.per_query_head,
        kv_rows=kv_rows, moe_all_to_all_min_ep=moe_all_to_all_min_ep,
    )
    s.extra["engine_layer_us"] = engine_layer_us
    s.extra["module_us"] = module_us
    unfused = cfg.kernels.value == "unfused"
    steps = batch.shape[0]
    names: list[str] = []
    templates: list[int] = []  # index into `costs` per op
    after: list[list[int]] = []
    costs: list[Cost] = []
    template_of: dict[tuple[int, str], int] = {}
    weights = 0.0
    layer = 0
    for group_index, (entries, count) in enumerate(_op_sequence_groups(card, cfg.kernels.value)):
        in_layers = 0 < group_index <= len(card["layer_groups"])
        if in_layers and engine_layer_us > 0:
            entries = ["engine_overhead", *entries]
        if unfused and module_us > 0:
            entries = ["layer_modules" if in_layers else "pre_modules" if group_index == 0 else "post_modules", *entries]
        for repeat in range(count):
            issued: dict[str, int] = {}  # op name → index of its latest issue in this layer
            previous = len(names) - 1
            for index, entry in enumerate(entries):
                op, after_name = _entry(entry)
                if static_kv:
                    op, after_name = STATIC_KV_UPDATE.get(op, op), STATIC_KV_UPDATE.get(after_name, after_name)
                key: tuple = (group_index, op)
                if op == "dynamic_quant" and s.quant:  # one template per matmul it feeds
                    key = (group_index, op, index)
                if key not in template_of:
                    template_of[key] = len(costs)
                    if op == "dynamic_quant":
                        costs.append(_dynamic_quant(s, _quant_target(entries, index, s, static_kv)))
                    else:
                        costs.append(OP_FORMULAS[op](s))
                cost = costs[template_of[key]]
                if cost is None:
                    # Not issued here: an op naming it in `after` waits for what it would have waited for.
                    if after_name is not None and after_name in issued:
                        issued[op] = issued[after_name]
                    elif after_name is None:
                        issued[op] = previous
                    continue
                weights += cost.weight_bytes
                names.append(f"layers.{layer}.{op}" if in_layers else op)
                templates.append(template_of[key])
                if after_name is not None:
                    after.append([issued[after_name]] if issued.get(after_name, -1) >= 0 else [])
                else:
                    after.append([previous] if previous >= 0 else [])
                issued[op] = previous = len(names) - 1
            if in_layers:
                layer += 1
    n = len(names)
    template_ids = np.array(templates, dtype=np.int64)
    def per_step(values: list) -> np.ndarray:  # (steps, templates) from each template's scalar or per-step value
        return np.stack([np.broadcast_to(np.asarray(v, dtype=np.float64), (steps,)) for v in values], axis=1) if values else np.zeros((steps, 0))

    flops_t = per_step([c.flops if c is not None else 0.0 for c in costs])
    bytes_t = per_step([c.bytes if c is not None else 0.0 for c in costs])
    cache_t = per_step([c.cache_bytes if c is not None else 0.0 for c in costs])
    groups_t = per_step([c.expert_groups if c is not None else 0.0 for c in costs])
    used = [c if c is not None else Cost(OpKind.vector) for c in costs]
    kind_t = np.array([KIND_CODE[c.kind] for c in used], dtype=np.int8)
    weights_read_t = np.array([c.weight_bytes if c.weight_read_bytes is None else c.weight_read_bytes for c in used], dtype=np.float64)
    varies = [c.step_weight_bytes is not None for c in used]
    step_weights_t = per_step([c.step_weight_bytes if v else w for c, v, w in zip(used, varies, weights_read_t)])
    dynamic_t = np.array([c.dynamic for c in used], dtype=bool)
    flags_t = (
        dynamic_t * FLAG_DYNAMIC
        | np.array([c.value_dependent for c in used], dtype=bool) * FLAG_VALUE_DEPENDENT
        | np.array([c.routed for c in used], dtype=bool) * FLAG_ROUTED
        | np.array([c.int8 for c in used], dtype=bool) * FLAG_INT8
    ).astype(np.uint8)
    # Attention-like ops change with the KV tokens; routed (MoE) ops with the routing, i.e. every step
    # in decode unless their token counts are padded to buckets (on the steps that pad them).
    padded_steps = s.extra["moe_pad"][:, None]
    routed = np.array([c.routed for c in used], dtype=bool)[None, :]
    varying = np.where(routed & s.decode & ~padded_steps, np.arange(steps)[:, None] + 1, np.rint(s.kv * s.batch)[:, None])
    shape_key_t = shape_keys(np.arange(len(costs)), s.tokens, varying, s.batch, dynamic_t[None, :] & ~(routed & padded_steps))
    kv_per_token = _kv_bytes_per_token(card, s)
    memory = MemoryPlan(
        weights_gb=weights / BYTES_PER_GB,
        kv_cache_gb=kv_per_token * float((s.batch * s.kv).max()) / BYTES_PER_GB,
        workspace_gb=2.0 * float((bytes_t - cache_t - step_weights_t).max(initial=0.0)) / BYTES_PER_GB,
    )
    return Workload(
        name=cfg.name,
        phase=cfg.phase,
        op_names=names,
        kind=kind_t[template_ids],
        stream=np.where(kind_t[template_ids] == KIND_CODE[OpKind.comm], STREAM_COMM, STREAM_COMPUTE).astype(np.int8),
        flags=flags_t[template_ids],
        after=after,
        comm=np.array([used[t].comm for t in templates], dtype=np.int8),
        comm_ranks=np.array([used[t].ranks for t in templates], dtype=np.int32),
        comm_stride=np.array([used[t].stride for t in templates], dtype=np.int32),
        devices=int(s.devices),
        flops=flops_t[:, template_ids],
        bytes=bytes_t[:, template_ids],
        device_us=np.full((steps, n), np.nan),
        shape_key=shape_key_t[:, template_ids],
        host_us=np.array([used[t].host_us for t in templates], dtype=np.float64),
        weight_bytes=weights_read_t[template_ids],
        step_weight_bytes=step_weights_t[:, template_ids] if any(varies) else None,
        expert_groups=groups_t[:, template_ids] if groups_t.any() else None,
        cache_bytes=cache_t[:, template_ids],
        batch=batch,
        kv_len=s.kv.copy(),
        tokens=s.tokens.astype(np.int64),
        warmup_steps=cfg.warmup_steps,
        memory=memory,
    )


def _kv_bytes_per_token(card: dict, s: Shapes) -> float:
    """KV-cache bytes one token occupies on the simulated rank, over all layers."""
    if card.get("kv_lora_rank"):
        per_layer = (card["kv_lora_rank"] + card["qk_rope_head_dim"]) * s.kv_width  # MLA latent, replicated over TP
    else:
        per_layer = s.kv_heads * (s.head_dim + s.v_head_dim) * s.kv_width
    return per_layer * card["num_hidden_layers"]


def parameter_count_b(card_name: str) -> float:
    """Billions of parameters of a card (unsplit)."""
    return card_parameter_count(load_card(card_name)) / 1e9


