"""Workload builder: a model card (or an explicit op list) plus phase and batch → the ops of one step.

A card in workloads/ holds the architecture numbers of the official config.json and the sequence of
ops a framework issues per step (`pre_ops`, `layer_ops` × layers, `post_ops`). Each op name maps to a
cost formula here: FLOPs and bytes from the shapes. Attention in decode has a part that grows with
the KV length; it is kept as per-KV-token coefficients so every step gets its own cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from omegaconf import OmegaConf

from harness.config import WORKLOADS_DIR, OpKind, Phase, WorkloadConfig
from harness.errors import ConfigError

KIND_CODE = {OpKind.cube: 0, OpKind.vector: 1, OpKind.comm: 2}

# Op flags (bit set per op).
FLAG_DYNAMIC = 1
FLAG_VALUE_DEPENDENT = 2
FLAG_COMPUTE_DEPENDENT = 4

TOKEN_ID_BYTES = 4  # int32 token ids (and positions) copied per token


@dataclass
class Workload:
    """The ops of one step (same list every step) and what changes between steps."""

    name: str
    phase: Phase
    op_names: list[str]
    kind: np.ndarray  # int8: 0 cube, 1 vector, 2 comm
    flops: np.ndarray  # float64, per op, part independent of the KV length
    bytes: np.ndarray  # float64
    flops_per_kv: np.ndarray  # float64, added per KV-cache token (decode attention)
    bytes_per_kv: np.ndarray  # float64
    device_us: np.ndarray  # float64, fixed device time; NaN = use the roofline
    flags: np.ndarray  # uint8 bit set
    kv_len: np.ndarray  # int64 per step: KV-cache tokens attention reads
    tokens_per_step: int  # tokens processed per step (batch for decode, batch × prompt for prefill)
    tokens_out_per_step: int  # tokens generated per step (sampled and copied back to the host)
    batch_size: int
    warmup_steps: int

    @property
    def n_ops(self) -> int:
        return len(self.op_names)

    @property
    def steps(self) -> int:
        return int(self.kv_len.shape[0])


@dataclass
class _Shapes:
    tokens: int  # tokens through the layer this step
    batch: int
    context: int  # prompt length (prefill)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    width: int  # bytes per element
    decode: bool


# An op formula returns (kind, flops, bytes, flops_per_kv, bytes_per_kv, dynamic).
OpCost = tuple[OpKind, float, float, float, float, bool]


def _matmul(s: _Shapes, n_in: int, n_out: int, tokens: int | None = None) -> OpCost:
    t = s.tokens if tokens is None else tokens
    return (OpKind.cube, 2.0 * t * n_in * n_out, float(n_in * n_out + t * (n_in + n_out)) * s.width, 0.0, 0.0, False)


def _rms_norm(s: _Shapes) -> OpCost:
    return (OpKind.vector, 4.0 * s.tokens * s.hidden, float(2 * s.tokens * s.hidden + s.hidden) * s.width, 0.0, 0.0, False)


def _attention(s: _Shapes) -> OpCost:
    q_and_out = 2.0 * s.tokens * s.heads * s.head_dim * s.width
    if s.decode:
        # Each new token reads K and V of every cached token: 2 matmul-like passes of 2 FLOPs per MAC.
        return (
            OpKind.cube,
            0.0,
            q_and_out,
            4.0 * s.batch * s.heads * s.head_dim,
            2.0 * s.batch * s.kv_heads * s.head_dim * s.width,
            True,
        )
    causal_flops = 2.0 * s.batch * s.heads * s.head_dim * s.context * s.context  # half of 4·L² per head
    kv_bytes = 2.0 * s.tokens * s.kv_heads * s.head_dim * s.width
    return (OpKind.cube, causal_flops, q_and_out + kv_bytes, 0.0, 0.0, False)


OP_FORMULAS: dict[str, Callable[[_Shapes], OpCost]] = {
    "embedding": lambda s: (OpKind.vector, 0.0, float(2 * s.tokens * s.hidden * s.width + s.tokens * TOKEN_ID_BYTES), 0.0, 0.0, False),
    "input_norm": _rms_norm,
    "post_norm": _rms_norm,
    "final_norm": _rms_norm,
    "q_proj": lambda s: _matmul(s, s.hidden, s.heads * s.head_dim),
    "k_proj": lambda s: _matmul(s, s.hidden, s.kv_heads * s.head_dim),
    "v_proj": lambda s: _matmul(s, s.hidden, s.kv_heads * s.head_dim),
    "o_proj": lambda s: _matmul(s, s.heads * s.head_dim, s.hidden),
    "gate_proj": lambda s: _matmul(s, s.hidden, s.ffn),
    "up_proj": lambda s: _matmul(s, s.hidden, s.ffn),
    "down_proj": lambda s: _matmul(s, s.ffn, s.hidden),
    "rope": lambda s: (
        OpKind.vector,
        6.0 * s.tokens * (s.heads + s.kv_heads) * s.head_dim,
        2.0 * s.tokens * (s.heads + s.kv_heads) * s.head_dim * s.width,
        0.0,
        0.0,
        False,
    ),
    "kv_cache_write": lambda s: (OpKind.vector, 0.0, 4.0 * s.tokens * s.kv_heads * s.head_dim * s.width, 0.0, 0.0, False),
    "attention": _attention,
    "residual_add": lambda s: (OpKind.vector, float(s.tokens * s.hidden), 3.0 * s.tokens * s.hidden * s.width, 0.0, 0.0, False),
    "act_mul": lambda s: (OpKind.vector, 5.0 * s.tokens * s.ffn, 3.0 * s.tokens * s.ffn * s.width, 0.0, 0.0, False),
    # Logits are computed for the last token of each sequence only (as serving engines do).
    "lm_head": lambda s: _matmul(s, s.hidden, s.vocab, tokens=s.batch),
    "sampling": lambda s: (OpKind.vector, float(s.batch * s.vocab), float(s.batch * s.vocab * s.width), 0.0, 0.0, False),
}

CARD_INT_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "dtype_bytes",
)


def load_card(name: str) -> dict:
    path = WORKLOADS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"workload.card={name!r}: no such model card in workloads/")
    card = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert isinstance(card, dict)
    for key in CARD_INT_KEYS:
        value = card.get(key)
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"workloads/{name}.yaml {key}={value!r}: must be a positive integer")
    for key in ("pre_ops", "layer_ops", "post_ops"):
        for op in card.get(key) or []:
            if op not in OP_FORMULAS:
                raise ConfigError(f"workloads/{name}.yaml {key} op {op!r}: unknown op (known: {', '.join(sorted(OP_FORMULAS))})")
    if not card.get("layer_ops"):
        raise ConfigError(f"workloads/{name}.yaml layer_ops=[]: empty op list")
    return card


def build_workload(cfg: WorkloadConfig) -> Workload:
    """Ops of one step with their costs, and the KV length of every step."""
    decode = cfg.phase == Phase.decode
    tokens = cfg.batch_size if decode else cfg.batch_size * cfg.context_len
    steps = np.arange(cfg.steps, dtype=np.int64)
    # Decode step s attends over the prompt plus the s tokens generated before it (and itself).
    kv_len = cfg.context_len + steps + 1 if decode else np.full(cfg.steps, cfg.context_len, dtype=np.int64)
    if cfg.card is not None:
        names, costs = _ops_from_card(load_card(cfg.card), cfg, tokens, decode)
        fixed_us = np.full(len(names), np.nan)
        value_dep = compute_dep = np.zeros(len(names), dtype=bool)
    else:
        names = [op.name for op in cfg.ops]
        costs = [(op.kind, op.flops, op.bytes, 0.0, 0.0, op.dynamic) for op in cfg.ops]
        fixed_us = np.array([np.nan if op.device_us is None else op.device_us for op in cfg.ops], dtype=np.float64)
        value_dep = np.array([op.value_dependent for op in cfg.ops], dtype=bool)
        compute_dep = np.array([op.compute_dependent for op in cfg.ops], dtype=bool)
    dynamic = np.array([c[5] for c in costs], dtype=bool)
    flags = (dynamic * FLAG_DYNAMIC | value_dep * FLAG_VALUE_DEPENDENT | compute_dep * FLAG_COMPUTE_DEPENDENT).astype(np.uint8)
    return Workload(
        name=cfg.name,
        phase=cfg.phase,
        op_names=names,
        kind=np.array([KIND_CODE[c[0]] for c in costs], dtype=np.int8),
        flops=np.array([c[1] for c in costs], dtype=np.float64),
        bytes=np.array([c[2] for c in costs], dtype=np.float64),
        flops_per_kv=np.array([c[3] for c in costs], dtype=np.float64),
        bytes_per_kv=np.array([c[4] for c in costs], dtype=np.float64),
        device_us=fixed_us,
        flags=flags,
        kv_len=kv_len.astype(np.int64),
        tokens_per_step=tokens,
        tokens_out_per_step=cfg.batch_size,
        batch_size=cfg.batch_size,
        warmup_steps=cfg.warmup_steps,
    )


def _ops_from_card(card: dict, cfg: WorkloadConfig, tokens: int, decode: bool) -> tuple[list[str], list[OpCost]]:
    shapes = _Shapes(
        tokens=tokens,
        batch=cfg.batch_size,
        context=cfg.context_len,
        hidden=card["hidden_size"],
        heads=card["num_attention_heads"],
        kv_heads=card["num_key_value_heads"],
        head_dim=card["head_dim"],
        ffn=card["intermediate_size"],
        vocab=card["vocab_size"],
        width=card["dtype_bytes"],
        decode=decode,
    )
    names: list[str] = list(card.get("pre_ops") or [])
    for layer in range(card["num_hidden_layers"]):
        names += [f"layers.{layer}.{op}" for op in card["layer_ops"]]
    names += list(card.get("post_ops") or [])
    costs = [OP_FORMULAS[name.rsplit(".", 1)[-1]](shapes) for name in names]
    return names, costs
