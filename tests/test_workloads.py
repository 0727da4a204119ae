"""Model cards, parallel layouts, memory and shapes: the workload side of the seeds' headline cases."""
from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import compose_run
from harness.base.errors import ConfigError
from harness.sim.task_graph import CATEGORY
from harness.sim.simulate import simulate_run
from harness.config.schema import OpKind
from harness.model.ops import FLAG_DYNAMIC, FLAG_VALUE_DEPENDENT, KIND_CODE
from harness.model.workload import build_workload, parameter_count_b, run_build_options

# Published totals (billions): model cards / release notes of each model.
PUBLISHED_B = {"deepseek_v3": 671.0, "qwen3_30b_a3b": 30.5, "qwen25_7b": 7.61, "llama2_7b": 6.74, "llama31_8b": 8.03, "llama2_70b": 68.98, "gptj_6b": 6.05, "falcon_180b": 180.0}


@pytest.mark.parametrize("card,published", PUBLISHED_B.items())
def test_card_parameter_count_matches_published_total(card, published):
    assert parameter_count_b(card) == pytest.approx(published, rel=0.02)


def workload(*overrides):
    run = compose_run(*overrides)
    return run, build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node)


def quick(*overrides) -> dict:
    return simulate_run(compose_run(*overrides, "workload.steps=2")).summary


def test_deepseek_v3_eager_decode_is_host_bound_with_20_plus_ops_per_layer():
    s = quick("workload=deepseek_v3", "strategy=eager")
    assert s["ops_per_step"] >= 61 * 20
    assert s["bound"] == "host" and s["bubble_ratio"] > 0.3
    assert s["devices"] == 16 and 0 < s["peak_mem_gb"] <= 64


def test_qwen3_30b_eager_decode_is_host_bound():
    s = quick("workload=qwen3_30b_decode", "strategy=eager")
    assert s["bound"] == "host" and s["bubble_ratio"] > 0.3
    assert s["ops_per_step"] >= 48 * 15


@pytest.mark.parametrize("preset", ["deepseek_v3_prefill", "qwen3_30b_prefill", "qwen25_7b_prefill", "llama2_7b_prefill"])
def test_prefill_variants_are_device_bound(preset):
    s = quick(f"workload={preset}", "strategy=eager")
    assert s["bound"] == "device" and s["bubble_ratio"] < 0.1


def test_memory_check_fails_with_the_sizes_and_passes_on_presets():
    run, wl = workload("workload=deepseek_v3", "hardware.device.hbm_gb=8")
    from harness.model.ops import check_memory

    with pytest.raises(ConfigError) as err:
        check_memory(wl, run.hardware.device.hbm_gb)
    # MLA caches a latent of (512 + 64) × 2 bytes a token in each of 61 layers: 70,272 bytes a token; the
    # preset's 8 sequences hold 2048 + 32 tokens at the last step: 1.17 GB.
    assert wl.memory.kv_cache_gb == pytest.approx(70_272 * 8 * 2_080 / 1e9, rel=1e-12)
    assert str(err.value).startswith(
        "hardware.device.hbm_gb=8: deepseek_v3 does not fit on one rank: weights 46.75 GB + KV cache 1.17 GB + workspace 0.00 GB"
        " + graphs 0.00 GB = 47.922 GB"
    )
    # Attention's read of that latent cache is the cache, counted once, not again as workspace.
    assert wl.memory.workspace_gb < 0.005
    # bf16 DeepSeek-V3 on the same 16 ranks needs ~88 GB of weights per rank: does not fit 68.7 GB either.
    run, wl = workload("workload=deepseek_v3", "workload.quant=bf16")
    with pytest.raises(ConfigError):
        check_memory(wl, run.hardware.device.hbm_gb)
    for preset in ["deepseek_v3", "qwen3_30b_decode", "qwen25_7b_decode", "llama2_7b_decode", "llama31_8b_decode"]:
        run, wl = workload(f"workload={preset}")
        check_memory(wl, run.hardware.device.hbm_gb)
        assert wl.memory.weights_gb > 1


def test_a_split_linear_reads_and_writes_what_its_rank_holds():
    """Llama-2-7B prefill of 16 tokens at TP 2. gate_proj is column-parallel: it reads all 16 x 4,096 input
    values and writes its 16 x 5,504 slice of the output; down_proj is row-parallel: it reads its 16 x 5,504
    slice and writes a whole 16 x 4,096 partial sum (the all-reduce adds them). Each holds 4,096 x 11,008 / 2
    float16 weights."""
    _, w = workload("workload=llama2_7b_prefill", "workload.tp=2", "workload.context_len=16", "workload.steps=1")
    weights = 4096 * 11008 / 2 * 2
    gate, down = w.op_names.index("layers.0.gate_proj"), w.op_names.index("layers.0.down_proj")
    assert w.bytes[0, gate] == weights + 16 * (4096 + 5504) * 2
    assert w.bytes[0, down] == weights + 16 * (5504 + 4096) * 2
    assert w.weight_bytes[gate] == w.weight_bytes[down] == weights
    _, single = workload("workload=llama2_7b_prefill", "workload.context_len=16", "workload.steps=1")
    assert single.bytes[0, single.op_names.index("layers.0.gate_proj")] == 2 * weights + 16 * (4096 + 11008) * 2  # unsplit: everything


def test_the_vocab_parallel_head_gathers_its_logits_across_tp():
    """Llama-2-70B decode at TP 4, batch 8: each rank's LM head computes 8 x 32,000 / 4 logits, gathered
    before sampling (vLLM's LogitsProcessor._gather_logits): an all-gather over 4 ranks to which each
    contributes 8 x 8,000 x 2 B = 128,000 B, once a step after the head. At TP 1 there is nothing to gather."""
    from harness.model.ops import COMM_ALL_GATHER

    _, split = workload("workload=llama2_70b_decode", "workload.batch_size=8", "workload.steps=2")
    gathers = [j for j, name in enumerate(split.op_names) if name == "logits_gather"]
    assert len(gathers) == 1 and split.op_names[gathers[0] - 1] == "lm_head"
    assert (split.comm[gathers[0]], split.comm_ranks[gathers[0]]) == (COMM_ALL_GATHER, 4)
    assert split.bytes[:, gathers[0]].tolist() == [128_000.0, 128_000.0]
    _, single = workload("workload=llama2_7b_decode", "workload.steps=2")
    assert "logits_gather" not in single.op_names


def test_a_tied_head_reads_the_embeddings_weights_which_are_not_activations():
    """Qwen2.5-1.5B ties its LM head to the embedding (tie_word_embeddings): the head holds no weights of
    its own, but reads the embedding's 151,936 x 1,536 x 2 B = 466.7 MB every step. Those bytes are
    weights, not activations: the head's activations (batch 4's logits, 4 x 151,936 x 2 B, and its
    input) and the workspace must be those of the same head untied; only weights_gb differs, by the
    head's 0.4667 GB (they were counted as 233 MB of activations and a 0.93 GB workspace)."""
    head_bytes = 151_936 * 1_536 * 2
    args = ("workload=qwen25_1_5b_decode", "workload.batch_size=4", "workload.steps=2")
    _, tied = workload(*args, "+workload.card_overrides.tie_word_embeddings=true")
    _, untied = workload(*args, "+workload.card_overrides.tie_word_embeddings=false")
    head = tied.op_names.index("lm_head")
    assert tied.bytes[0, head] == untied.bytes[0, head] == head_bytes + 4 * (1_536 + 151_936) * 2
    assert tied.weight_bytes[head] == untied.weight_bytes[head] == head_bytes
    assert tied.activation_bytes()[:, head].tolist() == untied.activation_bytes()[:, head].tolist() == [4 * (1_536 + 151_936)] * 2
    assert tied.memory.workspace_gb == untied.memory.workspace_gb < 0.01
    assert untied.memory.weights_gb - tied.memory.weights_gb == pytest.approx(head_bytes / 1e9, rel=1e-12)


def test_an_fp8_kv_cache_holds_and_streams_one_byte_a_value():
    """Llama-2-7B decode at batch 8 from 1,024 cached tokens, 2 steps: a token's K and V are 32 layers x 32
    heads x 128 x 2 values, 262,144 of them. In float16 the cache holds 8 x 1,026 tokens x 524,288 B =
    4.303355904 GB; in FP8 half that. Decode attention reads the cache (at step 0, 8 x 1,025 tokens, the cached
    ones and the new one, x 8,192 values a layer) plus the queries and outputs (8 x 32 x 256 float16 values); the write of the new
    tokens reads 8 x 8,192 float16 values and writes them at one byte each in FP8."""
    base = ("workload=llama2_7b_decode", "workload.batch_size=8", "workload.context_len=1024", "workload.steps=2")
    (_, half), (_, fp8) = workload(*base), workload(*base, "workload.kv_cache_dtype=fp8")
    assert half.memory.kv_cache_gb == pytest.approx(8 * 1026 * 524_288 / 1e9, rel=1e-12)
    assert fp8.memory.kv_cache_gb == pytest.approx(8 * 1026 * 262_144 / 1e9, rel=1e-12)
    attention = half.op_names.index("layers.0.attention")
    write = half.op_names.index("layers.0.kv_cache_write")
    queries = 8 * 32 * 256 * 2
    assert half.bytes[0, attention] == 8 * 1025 * 8192 * 2 + queries
    assert fp8.bytes[0, attention] == 8 * 1025 * 8192 * 1 + queries
    assert (half.bytes[0, write], fp8.bytes[0, write]) == (8 * 8192 * 4, 8 * 8192 * 3)
    assert fp8.flops.tolist() == half.flops.tolist()  # the same arithmetic, fewer bytes


@pytest.mark.parametrize("card, tp, kv_heads_read", [("llama2_70b", 4, 16), ("llama2_7b", 1, 32)])
def test_gqa_decode_reads_a_kv_head_once_per_query_head_when_asked(card, tp, kv_heads_read):
    """Llama-2-70B at TP 4 holds 16 query heads and 2 KV heads a rank: its decode attention at batch 4 from
    512 cached tokens (513 at step 0) reads 4 x 513 tokens x 2 heads x 256 values x 2 B of K and V, or 16
    heads' worth once per query head; queries and outputs add 4 x 16 x 256 x 2 B. Llama-2-7B has a KV
    head a query head (MHA): both read the same."""
    base = ("workload=llama2_7b_decode", f"workload.card={card}", f"workload.tp={tp}", "workload.batch_size=4",
            "workload.context_len=512", "workload.steps=2")
    (_, shared), (_, each) = workload(*base), workload(*base, "workload.decode_kv_reads=per_query_head")
    attention = shared.op_names.index("layers.0.attention")
    heads = 64 // tp if card == "llama2_70b" else 32
    kv_heads = 8 // tp if card == "llama2_70b" else 32
    queries = 4 * heads * 256 * 2
    assert shared.bytes[0, attention] == 4 * 513 * kv_heads * 256 * 2 + queries
    assert each.bytes[0, attention] == 4 * 513 * kv_heads_read * 256 * 2 + queries
    # What is held does not change, only what is read: the cache read is not an activation either.
    assert (each.memory.kv_cache_gb, each.memory.workspace_gb) == (shared.memory.kv_cache_gb, shared.memory.workspace_gb)
    assert each.activation_bytes()[0, attention] == shared.activation_bytes()[0, attention] == queries / 2


def test_an_fp8_kv_cache_is_refused_for_hf_transformers_kernels_and_op_lists():
    with pytest.raises(ConfigError, match=r"^workload\.kv_cache_dtype=fp8: fp8 needs kernels=fused"):
        compose_run("workload.kernels=unfused", "workload.kv_cache_dtype=fp8")
    op_list = ("workload.card=null", "+workload.ops=[{name: a, kind: vector, flops: 1.0, bytes: 1.0}]")
    with pytest.raises(ConfigError, match=r"^workload\.kv_cache_dtype=fp8: fp8 prices a model card's KV cache"):
        compose_run(*op_list, "workload.kv_cache_dtype=fp8")
    with pytest.raises(ConfigError, match=r"^workload\.decode_kv_reads=per_query_head: per_query_head prices a model card's attention"):
        compose_run(*op_list, "workload.decode_kv_reads=per_query_head")


def test_kv_cache_grows_with_batch_and_context():
    _, small = workload("workload=llama31_8b_decode")
    _, large = workload("workload=llama31_8b_decode", "workload.batch_size=4", "workload.context_len=4096")
    # 4× the sequences, ~4× the tokens each: ~16× the cache.
    assert large.memory.kv_cache_gb == pytest.approx(16 * small.memory.kv_cache_gb, rel=0.05)
    # Llama-3.1-8B: 32 layers × 8 KV heads × 128 × (K+V) × 2 bytes = 128 KiB per token.
    tokens = 1024 + 64
    assert small.memory.kv_cache_gb == pytest.approx(tokens * 32 * 8 * 128 * 2 * 2 / 1e9)


def test_tensor_parallelism_splits_weights_and_adds_all_reduces():
    _, single = workload("workload=qwen25_7b_decode")
    _, split = workload("workload=qwen25_7b_decode", "workload.tp=2")
    assert split.memory.weights_gb == pytest.approx(single.memory.weights_gb / 2, rel=0.01)
    # an all-reduce after attention and after the MLP; the embedding's all-reduce; the logits' gather
    assert split.n_ops == single.n_ops + 2 * 28 + 2
    reduces = [i for i, name in enumerate(split.op_names) if name.endswith("tp_all_reduce")]
    assert np.all(split.stream[reduces] == 1)


FREE_HOST = [f"hardware.host.{stage}_us=0" for stage in ("framework", "infer_shape", "tiling", "alloc", "launch", "free", "sync")] + [
    "hardware.host.kernel_params=0"
]


def test_collectives_run_on_the_comm_stream_and_the_shared_expert_overlaps_dispatch():
    # With host work free, only device-side dependencies order the ops: the shared expert (compute
    # stream) does not wait for the dispatch (comm stream), the routed experts do.
    outcome = simulate_run(compose_run("workload=deepseek_v3", "strategy=pipeline", "workload.steps=2", *FREE_HOST))
    graph, start, end = outcome.result.graph, outcome.result.start_us, outcome.result.end_us
    tasks = graph.tasks
    comm_lane = graph.lane_names.index("device.comm")
    assert np.any(tasks["lane"] == comm_lane)
    assert np.all(tasks["category"][tasks["lane"] == comm_lane] == CATEGORY["comm"])
    name = graph.op_names
    device = (tasks["category"] == CATEGORY["compute"]) | (tasks["category"] == CATEGORY["comm"])

    def task_of(op_name, step=1):
        return int(np.flatnonzero(device & (tasks["op"] == name.index(op_name)) & (tasks["step"] == step))[0])

    dispatch, shared, grouped = task_of("layers.10.moe_dispatch"), task_of("layers.10.shared_gate_up"), task_of("layers.10.grouped_gate_up")
    assert start[shared] < end[dispatch]  # computes while tokens are in flight
    assert start[grouped] >= end[dispatch]  # the routed experts need the dispatched tokens


def test_expert_parallel_off_removes_all_to_all_and_internode_groups_are_slower():
    _, local = workload("workload=qwen3_30b_decode", "workload.ep=1")
    assert not any("moe_dispatch" in n for n in local.op_names)
    # Through a switch, so that a node of 16 has the links a node of 8 has (on the A2's full mesh, 196 GB/s
    # spread over 15 links would be thinner than over 7).
    one_node = quick("workload=deepseek_v3", "strategy=pipeline", "hardware.link.devices_per_node=16", "hardware.link.scaleup_topology=switch")
    two_nodes = quick("workload=deepseek_v3", "strategy=pipeline", "hardware.link.scaleup_topology=switch")
    assert two_nodes["breakdown_comm"] > one_node["breakdown_comm"]


def test_w8a8_halves_linear_weights_and_issues_quant_ops():
    _, bf16 = workload("workload=qwen3_30b_decode")
    _, int8 = workload("workload=qwen3_30b_decode", "workload.quant=w8a8")
    assert int8.memory.weights_gb < 0.6 * bf16.memory.weights_gb
    assert sum("dynamic_quant" in n for n in int8.op_names) == 4 * 48
    assert not any("dynamic_quant" in n for n in bf16.op_names)


def test_shape_keys_follow_shapes():
    _, wl = workload("workload=llama31_8b_decode", "workload.steps=4")
    names = wl.op_names
    attention = names.index("layers.0.attention")
    qkv0, qkv5 = names.index("layers.0.qkv_proj"), names.index("layers.5.qkv_proj")
    assert len(set(wl.shape_key[:, attention])) == 4  # KV length changes every decode step
    assert len(set(wl.shape_key[:, qkv0])) == 1  # same batch, same shapes
    assert np.all(wl.shape_key[:, qkv0] == wl.shape_key[:, qkv5])  # same op, same shapes in another layer
    assert wl.shape_key[0, qkv0] != wl.shape_key[0, names.index("layers.0.o_proj")]
    assert wl.flags[attention] & FLAG_DYNAMIC and not wl.flags[qkv0] & FLAG_DYNAMIC
    _, moe = workload("workload=qwen3_30b_decode")
    dispatch = moe.op_names.index("layers.0.moe_dispatch")
    assert moe.flags[dispatch] & FLAG_VALUE_DEPENDENT  # split sizes come from the routing counts


@pytest.mark.parametrize("all_to_all_from, syncs", [(2, 48 + 1), (16, 1)])
def test_value_dependent_dispatch_adds_host_syncs(all_to_all_from, syncs):
    """Qwen3-30B-A3B at TP 4 / EP 4 on the A2: an all-to-all dispatch reads its split sizes on the host,
    one sync a MoE layer (48) besides the sampled tokens'; the A2's all-gather method below 16 EP ranks
    dispatches nothing."""
    outcome = simulate_run(compose_run("workload=qwen3_30b_decode", "workload.steps=2",
                                       f"hardware.link.moe_all_to_all_min_ep={all_to_all_from}"))
    tasks = outcome.result.graph.tasks
    syncs_per_step = np.count_nonzero((tasks["category"] == CATEGORY["sync"]) & (tasks["step"] == 0))
    assert syncs_per_step == syncs


def test_an_a2_moe_layer_all_gathers_below_16_ep_ranks_and_exchanges_all_to_all_from_16():
    """vllm-ascend v0.11.0 on A2 (_select_moe_comm_method): an EP group of 4 takes the all-gather method:
    no token split and no dispatch or combine; every rank routes the batch's 16 tokens to its 32 whole
    experts (16 x 8 / 4 = 32 picks) and the outputs are all-reduced over the 4 ranks (16 x 2,048 x 2 B).
    EP 16 (TP 4 x DP 4) exchanges all-to-all: each TP rank dispatches its 4 tokens' 8 picks."""
    from harness.model.ops import COMM_ALL_REDUCE, COMM_ALL_TO_ALL

    run = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.steps=1")
    small = build_workload(run.workload, run.hardware.link.devices_per_node, **run_build_options(run))
    names = [n for n in small.op_names if n.startswith("layers.0.")]
    assert "layers.0.moe_dispatch" not in names and "layers.0.moe_combine" not in names
    gate_up, reduce = small.op_names.index("layers.0.grouped_gate_up"), small.op_names.index("layers.0.moe_finalize_tp")
    assert small.flops[0, gate_up] == 2.0 * 32 * 2048 * 1536
    assert (small.comm[reduce], small.comm_ranks[reduce], small.bytes[0, reduce]) == (COMM_ALL_REDUCE, 4, 16 * 2048 * 2)
    run16 = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.steps=1", "workload.dp=4", "workload.ep=16")
    large = build_workload(run16.workload, run16.hardware.link.devices_per_node, **run_build_options(run16))
    dispatch = large.op_names.index("layers.0.moe_dispatch")
    assert (large.comm[dispatch], large.comm_ranks[dispatch], large.bytes[0, dispatch]) == (COMM_ALL_TO_ALL, 16, 4 * 8 * 2048 * 2)


def test_llama2_issues_an_all_reduce_per_attention_and_mlp_under_tensor_parallelism():
    """The card used to issue no all-reduce: workload.tp=8 silently dropped all communication."""
    tp1 = build_workload(compose_run("workload=llama2_7b_decode", "workload.steps=2").workload)
    tp8 = build_workload(compose_run("workload=llama2_7b_decode", "workload.steps=2", "workload.tp=8").workload)
    comm = KIND_CODE[OpKind.comm]
    assert np.count_nonzero(tp1.kind == comm) == 0
    # and the embedding's all-reduce and the logits' gather
    assert np.count_nonzero(tp8.kind == comm) == 2 * 32 + 2 and tp8.n_ops == tp1.n_ops + 66


def test_card_overrides_take_list_values():
    """An op list override (any list value) used to crash with "unhashable type: 'list'"."""
    wl = build_workload(compose_run("workload=llama2_7b_decode", "workload.steps=2", "+workload.card_overrides.layer_ops=[input_norm,q_proj,attention]").workload)
    assert wl.n_ops == 1 + 32 * 3 + 3
    again = build_workload(compose_run("workload=llama2_7b_decode", "workload.steps=2").workload)
    assert again.n_ops > wl.n_ops  # the cache keyed the override: the plain card is unchanged


# ---------------------------------------------------------------- explicit op lists (harness.model.ops)


def op_list_config(**fields):
    from harness.config.schema import OpSpec, WorkloadConfig

    return WorkloadConfig(card=None, ops=[OpSpec()], **{"steps": 3, **fields})


def test_an_op_row_needs_only_a_name_and_a_kind():
    """Unset fields of a row: no flags, no FLOPs or bytes, a device time from the cost model (NaN), the
    stream of its kind, no host time, and the previous op to wait for."""
    from harness.model.ops import COMM_NONE, STREAM_COMM, STREAM_COMPUTE, from_static_ops

    rows = [{"name": "v", "kind": OpKind.vector}, {"name": "h", "kind": OpKind.host, "host_us": None}, {"name": "c", "kind": OpKind.comm}]
    wl = from_static_ops(op_list_config(), rows)
    assert wl.flags.tolist() == [0, 0, 0] and wl.after == [[], [0], [1]]
    assert wl.flops.tolist() == [[0.0] * 3] * 3 and wl.bytes.tolist() == [[0.0] * 3] * 3 and np.isnan(wl.device_us).all()
    assert wl.stream.tolist() == [STREAM_COMPUTE, STREAM_COMPUTE, STREAM_COMM] and wl.host_us.tolist() == [0.0, 0.0, 0.0]
    assert wl.comm.tolist() == [COMM_NONE] * 3 and wl.comm_ranks.tolist() == [1, 1, 1]


def test_an_op_rows_flags_host_time_and_stream_are_its_own():
    from harness.model.ops import FLAG_COMPUTE_DEPENDENT, FLAG_CPU_ELIGIBLE, FLAG_ROUTED, from_static_ops

    rows = [
        {"name": "d", "kind": OpKind.vector, "dynamic": True},
        {"name": "v", "kind": OpKind.vector, "value_dependent": True},
        {"name": "u", "kind": OpKind.vector, "compute_dependent": True},
        {"name": "e", "kind": OpKind.vector, "cpu_eligible": True},
        {"name": "r", "kind": OpKind.vector, "routed": True},
        {"name": "py", "kind": OpKind.host, "host_us": 7.0},
        {"name": "ar", "kind": OpKind.comm, "stream": 0},  # a collective kept on the compute stream
        {"name": "s2", "kind": OpKind.vector, "stream": 2, "after": []},
    ]
    wl = from_static_ops(op_list_config(), rows)
    assert wl.flags.tolist() == [FLAG_DYNAMIC, FLAG_VALUE_DEPENDENT, FLAG_COMPUTE_DEPENDENT, FLAG_CPU_ELIGIBLE, FLAG_ROUTED, 0, 0, 0]
    assert wl.host_us.tolist() == [0, 0, 0, 0, 0, 7.0, 0, 0]
    assert wl.stream.tolist() == [0, 0, 0, 0, 0, 0, 0, 2] and wl.after[-1] == []
    # A dynamic op's shapes change every step; a static op's never.
    assert len(set(wl.shape_key[:, 0])) == 3 and len(set(wl.shape_key[:, 1])) == 1


@pytest.mark.parametrize("after", [[1], [-1], [5]])
def test_an_op_waits_only_for_earlier_ops(after):
    from harness.model.ops import from_static_ops

    with pytest.raises(ConfigError, match=re.escape(f"workload.ops[1].after={after}: must name earlier ops (indices 0..0)")):
        from_static_ops(op_list_config(), [{"name": "a", "kind": OpKind.vector}, {"name": "b", "kind": OpKind.vector, "after": after}])


@pytest.mark.parametrize("phase, tokens, kv_len", [("decode", [2, 2, 2], [513, 514, 515]), ("prefill", [1024, 1024, 1024], [512, 512, 512])])
def test_an_op_lists_tokens_and_kv_length_follow_the_phase(phase, tokens, kv_len):
    from harness.config.schema import Phase
    from harness.model.ops import from_static_ops

    wl = from_static_ops(op_list_config(phase=Phase(phase), batch_size=2, context_len=512), [{"name": "a", "kind": OpKind.vector}])
    assert wl.tokens.tolist() == tokens and wl.kv_len.tolist() == kv_len and wl.batch.tolist() == [2, 2, 2]


def test_a_workload_starts_with_its_real_sizes_and_no_groups_or_memory():
    from harness.model.ops import MemoryPlan

    wl = build_workload(compose_run("workload.steps=3", "workload.batch_size=4").workload)
    assert wl.real_batch is wl.batch and wl.real_kv_len is wl.kv_len and wl.tokens_out.tolist() == [4, 4, 4]
    assert wl.group.tolist() == [-1] * wl.n_ops and wl.n_kernels.tolist() == [1] * wl.n_ops and wl.steps == 3
    assert MemoryPlan().total_gb == 0.0
    listed = build_workload(compose_run("workload.card=null", "workload.ops=[{name:a}]").workload)
    assert listed.memory.total_gb == 0.0 and listed.host_us.tolist() == [0.0] and listed.weight_bytes.tolist() == [0.0]


def test_activations_are_half_the_traffic_beyond_the_weights():
    """An op allocates its outputs: half of what it moves that is not its resident weights, never less
    than nothing. Eager frees each op's outputs before the next op allocates: the peak is the largest op's."""
    wl = build_workload(compose_run("workload.card=null", "workload.ops=[{name:a,bytes:200},{name:b,bytes:0},{name:c,bytes:50}]",
                                    "workload.steps=1").workload)
    wl.weight_bytes = np.array([0.0, 0.0, 100.0])
    assert wl.activation_bytes().tolist() == [[100.0, 0.0, 0.0]]
    # A card's embedding reads a few rows of a table it holds whole: less traffic than weights, no activations.
    card = build_workload(compose_run("workload.steps=1").workload)
    embedding = card.op_names.index("embedding")
    assert card.bytes[0, embedding] < card.weight_bytes[embedding] and card.activation_bytes()[0, embedding] == 0.0
    assert card.activation_bytes().min() == 0.0
    summary = simulate_run(compose_run("workload.card=null", "workload.ops=[{name:a,bytes:200},{name:b,bytes:600},{name:c,bytes:400}]",
                                       "workload.steps=2")).summary
    assert summary["peak_activation_gb"] == 300e-9 and "peak_mem_gb" not in summary  # an op list knows no weights
    nothing = simulate_run(compose_run("workload.card=null", "workload.ops=[{name:a},{name:b}]", "workload.steps=1")).summary
    assert nothing["peak_activation_gb"] == 0.0


def test_an_op_lists_collectives_survive_an_export(tmp_path):
    from harness.model.ops_csv import read_ops_csv, write_ops_csv

    run = compose_run("workload.card=null", "workload.ops=[{name:a,device_us:1},{name:ar,kind:comm,device_us:2}]", "workload.steps=2")
    wl = build_workload(run.workload)
    write_ops_csv(wl, tmp_path / "ops.csv")
    back = read_ops_csv(tmp_path / "ops.csv", run.workload)
    assert back.comm.tolist() == wl.comm.tolist() and back.kind.tolist() == wl.kind.tolist() and back.stream.tolist() == [0, 1]


def test_a_card_edited_on_disk_is_read_again(tmp_path, monkeypatch):
    """Cards are cached by path and modification time: a long-lived process (a sweep's worker, a test)
    sees an edit without anyone clearing a cache."""
    import os

    import harness.model.workload as workload_module
    from harness.config.paths import WORKLOADS_DIR
    from harness.model.workload import load_card

    (tmp_path / "llama2_7b.yaml").write_text((WORKLOADS_DIR / "llama2_7b.yaml").read_text())
    monkeypatch.setattr(workload_module, "WORKLOADS_DIR", tmp_path)
    assert load_card("llama2_7b")["num_hidden_layers"] == 32
    assert load_card("llama2_7b") is load_card("llama2_7b")  # cached while the file is unchanged
    card = tmp_path / "llama2_7b.yaml"
    card.write_text(card.read_text().replace("num_hidden_layers: 32", "num_hidden_layers: 30").replace("count: 32", "count: 30"))
    stat = card.stat()
    os.utime(card, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert load_card("llama2_7b")["num_hidden_layers"] == 30


@pytest.mark.parametrize(
    "overrides, message",
    [
        # Qwen2.5-7B: 28 attention heads (vLLM: "Total number of attention heads (28) must be divisible by
        # tensor parallel size (8)").
        (["workload=qwen25_7b_decode", "workload.tp=8"], "workload.tp=8: card 'qwen25_7b' has 28 attention heads, which do not split over 8 ranks"),
        (["workload=llama31_8b_decode", "workload.tp=3"], "workload.tp=3: card 'llama31_8b' has 32 attention heads, which do not split over 3 ranks"),
        # Qwen2.5-1.5B: its 12 heads split over 3 ranks, its 2 KV heads neither split nor replicate evenly.
        (["workload=qwen25_1_5b_decode", "workload.tp=3"],
         "workload.tp=3: card 'qwen25_1_5b' has 2 KV heads, which neither split over 3 ranks nor replicate evenly"),
    ],
)
def test_a_tp_degree_the_heads_do_not_split_over_is_refused(overrides, message):
    with pytest.raises(ConfigError) as refused:
        build_workload(compose_run(*overrides, "workload.steps=2").workload)
    assert str(refused.value) == message


def test_kv_heads_fewer_than_tp_ranks_replicate_when_tp_is_a_multiple_of_them():
    """Llama-3.1-8B at TP 16: 32 heads split (2 a rank), 8 KV heads each held by 2 ranks."""
    build_workload(compose_run("workload=llama31_8b_decode", "workload.tp=16", "workload.steps=2").workload)
    with pytest.raises(ConfigError, match=r"^workload\.tp=32: card 'qwen25_7b' has 28 attention heads"):
        build_workload(compose_run("workload=qwen25_7b_decode", "workload.tp=32", "workload.steps=2").workload)


def test_mla_absorb_bmms_read_and_write_every_head_of_their_rank():
    """DeepSeek-V3 decode, batch 8, TP 4 (32 of 128 heads a rank). q_absorb multiplies each head's
    128-wide nope query by its 128 x 512 slice of W_UK: bf16 weights 32 x 128 x 512 x 2 B = 4,194,304 B,
    reads 8 x 32 x 128 x 2 B = 65,536 B and writes 8 x 32 x 512 x 2 B = 262,144 B (the latent query
    mla_attention reads), 4,521,984 B in all; v_absorb the same transposed (512 in, 128 out a head);
    2 x 8 x 32 x 128 x 512 = 33,554,432 FLOPs each. (The output had been one head's: 17,047,552 B at TP 1.)"""
    _, w = workload("workload=deepseek_v3", "workload.batch_size=8", "workload.steps=1")
    for name in ("layers.3.q_absorb_bmm", "layers.3.v_absorb_bmm"):
        j = w.op_names.index(name)
        assert (w.bytes[0, j], w.flops[0, j], w.weight_bytes[j]) == (4_521_984.0, 33_554_432.0, 4_194_304.0)


@pytest.mark.parametrize("batch, flops", [(1, 12_582_912.0), (4, 50_331_648.0), (5, 62_914_560.0)])
def test_experts_without_expert_parallelism_multiply_every_token_once(batch, flops):
    """Qwen3-30B-A3B at TP 4 with ep=1: every rank holds a quarter of each expert's 2,048 x 1,536 gate_up
    and multiplies every token's 8 picks by it: 2 x batch x 8 x 2,048 x 384 x 2 FLOPs (a batch of 1 had
    been counted as 4 tokens: the split of tokens among TP ranks before a dispatch, which ep=1 has not)."""
    _, w = workload("workload=qwen3_30b_decode", "workload.ep=1", f"workload.batch_size={batch}", "workload.steps=1")
    j = w.op_names.index("layers.0.grouped_gate_up")
    assert w.flops[0, j] == flops == 2 * batch * 8 * 2048 * 1536 / 4


def test_experts_split_over_tp_read_whole_input_rows_or_write_whole_output_rows():
    """Qwen3-30B-A3B decode at TP 4 with ep=1, batch 16: every rank multiplies the 16 tokens' 128 picks by
    its quarter of each expert; 128 (1 - (1 - 8/128)^16) = 82.42 experts are hit. gate_up is split by
    columns: each slice (2,048 x 384) reads a pick's whole 2,048-wide input and writes its 384 outputs;
    down by rows: its 192 of the input, a whole 2,048-wide partial output. Bytes = weights read + picks x
    (input + output) x 2 B. (Both were counted in quarter rows: 128 / 4 picks.)"""
    _, w = workload("workload=qwen3_30b_decode", "workload.tp=4", "workload.ep=1", "workload.batch_size=16", "workload.steps=1")
    hit = 128 * (1 - (1 - 8 / 128) ** 16)
    gate_up, down = (w.op_names.index(f"layers.0.grouped_{name}") for name in ("gate_up", "down"))
    assert w.bytes[0, gate_up] == pytest.approx(hit * 2048 * 384 * 2 + 128 * (2048 + 384) * 2, rel=1e-12)
    assert w.bytes[0, down] == pytest.approx(hit * 192 * 2048 * 2 + 128 * (192 + 2048) * 2, rel=1e-12)


@pytest.mark.parametrize("override, message", [
    ("num_experts_per_tok=200", "workload.card_overrides.num_experts_per_tok=200: a token picks that many distinct experts, more than n_routed_experts=128"),
    ("n_routed_experts=4", "workload.card_overrides.n_routed_experts=4: fewer experts than a token picks (num_experts_per_tok=8)"),
])
def test_a_token_cannot_pick_more_experts_than_there_are(override, message):
    """A token's top-k are k distinct experts: k above the card's expert count is refused, naming the key the
    user set (the experts hit, E (1 - (1 - k/E)^T), went negative inside)."""
    with pytest.raises(ConfigError) as refused:
        build_workload(compose_run("workload=qwen3_30b_decode", f"+workload.card_overrides.{override}").workload)
    assert str(refused.value) == message


@pytest.mark.parametrize("ep", [2, 3])
def test_an_expert_parallel_degree_between_one_and_every_device_is_refused(ep):
    with pytest.raises(ConfigError) as refused:
        compose_run("workload=qwen3_30b_decode", f"workload.ep={ep}")
    assert str(refused.value) == (
        f"workload.ep={ep}: must be 0 or 4 (experts spread over every device, tp × dp, as vLLM's expert parallelism) or 1"
        " (none: every device holds its slice of every expert)")
    # On one device the two ways in are the same number: said once (it read "0 or 1 (...) or 1 (...)").
    with pytest.raises(ConfigError) as refused:
        compose_run(f"workload.ep={ep}")
    assert str(refused.value) == f"workload.ep={ep}: must be 0 or 1 on one device (tp × dp = 1): expert parallelism spreads experts over several"


def test_the_vocab_parallel_embedding_sums_its_rows_across_tp():
    """Llama-2-7B prefill of 16 tokens at TP 2: each rank looks up the ids in its half of the vocabulary
    and the halves are summed (vLLM's VocabParallelEmbedding): an all-reduce of 16 x 4,096 x 2 B = 131,072 B
    right after the lookup. At TP 1 there is nothing to sum."""
    from harness.model.ops import COMM_ALL_REDUCE

    _, split = workload("workload=llama2_7b_prefill", "workload.tp=2", "workload.context_len=16", "workload.steps=1")
    assert split.op_names[:2] == ["embedding", "tp_all_reduce"]
    assert (split.comm[1], split.comm_ranks[1], split.bytes[0, 1]) == (COMM_ALL_REDUCE, 2, 131_072.0)
    _, single = workload("workload=llama2_7b_prefill", "workload.context_len=16", "workload.steps=1")
    assert single.op_names[1] != "tp_all_reduce"


def test_a_w8a8_linear_reads_int8_and_writes_the_model_dtype():
    """Llama-3.1-8B W8A8 decode, batch 1: qkv_proj holds 4,096 x 6,144 int8 weights (25,165,824 B), reads
    the 4,096 int8 activations the quant op wrote and writes 6,144 dequantised bf16 values (12,288 B):
    25,182,208 B."""
    _, w = workload("hardware=atlas_a2", "workload=llama31_8b_decode", "workload.quant=w8a8", "workload.batch_size=1", "workload.steps=1")
    j = w.op_names.index("layers.0.qkv_proj")
    assert w.bytes[0, j] == 4096 * 6144 + 4096 + 6144 * 2 == 25_182_208


def _op(w, name: str) -> tuple[float, int, int]:
    """(bytes at step 0, collective type, ranks) of an op of a built workload."""
    j = w.op_names.index(name)
    return float(w.bytes[0, j]), int(w.comm[j]), int(w.comm_ranks[j])


def test_deepseek_moe_gathers_the_tp_slices_and_reduces_the_shared_expert():
    """DeepSeek-V3 (tp 4, dp 4, ep 16, W8A8, 8 sequences a DP group), vllm-ascend's MC2 path: each TP rank
    routes ceil(8 / 4) = 2 of its DP group's 8 tokens; after the combine the 4 ranks' slices are
    all-gathered over TP, 2 x 7168 x 2 B = 28,672 B a rank (FusedMoEPrepareAndFinalizeWithMC2.finalize),
    so that the next layer's norm and attention have all 8. The shared expert runs TP-split on all 8 tokens
    (down_proj row-parallel: partial sums), all-reduced over TP on its own: 8 x 7168 x 2 B = 114,688 B
    (AscendSharedFusedMoE.forward_impl). The 3 dense layers have neither; the 58 MoE layers both."""
    from harness.model.ops import COMM_ALL_GATHER, COMM_ALL_REDUCE

    _, w = workload("workload=deepseek_v3", "workload.steps=1")
    assert _op(w, "layers.3.moe_finalize_tp") == (28_672.0, COMM_ALL_GATHER, 4)
    assert _op(w, "layers.3.shared_all_reduce") == (114_688.0, COMM_ALL_REDUCE, 4)
    assert sum(n.endswith(".moe_finalize_tp") for n in w.op_names) == sum(n.endswith(".shared_all_reduce") for n in w.op_names) == 58
    assert not any(n.startswith("layers.2.") and ("moe_" in n or "shared_" in n) for n in w.op_names)
    # the shared expert's weights a rank holds follow its TP split: 7168 x 2 x 2048 / 4 int8 gate_up, 2048 x 7168 / 4 down
    gate_up, down = w.op_names.index("layers.3.shared_gate_up"), w.op_names.index("layers.3.shared_down")
    assert (w.weight_bytes[gate_up], w.weight_bytes[down]) == (7168 * 4096 / 4, 2048 * 7168 / 4)


def test_qwen3_moe_gathers_the_tp_slices_of_its_tokens():
    """Qwen3-30B-A3B (tp 4, ep 4, bf16, 16 sequences): each rank dispatches 16 / 4 = 4 tokens; their
    outputs are all-gathered over TP, 4 x 2048 x 2 B = 16,384 B a rank. No shared expert to reduce."""
    from harness.model.ops import COMM_ALL_GATHER

    _, w = workload("workload=qwen3_30b_decode", "workload.steps=1")
    assert _op(w, "layers.0.moe_finalize_tp") == (16_384.0, COMM_ALL_GATHER, 4)
    assert sum(n.endswith(".moe_finalize_tp") for n in w.op_names) == 48
    assert not any("shared_all_reduce" in n for n in w.op_names)


def test_experts_without_ep_over_dp_groups_gather_the_other_groups_tokens():
    """Qwen3-30B-A3B at tp 2, dp 2, ep 1, 16 sequences a DP group: every rank holds a quarter (tp x dp) of
    each expert and multiplies both DP groups' 32 tokens, so they are all-gathered over DP first (hidden
    states and router logits: 16 x (2048 + 128) x 2 B = 69,632 B a rank), the outputs reduce-scattered
    over DP after (each rank keeps its 16 rows: 16 x 2048 x 2 = 65,536 B, priced as the all-gather of that
    slice), and the TP ranks' partial sums all-reduced (65,536 B): vllm-ascend's all-gather method
    (_prepare_with_dp_group, _finalize_with_dp_group, then maybe_all_reduce_tensor_model_parallel). The
    experts multiply 32 x 8 = 256 rows: 2 x 256 x 2048 x 1536 / 4 FLOPs of gate_up."""
    from harness.model.ops import COMM_ALL_GATHER, COMM_ALL_REDUCE

    _, w = workload("workload=qwen3_30b_decode", "workload.tp=2", "workload.dp=2", "workload.ep=1", "workload.steps=1")
    assert _op(w, "layers.0.moe_dispatch") == (69_632.0, COMM_ALL_GATHER, 2)
    assert _op(w, "layers.0.moe_combine") == (65_536.0, COMM_ALL_GATHER, 2)
    assert _op(w, "layers.0.moe_finalize_tp") == (65_536.0, COMM_ALL_REDUCE, 2)
    assert not w.flags[w.op_names.index("layers.0.moe_dispatch")] & FLAG_VALUE_DEPENDENT  # fixed sizes: no host read
    j = w.op_names.index("layers.0.grouped_gate_up")
    assert w.flops[0, j] == 2 * 256 * 2048 * 1536 / 4 == 402_653_184.0


@pytest.mark.parametrize("tp, widths", [
    # 2048 tokens x: hidden 4096 (qkv), 32 heads x 128 / tp (o_proj), hidden (gate_up), 14336 / tp (down)
    (1, [4096, 4096, 4096, 14336]),
    (2, [4096, 2048, 4096, 7168]),
])
def test_dynamic_quant_quantises_the_input_of_the_matmul_it_feeds(tp, widths):
    """Llama-3.1-8B W8A8 prefill of 2,048 tokens: each npu_dynamic_quant reads its matmul's input in bf16
    and writes int8, 3 B an element: before down_proj 2048 x 14336 x 3 = 88,080,384 B at TP 1 (not the
    hidden size's 2048 x 4096 x 3 = 25,165,824 B)."""
    _, w = workload("workload=llama31_8b_decode", "workload.quant=w8a8", "workload.phase=prefill", "workload.context_len=2048",
                    f"workload.tp={tp}", "workload.steps=1")
    quants = [j for j, n in enumerate(w.op_names) if n.startswith("layers.0.dynamic_quant")]
    assert [w.bytes[0, j] for j in quants] == [2048 * width * 3.0 for width in widths]
    if tp == 1:
        assert w.bytes[0, quants[3]] == 88_080_384.0


def test_deepseek_dynamic_quants_follow_their_matmuls_inputs():
    """DeepSeek-V3 W8A8, tp 4, 8 tokens a rank, 3 B an element: qkv_a_proj's input 8 x 7168 (172,032 B);
    q_b_proj's 8 x q_lora_rank 1536 (36,864 B); o_proj's 8 x 128 heads x 128 / 4 (98,304 B); the dense
    gate_up's 8 x 7168 (172,032 B) and down's 8 x 18432 / 4 (110,592 B). MoE layer: before the dispatch the
    shared expert's 8 x 7168 (172,032 B: the routed tokens' quantisation is fused into MC2's dispatch);
    before grouped_down the rows the rank's 16 experts receive, 16 ranks x 2 tokens x 8 picks x 16 / 256 =
    16 rows x moe_intermediate 2048 (98,304 B)."""
    _, w = workload("workload=deepseek_v3", "workload.steps=1")
    dense = [w.bytes[0, j] for j, n in enumerate(w.op_names) if n.startswith("layers.0.dynamic_quant")]
    moe = [w.bytes[0, j] for j, n in enumerate(w.op_names) if n.startswith("layers.3.dynamic_quant")]
    assert dense == [172_032.0, 36_864.0, 98_304.0, 172_032.0, 110_592.0]
    assert moe == [172_032.0, 36_864.0, 98_304.0, 172_032.0, 98_304.0]
