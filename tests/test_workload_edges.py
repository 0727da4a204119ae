"""The op-list builder (harness/model/workload.py) at its edges: KV-cache bytes, collective sizes and
groups, MoE routing and exchange, TP/DP/EP splits, weights and quantisation, each checked against a
value computed by hand from the model's published numbers (the arithmetic is in each test)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_run
from harness.model.ops import COMM_ALL_GATHER, COMM_ALL_REDUCE, COMM_ALL_TO_ALL, COMM_NONE, STREAM_COMM, STREAM_COMPUTE
from harness.model.workload import build_workload


def built(*overrides: str, **options):
    run = compose_run(*overrides)
    return run, build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node, **options)


def op(workload, name: str) -> int:
    return workload.op_names.index(name)


# ---------------------------------------------------------------- KV cache


def test_llama2_7b_kv_cache_is_k_and_v_of_every_head_in_every_layer():
    """Llama-2-7B (MHA: 32 KV heads of 128, 32 layers, fp16): a token's K and V take
    2 x 32 layers x 4096 x 2 B = 524,288 B. Batch 3 at context 1024 over 4 decode steps: the last step
    attends over 1024 + 4 = 1028 tokens a sequence, 3 x 1028 = 3084 tokens: 1.616905 GB."""
    _, wl = built("workload=llama2_7b_decode", "workload.batch_size=3", "workload.steps=4")
    assert wl.kv_len.tolist() == [1025, 1026, 1027, 1028]
    assert wl.memory.kv_cache_gb == pytest.approx(524_288 * 3 * 1028 / 1e9, rel=1e-12)


@pytest.mark.parametrize("tp, kv_heads", [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_llama31_8b_kv_cache_splits_its_kv_heads_over_tp_and_replicates_below_one(tp, kv_heads):
    """Llama-3.1-8B (GQA: 8 KV heads of 128, 32 layers, bf16): a rank caches its 8 / tp KV heads, one
    whole head when there are fewer heads than ranks (TP 16: two ranks hold each). Bytes a token:
    kv_heads x (128 + 128) x 2 B x 32 layers (TP 1: 131,072; TP 2: 65,536; TP 8 and 16: 16,384).
    Batch 1 at context 1024, one decode step: 1025 tokens."""
    _, wl = built("workload=llama31_8b_decode", f"workload.tp={tp}", "workload.batch_size=1", "workload.steps=1")
    assert wl.memory.kv_cache_gb == pytest.approx(kv_heads * 256 * 2 * 32 * 1025 / 1e9, rel=1e-12)


def test_an_fp8_kv_cache_takes_one_byte_a_value_and_mla_keeps_its_latent():
    """fp8 KV: Llama-2-7B's 2 x 32 x 4096 x 1 B = 262,144 B a token. DeepSeek-V3's MLA caches the
    512 + 64 latent a layer (replicated over TP): 576 x 61 layers x 1 B = 35,136 B a token at fp8."""
    _, wl = built("workload=llama2_7b_decode", "workload.kv_cache_dtype=fp8", "workload.batch_size=2", "workload.steps=1")
    assert wl.memory.kv_cache_gb == pytest.approx(262_144 * 2 * 1025 / 1e9, rel=1e-12)
    run, wl = built("workload=deepseek_v3", "workload.kv_cache_dtype=fp8", "workload.steps=1")
    seqs, kv = run.workload.batch_size, run.workload.context_len + 1
    assert wl.memory.kv_cache_gb == pytest.approx(576 * 61 * seqs * kv / 1e9, rel=1e-12)


def test_prefill_caches_the_prompt():
    """Prefill of 2 prompts of 16 tokens (Llama-2-7B): the cache holds 2 x 16 tokens x 524,288 B."""
    _, wl = built("workload=llama2_7b_prefill", "workload.batch_size=2", "workload.context_len=16", "workload.steps=1")
    assert wl.tokens.tolist() == [32]
    assert wl.kv_len.tolist() == [16]
    assert wl.memory.kv_cache_gb == pytest.approx(524_288 * 32 / 1e9, rel=1e-12)


def test_decode_attention_reads_the_cache_of_the_real_rows_only():
    """Llama-2-7B decode at TP 1, batch 4 padded from 3 real sequences (kv_rows): attention reads the 3 real
    sequences' K and V, 3 x 1025 tokens x 32 heads x 256 x 2 B = 50,380,800 B; its FLOPs
    2 x 32 heads x 256 x 3075 tokens; it writes and reads the 4 rows' q/o: 4 x 32 x 256 x 2 B."""
    _, wl = built("workload=llama2_7b_decode", "workload.batch_size=4", "workload.steps=1", kv_rows=np.array([3]))
    j = op(wl, "layers.0.attention")
    cache = 3 * 1025 * 32 * 256 * 2
    assert wl.cache_bytes[0, j] == cache
    assert wl.bytes[0, j] == cache + 4 * 32 * 256 * 2
    assert wl.flops[0, j] == 2 * 32 * 256 * 3 * 1025


# ---------------------------------------------------------------- collectives


def test_llama2_tp_collectives_carry_the_batch_hidden_state_and_the_logit_slices():
    """Llama-2-7B at TP 4, batch 8 decode: each all-reduce after o_proj / down_proj (and the embedding's)
    carries 8 tokens x 4096 x 2 B = 65,536 B over the 4 ranks, 1 apart; the logits gathered after the head are
    each rank's 8 x 32000 / 4 x 2 B = 128,000 B. All on the comm stream; compute ops carry no collective."""
    _, wl = built("workload=llama2_7b_decode", "workload.tp=4", "workload.batch_size=8", "workload.steps=1")
    names = wl.op_names
    reduces = [i for i, n in enumerate(names) if n.endswith("tp_all_reduce")]
    assert len(reduces) == 1 + 2 * 32
    for i in reduces:
        assert (wl.comm[i], wl.comm_ranks[i], wl.comm_stride[i], wl.bytes[0, i], wl.stream[i]) == (COMM_ALL_REDUCE, 4, 1, 65_536, STREAM_COMM)
    g = op(wl, "logits_gather")
    assert (wl.comm[g], wl.comm_ranks[g], wl.bytes[0, g], wl.stream[g]) == (COMM_ALL_GATHER, 4, 128_000, STREAM_COMM)
    q = op(wl, "layers.0.q_proj")
    assert (wl.comm[q], wl.comm_ranks[q], wl.stream[q]) == (COMM_NONE, 1, STREAM_COMPUTE)
    assert wl.devices == 4


def test_a_dense_model_at_tp_1_issues_no_collective():
    """TP 1: no all-reduce, no logits gather (a group of one rank has nothing to exchange)."""
    _, wl = built("workload=llama2_7b_decode", "workload.tp=1", "workload.steps=1")
    assert not any("all_reduce" in n or "gather" in n for n in wl.op_names)
    assert (wl.comm == COMM_NONE).all() and (wl.stream == STREAM_COMPUTE).all()


# ---------------------------------------------------------------- MoE routing and exchange


def test_the_exchange_method_switches_at_the_all_to_all_threshold():
    """An EP group of at least max(2, moe_all_to_all_min_ep) ranks exchanges all-to-all; a smaller one,
    and no EP at all (1 rank), take the all-gather method."""
    from harness.model.workload import MOE_ALL_GATHER, MOE_ALL_TO_ALL, moe_exchange

    assert [moe_exchange(ep, 2) for ep in (1, 2, 4)] == [MOE_ALL_GATHER, MOE_ALL_TO_ALL, MOE_ALL_TO_ALL]
    assert [moe_exchange(ep, 16) for ep in (4, 15, 16, 32)] == [MOE_ALL_GATHER, MOE_ALL_GATHER, MOE_ALL_TO_ALL, MOE_ALL_TO_ALL]
    assert [moe_exchange(ep, 0) for ep in (1, 2)] == [MOE_ALL_GATHER, MOE_ALL_TO_ALL]  # never below 2 ranks


def test_an_odd_batch_splits_over_tp_rounding_up_before_the_dispatch():
    """Qwen3-30B-A3B (128 experts, 8 a token, hidden 2048, bf16) at TP 2 x DP 2, EP 4, 7 sequences a DP
    group: each TP rank routes ceil(7 / 2) = 4 rows (the padded split), not 3.5. Dispatch and combine send
    4 x 8 picks x 2048 x 2 B = 131,072 B all-to-all over the 4 EP ranks; the TP all-gather after carries
    4 x 2048 x 2 B = 16,384 B over 2 ranks. top-k scores 4 x 128 logits (4 flops, 1 pass of 2 B each).
    Each rank holds 128 / 4 = 32 whole experts; the 4 ranks' 16 rows pick 16 x 8 x 32 / 128 = 32 of its
    rows: gate_up 2 x 32 x 2048 x 1536 FLOPs."""
    _, wl = built("workload=qwen3_30b_decode", "workload.tp=2", "workload.dp=2", "workload.ep=4", "workload.batch_size=7",
                  "workload.steps=1")
    for name in ("moe_dispatch", "moe_combine"):
        j = op(wl, f"layers.0.{name}")
        assert (wl.comm[j], wl.comm_ranks[j], wl.comm_stride[j], wl.bytes[0, j]) == (COMM_ALL_TO_ALL, 4, 1, 131_072)
    j = op(wl, "layers.0.moe_finalize_tp")
    assert (wl.comm[j], wl.comm_ranks[j], wl.bytes[0, j]) == (COMM_ALL_GATHER, 2, 16_384)
    j = op(wl, "layers.0.moe_topk")
    assert (wl.flops[0, j], wl.bytes[0, j]) == (4 * 128 * 4.0, 4 * 128 * 2.0)
    j = op(wl, "layers.0.grouped_gate_up")
    assert wl.flops[0, j] == 2 * 32 * 2048 * 1536
    assert wl.devices == 4


def test_a_w8a8_dispatch_sends_int8_rows_and_the_combine_returns_the_model_dtype():
    """Qwen3-30B-A3B W8A8 at TP 4 / EP 4, 16 sequences: each rank dispatches its 4 tokens' 8 picks as int8
    (4 x 8 x 2048 x 1 B = 65,536 B: MC2 quantises before sending) and gets them back combined in bf16
    (131,072 B)."""
    _, wl = built("workload=qwen3_30b_decode", "workload.quant=w8a8", "workload.steps=1")
    assert wl.bytes[0, op(wl, "layers.0.moe_dispatch")] == 65_536
    assert wl.bytes[0, op(wl, "layers.0.moe_combine")] == 131_072


def test_the_all_gather_method_gathers_over_the_dp_group_whose_members_are_tp_apart():
    """Qwen3-30B-A3B at TP 2 x DP 2 without EP, 8 sequences a DP group: the DP group is ranks {r, r + 2}:
    stride tp = 2. Dispatch all-gathers 8 x (2048 + 128 logits) x 2 B = 34,816 B; the combine 8 x 2048 x 2
    = 32,768 B; the TP all-reduce after it 32,768 B over 2 ranks 1 apart. top-k scores all 16 tokens of both
    DP groups: 16 x 128 x 4 flops."""
    _, wl = built("workload=qwen3_30b_decode", "workload.tp=2", "workload.dp=2", "workload.ep=1", "workload.batch_size=8",
                  "workload.steps=1")
    got = lambda name: (int(wl.comm[op(wl, name)]), int(wl.comm_ranks[op(wl, name)]), int(wl.comm_stride[op(wl, name)]), float(wl.bytes[0, op(wl, name)]))
    assert got("layers.0.moe_dispatch") == (COMM_ALL_GATHER, 2, 2, 34_816)
    assert got("layers.0.moe_combine") == (COMM_ALL_GATHER, 2, 2, 32_768)
    assert got("layers.0.moe_finalize_tp") == (COMM_ALL_REDUCE, 2, 1, 32_768)
    assert wl.flops[0, op(wl, "layers.0.moe_topk")] == 16 * 128 * 4


def test_the_shared_expert_is_split_over_tp_and_all_reduced_on_its_own():
    """DeepSeek-V3 bf16 at TP 4, DP 4, EP 16, 8 sequences: the shared expert (1 x 2048 wide) runs TP-split
    on all 8 tokens: gate_up 7168 x 4096 / 4 weights, 2 x 8 x 7168 x 4096 / 4 FLOPs; its activation over
    8 x 2048 / 4 = 4096 elements (5 flops, 3 passes of 2 B); the all-reduce 8 x 7168 x 2 B = 114,688 B."""
    _, wl = built("workload=deepseek_v3", "workload.quant=bf16", "workload.steps=1")
    j = op(wl, "layers.3.shared_gate_up")
    assert (wl.weight_bytes[j], wl.flops[0, j]) == (7168 * 4096 / 4 * 2, 2 * 8 * 7168 * 4096 / 4)
    j = op(wl, "layers.3.shared_act")
    assert (wl.flops[0, j], wl.bytes[0, j]) == (5 * 4096, 3 * 4096 * 2)
    j = op(wl, "layers.3.shared_all_reduce")
    assert (wl.comm[j], wl.comm_ranks[j], wl.bytes[0, j]) == (COMM_ALL_REDUCE, 4, 114_688)


def test_a_moe_without_a_shared_expert_or_under_the_all_gather_method_reduces_no_shared_output():
    """DeepSeek-V3 on the all-gather method (EP 16 below an all-to-all threshold of 32): the shared output is
    added to the routed one and reduced with it (moe_finalize_tp): no shared_all_reduce. With
    n_shared_experts 0 there is no shared expert at all."""
    _, wl = built("workload=deepseek_v3", "workload.steps=1", moe_all_to_all_min_ep=32)
    assert not any(n.endswith("shared_all_reduce") for n in wl.op_names)
    assert "layers.3.shared_gate_up" in wl.op_names
    _, wl = built("workload=deepseek_v3", "workload.steps=1", "+workload.card_overrides.n_shared_experts=0")
    assert not any(".shared_" in n for n in wl.op_names)


# ---------------------------------------------------------------- weights, workspace


# Llama-2-7B's parameters (config.json: hidden 4096, 32 layers, intermediate 11008, vocab 32000, untied head):
EMBED = 32_000 * 4_096  # 131,072,000: the embedding, and again the LM head
LINEARS = 4 * 4_096 * 4_096 + 3 * 4_096 * 11_008  # q, k, v, o + gate, up, down: 202,375,168 a layer
NORMS = 2 * 4_096  # input and post-attention RMSNorm weights a layer


@pytest.mark.parametrize("tp", [1, 2])
def test_llama2_7b_weights_a_rank_holds(tp):
    """bf16, TP t: the embedding, the head and every linear split t ways; the norms (32 x 2 + 1 of 4096)
    replicated. TP 1: (2 x 131,072,000 + 32 x 202,375,168 + 65 x 4096) x 2 B = 13,476,831,232 B (6.74 B
    parameters, the published 6.74 B)."""
    _, wl = built("workload=llama2_7b_decode", f"workload.tp={tp}", "workload.steps=1")
    expected = ((2 * EMBED + 32 * LINEARS) / tp + 32 * NORMS + 4_096) * 2
    assert wl.memory.weights_gb == pytest.approx(expected / 1e9, rel=1e-12)
    if tp == 1:
        assert expected == 13_476_831_232


def test_w8a8_stores_the_linears_in_one_byte_and_the_rest_in_the_model_dtype():
    """W8A8 Llama-2-7B at TP 1: the 32 x 202,375,168 linear weights in 1 B, the embedding, the head (not
    quantised) and the norms in 2 B: 6,476,005,376 + 2 x (262,144,000 + 266,240) = 7,000,826,256 B."""
    _, wl = built("workload=llama2_7b_decode", "workload.quant=w8a8", "workload.steps=1")
    assert wl.memory.weights_gb == pytest.approx((32 * LINEARS + 2 * (2 * EMBED + 65 * 4_096)) / 1e9, rel=1e-12)
    q = op(wl, "layers.0.q_proj")
    assert wl.weight_bytes[q] == 4_096 * 4_096  # int8
    assert wl.weight_bytes[op(wl, "lm_head")] == EMBED * 2


def test_workspace_is_twice_the_largest_activation_traffic_beyond_weights_and_cache():
    """Llama-2-7B prefill of 16 tokens at TP 1: the op moving the most activations is act_mul (SwiGLU: reads
    gate and up, writes their product, 3 passes over 16 x 11008 values of 2 B = 1,056,768 B; q/k/v/o move
    16 x 8192 x 2 = 262,144, gate/up 16 x 15104 x 2 = 483,328 besides their weights, attention 524,288);
    the plan keeps two such buffers: 2,113,536 B."""
    _, wl = built("workload=llama2_7b_prefill", "workload.context_len=16", "workload.steps=1")
    assert wl.memory.workspace_gb == pytest.approx(2 * 3 * 16 * 11_008 * 2 / 1e9, rel=1e-12)


# ---------------------------------------------------------------- op order, names and dependencies


def test_layers_are_numbered_across_layer_groups_and_each_op_waits_for_the_one_before():
    """DeepSeek-V3: 3 dense layers (0-2) then 58 MoE layers (3-60), numbered on; the embedding waits for
    nothing; every later op, unless it names another, waits for the op issued just before it."""
    _, wl = built("workload=deepseek_v3", "workload.steps=1")
    names = wl.op_names
    assert "layers.2.gate_up_proj" in names and "layers.3.gate_up_proj" not in names
    assert "layers.3.moe_gate" in names and "layers.60.moe_gate" in names and "layers.2.moe_gate" not in names
    assert not any(n.startswith("layers.61.") for n in names)
    assert names[:2] == ["embedding", "tp_all_reduce"] and wl.after[0] == [] and wl.after[1] == [0]
    assert names[-1] == "sampling" and wl.after[-1] == [len(names) - 2]
    q = op(wl, "layers.5.q_b_proj")
    assert wl.after[q] == [q - 1]


def test_an_op_named_after_another_waits_for_that_ops_latest_issue():
    """DeepSeek-V3 MoE layer: the shared expert's gate_up waits for the dynamic_quant just before the dispatch
    (the latest of its name), not for the dispatch; the routed gate_up waits for the dispatch. In bf16 no
    dynamic_quant is issued: shared_gate_up waits for what it would have waited for, moe_topk."""
    _, wl = built("workload=deepseek_v3", "workload.steps=1")
    names = wl.op_names
    dispatch = op(wl, "layers.3.moe_dispatch")
    assert names[dispatch - 1] == "layers.3.dynamic_quant"
    assert wl.after[op(wl, "layers.3.shared_gate_up")] == [dispatch - 1]
    assert wl.after[op(wl, "layers.3.grouped_gate_up")] == [dispatch]
    _, wl = built("workload=deepseek_v3", "workload.quant=bf16", "workload.steps=1")
    assert wl.after[op(wl, "layers.3.shared_gate_up")] == [op(wl, "layers.3.moe_topk")]
    assert wl.after[op(wl, "layers.3.grouped_gate_up")] == [op(wl, "layers.3.moe_dispatch")]


def test_an_op_named_after_one_not_issued_at_the_start_of_a_list_waits_for_nothing():
    """An op list whose first op is not issued (tp_all_reduce at TP 1) and whose next names it in `after`:
    nothing was issued before it, so it waits for nothing."""
    _, wl = built("workload=llama2_7b_decode", "workload.steps=1",
                  "+workload.card_overrides.pre_ops=[tp_all_reduce,{op:embedding,after:tp_all_reduce}]")
    assert wl.op_names[0] == "embedding" and wl.after[0] == []


# ---------------------------------------------------------------- HF transformers eager (kernels=unfused)

# Llama-3.1-8B at TP 2, decode of 2 sequences at context 1024 (one step: KV 1025): a rank has 32 / 2 = 16
# query heads, 8 / 2 = 4 KV heads of 128, 14336 / 2 MLP columns, 128256 / 2 logits a token. Each kernel:
# (elements, bytes, FLOPs); bytes = elements x (read + written bytes a value), float32 (4 B) inside RMSNorm.
HIDDEN = 2 * 4_096  # tokens x hidden
UNFUSED = {
    "rms_cast_up": (HIDDEN, HIDDEN * (2 + 4), HIDDEN),
    "rms_pow": (HIDDEN, HIDDEN * (4 + 4), HIDDEN),
    "rms_mean": (HIDDEN, HIDDEN * 4, HIDDEN),
    "rms_add_eps": (2, 2 * (4 + 4), 2),  # one value a token
    "rms_rsqrt": (2, 2 * (4 + 4), 2 * 4),
    "rms_mul": (HIDDEN, HIDDEN * (4 + 4), HIDDEN),
    "rms_cast_down": (HIDDEN, HIDDEN * (4 + 2), HIDDEN),
    "rms_weight": (HIDDEN, HIDDEN * (2 + 2) + 4_096 * 2, HIDDEN),  # and its 4096 weights
    "rope_q_mul": (2 * 16 * 128, 2 * 16 * 128 * (2 * 2 + 2), 2 * 16 * 128),  # q and cos in, q out
    "rope_q_neg": (2 * 16 * 64, 2 * 16 * 64 * (2 + 2), 2 * 16 * 64),  # rotate_half negates half the head
    "rope_q_cat": (2 * 16 * 128, 2 * 16 * 128 * (2 + 2), 0),
    "rope_q_add": (2 * 16 * 128, 2 * 16 * 128 * (2 * 2 + 2), 2 * 16 * 128),
    "rope_k_mul": (2 * 4 * 128, 2 * 4 * 128 * (2 * 2 + 2), 2 * 4 * 128),
    "rope_k_neg": (2 * 4 * 64, 2 * 4 * 64 * (2 + 2), 2 * 4 * 64),
    "rope_k_cat": (2 * 4 * 128, 2 * 4 * 128 * (2 + 2), 0),
    "rope_k_add": (2 * 4 * 128, 2 * 4 * 128 * (2 * 2 + 2), 2 * 4 * 128),
    # torch.cat of the whole cached K (or V), 2 sequences x 1025 tokens x 4 heads x 128, read and written
    "kv_cat": (None, 2 * (2 * 1025 * 4 * 128) * 2, 0),
    "silu": (2 * 7_168, 2 * 7_168 * (2 + 2), 2 * 7_168 * 4),
    "mul": (2 * 7_168, 2 * 7_168 * (2 * 2 + 2), 2 * 7_168),
}
UNFUSED_AROUND = {
    "rope_table": 2 * 128 * (4 + 4),  # cos/sin of each token's positions, float32
    "logits_cast": 2 * 64_128 * (2 + 4),  # the rank's logits to float32
    "argmax": 2 * 64_128 * 4,
    "generate_bookkeeping": 2 * (8 + 8),  # int64 ids and flags a sequence
}


def test_unfused_kernels_move_what_hf_transformers_eager_moves():
    _, wl = built("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.tp=2", "workload.batch_size=2", "workload.steps=1")
    for name, (_, nbytes, flops) in UNFUSED.items():
        j = op(wl, f"layers.0.{name}")
        assert (wl.bytes[0, j], wl.flops[0, j]) == (nbytes, flops), name
    for name, nbytes in UNFUSED_AROUND.items():
        assert wl.bytes[0, op(wl, name)] == nbytes, name
    assert wl.flags[op(wl, "layers.0.kv_cat")] & 1  # FLAG_DYNAMIC: the cache's shape changes every step
    # 7 before the layers, 40 kernels in each of 32, 15 after; no module calls unless they are priced
    assert wl.n_ops == 7 + 32 * 40 + 15 and wl.host_us.sum() == 0.0
    assert wl.weight_bytes[op(wl, "layers.0.rms_weight")] == 4_096 * 2


def test_a_static_kv_write_writes_the_new_tokens_values_in_place():
    """kv_cache=static: each of K and V writes the 2 new tokens' 4 heads x 128 values: read and written at
    2 B, 2 x 512 x 4 = 4,096 B; no FLOPs; not dynamic."""
    _, wl = built("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.kv_cache=static", "workload.tp=2",
                  "workload.batch_size=2", "workload.steps=1")
    j = op(wl, "layers.0.kv_write")
    assert (wl.bytes[0, j], wl.flops[0, j], wl.flags[j] & 1) == (4_096, 0, 0)
    assert not any(n.endswith("kv_cat") for n in wl.op_names)


def test_engine_and_module_python_time_are_host_ops_where_the_code_runs():
    """engine_layer_us=7 puts a 7 us host op first in each of the 32 layers (none before or after them);
    module_us=5 with unfused kernels prices 4 module calls before the layers (20 us), 13 in each (65 us), 2
    after (10 us), first in each part; fused kernels make no module calls."""
    run = compose_run("workload=llama31_8b_decode", "workload.steps=1")
    wl = build_workload(run.workload, engine_layer_us=7.0)
    engine = [j for j, n in enumerate(wl.op_names) if n.endswith("engine_overhead")]
    assert len(engine) == 32 and wl.op_names[engine[0]] == "layers.0.engine_overhead"
    assert wl.op_names[engine[0] - 1] == "embedding" and wl.host_us[engine].tolist() == [7.0] * 32
    assert wl.host_us.sum() == 32 * 7.0
    assert build_workload(run.workload, module_us=5.0).host_us.sum() == 0.0
    run = compose_run("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=1")
    wl = build_workload(run.workload, module_us=5.0)
    assert wl.op_names[0] == "pre_modules" and wl.host_us[0] == 20.0
    assert wl.op_names[op(wl, "layers.0.layer_modules") - 1] == "rope_table"
    assert wl.host_us[op(wl, "layers.31.layer_modules")] == 65.0
    assert wl.op_names[-15 - 1] == "post_modules" and wl.host_us[-16] == 10.0
    assert wl.host_us.sum() == (4 + 32 * 13 + 2) * 5.0


# ---------------------------------------------------------------- cards: what is refused, what is not


@pytest.mark.parametrize("card, overrides, message", [
    ("qwen3_30b_a3b", {"tie_word_embeddings": 1}, "tie_word_embeddings=1: must be true or false"),
    ("llama2_7b", {"family": 3}, "family=3: must be text"),
    ("llama2_7b", {"pre_ops": "embedding"}, "pre_ops='embedding': must be a list of ops"),
    ("llama2_7b", {"vocab_size": None}, "vocab_size=None: must be an integer"),  # a required field cannot be unset
    ("llama2_7b", {"hidden_size": 4096.5}, "hidden_size=4096.5: must be an integer"),
    ("deepseek_v3", {"layer_groups": [{"count": 61, "ops": ["input_norm"], "repeat": 1}]}, r"layer_groups\[0\]=.*must be \{count: N, ops"),
    ("deepseek_v3", {"layer_groups": ["input_norm"]}, r"layer_groups\[0\]='input_norm': must be \{count: N, ops"),
    ("deepseek_v3", {"layer_groups": [{"count": 0, "ops": ["input_norm"]}, {"count": 61, "ops": ["input_norm"]}]}, r"layer_groups\[0\]\.count=0"),
    ("deepseek_v3", {"layer_groups": [{"count": 60, "ops": ["input_norm"]}]}, "counts add up to 60, not num_hidden_layers=61"),
    ("deepseek_v3", {"layer_groups": [{"count": 61, "ops": []}]}, r"layer_groups\[0\]\.ops=\[\]: empty op list"),
    ("llama2_7b", {"post_ops": ["final_norm", "lm_head", "softmax"]}, "post_ops op 'softmax': unknown op"),
    ("llama2_7b", {"unfused_layer_ops": ["rms_pow", "nope"]}, "unfused_layer_ops op 'nope': unknown op"),
    ("llama2_7b", {"pre_ops": [{"op": "embedding", "after": "tp_all_reduce"}, "tp_all_reduce"]},
     "pre_ops op 'embedding' after='tp_all_reduce': not an earlier op of the same list"),
    # Each KV head serves a whole group of query heads: checked at TP 1 too (only a TP split checked them).
    ("llama2_7b", {"num_key_value_heads": 64}, "num_key_value_heads=64: must divide num_attention_heads=32"),
    ("llama31_8b", {"num_key_value_heads": 5}, "num_key_value_heads=5: must divide num_attention_heads=32"),
    ("llama2_7b", {"num_attention_heads": 7}, "num_attention_heads=7: must be a multiple of num_key_value_heads=32"),
])
def test_a_card_is_refused_naming_the_field_at_fault(card, overrides, message):
    from harness.base.errors import ConfigError
    from harness.model.workload import load_card

    with pytest.raises(ConfigError, match=message):
        load_card(card, overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"n_routed_experts": 4, "num_experts_per_tok": 8},
     "workload.card_overrides.num_experts_per_tok=8: a token picks that many distinct experts, more than n_routed_experts=4"),
    ({"num_experts_per_tok": 200},
     "workload.card_overrides.num_experts_per_tok=200: a token picks that many distinct experts, more than n_routed_experts=128"),
    # no experts at all for a token's 8 picks: refused here, not a "division by zero" when the layer is built
    ({"n_routed_experts": 0},
     "workload.card_overrides.n_routed_experts=0: fewer experts than a token picks (num_experts_per_tok=8)"),
])
def test_too_many_experts_a_token_picks_names_the_key_that_set_them(overrides, message):
    from harness.base.errors import ConfigError
    from harness.model.workload import load_card

    with pytest.raises(ConfigError) as refused:
        load_card("qwen3_30b_a3b", overrides)
    assert str(refused.value) == message


def test_a_card_file_that_picks_more_experts_than_it_has_is_named(tmp_path, monkeypatch):
    import harness.model.workload as workload_module
    from harness.base.errors import ConfigError
    from harness.config.paths import WORKLOADS_DIR

    text = (WORKLOADS_DIR / "qwen3_30b_a3b.yaml").read_text().replace("num_experts_per_tok: 8", "num_experts_per_tok: 200")
    (tmp_path / "qwen3_30b_a3b.yaml").write_text(text)
    monkeypatch.setattr(workload_module, "WORKLOADS_DIR", tmp_path)
    with pytest.raises(ConfigError) as refused:
        workload_module.load_card("qwen3_30b_a3b")
    assert str(refused.value) == (
        "workloads/qwen3_30b_a3b.yaml num_experts_per_tok=200: a token picks that many distinct experts, more than n_routed_experts=128")


def test_a_card_file_missing_a_required_field_is_refused(tmp_path, monkeypatch):
    import harness.model.workload as workload_module
    from harness.base.errors import ConfigError
    from harness.config.paths import WORKLOADS_DIR

    text = (WORKLOADS_DIR / "llama2_7b.yaml").read_text().replace("vocab_size: 32000", "")
    (tmp_path / "llama2_7b.yaml").write_text(text)
    monkeypatch.setattr(workload_module, "WORKLOADS_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"^workloads/llama2_7b.yaml vocab_size: missing"):
        workload_module.load_card("llama2_7b")


@pytest.mark.parametrize("card, overrides", [
    ("qwen3_30b_a3b", {"layer_overhead_us": 12.5}),  # microseconds: not only whole ones
    ("qwen3_30b_a3b", {"num_experts_per_tok": 128}),  # a token may pick every expert
    ("qwen3_30b_a3b", {"n_routed_experts": 8}),
    ("llama2_7b", {"head_dim": None}),  # optional fields may be left out
    ("llama2_7b", {"layer_ops": [{"op": "input_norm"}, "q_proj", {"op": "attention", "after": "q_proj"}]}),
])
def test_a_card_within_its_rules_is_taken(card, overrides):
    from harness.model.workload import load_card

    got = load_card(card, overrides)
    for key, value in overrides.items():
        if key == "layer_ops":
            assert got["layer_groups"] == [{"count": 32, "ops": value}] and "layer_ops" not in got
        else:
            assert got[key] == value


def test_a_card_without_head_dim_takes_hidden_over_heads():
    """Llama-2-7B without head_dim: 4096 / 32 heads = 128, as in its config.json: the KV cache is unchanged
    (2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B a token)."""
    _, wl = built("workload=llama2_7b_decode", "workload.steps=1", "+workload.card_overrides.head_dim=null")
    assert wl.memory.kv_cache_gb == pytest.approx(524_288 * 1025 / 1e9, rel=1e-12)


def test_the_parameter_count_of_a_moe_card_counts_every_expert():
    """Qwen3-30B-A3B: per layer attention 2048 x (32 + 2 x 4) x 128 + 32 x 128 x 2048 = 18,874,368,
    q/k norms 2 x 128, two RMSNorms 2 x 2048, the router 2048 x 128 = 262,144 and 128 experts of
    3 x 2048 x 768 = 603,979,776: 623,120,640 a layer, x 48 = 29,909,790,720; embedding and head
    2 x 151,936 x 2048 = 622,329,856; the final norm 2048: 30,532,122,624 (the published 30.5 B)."""
    from harness.model.workload import card_parameter_count, load_card

    layer = 2048 * 40 * 128 + 32 * 128 * 2048 + 2 * 128 + 2 * 2048 + 2048 * 128 + 128 * 3 * 2048 * 768
    assert card_parameter_count(load_card("qwen3_30b_a3b")) == 48 * layer + 2 * 151_936 * 2048 + 2048 == 30_532_122_624


# ---------------------------------------------------------------- the fused ops of a dense layer

# Llama-3.1-8B bf16 at TP 2, decode of 2 sequences (one step at KV 1025): hidden 4096, 16 of 32 query heads
# and 4 of 8 KV heads of 128 a rank, 14336 / 2 MLP columns, 128256 / 2 vocabulary rows. (bytes, FLOPs):
LLAMA31_TP2 = {
    # 2 tokens x 4096 read + written twice (residual in/out, normed out) x 2 B, and the 4096 weights
    "layers.0.add_rms_norm": (4 * 2 * 4096 * 2 + 4096 * 2, 5 * 2 * 4096),
    # column-parallel 4096 x (32 + 2 x 8) x 128 / 2 = 4096 x 3072: weights, the whole input, its 3072 outputs
    "layers.0.qkv_proj": (4096 * 3072 * 2 + 2 * (4096 + 3072) * 2, 2 * 2 * 4096 * 3072),
    # rotary on the rank's 16 + 4 heads: read and written once, 6 flops a value
    "layers.0.rope": (2 * 2 * 20 * 128 * 2, 6 * 2 * 20 * 128),
    # the 2 new tokens' K and V of 4 heads read (2 B) and written to the cache (2 B)
    "layers.0.kv_cache_write": (2 * 4 * 256 * (2 + 2), 0),
    # decode attention: the cache of 2 x 1025 tokens x 4 heads x (128 + 128) x 2 B, and q in / o out
    "layers.0.attention": (2050 * 4 * 256 * 2 + 2 * 16 * 256 * 2, 2 * 16 * 256 * 2050),
    # row-parallel 2048 x 4096: its half of the input in, the whole partial output out
    "layers.0.o_proj": (2048 * 4096 * 2 + 2 * (2048 + 4096) * 2, 2 * 2 * 2048 * 4096),
    "layers.0.gate_up_proj": (4096 * 14336 * 2 + 2 * (4096 + 14336) * 2, 2 * 2 * 4096 * 14336),
    "layers.0.act_mul": (3 * 2 * 7168 * 2, 5 * 2 * 7168),
    "layers.0.down_proj": (7168 * 4096 * 2 + 2 * (7168 + 4096) * 2, 2 * 2 * 7168 * 4096),
    "final_norm": (2 * 2 * 4096 * 2 + 4096 * 2, 4 * 2 * 4096),
    # vocab-parallel head on the 2 sampled tokens: 4096 x 64128 weights, 4096 in, 64128 logits out
    "lm_head": (4096 * 64128 * 2 + 2 * (4096 + 64128) * 2, 2 * 2 * 4096 * 64128),
    "logits_gather": (2 * 64128 * 2, 0),
    "sampling": (2 * 128256 * 2, 2 * 128256),
    # 2 tokens' rows looked up (read and written) and their int32 ids
    "embedding": (2 * 2 * 4096 * 2 + 2 * 4, 0),
}


def test_the_fused_ops_of_a_tp_split_decoder_layer():
    _, wl = built("workload=llama31_8b_decode", "workload.tp=2", "workload.batch_size=2", "workload.steps=1")
    for name, (nbytes, flops) in LLAMA31_TP2.items():
        j = op(wl, name)
        assert (wl.bytes[0, j], wl.flops[0, j]) == (nbytes, flops), name
    assert wl.weight_bytes[op(wl, "embedding")] == 128256 * 4096 / 2 * 2
    assert wl.cache_bytes[0, op(wl, "layers.0.attention")] == 2050 * 4 * 256 * 2
    assert not any("dynamic_quant" in n for n in wl.op_names)  # bf16


def test_gptj_ropes_only_its_rotary_dims_and_runs_an_ungated_gelu_mlp():
    """GPT-J-6B (16 heads of 256, rotary_dim 64, n_inner 16384) at TP 2, one token: 8 query and 8 KV heads a
    rank; rope over (8 + 8) x 64 = 1024 values (6 flops, read + written at 2 B); gelu over the rank's
    16384 / 2 = 8192 (8 flops, 2 passes); up_proj 4096 x 8192 a rank (the whole input, its half of the
    output); each residual add 3 passes over 4096; the LayerNorm 2 passes + its 4096 weights."""
    _, wl = built("workload=llama2_7b_decode", "workload.card=gptj_6b", "workload.tp=2", "workload.steps=1")
    expect = {
        "layers.0.rope": (2 * 1024 * 2, 6 * 1024),
        "layers.0.gelu": (2 * 8192 * 2, 8 * 8192),
        "layers.0.up_proj": (4096 * 8192 * 2 + (4096 + 8192) * 2, 2 * 4096 * 8192),
        "layers.0.residual_add": (3 * 4096 * 2, 4096),
        "layers.0.input_norm": (2 * 4096 * 2 + 4096 * 2, 4 * 4096),
    }
    for name, (nbytes, flops) in expect.items():
        j = op(wl, name)
        assert (wl.bytes[0, j], wl.flops[0, j]) == (nbytes, flops), name


def test_qwen25_1_5b_biased_projection_and_tied_head():
    """Qwen2.5-1.5B (hidden 1536, 12 heads and 2 KV heads of 128, biased q/k/v, tied embeddings). Its
    parameters: a layer's qkv 1536 x 2048 + 2048 biases = 3,147,776, o 1536 x 1536 = 2,359,296, gate_up
    1536 x 17920 = 27,525,120, down 8960 x 1536 = 13,762,560, two norms 3072: 46,797,824, x 28 layers
    = 1,310,339,072; the embedding 151936 x 1536 = 233,373,696 (the head shares it), the final norm 1536:
    1,543,714,304 (the published 1.54 B). At TP 4 each rank holds 3 query heads and one whole KV head of
    the 2 (replicated): qkv (3 + 2) x 128 = 640 outputs and their biases, 1536 x 640 + 640 = 983,680 weights.
    The tied head reads the embedding's 151936 / 4 x 1536 rows but holds no weights of its own."""
    from harness.model.workload import card_parameter_count, load_card

    assert card_parameter_count(load_card("qwen25_1_5b")) == 1_543_714_304
    _, wl = built("workload=qwen25_1_5b_decode", "workload.tp=4", "workload.batch_size=1", "workload.steps=1")
    j = op(wl, "layers.0.qkv_proj")
    assert wl.weight_bytes[j] == (1536 * 640 + 640) * 2
    assert wl.weight_bytes[op(wl, "lm_head")] == 151936 / 4 * 1536 * 2
    norms = (28 * 2 + 1) * 1536
    layer = (1536 * 640 + 640) + (384 * 1536) + (1536 * 17920 + 8960 * 1536) / 4
    assert wl.memory.weights_gb == pytest.approx(((151936 * 1536 / 4 + 28 * layer) + norms) * 2 / 1e9, rel=1e-12)


def test_the_router_is_replicated_and_two_ep_ranks_exchange_all_to_all_by_default():
    """Qwen3-30B-A3B at TP 2 / EP 2, 7 sequences, built with the default threshold (2 ranks): the router
    (2048 x 128, bf16) is not split: every rank scores all 7 tokens, 2 x 7 x 2048 x 128 FLOPs, reading its
    524,288 B of weights, the 7 hidden states and writing 7 x 128 logits. The 2 EP ranks exchange
    all-to-all: each sends its ceil(7 / 2) = 4 tokens' 8 picks, 4 x 8 x 2048 x 2 B = 131,072 B."""
    _, wl = built("workload=qwen3_30b_decode", "workload.tp=2", "workload.ep=2", "workload.batch_size=7", "workload.steps=1")
    j = op(wl, "layers.0.moe_gate")
    assert (wl.flops[0, j], wl.weight_bytes[j], wl.bytes[0, j]) == (2 * 7 * 2048 * 128, 2048 * 128 * 2, 2048 * 128 * 2 + 7 * (2048 + 128) * 2)
    j = op(wl, "layers.0.moe_dispatch")
    assert (wl.comm[j], wl.comm_ranks[j], wl.bytes[0, j]) == (COMM_ALL_TO_ALL, 2, 131_072)


def test_routed_rows_are_padded_to_a_power_of_two_only_when_asked():
    """Qwen3-30B-A3B at TP 4 / EP 4, 12 sequences: each rank dispatches ceil(12 / 4) = 3 tokens; the 4 ranks'
    12 tokens' 96 picks spread over 128 experts land 96 x 32 / 128 = 24 rows on a rank's 32 experts:
    gate_up 2 x 24 x 2048 x 1536 FLOPs, their shapes new every decode step (routing). Shape buckets
    (moe_pad) pad the 24 rows to 32, and the shapes stay the same from step to step."""
    run = compose_run("workload=qwen3_30b_decode", "workload.batch_size=12", "workload.steps=2")
    wl = build_workload(run.workload)
    j = op(wl, "layers.0.grouped_gate_up")
    assert wl.flops[:, j].tolist() == [2 * 24 * 2048 * 1536] * 2
    assert wl.shape_key[0, j] != wl.shape_key[1, j]
    padded = build_workload(run.workload, moe_pad=True)
    assert padded.flops[:, j].tolist() == [2 * 32 * 2048 * 1536] * 2
    assert padded.shape_key[0, j] == padded.shape_key[1, j]


def test_prefill_attention_reads_fresh_q_k_v_and_writes_o_of_the_ranks_heads():
    """Llama-3.1-8B prefill of 16 tokens at TP 2: 16 query heads and 4 KV heads of 128 a rank. Attention
    reads Q and writes O (16 heads x (128 + 128)) and reads the fresh K and V (4 heads x (128 + 128)), at
    2 B: 16 x (16 x 256 + 4 x 256) x 2 = 163,840 B; 16 x 17 / 2 = 136 causal pairs, 2 x 16 x 256 x 136 FLOPs."""
    _, wl = built("workload=llama31_8b_decode", "workload.phase=prefill", "workload.context_len=16", "workload.tp=2", "workload.steps=1")
    j = op(wl, "layers.0.attention")
    assert (wl.bytes[0, j], wl.flops[0, j], wl.cache_bytes[0, j]) == (163_840, 2 * 16 * 256 * 136, 0)


def test_an_op_after_one_not_issued_waits_for_what_that_one_waited_for():
    """At TP 1 the all-reduce is not issued; an op named after it waits for what the all-reduce would have
    waited for (input_norm, which it names), not for the op just before it (q_proj)."""
    _, wl = built("workload=llama2_7b_decode", "workload.steps=1",
                  "+workload.card_overrides.layer_ops=[input_norm,q_proj,{op:tp_all_reduce,after:input_norm},{op:attention,after:tp_all_reduce}]")
    assert wl.op_names[1:4] == ["layers.0.input_norm", "layers.0.q_proj", "layers.0.attention"]
    assert wl.after[3] == [1]


def test_routed_shapes_change_every_decode_step_even_when_the_kv_does_not():
    """The per-expert token counts change with the routing every decode step: a routed op's shapes differ
    between two steps of the same batch and the same KV length, while attention's, which follow the KV, do
    not; the dispatch is routed, dynamic and read by the host (its split sizes), the combine routed and
    dynamic only. Without EP (all-gather method) the exchange moves fixed sizes: no such flags."""
    from harness.model.ops import FLAG_DYNAMIC, FLAG_ROUTED, FLAG_VALUE_DEPENDENT

    run = compose_run("workload=qwen3_30b_decode", "workload.batch_size=12", "workload.steps=2")
    wl = build_workload(run.workload, kv_len=np.array([100, 100]))
    j, a = op(wl, "layers.0.grouped_gate_up"), op(wl, "layers.0.attention")
    assert wl.shape_key[0, j] != wl.shape_key[1, j]
    assert wl.shape_key[0, a] == wl.shape_key[1, a]
    assert wl.flags[op(wl, "layers.0.moe_dispatch")] == FLAG_DYNAMIC | FLAG_ROUTED | FLAG_VALUE_DEPENDENT
    assert wl.flags[op(wl, "layers.0.moe_combine")] == FLAG_DYNAMIC | FLAG_ROUTED
    _, wl = built("workload=qwen3_30b_decode", "workload.tp=2", "workload.dp=2", "workload.ep=1", "workload.steps=1")
    assert wl.flags[op(wl, "layers.0.moe_dispatch")] == wl.flags[op(wl, "layers.0.moe_combine")] == 0


def test_a_shared_expert_one_column_wide_is_still_reduced_over_tp():
    """Whatever its width, a shared expert is issued, and TP-split it leaves partial sums of every token to all-reduce
    (DeepSeek-V3 with moe_intermediate_size=1: 8 x 7168 x 2 B over the 4 TP ranks)."""
    _, wl = built("workload=deepseek_v3", "workload.steps=1", "+workload.card_overrides.moe_intermediate_size=1")
    assert all(f"layers.3.shared_{part}" in wl.op_names for part in ("gate_up", "act", "down"))
    j = op(wl, "layers.3.shared_all_reduce")
    assert (wl.comm[j], wl.comm_ranks[j], wl.bytes[0, j]) == (COMM_ALL_REDUCE, 4, 8 * 7168 * 2)


def test_an_op_list_of_host_work_alone_needs_no_device_workspace():
    """Qwen3-30B-A3B at TP 1 with each layer only its Python overhead and an all-reduce (not issued at TP 1):
    48 host ops that move no bytes: no activations, no workspace, no weights; the KV cache is still the
    model's (48 layers x 4 KV heads x 256 x 2 B = 98,304 B a token, 1025 tokens)."""
    _, wl = built("workload=qwen3_30b_decode", "workload.tp=1", "workload.ep=0", "workload.batch_size=1", "workload.steps=1",
                  "+workload.card_overrides.pre_ops=[]", "+workload.card_overrides.post_ops=[]",
                  "+workload.card_overrides.layer_ops=[layer_overhead,tp_all_reduce]", "+workload.card_overrides.layer_overhead_us=2436")
    assert wl.n_ops == 48 and wl.host_us.tolist() == [2436.0] * 48
    assert not wl.bytes.any() and not wl.flops.any() and not wl.weight_bytes.any() and not wl.cache_bytes.any()
    assert (wl.memory.workspace_gb, wl.memory.weights_gb) == (0.0, 0.0)
    assert wl.memory.kv_cache_gb == pytest.approx(98_304 * 1025 / 1e9, rel=1e-12)


# ---------------------------------------------------------------- MLA, qk-norm, the routed activation

# DeepSeek-V3 W8A8 at TP 4 (32 of 128 heads a rank), 8 sequences at context 2048, one decode step (KV 2049):
# q_lora_rank 1536, kv_lora_rank 512, rope 64, nope 128; the latent a token caches is 512 + 64 = 576 wide.
DEEPSEEK_MLA = {
    # 7168 -> 1536 + 576 = 2112, not split (int8 weights, int8 input, bf16 output)
    "layers.0.qkv_a_proj": (7168 * 2112 + 8 * (7168 + 2112 * 2), 2 * 8 * 7168 * 2112),
    # RMSNorm of the 1536-wide query latent: 2 passes and its 1536 weights, 4 flops a value
    "layers.0.q_a_norm": (2 * 8 * 1536 * 2 + 1536 * 2, 4 * 8 * 1536),
    # 1536 -> 128 x 192 / 4 = 6144 a rank, int8
    "layers.0.q_b_proj": (1536 * 6144 + 8 * (1536 + 6144 * 2), 2 * 8 * 1536 * 6144),
    # rotary on the 64 rope values of 32 query heads and the one shared key: 8 x 33 x 64 values
    "layers.0.mla_rope": (2 * 8 * 33 * 64 * 2, 6 * 8 * 33 * 64),
    # the latent normed and roped (2 passes, the 512 norm weights) and written to the cache (2 B a value)
    "layers.0.kv_norm_rope_cache": (2 * 8 * 576 * 2 + 512 * 2 + 8 * 576 * 2, 10 * 8 * 576),
    # absorbed decode attention: every head over the latent cache of 8 x 2049 tokens, the latent query and
    # output (576 + 512 a head) as activations
    "layers.0.mla_attention": (8 * 2049 * 576 * 2 + 8 * 32 * (576 + 512) * 2, 2 * 32 * (576 + 512) * 8 * 2049),
}


def test_mla_decode_ops_of_a_rank():
    _, wl = built("workload=deepseek_v3", "workload.steps=1")
    for name, (nbytes, flops) in DEEPSEEK_MLA.items():
        j = op(wl, name)
        assert (wl.bytes[0, j], wl.flops[0, j]) == (nbytes, flops), name
    assert wl.cache_bytes[0, op(wl, "layers.0.mla_attention")] == 8 * 2049 * 576 * 2
    assert wl.cache_bytes[0, op(wl, "layers.0.kv_norm_rope_cache")] == 0  # writes the cache, reads no cache


def test_qk_norm_and_the_routed_activation_of_qwen3_moe():
    """Qwen3-30B-A3B bf16 at TP 4 / EP 4, 12 sequences: qk_norm normalises the rank's 8 query and 1 KV heads
    of 128 for 12 tokens (12 x 9 x 128 values, 2 passes, 4 flops, 2 x 128 weights); the routed SwiGLU runs on
    the 24 rows the rank's experts receive (24 x 768 values: 3 passes, 5 flops), routed and dynamic."""
    from harness.model.ops import FLAG_DYNAMIC, FLAG_ROUTED

    _, wl = built("workload=qwen3_30b_decode", "workload.batch_size=12", "workload.steps=1")
    j = op(wl, "layers.0.qk_norm")
    assert (wl.bytes[0, j], wl.flops[0, j]) == (2 * 12 * 9 * 128 * 2 + 2 * 128 * 2, 4 * 12 * 9 * 128)
    j = op(wl, "layers.0.moe_act")
    assert (wl.bytes[0, j], wl.flops[0, j], wl.flags[j]) == (3 * 24 * 768 * 2, 5 * 24 * 768, FLAG_DYNAMIC | FLAG_ROUTED)


@pytest.mark.parametrize("layer_ops", [
    "[add_rms_norm,dynamic_quant,attention,lm_head]",  # the head is not quantised: nothing to feed
    "[add_rms_norm,dynamic_quant,dynamic_quant,qkv_proj]",  # the next quant comes first
])
def test_a_quant_op_with_no_int8_matmul_to_feed_is_refused(layer_ops):
    from harness.base.errors import ConfigError

    run = compose_run("workload=llama31_8b_decode", "workload.quant=w8a8", "workload.steps=1", f"+workload.card_overrides.layer_ops={layer_ops}")
    with pytest.raises(ConfigError, match="card 'llama31_8b' dynamic_quant: no INT8 matmul after it"):
        build_workload(run.workload)


def test_a_quant_op_feeds_the_next_int8_matmul_past_other_ops():
    """W8A8 Llama-3.1-8B, 2 sequences: a dynamic_quant followed by a norm, the (unquantised) head and then
    qkv_proj quantises qkv_proj's 2 x 4096 input: 3 B a value (read bf16, write int8), 24,576 B, 3 flops a
    value. In bf16 it is not issued."""
    overrides = ("workload=llama31_8b_decode", "workload.batch_size=2", "workload.steps=1",
                 "+workload.card_overrides.layer_ops=[dynamic_quant,add_rms_norm,lm_head,qkv_proj]")
    _, wl = built(*overrides, "workload.quant=w8a8")
    j = op(wl, "layers.0.dynamic_quant")
    assert (wl.bytes[0, j], wl.flops[0, j]) == (2 * 4096 * 3, 3 * 2 * 4096)
    _, wl = built(*overrides)
    assert not any("dynamic_quant" in n for n in wl.op_names)


def test_an_unknown_card_or_card_field_is_refused():
    from harness.base.errors import ConfigError
    from harness.model.workload import load_card

    with pytest.raises(ConfigError, match=r"^workload.card='nosuch': no such model card in workloads/"):
        load_card("nosuch")
    with pytest.raises(ConfigError, match=r"^workload.card_overrides.rope_theta=1: card 'llama2_7b' has no such field"):
        load_card("llama2_7b", {"rope_theta": 1})


def test_an_engine_overhead_op_a_card_lists_costs_nothing_unless_the_engine_prices_it():
    """A card may list engine_overhead itself: built without an engine's per-layer time it is not issued
    (no host op of 0 or less)."""
    _, wl = built("workload=llama2_7b_decode", "workload.steps=1", "+workload.card_overrides.layer_ops=[engine_overhead,input_norm]")
    assert wl.op_names[1:3] == ["layers.0.input_norm", "layers.1.input_norm"] and wl.host_us.sum() == 0.0


@pytest.mark.parametrize("post_modules", ["0", "null"])
def test_a_part_without_module_calls_issues_no_host_op_for_them(post_modules):
    """module_us=5 prices each part's nn.Module calls; a card whose post part makes none
    (unfused_post_modules=0) issues no post_modules op: no host op of 0 us in the op list."""
    run = compose_run("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=1", f"+workload.card_overrides.unfused_post_modules={post_modules}")
    wl = build_workload(run.workload, module_us=5.0)
    assert "post_modules" not in wl.op_names and "pre_modules" in wl.op_names
    assert wl.host_us.sum() == (4 + 32 * 13) * 5.0


def test_w8a8_quant_ops_of_experts_split_over_tp_quantise_their_slice_of_the_rows():
    """Qwen3-30B-A3B W8A8 at TP 4 without EP, 16 sequences: every rank multiplies all 16 x 8 = 128 picks by a
    quarter of each expert. The quant before gate_up (column slices) quantises the 128 rows' whole 2048-wide
    input; the one before down (row slices) each row's 768 / 4 = 192 inputs of the rank: 3 B a value,
    128 x 2048 x 3 = 786,432 B and 128 x 192 x 3 = 73,728 B. Before them: qkv_proj's 16 x 2048 and o_proj's
    16 x 32 x 128 / 4 inputs."""
    _, wl = built("workload=qwen3_30b_decode", "workload.quant=w8a8", "workload.ep=1", "workload.steps=1")
    quants = [wl.bytes[0, j] for j, n in enumerate(wl.op_names) if n.startswith("layers.0.dynamic_quant")]
    assert quants == [16 * 2048 * 3, 16 * 1024 * 3, 128 * 2048 * 3, 128 * 192 * 3]


def test_head_dim_defaults_to_the_whole_part_of_hidden_over_heads():
    """Without head_dim a head is hidden_size // num_attention_heads wide, a whole number (transformers'
    default): Llama-2-7B with a hidden size of 4100 and 32 heads has heads of 128 (not 128.125): K and V of
    2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B a token, 1025 tokens."""
    _, wl = built("workload=llama2_7b_decode", "workload.steps=1", "+workload.card_overrides.head_dim=null",
                  "+workload.card_overrides.hidden_size=4100")
    assert wl.memory.kv_cache_gb == pytest.approx(524_288 * 1025 / 1e9, rel=1e-12)


def test_the_routed_activation_of_experts_split_over_tp_runs_on_the_ranks_share_of_each_row():
    """Qwen3-30B-A3B bf16 at TP 4 without EP, 16 sequences: the 128 picks' rows each pass a quarter of their
    expert's 768 columns through SwiGLU on this rank: 128 x 768 / 4 = 24,576 values (3 passes of 2 B,
    5 flops), as many as 32 whole rows."""
    _, wl = built("workload=qwen3_30b_decode", "workload.ep=1", "workload.steps=1")
    j = op(wl, "layers.0.moe_act")
    assert (wl.bytes[0, j], wl.flops[0, j]) == (3 * 24_576 * 2, 5 * 24_576)


def test_an_op_issued_twice_in_a_layer_keeps_one_shape_under_w8a8():
    """W8A8 Llama-3.1-8B: each quant op gets its own template (it quantises a different matmul's input), but
    the two add_rms_norms of a layer, and its two all-reduces, are the same op on the same shapes: one
    shape key each, in every layer."""
    _, wl = built("workload=llama31_8b_decode", "workload.quant=w8a8", "workload.tp=2", "workload.steps=1")
    for name in ("add_rms_norm", "tp_all_reduce", "dynamic_quant"):
        keys = {int(wl.shape_key[0, j]) for j, n in enumerate(wl.op_names) if n.startswith("layers.") and n.endswith(f".{name}")}
        assert len(keys) == (4 if name == "dynamic_quant" else 1), name



def test_a_w8a8_expert_matmul_reads_int8_rows_and_the_int8_experts_hit():
    """Qwen3-30B-A3B W8A8 at TP 4 / EP 4, 16 sequences: the 16 tokens' picks hit 32 (1 - (1 - 8/128)^16) of a
    rank's 32 experts, each read once as int8 (2048 x 1536 x 1 B); the 32 rows it receives are read as int8
    (2048 x 1 B) and written dequantised (1536 x 2 B). An INT8 matmul (flag 128)."""
    from harness.model.ops import FLAG_INT8

    _, wl = built("workload=qwen3_30b_decode", "workload.quant=w8a8", "workload.steps=1")
    j = op(wl, "layers.0.grouped_gate_up")
    hit = 32 * (1 - (1 - 8 / 128) ** 16)
    assert wl.bytes[0, j] == pytest.approx(hit * 2048 * 1536 + 32 * (2048 + 1536 * 2), rel=1e-12)
    assert wl.weight_bytes[j] == 32 * 2048 * 1536 and wl.flags[j] & FLAG_INT8


def test_a_routed_expert_matmul_allocates_its_rows_whatever_share_of_its_experts_is_hit():
    """Qwen3-30B-A3B bf16 at TP 4 / EP 4 (all-gather method), 16 sequences: a rank holds 32 experts (32 x 2048 x
    1536 x 2 B of gate_up) but reads only the 32 (1 - (1 - 8/128)^16) = 20.6 it hits; what it allocates is its
    output, half the traffic beyond the weights read: 32 rows x (2048 + 1536) x 2 B / 2 = 114,688 B, and the
    down projection's 32 x (768 + 2048) x 2 B / 2 = 90,112 B. (They counted 0 bytes while the resident 201 MB
    of weights were subtracted from the 130 MB the step reads.)"""
    _, wl = built("workload=qwen3_30b_decode", "workload.steps=1")
    gate_up, down = op(wl, "layers.0.grouped_gate_up"), op(wl, "layers.0.grouped_down")
    hit = 32 * (1 - (1 - 8 / 128) ** 16)
    assert wl.weight_bytes[gate_up] == 32 * 2048 * 1536 * 2
    assert wl.step_weight_bytes[0, gate_up] == pytest.approx(hit * 2048 * 1536 * 2, rel=1e-12)
    assert wl.activation_bytes()[0, gate_up] == pytest.approx(32 * (2048 + 1536) * 2 / 2, rel=1e-9)
    assert wl.activation_bytes()[0, down] == pytest.approx(32 * (768 + 2048) * 2 / 2, rel=1e-9)
    dense = op(wl, "layers.0.qkv_proj")  # a dense op reads all its weights every step
    assert wl.step_weight_bytes[0, dense] == wl.weight_bytes[dense]


def test_shape_buckets_pad_the_routed_rows_to_at_least_one():
    """Qwen3-30B-A3B with one pick a token (num_experts_per_tok=1) at TP 4 / EP 4 on the all-gather method,
    one sequence: a rank's 32 of 128 experts receive 1 x 1 x 32 / 128 = 0.25 rows on average; shape buckets
    pad that to one whole row (2^0), not to a quarter: gate_up 2 x 1 x 2048 x 1536 FLOPs."""
    run = compose_run("workload=qwen3_30b_decode", "workload.batch_size=1", "workload.steps=1", "+workload.card_overrides.num_experts_per_tok=1")
    wl = build_workload(run.workload, moe_pad=True, moe_all_to_all_min_ep=16)
    assert wl.flops[0, op(wl, "layers.0.grouped_gate_up")] == 2 * 2048 * 1536


def test_a_card_file_may_refer_to_its_own_fields(tmp_path, monkeypatch):
    """Cards are YAML read with OmegaConf: an interpolation is resolved when the card is read
    (num_key_value_heads: ${num_attention_heads} gives Llama-2-7B's 32)."""
    import harness.model.workload as workload_module
    from harness.config.paths import WORKLOADS_DIR

    text = (WORKLOADS_DIR / "llama2_7b.yaml").read_text().replace("num_key_value_heads: 32", "num_key_value_heads: ${num_attention_heads}")
    (tmp_path / "llama2_7b.yaml").write_text(text)
    monkeypatch.setattr(workload_module, "WORKLOADS_DIR", tmp_path)
    assert workload_module.load_card("llama2_7b")["num_key_value_heads"] == 32


def test_an_op_named_after_the_first_op_of_the_workload_waits_for_it():
    _, wl = built("workload=llama2_7b_decode", "workload.tp=2", "workload.steps=1",
                  "+workload.card_overrides.pre_ops=[embedding,{op:tp_all_reduce,after:embedding}]")
    assert wl.op_names[:2] == ["embedding", "tp_all_reduce"] and wl.after[1] == [0]


def test_an_unset_optional_field_does_not_stop_the_checks_of_the_fields_after_it():
    from harness.base.errors import ConfigError
    from harness.model.workload import load_card

    with pytest.raises(ConfigError, match="pre_ops='embedding': must be a list of ops"):
        load_card("llama2_7b", {"head_dim": None, "pre_ops": "embedding"})


def test_one_module_call_of_one_microsecond_is_still_a_host_op():
    run = compose_run("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=1", "+workload.card_overrides.unfused_post_modules=1")
    wl = build_workload(run.workload, module_us=1.0)
    assert wl.host_us[op(wl, "post_modules")] == 1.0


def test_mla_decode_attention_is_dynamic_its_shapes_following_the_latent_cache_it_reads():
    """DeepSeek-V3 decode, 8 sequences at context 2048, two steps: MLA attention reads 8 x 2049 latent tokens
    in the first step and 8 x 2050 in the second, so its shapes (and its graph capture) change every step,
    as GQA attention's do: flagged dynamic (1), a new shape key each step. Its prefill form attends over
    the fresh prompt only: fixed shapes."""
    from harness.model.ops import FLAG_DYNAMIC

    _, wl = built("workload=deepseek_v3", "workload.steps=2")
    j = op(wl, "layers.0.mla_attention")
    assert wl.cache_bytes[:, j].tolist() == [8 * 2049 * 576 * 2, 8 * 2050 * 576 * 2]
    assert wl.flags[j] & FLAG_DYNAMIC
    assert wl.shape_key[0, j] != wl.shape_key[1, j]
    _, wl = built("workload=deepseek_v3", "workload.phase=prefill", "workload.context_len=16", "workload.steps=1")
    assert not wl.flags[op(wl, "layers.0.mla_attention")] & FLAG_DYNAMIC


def test_a_tied_head_stays_in_the_model_dtype_under_w8a8():
    """Qwen2.5-1.5B W8A8 at TP 4, one sequence: the tied head multiplies by the embedding's rows, which W8A8
    leaves in bf16 (only the linears of the layers are int8): it reads the rank's 151936 / 4 = 37,984 rows x
    1536 at 2 B = 116,686,848 B, the token's 1536 inputs at 2 B (not int8) and writes its 37,984 logits at
    2 B: 116,686,848 + (1536 + 37984) x 2 = 116,765,888 B; not an INT8 matmul. The layers' qkv_proj, for
    contrast, holds (1536 x 640 + 640) int8 weights."""
    from harness.model.ops import FLAG_INT8

    _, wl = built("workload=qwen25_1_5b_decode", "workload.quant=w8a8", "workload.tp=4", "workload.batch_size=1", "workload.steps=1")
    j = op(wl, "lm_head")
    assert wl.weight_bytes[j] == 116_686_848
    assert wl.bytes[0, j] == 116_765_888
    assert wl.flops[0, j] == 2 * 1536 * 37_984
    assert not wl.flags[j] & FLAG_INT8
    assert wl.weight_bytes[op(wl, "layers.0.qkv_proj")] == 1536 * 640 + 640


def test_the_first_op_of_each_layer_and_of_the_head_waits_for_the_last_op_before_it():
    """Llama-2-7B at TP 2: ops 0 and 1 are the embedding and its all-reduce; each of the 32 layers issues its
    17 ops (input_norm ... the MLP's all-reduce and residual_add), so layer L's input_norm is op 2 + 17 L and
    waits for op 1 + 17 L, the op just before it (the residual_add ending the layer before, or the
    embedding's all-reduce); the head's final_norm, op 2 + 17 x 32 = 546, waits for op 545, the last layer's
    residual_add."""
    _, wl = built("workload=llama2_7b_decode", "workload.tp=2", "workload.steps=1")
    names = wl.op_names
    assert names[:3] == ["embedding", "tp_all_reduce", "layers.0.input_norm"] and wl.after[2] == [1]
    for layer in range(1, 32):
        first = 2 + 17 * layer
        assert (names[first - 1], names[first]) == (f"layers.{layer - 1}.residual_add", f"layers.{layer}.input_norm")
        assert wl.after[first] == [first - 1]
    assert (names[545], names[546]) == ("layers.31.residual_add", "final_norm")
    assert wl.after[546] == [545]
