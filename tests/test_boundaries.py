"""Every capacity-style knob at N − 1, N and N + 1, against values computed by hand.

A capacity off by one (a cache that holds one entry more, a queue one slot deeper, a graph budget that
allows one graph more) changes users' numbers without breaking any direction a test could check: only
the exact boundary tells. Each case says how its numbers were worked out.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compose_run
from harness.config.schema import Dispatch, OpKind, OpSpec, StrategyConfig
from harness.sim.kernel import lru_hits
from harness.base.errors import ConfigError
from harness.sim.task_graph import CATEGORY
from harness.model.ops import MemoryPlan, check_memory
from harness.sim.policies import BUILD, EAGER, REPLAY, bucket_batch, fuse, pad_up, prepare, trim_buckets
from harness.sim.simulate import simulate_run
from harness.model.workload import build_workload
from test_semantics import TOKEN_BACK_US, three_op_run

B, E, R = BUILD, EAGER, REPLAY
MIB = 2**20
A2_GRAPH_MIB = compose_run().hardware.graph.graph_mem_mib  # a captured graph's memory on the default hardware (atlas_a2)


# ---------------------------------------------------------------- the tiling cache (LRU)


@pytest.mark.parametrize(
    "keys, capacity, expected",
    [
        # Three keys in a cycle: each comes back after the 2 others, so it stays with 3 entries, not with 2.
        ([0, 1, 2, 0, 1, 2], 2, [0, 0, 0, 0, 0, 0]),
        ([0, 1, 2, 0, 1, 2], 3, [0, 0, 0, 1, 1, 1]),
        ([0, 1, 2, 0, 1, 2], 4, [0, 0, 0, 1, 1, 1]),
        # Key 0 returns after one other key (1 entry is too few), key 1 after two (0 and 2).
        ([0, 1, 0, 2, 1], 1, [0, 0, 0, 0, 0]),
        ([0, 1, 0, 2, 1], 2, [0, 0, 1, 0, 0]),
        ([0, 1, 0, 2, 1], 3, [0, 0, 1, 0, 1]),
        # A key used again at once hits even a one-entry cache; a new key never hits.
        ([7, 7, 7, 8, 7], 1, [0, 1, 1, 0, 0]),
        ([7, 7, 7, 8, 7], 2, [0, 1, 1, 0, 1]),
        # Key 0 returns after key 1 was used twice: one distinct key between, however often.
        ([0, 1, 1, 0], 1, [0, 0, 1, 0]),
        ([0, 1, 1, 0], 2, [0, 0, 1, 1]),
        ([0, 1, 1, 1, 2, 2, 0], 2, [0, 0, 1, 1, 0, 1, 0]),
        ([0, 1, 1, 1, 2, 2, 0], 3, [0, 0, 1, 1, 0, 1, 1]),
    ],
)
def test_lru_holds_exactly_its_capacity(keys, capacity, expected):
    assert lru_hits(np.array(keys), capacity).astype(int).tolist() == expected


def lru_reference(keys: list[int], capacity: int) -> list[bool]:
    """A plain LRU cache: a hit moves its key to the front; a miss inserts it and evicts the oldest."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for key in keys:
        hits.append(key in cache)
        cache[key] = None
        cache.move_to_end(key)
        if len(cache) > capacity:
            cache.popitem(last=False)
    return hits


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=60), st.integers(1, 8))
def test_lru_kernel_matches_a_plain_lru_cache(keys, capacity):
    assert lru_hits(np.array(keys), capacity).tolist() == lru_reference(keys, capacity)


def tiling_run(entries: int, steps: int = 3):
    run = three_op_run("eager", steps=steps, tiling_lookup_us=0.25)
    return simulate_run(dataclasses.replace(run, strategy=StrategyConfig(tiling_cache=True, tiling_cache_entries=entries)))


@pytest.mark.parametrize("entries, hits", [(2, 0), (3, 6), (4, 6)])
def test_tiling_cache_entries_at_the_step_size(entries, hits):
    """Three static ops look up 3 keys a step: 2 entries never hit (each key returns after the 2 others),
    3 or more hit from step 1 on. A hit's Tiling takes the 0.25 µs lookup instead of 1 µs: op b launches
    2 × 0.75 µs earlier (its own and op a's tiling), and c waits for b on the stream, so the step is
    1.5 µs shorter than the 25 µs of the unit-cost eager step (test_semantics): 23.5 µs, then the token's
    D2H and the 2 µs sync."""
    outcome = tiling_run(entries)
    tasks, durations = outcome.result.graph.tasks, outcome.result.end_us - outcome.result.start_us
    tiling = durations[tasks["category"] == CATEGORY["tiling"]].round(9)
    assert np.count_nonzero(tiling == 0.25) == hits and np.count_nonzero(tiling == 1.0) == 9 - hits
    assert outcome.summary["tiling_cache_hit_rate"] == pytest.approx(hits / 9)
    miss_us, hit_us = 25 + TOKEN_BACK_US + 2, 23.5 + TOKEN_BACK_US + 2
    expected = [miss_us] * 3 if hits == 0 else [miss_us, hit_us, hit_us]
    assert (outcome.steps["latency_ms"] * 1e3).tolist() == pytest.approx(expected, abs=1e-9)


def test_the_tiling_hit_rate_is_the_measured_steps_and_a_copy_has_no_tiling():
    """a, a copy cp and c, unit host costs, a 0.25 µs lookup, 3 steps of which 1 is warm-up. A copy has no
    kernel to tile: no Tiling time, no lookup (it paid a full 1 µs Tiling every step, never looked up).
    a and c miss in step 0 and hit in steps 1 and 2: the measured steps' rate is 4 of 4 (it was 4 of 6,
    the warm-up step's misses counted)."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="cp", kind=OpKind.copy, device_us=1.0), OpSpec(name="c", device_us=3.0)]
    run = three_op_run("eager", ops=ops, steps=3, tiling_lookup_us=0.25)
    run = dataclasses.replace(run, workload=dataclasses.replace(run.workload, warmup_steps=1), strategy=StrategyConfig(tiling_cache=True))
    outcome = simulate_run(run)
    g = outcome.result.graph
    tiling = np.flatnonzero(g.tasks["category"] == CATEGORY["tiling"])
    durations = {(int(g.tasks["step"][i]), g.op_names[g.tasks["op"][i]]): outcome.result.end_us[i] - outcome.result.start_us[i] for i in tiling}
    assert [durations[(s, "cp")] for s in range(3)] == [0.0, 0.0, 0.0]
    assert [durations[(s, op)] for s in range(3) for op in ("a", "c")] == pytest.approx([1.0, 1.0, 0.25, 0.25, 0.25, 0.25])
    assert outcome.summary["tiling_cache_hit_rate"] == 1.0


@pytest.mark.parametrize("entries", [483, 484, 485])
def test_tiling_cache_on_a_preset_thrashes_below_one_steps_lookups(entries):
    """Llama-2-7B decode looks up 484 tiling keys a step (every op; each node caches its own). Between two
    uses of a node come the 483 others, so 483 entries never hit; from 484 on, every static op hits from
    step 1 on, and the 32 attention ops (their KV length changes every step) never: over 4 steps
    (484 - 32) × 3 hits of 484 × 4 lookups."""
    summary = simulate_run(compose_run("strategy=eager", "strategy.tiling_cache=true", f"strategy.tiling_cache_entries={entries}",
                                       "workload.steps=4")).summary
    expected = 0.0 if entries < 484 else (484 - 32) * 3 / (484 * 4)
    assert summary["tiling_cache_hit_rate"] == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------- the bounded queue between host threads


def queue_run(capacity: int):
    """Async dispatch of 5 ops: the main thread spends 3 µs an op (framework, InferShape, Tiling), the
    launch thread 7 (alloc 5, launch 1, free 1)."""
    ops = [OpSpec(name=f"op{i}", device_us=0.1) for i in range(5)]
    run = three_op_run("async", ops=ops, alloc_us=5.0)
    return simulate_run(dataclasses.replace(run, strategy=StrategyConfig(dispatch=Dispatch["async"], queue_capacity=capacity)))


@pytest.mark.parametrize(
    "capacity, framework_starts, step_us",
    [
        # Op k's alloc starts at a_k; op k + C's framework waits for that alloc to end (a_k + 5).
        # C = 1: a_k = 4 + 8k (3 µs of main-thread work after each wait), frameworks at a_k + 5.
        (1, [1, 9, 17, 25, 33], 36 + 6 + 0.1),
        # C = 2: a_k = 4 + 7k (the launch thread is the bottleneck); framework 2 waits until 9 (a_0 + 5),
        # 3 until 16 (a_1 + 5), 4 until 23 (a_2 + 5).
        (2, [1, 4, 9, 16, 23], 32 + 6 + 0.1),
        # C = 3: framework 3 waits until 9, but the main thread is busy until 10; framework 4 until 16.
        (3, [1, 4, 7, 10, 16], 32 + 6 + 0.1),
        # C = 4: only framework 4 could wait (until 9); the main thread reaches it at 13.
        (4, [1, 4, 7, 10, 13], 32 + 6 + 0.1),
    ],
)
def test_queue_capacity_is_exact(capacity, framework_starts, step_us):
    outcome = queue_run(capacity)
    tasks = outcome.result.graph.tasks
    framework = (tasks["category"] == CATEGORY["framework"]) & (tasks["op"] >= 0)
    assert outcome.result.start_us[framework].tolist() == pytest.approx(framework_starts)
    # The last op's kernel ends at `step_us` (its alloc at a_4, + 5 + 1 launch, + 0.1 on the device);
    # then the sampled token's D2H and the 2 µs sync.
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(step_us + TOKEN_BACK_US + 2)


# ---------------------------------------------------------------- host threads (a pool of cores)


@pytest.mark.parametrize("threads, device_end_us", [(1, 26), (2, 22), (3, 22)])
def test_host_cores_at_the_number_of_host_threads(threads, device_end_us):
    """Async dispatch runs two host threads. With two cores or more the three-op step of test_semantics
    ends its last kernel at 22 µs. With one core every host task waits for it in the order it became
    ready: the main and the launch thread alternate (tasks ready at the same time go by task id, an
    op's alloc before the next op's framework), b's launch ends at 13, its kernel runs to 23 and c's
    to 26."""
    outcome = simulate_run(three_op_run("async", threads=threads))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(device_end_us + TOKEN_BACK_US + 2)
    launches = (outcome.result.graph.tasks["category"] == CATEGORY["launch"]) & (outcome.result.graph.tasks["op"] >= 0)
    expected_launch_ends = [7, 13, 18] if threads == 1 else [6, 9, 12]
    assert outcome.result.end_us[launches].tolist() == pytest.approx(expected_launch_ends)


# ---------------------------------------------------------------- fusion


@pytest.mark.parametrize(
    "max_ops, kernels",
    [(1, [1] * 7), (2, [1, 2, 2, 2]), (3, [1, 3, 3]), (4, [1, 4, 2]), (5, [1, 5, 1]), (6, [1, 6]), (7, [1, 6])],
)
def test_fusion_groups_hold_at_most_max_ops(max_ops, kernels):
    """A matmul, then six fusible vector ops: groups of at most `max_ops`, filled in order."""
    ops = [OpSpec(name="mm", kind=OpKind.cube, device_us=5.0)] + [OpSpec(name=f"v{i}", device_us=1.0) for i in range(6)]
    run = three_op_run("eager", ops=ops)
    workload = build_workload(run.workload)
    fused, _ = fuse(workload, max_ops, np.zeros(workload.n_ops, dtype=bool))
    assert fused.n_kernels.tolist() == kernels
    assert fused.device_us[0].tolist() == [5.0] + [float(k) for k in kernels[1:]]
    summary = simulate_run(dataclasses.replace(run, strategy=StrategyConfig(fusion=True, fusion_max_ops=max_ops))).summary
    assert summary["launches_per_step"] == len(kernels)


# ---------------------------------------------------------------- shape buckets and graph budgets


def test_bucket_edges():
    buckets = [1, 2, 4, 8]
    padded, fits = bucket_batch(np.array([1, 2, 3, 4, 5, 7, 8, 9]), buckets)
    assert padded.tolist() == [1, 2, 4, 4, 8, 8, 8, 9] and fits.tolist() == [True] * 7 + [False]
    # KV lengths padded up to a block: a multiple stays, one more goes to the next block.
    assert pad_up(np.array([255.0, 256.0, 257.0, 512.0]), 256).tolist() == [256.0, 256.0, 512.0, 512.0]


@pytest.mark.parametrize(
    "max_graphs, kept",
    [(1, [32]), (2, [1, 32]), (3, [1, 8, 32]), (6, [1, 2, 4, 16, 24, 32]), (7, [1, 2, 4, 8, 16, 24, 32]), (8, [1, 2, 4, 8, 16, 24, 32])],
)
def test_trim_buckets_keeps_exactly_the_budget_evenly(max_graphs, kept):
    """Seven sizes, positions 0..6 picked at rint(linspace(0, 6, n)): 3 → 0, 3, 6; 6 → 0, 1.2, 2.4, 3.6,
    4.8, 6 → 0, 1, 2, 4, 5, 6 (2.4 → 2, 3.6 → 4)."""
    assert trim_buckets([32, 1, 2, 4, 8, 16, 24, 2], max_graphs) == kept


def capture_plan(streams: int):
    """Capture/replay of Llama-3.1-8B decode (32 layers: a graph uses 33 streams) over batches 1, 2, 3, 5,
    8, 9 with capture sizes 1, 2, 4, 8."""
    run = compose_run("workload=llama31_8b_decode", "workload.steps=6", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4,8]",
                      f"hardware.graph.max_graphs={streams}")
    workload, plan = prepare(run, np.array([1, 2, 3, 5, 8, 9]), None)
    return workload, plan


@pytest.mark.parametrize(
    "streams, padded, modes",
    [
        # 131 streams: 3 graphs; the sizes are trimmed to 1, 4, 8 (positions rint(0, 1.5, 3) = 0, 2, 3).
        (131, [1, 4, 4, 8, 8, 9], [B, B, R, B, R, E]),
        # 132 or 133 streams: 4 graphs, every size kept; 9 sequences fit no graph and run eagerly.
        (132, [1, 2, 4, 8, 8, 9], [B, B, B, B, R, E]),
        (133, [1, 2, 4, 8, 8, 9], [B, B, B, B, R, E]),
    ],
)
def test_graph_count_follows_the_stream_budget(streams, padded, modes):
    workload, plan = capture_plan(streams)
    assert workload.batch.tolist() == padded and workload.real_batch.tolist() == [1, 2, 3, 5, 8, 9]
    assert plan.mode.tolist() == modes
    graphs = modes.count(B)
    assert plan.info["graph_captures"] == graphs and plan.info["graph_buckets"] == (3 if streams == 131 else 4)
    # The run says what trimming did (nothing when every size is kept), and that the batch of 9 ran eagerly.
    trimmed = ("3 of 4 capture sizes kept (1, 4, 8), trimmed evenly as vllm-ascend does: 131 streams (hardware.graph.max_graphs)"
               " hold 3 graphs of 32 layers + 1 = 33 streams; ")
    eager = "1 of 6 steps run eagerly: batch 9 is above the largest graph size (8) (strategy.graph.buckets)"
    assert plan.info.get("graph_note", "") == (trimmed if streams == 131 else "") + eager
    assert workload.memory.graphs_gb == pytest.approx(graphs * A2_GRAPH_MIB * MIB / 1e9)


@pytest.mark.parametrize("streams, graphs", [(65, 1), (66, 2), (98, 2), (99, 3)])
def test_sink_builds_graphs_in_program_order_while_the_budget_lasts(streams, graphs):
    """Graph sink of Llama-2-7B decode with KV lengths bucketed to 12 tokens: steps 0-7 attend over
    1025-1032 tokens (padded to 1032), 8-19 over 1033-1044 (1044), 20-31 over 1045-1056 (1056): three shape
    sets. A graph of 32 layers takes 33 streams: 65 streams allow 1 graph, 66-98 two, 99 three. A step
    whose shapes have a graph replays it; a new shape set builds one while the budget lasts, else the
    step runs on the host. (One batch size, 1: more would be trimmed to the budget, the largest kept.)"""
    outcome = simulate_run(compose_run("strategy=ge_sink", "strategy.shape_buckets=true", "strategy.kv_block=12", "strategy.graph.buckets=[1]",
                                       "workload.steps=32", f"hardware.graph.max_graphs={streams}"))
    first = {0: "build", 8: "build" if graphs >= 2 else "eager", 20: "build" if graphs >= 3 else "eager"}
    rest = {0: "replay", 8: "replay" if graphs >= 2 else "eager", 20: "replay" if graphs >= 3 else "eager"}
    expected = [first[s] if s in first else rest[max(k for k in first if k <= s)] for s in range(32)]
    steps = outcome.steps
    assert steps["mode"].tolist() == expected
    assert outcome.summary["graph_captures"] == graphs
    assert steps["padded_kv_len"].tolist() == [1032.0] * 8 + [1044.0] * 12 + [1056.0] * 12
    # Builds inside the measured window are left out of it (reported as capture_ms), the rest tiles it.
    built = steps["mode"] == "build"
    assert outcome.summary["window_ms"] == pytest.approx(steps["latency_ms"][~built & (steps["step"] > 0)].sum())
    assert outcome.summary["capture_ms"] == pytest.approx(steps["latency_ms"][built].sum())
    assert outcome.workload.memory.graphs_gb == pytest.approx(graphs * A2_GRAPH_MIB * MIB / 1e9)


@pytest.mark.parametrize(
    "max_batch, sizes, padded",
    # Every size up to the first that holds max_batch is captured (vLLM V0 pads max_num_seqs up to a
    # capture size, V1 captures up to twice it): 3 and 4 capture the 4-graph, 5 the 8-graph.
    [(3, [1, 2, 4], [1, 2, 4, 4]), (4, [1, 2, 4], [1, 2, 4, 4]), (5, [1, 2, 4, 8], [1, 2, 4, 8])],
)
def test_a_serving_engine_captures_every_size_up_to_the_one_holding_its_largest_batch(max_batch, sizes, padded):
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4,8]",
                      "workload.serving.enabled=true", f"workload.serving.max_batch={max_batch}", "workload.steps=4")
    workload, plan = prepare(run, np.array([1, 2, 3, max_batch]), None)
    assert plan.info["graph_captures"] == len(sizes)
    assert plan.info["capture_ms"] == pytest.approx(len(sizes) * run.hardware.graph.capture_ms)
    assert plan.mode.tolist() == [R, R, R, R]
    assert workload.batch.tolist() == padded
    assert workload.memory.graphs_gb == pytest.approx(len(sizes) * run.hardware.graph.graph_mem_mib * MIB / 1e9)



def test_start_up_captures_stop_at_the_stream_budget():
    """Llama-3.1-8B: 33 streams a graph; 99 streams hold 3 of the 4 sizes up to max_batch 8."""
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4,8]",
                      "workload.serving.enabled=true", "workload.serving.max_batch=8", "workload.steps=2", "hardware.graph.max_graphs=99")
    _, plan = prepare(run, np.array([1, 8]), None)
    assert plan.info["graph_buckets"] == 3  # 1, 4, 8 after trimming to 3
    assert plan.info["graph_captures"] == 3 and plan.mode.tolist() == [R, R]


def test_a_serving_engine_limits_its_sizes_by_its_largest_batch_before_the_budget_trims_them():
    """vLLM limits its capture sizes by max_num_seqs, then vllm-ascend trims what is left to the streams
    (update_aclgraph_sizes). Qwen3-30B-A3B on Atlas A2: 1,800 // 49 = 36 graphs; at max_batch 16 the
    engine asks for 1, 2, 4, 8, 16, all kept, and a batch of 4 runs its own graph. Trimming the 51 sizes
    first would keep 1, 2, 8, 16, … (4 dropped, batch 4 padded to 8)."""
    run = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "strategy=acl_graph", "workload.serving.enabled=true",
                      "workload.serving.max_batch=16", "workload.steps=2")
    assert len(run.strategy.graph.buckets) == 51
    workload, plan = prepare(run, np.array([4, 16]), None)
    assert plan.info["graph_buckets"] == plan.info["graph_captures"] == 5 and "graph_note" in plan.info
    assert "capture sizes kept" not in plan.info["graph_note"]  # nothing trimmed
    assert workload.batch.tolist() == [4, 16] and plan.mode.tolist() == [R, R]


# ---------------------------------------------------------------- HBM at exactly its capacity


def test_memory_fits_at_exactly_the_capacity_and_not_above():
    workload = build_workload(compose_run("workload.steps=2").workload)
    workload.memory = MemoryPlan(weights_gb=10.0, kv_cache_gb=50.0, workspace_gb=3.0, graphs_gb=1.0)
    check_memory(workload, 64.0)
    check_memory(workload, 64.001)
    with pytest.raises(ConfigError) as refused:
        check_memory(workload, 63.999)
    assert str(refused.value) == (
        "hardware.device.hbm_gb=63.999: llama2_7b_decode does not fit on one rank: weights 10.00 GB + KV cache 50.00 GB"
        " + workspace 3.00 GB + graphs 1.00 GB = 64.000 GB (raise workload.tp (an MoE's experts: workload.ep),"
        " use workload.quant=w8a8 or shrink workload.batch_size or workload.context_len)"
    )


def test_an_out_of_memory_message_names_only_remedies_that_shrink_the_rank():
    """Already W8A8: no advice to quantise; a serving run's sizes are its requests', not batch_size's; and
    never dp (it replicates a rank: a dense model's weights per rank do not shrink)."""
    workload = build_workload(compose_run("workload.steps=2").workload)
    workload.memory = MemoryPlan(weights_gb=70.0)
    quantised = compose_run("workload.steps=2", "workload.quant=w8a8", "workload.serving.enabled=true").workload
    with pytest.raises(ConfigError) as refused:
        check_memory(workload, 64.0, quantised)
    assert "quant" not in str(refused.value) and "dp" not in str(refused.value)
    assert str(refused.value).endswith("(raise workload.tp (an MoE's experts: workload.ep) or shrink workload.serving.max_batch"
                                       " or the requests' lengths (workload.serving.prompt_len_mean, output_len_mean))")


def test_the_steps_that_fit_count_the_graphs_a_run_keeps():
    """Llama-2-70B at TP 4 on an A100 (85.9 GB), batch 64 from 9,795 tokens, as CUDA graphs: the first step
    needs 85.8577 GB without its graph, each step 64 x 81,920 B = 5.24 MB more, and the graph 26 MiB =
    0.0273 GB: (85.9 - 85.8577 - 0.0273) / 0.00524 + 1 = 3 steps fit (it said 9, the graph left out, and
    8 steps were then refused by the HBM check without naming workload.steps)."""
    from harness.sim.policies import graphs_memory_gb
    from harness.sim.simulate import check_size, last_step

    base = ("hardware=a100", "workload=llama2_70b_decode", "workload.tp=4", "workload.batch_size=64", "workload.context_len=9795", "strategy=cuda_graph")
    run = compose_run(*base)
    assert graphs_memory_gb(run, last_step(run)) == pytest.approx(26 * 2**20 / 1e9, rel=1e-12)
    check_size(compose_run(*base, "workload.steps=3"))
    with pytest.raises(ConfigError, match=r"^workload.steps=4: .* \(about 3 steps fit\)$"):
        check_size(compose_run(*base, "workload.steps=4"))


@pytest.mark.parametrize("batch, padded_to", [(8, 8), (9, 16)])
def test_padding_rows_of_a_graph_hold_no_kv_cache(batch, padded_to):
    """Llama-3.1-8B keeps 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 B = 131,072 B a token. A batch of 9
    replays the 16-graph, but its 7 padding rows get a dummy slot and no cache: 9 × 1,025 × 131,072 B =
    1.2091392 GB at 1,025 tokens (16 rows would be 2.1495808 GB); at 8 the graph holds the batch exactly."""
    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "strategy.graph.buckets=[1,2,4,8,16]",
                      f"workload.batch_size={batch}", "workload.steps=1")
    workload, plan = prepare(run, np.array([batch]), np.array([1025.0]))
    assert workload.batch.tolist() == [padded_to] and workload.real_batch.tolist() == [batch]
    assert workload.memory.kv_cache_gb == pytest.approx(batch * 1025 * 131_072 / 1e9, rel=1e-12)


def test_a_padded_prefill_counts_only_its_real_prompts_tokens():
    """Three 128-token prompts replayed from a sunk graph built for 4 (ge_sink pads prefill too): each step
    runs 4 rows but produces 3 × 128 = 384 prompt tokens, and throughput counts those (it had counted 512:
    4/3 too high). Steps 1-3 are measured (step 0 builds the graph)."""
    outcome = simulate_run(compose_run("workload=llama2_7b_prefill", "strategy=ge_sink", "workload.batch_size=3", "workload.context_len=128",
                                       "workload.steps=4", "+workload.card_overrides.num_hidden_layers=1"))
    steps = outcome.steps
    assert steps["padded_batch"].tolist() == [4] * 4 and steps["tokens"].tolist() == [384] * 4
    assert outcome.summary["throughput_tok_s"] == pytest.approx(3 * 384 / (outcome.summary["window_ms"] / 1e3), rel=1e-12)


def test_a_configuration_tensorrt_llm_ran_on_an_a100_80gb_fits_its_preset():
    """TensorRT-LLM ran Llama-2-7B in FP16 at batch 52 with 2,048-token prompts on one A100 80GB (its
    docs/source/performance.md, v0.6.1: 591 tok/s). By hand, the prompts' forward: weights 6,738,415,616 × 2 B
    = 13.476831232 GB; KV cache 52 × 2,048 tokens × 524,288 B = 55.834574848 GB; workspace twice the largest
    op's activations, SiLU-and-mul over 106,496 tokens × 11,008 × 3 tensors × 2 B: 14.067695616 GB; 83.38 GB
    in all. The card holds 81,920 MiB = 85.90 GB; read as 80 GB of 1e9 bytes (its datasheet's GiB) the run
    was refused."""
    run = compose_run("hardware=a100", "workload=llama2_7b_prefill", "workload.batch_size=52", "workload.context_len=2048", "workload.steps=2")
    workload = build_workload(run.workload)
    assert dataclasses.astuple(workload.memory) == pytest.approx((13.476831232, 55.834574848, 14.067695616, 0.0), rel=1e-12)
    assert run.hardware.device.hbm_gb == pytest.approx(81_920 * 2**20 / 1e9, abs=0.05)
    check_memory(workload, run.hardware.device.hbm_gb)
    with pytest.raises(ConfigError, match=r"^hardware\.device\.hbm_gb=80: .* = 83\.379 GB"):
        check_memory(workload, 80.0)


def test_llama2_70b_at_tp4_holds_a_quarter_of_the_weights_and_two_kv_heads_a_rank():
    """TensorRT-LLM ran Llama-2-70B in FP16 at TP 4, batch 120, 2,048-token prompts on A100 80GBs (its
    docs/source/performance.md, v0.6.1: 79 tok/s a GPU). By hand, per rank: a layer's q, k, v, o (8192 x
    8192, 8192 x 1024 twice, 8192 x 8192) and MLP (3 x 8192 x 28672) weights, 855,638,016, split 4 ways,
    plus its two norms (16,384) unsplit: 213,925,888 x 80 layers; the embedding and the LM head (32,000 x
    8,192 each) split 4 ways, the final norm (8,192) not: 17,245,151,232 params x 2 B = 34.490302464 GB.
    KV cache: 8 KV heads over 4 ranks = 2 a rank, K and V of 128 values each in 80 layers: 81,920 B a token,
    x 120 x 2,048 tokens = 20.1326592 GB. Workspace: twice the largest activation, the residual add over
    245,760 tokens x 8,192 x 3 tensors x 2 B = 24.15919104 GB. 78.78 GB in all: it fits 80 GB."""
    run = compose_run("hardware=a100", "workload=llama2_70b_prefill", "workload.batch_size=120", "workload.context_len=2048", "workload.steps=2")
    workload = build_workload(run.workload)
    assert dataclasses.astuple(workload.memory) == pytest.approx((34.490302464, 20.1326592, 24.15919104, 0.0), rel=1e-12)
    check_memory(workload, 80.0)
    with pytest.raises(ConfigError, match=r"^hardware\.device\.hbm_gb=78\.7: .* = 78\.782 GB"):
        check_memory(workload, 78.7)

@pytest.mark.parametrize("strategy", ["eager", "acl_graph"])
def test_a_run_fits_hbm_at_its_exact_footprint(strategy):
    """The footprint checked is weights + KV cache + workspace + the captured graphs (the preset's graph_mem_mib each).
    Eagerly or with graphs, a byte less is refused naming workload.steps: the last step's KV cache is what
    overflows (with graphs it was refused naming only the HBM: the steps that fit left the graph out)."""
    base = ("workload=llama31_8b_decode", f"strategy={strategy}", "workload.steps=3")
    run = compose_run(*base)
    workload, _ = prepare(run, np.full(3, 1), None)
    footprint = workload.memory.total_gb
    graphs = A2_GRAPH_MIB * MIB / 1e9 if strategy == "acl_graph" else 0.0
    assert workload.memory.graphs_gb == pytest.approx(graphs)
    simulate_run(compose_run(*base, f"hardware.device.hbm_gb={footprint!r}"))
    with pytest.raises(ConfigError, match=r"^workload\.steps=3: the KV cache grows .* hardware\.device\.hbm_gb=.* \(about 2 steps fit\)$"):
        simulate_run(compose_run(*base, f"hardware.device.hbm_gb={footprint - 1e-6!r}"))


# ---------------------------------------------------------------- warm-up


def test_a_run_of_graph_builds_alone_says_its_figures_include_them():
    """Graph sink at one step: the only step loads its graph (1,000 ms on atlas_a2), so it is measured
    rather than nothing and TTFT holds the load; the summary says so (it did not). Three steps measure
    the replays and say nothing of it."""
    one = simulate_run(compose_run("workload=llama2_7b_prefill", "strategy=ge_sink", "workload.steps=1")).summary
    assert one["ttft_ms"] == pytest.approx(one["capture_ms"]) and one["ttft_ms"] > 1000
    assert one["steps_note"].startswith("every measured step builds its graph: the figures include the capture or load")
    # The terminal said "the figures include the capture" and then "built in ... (outside the steady state above)".
    from pathlib import Path

    from harness.results.outputs import format_summary

    names = {"hardware": "atlas_a2", "workload": "llama2_7b_prefill", "strategy": "ge_sink"}
    assert "(in the figures above: no step replays)" in format_summary(one, names, Path("run"))
    three = simulate_run(compose_run("workload=llama2_7b_prefill", "strategy=ge_sink", "workload.steps=3")).summary
    assert three["ttft_ms"] < 200 and "builds its graph" not in three.get("steps_note", "")
    assert "(outside the steady state above)" in format_summary(three, names, Path("run"))


@pytest.mark.parametrize("warmup, measured", [(0, 4), (3, 1)])
def test_warmup_leaves_at_least_one_measured_step(warmup, measured):
    outcome = simulate_run(compose_run("workload.steps=4", f"workload.warmup_steps={warmup}"))
    assert outcome.summary["steps_measured"] == measured
    assert outcome.steps["measured"].tolist() == [False] * warmup + [True] * measured
    with pytest.raises(ConfigError, match="workload.warmup_steps=4: must be < workload.steps=4"):
        compose_run("workload.steps=4", "workload.warmup_steps=4")


# Llama-2-7B decode, one sequence of 1,024 prompt tokens, on atlas_a2's 64 GiB (the defaults: 68.72 GB of 1e9
# bytes). By hand: weights 6,738,415,616 parameters × 2 B = 13.476831232 GB; the KV cache 2 (K, V) × 32 layers
# × 32 heads × 128 × 2 B = 524,288 B a token; the workspace twice the largest op's activations, the LM head's
# (it reads the 4,096-wide hidden state and writes 32,000 logits, float16): 2 × 72,192 B. Attention's read of
# the cache is not an activation: the cache is counted once. Step s attends over 1,024 + s + 1 tokens, so
# 13.476831232e9 + 524,288 kv + 144,384 <= 68.72e9 holds up to kv = 105,367: s <= 104,342, 104,343 steps.
KV_STEPS_FIT = 104_343


@pytest.mark.parametrize("steps, fits", [(KV_STEPS_FIT - 1, True), (KV_STEPS_FIT, True), (KV_STEPS_FIT + 1, False)])
def test_a_decode_run_is_refused_when_its_kv_cache_outgrows_hbm_by_its_last_step(steps, fits, monkeypatch):
    import harness.sim.simulate as run_module

    monkeypatch.setattr(run_module, "available_memory_bytes", lambda: 1e15)  # the host's memory is not the question
    run = compose_run(f"workload.steps={steps}")
    assert run_module.steps_the_kv_cache_allows(run) == KV_STEPS_FIT
    if fits:
        run_module.check_size(run)
    else:
        with pytest.raises(ConfigError) as refused:
            run_module.check_size(run)
        assert str(refused.value) == (
            f"workload.steps={steps}: the KV cache grows by a token a step, to {1024 + steps:,} tokens a sequence at the last"
            f" step: 68.720 GB with hardware.device.hbm_gb=68.72 (about {KV_STEPS_FIT:,} steps fit)"
        )


@pytest.mark.parametrize(
    "max_graphs, tp, dp, expected",
    [
        # vllm-ascend's accounting (vllm_ascend/utils.py update_aclgraph_sizes, v0.10.2rc1-v0.20.2rc1), 48
        # layers: a graph takes 49 streams, tripled by one communication group (TP 4), plus 40 held apart.
        (1800, 4, 1, 11),  # floor((1800 - 40) / 49 / 3) = floor(11.97): the 11 of vllm-ascend#4807's log
        (40 + 11 * 49 * 3, 4, 1, 11),  # 1657 streams: exactly 11 graphs
        (40 + 11 * 49 * 3 - 1, 4, 1, 10),  # one stream fewer: 10
        (1800, 4, 4, 7),  # TP and DP: two groups, floor((1800 - 80) / 49 / 5) = floor(7.02)
        (1800, 1, 1, 36),  # no group: floor(1800 / 49)
        (10, 4, 4, 1),  # never fewer than one graph
    ],
)
def test_the_graph_budget_counts_communication_groups(max_graphs, tp, dp, expected):
    from harness.config.schema import GraphCostConfig, WorkloadConfig
    from harness.sim.policies import graph_budget

    costs = GraphCostConfig(max_graphs=max_graphs, comm_group_streams=2, comm_group_reserved_streams=40)
    assert graph_budget(costs, 48, WorkloadConfig(tp=tp, dp=dp)) == expected
