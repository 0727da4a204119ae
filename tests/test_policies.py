"""Strategy policies decided before the event loop (harness/sim/policies.py), case by case against plans
worked out by hand: what fusion, heterogeneous execution and the tiling cache may touch, how graph plans
fall back, and padding waste."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import compose_run
from harness.config.schema import OpKind, OpSpec, StrategyConfig
from harness.base.errors import ConfigError
from harness.model.ops import FLAG_ROUTED
from harness.sim.policies import BUILD, EAGER, REPLAY, _padding_waste, fuse, pad_up, prepare
from harness.sim.simulate import simulate_run
from harness.model.workload import build_workload
from test_semantics import TOKEN_BACK_US, three_op_run

B, E, R = BUILD, EAGER, REPLAY


def trace(tmp_path, body: str, *overrides: str):
    path = tmp_path / "ops.csv"
    path.write_text(body)
    return compose_run("workload=trace", f"workload.path={path}", "workload.steps=3", *overrides)


def plan_of(run, batch=None):
    return prepare(run, np.full(run.workload.steps, 1) if batch is None else np.asarray(batch), None)


# ---------------------------------------------------------------- fusion


def test_fusion_keeps_each_grouped_matmuls_expert_groups():
    """Task fusion merges vector ops, never a grouped matmul: Qwen3-30B-A3B's 96 grouped matmuls keep their
    experts (69.00 each at a batch of 12, TP 4 without EP: 128 (1 - (120/128)^12)), the fused kernels have none."""
    run = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.batch_size=12", "workload.tp=4", "workload.ep=1", "workload.steps=1")
    workload = build_workload(run.workload)
    fused, _ = fuse(workload, 8, np.zeros(workload.n_ops, dtype=bool))
    assert fused.n_ops < workload.n_ops
    grouped = np.array(["grouped_" in name for name in fused.op_names])
    assert grouped.sum() == 96
    assert fused.expert_groups[0, grouped] == pytest.approx(np.full(96, 128 * (1 - (120 / 128) ** 12)))
    assert (fused.expert_groups[0, ~grouped] == 0).all()


def test_fusion_leaves_alone_what_cannot_share_a_kernel(tmp_path):
    """Vector ops fuse in runs, except those in a launch group (a, b: group 0), carried in (e), inside a
    captured graph (g) or waiting for unseen work (i), and value- or compute-dependent ones (below)."""
    run = trace(tmp_path, "name,kind,device_us,group,carried_in,in_graph,not_before_us\n"
                          "a,vector,1,0,0,0,\nb,vector,1,0,0,0,\nc,vector,1,,0,0,\nd,vector,1,,0,0,\ne,vector,1,,1,0,\n"
                          "f,vector,1,,0,0,\ng,vector,1,,0,1,\nh,vector,1,,0,0,\ni,vector,1,,0,0,3\nj,vector,1,,0,0,\nk,vector,1,,0,0,\n")
    workload = build_workload(run.workload)
    fused, _ = fuse(workload, 8, np.zeros(workload.n_ops, dtype=bool))
    assert fused.op_names == ["a", "b", "c+d", "e", "f", "g", "h", "i", "j+k"]
    ops = [OpSpec(name="v0"), OpSpec(name="v1"), OpSpec(name="vd", value_dependent=True), OpSpec(name="v2"), OpSpec(name="v3"),
           OpSpec(name="cd", compute_dependent=True), OpSpec(name="v4")]
    listed = build_workload(three_op_run("eager", ops=ops).workload)
    fused, _ = fuse(listed, 8, np.zeros(listed.n_ops, dtype=bool))
    assert fused.op_names == ["v0+v1", "vd", "v2+v3", "cd", "v4"] and fused.n_kernels.tolist() == [2, 1, 2, 1, 1]


def test_fusion_keeps_an_output_read_later_in_its_own_kernel():
    """v0's output is read by v3 as well as by v1: it must be written out, so v1 starts a new kernel; v1's
    is read only by v2, which joins it; v3 waits for two ops and stands alone. Dependencies follow the groups."""
    ops = [OpSpec(name="v0"), OpSpec(name="v1", after=[0]), OpSpec(name="v2", after=[1]), OpSpec(name="v3", after=[0, 2])]
    listed = build_workload(three_op_run("eager", ops=ops).workload)
    fused, _ = fuse(listed, 8, np.zeros(listed.n_ops, dtype=bool))
    assert fused.op_names == ["v0", "v1+v2", "v3"] and fused.after == [[], [0], [0, 1]]


def test_a_fused_kernels_shape_changes_when_any_members_does():
    ops = [OpSpec(name="s"), OpSpec(name="d", dynamic=True)]
    listed = build_workload(three_op_run("eager", ops=ops, steps=3).workload)
    fused, _ = fuse(listed, 8, np.zeros(listed.n_ops, dtype=bool))
    assert fused.op_names == ["s+d"] and len(set(fused.shape_key[:, 0])) == 3


def test_a_fused_kernel_waits_for_the_collective_before_it():
    """ar on the communication stream (launched at 6, runs 6-16), then v0 + v1 fused on the compute stream,
    launched at 12: the kernel waits for ar's event and runs 16-18."""
    ops = [OpSpec(name="ar", kind=OpKind.comm, device_us=10.0), OpSpec(name="v0", device_us=1.0), OpSpec(name="v1", device_us=1.0)]
    run = three_op_run("eager", ops=ops)
    outcome = simulate_run(dataclasses.replace(run, strategy=StrategyConfig(fusion=True, fusion_max_ops=2)))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(18 + TOKEN_BACK_US + 2)
    assert outcome.workload.op_names == ["ar", "v0+v1"]


STAGES = "framework_us,infer_shape_us,tiling_us,alloc_us,launch_us,free_us"


def test_fused_measured_host_costs_add_up_but_launch_once(tmp_path):
    """Two measured vector ops: every member's framework work still runs (10 + 4 µs), but one launch call
    remains, the dearest member's (max(5, 7) µs); an unmeasured stage stays unmeasured (NaN)."""
    run = trace(tmp_path, f"step,name,kind,device_us,{STAGES}\n0,v0,vector,1,10,0,,0,5,0\n0,v1,vector,1,4,0,,0,7,0\n", "workload.steps=1")
    workload = build_workload(run.workload)
    fused, _ = fuse(workload, 8, np.zeros(workload.n_ops, dtype=bool))
    costs = fused.host_cost_us[0, 0]
    assert fused.op_names == ["v0+v1"] and costs[0] == 14.0 and costs[4] == 7.0 and np.isnan(costs[2])


# ---------------------------------------------------------------- heterogeneous execution


HETEROGENEOUS_CSV = (
    "name,kind,device_us,host_us,group,carried_in,in_graph,cpu_eligible\n"
    "lead,vector,1,,0,0,0,0\nfollow,vector,1,,0,0,0,0\nar,comm,1,,,0,0,0\ncp,copy,1,,,0,0,0\npy,host,,1,,0,0,0\n"
    "old,vector,1,,,1,0,0\ncap,vector,1,,,0,1,0\nok,vector,1,,,0,0,1\nplain,vector,1,,,0,0,0\n"
)


@pytest.mark.parametrize("op", ["lead", "follow", "ar", "cp", "py", "old", "cap"])
def test_only_a_plain_kernel_can_run_on_the_cpu(tmp_path, op):
    run = trace(tmp_path, HETEROGENEOUS_CSV, f"strategy.heterogeneous=[{op}]")
    with pytest.raises(ConfigError, match=rf"^strategy\.heterogeneous=\['{op}'\]: {op} is a collective, a copy, a host-only op or part of a graph"):
        plan_of(run)


def test_flagged_ops_and_named_types_run_on_the_cpu(tmp_path):
    run = trace(tmp_path, HETEROGENEOUS_CSV, "strategy.heterogeneous=[flagged]")
    assert plan_of(run)[1].cpu_ops.tolist() == [False] * 7 + [True, False]
    run = trace(tmp_path, HETEROGENEOUS_CSV, "strategy.heterogeneous=[plain]")
    assert plan_of(run)[1].cpu_ops.tolist() == [False] * 8 + [True]
    # A type names an op in every layer: `layers.<n>.act_mul` is of type act_mul.
    _, plan = plan_of(compose_run("workload.steps=2", "strategy.heterogeneous=[act_mul]"))
    assert plan.cpu_ops.sum() == 32


# ---------------------------------------------------------------- the tiling cache


def test_the_tiling_cache_is_looked_up_by_kernels_with_a_tiling_stage_of_their_own():
    """a (static) hits from step 1 on; d (dynamic) never; py (host work) and s (run on the CPU) have no
    Tiling: 2 hits in 6 lookups over 3 steps."""
    run = compose_run("workload.card=null", "workload.ops=[{name:a},{name:py,kind:host,host_us:1},{name:d,dynamic:true},{name:s}]",
                      "workload.steps=3", "strategy.tiling_cache=true", "strategy.heterogeneous=[s]")
    _, plan = plan_of(run)
    assert plan.info["tiling_cache_hit_rate"] == pytest.approx(2 / 6)
    assert plan.tiling_hit.astype(int).tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]


def test_a_launch_groups_followers_have_no_tiling_of_their_own(tmp_path):
    """lead issues f in the same host call: lead and g are looked up (both static: 4 hits in 6), f is not."""
    run = trace(tmp_path, "name,kind,device_us,group,dynamic\nlead,vector,1,0,0\nf,vector,1,0,1\ng,vector,1,,0\n", "strategy.tiling_cache=true")
    assert plan_of(run)[1].info["tiling_cache_hit_rate"] == pytest.approx(4 / 6)


def test_nothing_to_look_up_is_no_hit_rate_and_says_so():
    """It was a hit rate of 0 ("tiling cache hit rate 0.0%": a cache that always missed), also for an ACL
    graph run whose replays look nothing up."""
    run = compose_run("workload.card=null", "workload.ops=[{name:py,kind:host,host_us:1}]", "workload.steps=2", "strategy.tiling_cache=true")
    info = plan_of(run)[1].info
    assert "tiling_cache_hit_rate" not in info and "no lookups" in info["tiling_note"]
    info = plan_of(compose_run("strategy=acl_graph", "strategy.tiling_cache=true", "workload.steps=4"))[1].info
    assert "tiling_cache_hit_rate" not in info and "no lookups" in info["tiling_note"]


# ---------------------------------------------------------------- graph plans


def test_graphs_are_planned_past_a_step_that_fits_no_graph():
    """Capture sizes 1, 2, 4, 8: a batch of 9 runs eagerly, and planning goes on after it."""
    run = compose_run("workload=llama31_8b_decode", "workload.steps=4", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4,8]")
    assert plan_of(run, [1, 9, 1, 2])[1].mode.tolist() == [B, E, R, B]


def test_a_budget_below_one_graph_still_allows_one():
    """32 streams for a graph that needs 33 (32 layers + 1): one graph, the largest size."""
    run = compose_run("workload=llama31_8b_decode", "workload.steps=3", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4,8]",
                      "hardware.graph.max_graphs=32")
    workload, plan = plan_of(run, [1, 2, 8])
    assert plan.mode.tolist() == [B, R, R] and workload.batch.tolist() == [8, 8, 8]


def test_an_op_list_is_one_layer_for_the_graph_budget():
    """A sunk op list with a dynamic op gets new shapes every step; with no layers it counts as one, so a
    graph takes 2 streams: 4 streams, 2 graphs, then host scheduling."""
    run = compose_run("workload.card=null", "workload.ops=[{name:a},{name:d,dynamic:true}]", "workload.steps=5", "strategy=ge_sink",
                      "strategy.shape_buckets=true", "hardware.graph.max_graphs=4")
    _, plan = plan_of(run)
    assert plan.mode.tolist() == [B, B, E, E, E] and plan.info["graph_captures"] == 2


def test_a_sunk_batch_above_every_bucket_runs_on_the_host():
    run = compose_run("strategy=ge_sink", "strategy.shape_buckets=true", "strategy.graph.buckets=[1]", "workload.batch_size=2", "workload.steps=3")
    _, plan = plan_of(run, [2, 2, 2])
    assert plan.mode.tolist() == [E, E, E] and plan.info["graph_captures"] == 0


def test_steps_whose_batch_is_above_every_graph_size_are_said_to_run_eagerly():
    """Capture sizes 8, 16, 32 and batches 8, 48, 48, 16: steps 1 and 2 (48 > 32) run eagerly, and the note
    says so; a graph run ending "1 capture" said nothing of it. Every batch within a size: no such note."""
    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "strategy.graph.buckets=[8,16,32]", "workload.steps=4")
    _, plan = plan_of(run, [8, 48, 48, 16])
    assert plan.mode.tolist() == [B, E, E, B]
    assert plan.info["graph_note"] == "2 of 4 steps run eagerly: batch 48 is above the largest graph size (32) (strategy.graph.buckets)"
    _, plan = plan_of(run, [8, 32, 32, 16])
    assert "run eagerly" not in plan.info.get("graph_note", "")
    sunk = compose_run("strategy=ge_sink", "strategy.shape_buckets=true", "strategy.graph.buckets=[1]", "workload.batch_size=2", "workload.steps=3")
    assert plan_of(sunk, [2, 2, 2])[1].info["graph_note"] == "3 of 3 steps run eagerly: batch 2 is above the largest graph size (1) (strategy.graph.buckets)"


def test_a_serving_engine_with_no_size_up_to_its_batch_captures_the_smallest():
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "strategy.graph.buckets=[4,8]", "workload.serving.enabled=true",
                      "workload.serving.max_batch=2", "workload.steps=2")
    workload, plan = plan_of(run, [1, 2])
    assert plan.info["graph_captures"] == 1 and plan.mode.tolist() == [R, R] and workload.batch.tolist() == [4, 4]


def test_graph_notes_name_the_first_three_ops_to_blame():
    ops = "[{name:a},{name:u1,compute_dependent:true},{name:b},{name:u2,compute_dependent:true},{name:u3,compute_dependent:true},{name:u4,compute_dependent:true}]"
    _, plan = plan_of(compose_run("workload.card=null", f"workload.ops={ops}", "strategy=acl_graph", "workload.steps=2"))
    assert plan.info["graph_note"] == "capture falls back to host scheduling: compute-dependent ops cannot be in a graph (u1, u2, u3)"
    _, plan = plan_of(compose_run("strategy=ge_sink", "workload.steps=2"))
    assert plan.info["graph_note"] == (
        "sink falls back to host scheduling: dynamic shapes (layers.0.attention, layers.1.attention, layers.2.attention, ...) change every"
        " step: a sunk graph needs static shapes; bucket them (strategy.shape_buckets=true) or use capture"
    )


def test_syncs_are_dropped_only_when_a_graph_replays(tmp_path):
    body = "name,kind,device_us,after\nk,vector,5,\nwait,sync,,0\n"
    one = plan_of(trace(tmp_path, body, "strategy=acl_graph", "workload.steps=1"))[1]
    assert one.mode.tolist() == [B] and "graph_syncs_dropped" not in one.info
    two = plan_of(trace(tmp_path, body, "strategy=acl_graph", "workload.steps=2"))[1]
    assert two.mode.tolist() == [B, R] and two.info["graph_syncs_dropped"] == 1


def test_host_scheduling_with_shape_buckets_pads_the_batch():
    workload, plan = plan_of(compose_run("strategy.shape_buckets=true", "workload.batch_size=5", "workload.steps=2"), [5, 5])
    assert workload.batch.tolist() == [8, 8] and workload.real_batch.tolist() == [5, 5] and plan.mode.tolist() == [E, E]


def test_a_graphs_padding_rows_read_no_kv_cache():
    """Llama-3.1-8B at batch 33 with 8,192 tokens of context, padded into a 40-graph on an H100: attention
    reads the 33 real sequences' caches, 33 x (8,192 + s + 1) tokens x 8 KV heads x (128 + 128) x 2 bytes a
    layer (1.107 GB), not 40 sequences' (vLLM gives padding rows no cache blocks); the projections multiply
    all 40 rows (4,096 x 4,096 x 2 FLOPs a row for o_proj)."""
    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "workload.batch_size=33",
                      "workload.context_len=8192", "workload.steps=3")
    workload, plan = prepare(run, np.full(3, 33), None)
    attention, o_proj = workload.op_names.index("layers.0.attention"), workload.op_names.index("layers.0.o_proj")
    assert workload.batch.tolist() == [40] * 3 and plan.mode.tolist() == [B, R, R]
    kv_tokens = 33 * (8192 + np.arange(3) + 1)
    assert workload.cache_bytes[:, attention].tolist() == (kv_tokens * 8 * 256 * 2.0).tolist()
    assert workload.flops[:, attention].tolist() == (2.0 * 32 * 256 * kv_tokens).tolist()
    assert workload.flops[:, o_proj].tolist() == [40 * 4096 * 4096 * 2.0] * 3


def test_a_graph_multiplies_the_expert_rows_its_tokens_route_and_only_shape_buckets_pad_them():
    """Qwen3-30B-A3B on an H100: a batch of 24 (a capture size) and one of 600 (above every size, eager).
    A replayed or captured step's grouped matmuls multiply the rows its tokens route, as an eager step's do
    (a grouped matmul takes the per-expert counts as a device tensor: 24 x 8 = 192 picks over the 4 EP
    ranks, 48 rows a rank); shape bucketing pads them to a power of two (64) on every step. (Graph steps
    were padded to 64 before.)"""
    overrides = ("hardware=h100", "workload=qwen3_30b_decode", "workload.steps=2")
    graph, plan = prepare(compose_run(*overrides, "strategy=cuda_graph"), np.array([24, 600]), None)
    eager, _ = prepare(compose_run(*overrides, "strategy=eager"), np.array([24, 600]), None)
    bucketed, _ = prepare(compose_run(*overrides, "strategy=cuda_graph", "strategy.shape_buckets=true"), np.array([24, 600]), None)
    assert plan.mode.tolist() == [B, E]
    routed = (graph.flags & FLAG_ROUTED) > 0
    gate_up = graph.op_names.index("layers.0.grouped_gate_up")
    assert np.any(routed) and graph.flops[:, routed].tolist() == eager.flops[:, routed].tolist()
    assert graph.flops[0, gate_up] == 2.0 * 48 * 2048 * 1536
    assert bucketed.flops[0, gate_up] == 2.0 * 64 * 2048 * 1536


@pytest.mark.parametrize("overrides, note", [
    ((), "MoE: all-gather method (EP 4 below hardware.link.moe_all_to_all_min_ep=16): each rank routes all its tokens (gathered"
         " over DP) to its own experts, the outputs summed back (reduce-scattered over DP, all-reduced over TP)"),
    (("workload.dp=4", "workload.ep=16"), "MoE: tokens split over TP and exchanged all-to-all over EP 16 (dispatch, combine)"),
    (("workload.ep=1",), "MoE: experts split over the 4 devices (ep=1): every rank multiplies every token (gathered over DP) by"
                         " its slice of each expert, the partial outputs summed back (reduce-scattered over DP, all-reduced over TP)"),
])
def test_a_moe_run_says_how_its_tokens_moved(overrides, note):
    """The op names are the same whichever way a MoE layer moves its tokens (Qwen3-30B-A3B at TP 4 on the A2):
    the run says which (a dense model says nothing)."""
    _, plan = prepare(compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.steps=1", *overrides), np.full(1, 16), None)
    assert plan.info["moe_note"] == note
    _, dense = prepare(compose_run("workload=llama2_7b_decode", "workload.steps=1"), np.full(1, 1), None)
    assert "moe_note" not in dense.info


@pytest.mark.parametrize("hardware", ["h100", "h200", "b200", "a100", "l40s", "mi300x"])
def test_gpu_presets_move_moe_tokens_as_the_gpu_engines_do_by_default(hardware):
    """vLLM's all2all backend (allgather_reducescatter) and SGLang's --moe-a2a-backend none gather tokens at
    any EP size; the GPU presets priced every EP group as an all-to-all exchange. Opting into one (DeepEP):
    moe_all_to_all_min_ep=2."""
    run = ("workload=qwen3_30b_decode", "workload.steps=1", "workload.dp=4", "workload.ep=16", f"hardware={hardware}")
    _, plan = prepare(compose_run(*run), np.full(1, 16), None)
    assert plan.info["moe_note"].startswith("MoE: all-gather method (EP 16 below hardware.link.moe_all_to_all_min_ep=4096)")
    _, plan = prepare(compose_run(*run, "hardware.link.moe_all_to_all_min_ep=2"), np.full(1, 16), None)
    assert plan.info["moe_note"] == "MoE: tokens split over TP and exchanged all-to-all over EP 16 (dispatch, combine)"


def test_kv_lengths_pad_up_to_whole_blocks():
    """A serving batch's mean KV length can be fractional: even a block of 1 rounds it up."""
    assert pad_up(np.array([2.5, 3.0, 256.5]), 1).tolist() == [3.0, 3.0, 257.0]
    assert pad_up(np.array([2.5, 3.0, 256.5]), 256).tolist() == [256.0, 256.0, 512.0]


# ---------------------------------------------------------------- padding waste


def fixed(*device_us: float):
    ops = ",".join(f"{{name:o{i},device_us:{us}}}" for i, us in enumerate(device_us))
    run = compose_run("workload.card=null", f"workload.ops=[{ops}]", "workload.steps=1")
    return build_workload(run.workload), run


@pytest.mark.parametrize("padded, real, waste", [((0.25, 0.25), (0.25, 0.0), 0.5), ((0.5,), (0.75,), 0.0), ((0.0,), (0.0,), 0.0)])
def test_padding_waste_is_the_share_of_padded_device_time(padded, real, waste):
    """The share of device time spent on padding, at any scale (here a fraction of a microsecond), never
    negative, and zero for no device time at all."""
    padded_workload, run = fixed(*padded)
    real_workload, _ = fixed(*real)
    assert _padding_waste(padded_workload, real_workload, run) == waste


def test_when_every_step_builds_a_graph_the_hit_rate_is_over_the_steps_measured_instead():
    """A sink run whose every step builds (a KV block of 1: each step a new bucket) is measured on its build
    steps (nothing else to measure); the hit rate left them out and read 0. By hand: 19 lookups a step,
    the first step's all miss, each later step hits all but its attention (a new shape): 0 + 18 + 18 of 57."""
    run = compose_run("strategy=ge_sink", "strategy.tiling_cache=true", "strategy.shape_buckets=true", "strategy.kv_block=1",
                      "+workload.card_overrides.num_hidden_layers=1", "workload.steps=3")
    workload, plan = plan_of(run)
    assert plan.mode.tolist() == [BUILD, BUILD, BUILD]
    assert plan.tiling_hit.sum(axis=1).tolist() == [0, 18, 18] and workload.n_ops == 19
    assert plan.info["tiling_cache_hit_rate"] == pytest.approx(36 / 57)


def test_a_hit_rate_that_counts_the_cold_first_step_says_so():
    """strategy=tiling_cache over one step read "hit rate 0.0%" (0.47 at two steps, 0.90 at 32) with no word
    that the first step's lookups find the cache empty; with a warm-up step the note goes."""
    cold = plan_of(compose_run("strategy=tiling_cache", "workload.steps=1"))[1].info
    assert cold["tiling_cache_hit_rate"] == 0.0 and cold["tiling_note"].startswith("tiling hit rate counts the first step")
    assert cold["tiling_note"].endswith("(with workload.steps of 2 or more)")  # a warm-up step needs a second one
    warm = plan_of(compose_run("strategy=tiling_cache", "workload.steps=4", "workload.warmup_steps=1"))[1].info
    assert warm["tiling_cache_hit_rate"] > 0.9 and "tiling_note" not in warm
