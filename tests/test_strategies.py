"""Graph modes and host policies: each mechanism pinned on a small case, and the seeds' headline effects."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import compose_run
from harness.config.schema import Dispatch, Fallback, GraphMode, GraphStrategyConfig, OpKind, OpSpec, Phase, StrategyConfig
from harness.model.device import copy_time_us, device_times
from harness.base.errors import ConfigError
from harness.sim.task_graph import CATEGORY
from harness.sim.metrics import HOST_CATEGORIES, LAUNCH_STAGE
from harness.sim.policies import BUILD, EAGER, REPLAY, fuse, prepare, trim_buckets
from harness.sim.outcome import without_wall_clock
from harness.sim.simulate import simulate_run
from harness.model.workload import build_workload
from test_semantics import LINK, THREE_OPS, TOKEN_BACK_US, three_op_run

GRAPH_COSTS = dict(capture_ms=1.0, replay_launch_us=10.0, task_dispatch_us=0.5, param_update_us=7.0, sink_load_ms=2.0,
                   sink_trigger_us=4.0, address_update_us=3.0)


def graph_run(mode: str, ops=THREE_OPS, steps: int = 4, **strategy):
    run = three_op_run("eager", ops=ops, steps=steps)
    hardware = dataclasses.replace(run.hardware, graph=dataclasses.replace(run.hardware.graph, **GRAPH_COSTS))
    graph = GraphStrategyConfig(mode=GraphMode[mode], phases=[Phase.decode])
    return dataclasses.replace(run, hardware=hardware, strategy=StrategyConfig(dispatch=Dispatch.eager, graph=graph, **strategy))


def test_capture_once_then_replay_hand_computed():
    outcome = simulate_run(graph_run("capture"))
    steps = outcome.steps
    assert steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert outcome.summary["graph_captures"] == 1
    eager_step_us = 25 + TOKEN_BACK_US + 2  # the hand-computed eager step of test_semantics
    assert steps["latency_ms"][0] * 1e3 == pytest.approx(eager_step_us + 1000.0)  # + capture
    # Replay: h2d issue [0,1], one replay launch [1,11], then a, b, c back to back on the device,
    # each + 0.5 µs of device-side dispatch: 15 + 1.5; then the tokens' D2H and a 2 µs sync.
    replay_us = 1 + 10 + 15 + 1.5 + TOKEN_BACK_US + 2
    assert steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([replay_us] * 3)
    # Steady state leaves the capture out; it is reported on its own.
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(replay_us)
    assert outcome.summary["capture_ms"] == pytest.approx(steps["latency_ms"][0])
    assert outcome.summary["steps_measured"] == 3
    # One launch call a replay, the graph's trigger: on the main thread, jittered like any host work,
    # and for no one op (the trace names it after the step).
    assert steps["launches"].tolist() == [3, 1, 1, 1]
    tasks = outcome.result.graph.tasks
    trigger = tasks[(tasks["step"] == 1) & (tasks["stage"] == LAUNCH_STAGE)]
    assert trigger[["op", "lane", "pool"]].tolist() == [(-1, 0, 0)]


def test_replay_refreshes_dynamic_tasks_in_place():
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="attn", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0)]
    static = simulate_run(graph_run("capture")).summary["step_ms_mean"]
    dynamic = simulate_run(graph_run("capture", ops=ops)).summary["step_ms_mean"]
    assert (dynamic - static) * 1e3 == pytest.approx(7.0)  # one param update before the replay launch


def piecewise_run(splitting_ops: list[str], ops=THREE_OPS, steps: int = 4, **strategy):
    run = graph_run("capture", ops=ops, steps=steps, **strategy)
    graph = dataclasses.replace(run.strategy.graph, splitting_ops=splitting_ops)
    return dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=graph))


def test_a_piecewise_replay_launches_each_piece_and_the_split_op_eagerly_hand_computed():
    """b is a splitting op (vLLM's attention in piecewise CUDA graphs): a replay is piece [a], b eagerly,
    piece [c]. b is dynamic: its arguments are refreshed before the first launch, as in a whole-graph
    replay (the step's attention metadata is built either way). Host: h2d issue [0,1], refresh [1,8],
    trigger [8,18], b's six stages [18,24] (launch ends 23), trigger [24,34]. Device: a [18,20.5] (+0.5
    graph dispatch), b [23,33] (no gap on this preset's eager kernels), c [34,37.5]."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0)]
    outcome = simulate_run(piecewise_run(["b"], ops=ops))
    steps = outcome.steps
    assert steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([37.5 + TOKEN_BACK_US + 2] * 3)
    assert steps["launches"].tolist() == [3, 3, 3, 3]  # two triggers and b's own launch
    assert outcome.summary["graph_pieces"] == 2
    assert outcome.summary["graph_note"] == "piecewise: 2 graph pieces a step, 1 ops run eagerly between them"
    tasks = outcome.result.graph.tasks
    replayed = tasks[tasks["step"] == 1]
    assert sorted(replayed["op"][replayed["stage"] > 0].tolist()) == [-1, -1, 1, 1, 1, 1, 1, 1]  # triggers, b's stages


def test_leaving_a_graph_delays_the_eager_kernel_after_a_piece_hand_computed():
    """The piecewise step above with a 4 µs graph exit gap: b, the eager kernel after piece [a], holds
    its stream 10 + 4 µs, [23,37] (its work from 27); piece [c], triggered at 34, waits for it: [37,40.5],
    3 µs later.
    A whole-graph replay and an eager step hold no kernel launched alone after a graph's: unchanged."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0)]

    def exiting(run):
        graph = dataclasses.replace(run.hardware.graph, exit_gap_us=4.0)
        return dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, graph=graph))

    steps = simulate_run(exiting(piecewise_run(["b"], ops=ops))).steps
    assert steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([40.5 + TOKEN_BACK_US + 2] * 3)
    # The gaps hold the stream but are device idle: the device works 2 + 10 + 3 µs, and idles 0.5 + 4 + 0.5
    # of them in front-end gaps (a's and c's dispatch, b's exit gap).
    assert steps["device_busy_ms"][1:].to_numpy() * 1e3 == pytest.approx([15.0] * 3)
    assert steps["front_end_idle_ms"][1:].to_numpy() * 1e3 == pytest.approx([5.0] * 3)
    for run in (graph_run("capture", ops=ops), three_op_run("eager")):
        assert simulate_run(exiting(run)).summary["step_ms_mean"] == simulate_run(run).summary["step_ms_mean"]


def test_a_piecewise_replay_refreshing_after_launch_hand_computed():
    """vllm-ascend's order (refresh_after_launch): each refresh follows its piece's launch, a split op's
    precedes its own stages, and a task waits for its own refresh. b (split) and c are dynamic. Host: h2d
    issue [0,1], trigger [1,11], b's refresh [11,18], b's stages [18,24] (launch ends 23), trigger [24,34],
    c's refresh [34,41]. Device: a [11,13.5], b [23,33], c waits for its refresh: [41,44.5]."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0, dynamic=True)]
    run = piecewise_run(["b"], ops=ops)
    graph = dataclasses.replace(run.strategy.graph, refresh_after_launch=True)
    outcome = simulate_run(dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=graph)))
    assert outcome.steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([44.5 + TOKEN_BACK_US + 2] * 3)


def test_the_tiling_cache_serves_the_ops_a_piecewise_replay_launches_eagerly():
    """Step 0 (build) looks up a, b and c: three misses; each replay looks up b alone, which runs its host
    stages between the pieces: three hits. The rate is the measured steps' (the build step is not one,
    as for every other figure): 3 of 3."""
    run = piecewise_run(["b"], tiling_cache=True)
    workload, plan = prepare(run, np.ones(4, dtype=np.int64), None)
    assert plan.info["tiling_cache_hit_rate"] == 1.0
    assert plan.tiling_hit.tolist() == [[False, False, False], [False, True, False], [False, True, False], [False, True, False]]


def test_splitting_ops_without_a_captured_graph_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^strategy.graph.splitting_ops=\['attention'\]: splits a captured graph into pieces: it needs strategy.graph.mode=capture \(here none\)$"):
        compose_run("strategy=eager", "strategy.graph.splitting_ops=[attention]")


def test_splitting_ops_that_are_not_in_the_workload_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^strategy.graph.splitting_ops=\['attention'\]: no op of type attention in this workload \(types: a, b, c\)$"):
        simulate_run(piecewise_run(["attention"]))
    # One of the list present is enough; a type that no card has is a typo even beside one that is present.
    assert simulate_run(piecewise_run(["b", "mla_attention"])).summary["launches_per_step"] == simulate_run(piecewise_run(["b"])).summary["launches_per_step"]
    with pytest.raises(ConfigError, match=r"^strategy.graph.splitting_ops=\['b', 'atention'\]: no op of type atention in this workload"):
        simulate_run(piecewise_run(["b", "atention"]))


@pytest.mark.parametrize("hardware", ["h100", "b200", "mi300x"])
def test_the_piecewise_preset_splits_mla_attention_as_vllm_does(hardware):
    """strategy=cuda_graph_piecewise named only `attention`: DeepSeek's is `mla_attention`, and every GPU
    refused the pair (a sweep holding it, whole). One piece a layer plus one, either kind."""
    for workload, layers in (("deepseek_v3", 61), ("llama31_8b_decode", 32)):
        run = compose_run(f"hardware={hardware}", f"workload={workload}", "strategy=cuda_graph_piecewise", "workload.steps=2")
        # layers + 1 graph pieces with each layer's attention launched alone between them
        assert simulate_run(run).summary["launches_per_step"] == 2 * layers + 1


def test_sink_loads_once_and_triggers():
    outcome = simulate_run(graph_run("sink"))
    assert outcome.steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert outcome.steps["latency_ms"][0] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2 + 2000.0)
    # issue [0,1], address update [1,4], trigger [4,8], device 16.5, D2H, sync.
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(1 + 3 + 4 + 16.5 + TOKEN_BACK_US + 2)


def test_sink_refuses_dynamic_shapes_and_says_why():
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="attn", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0)]
    outcome = simulate_run(graph_run("sink", ops=ops, steps=6))
    assert set(outcome.steps["mode"]) == {"eager"}
    assert "attn" in outcome.summary["graph_note"] and "static" in outcome.summary["graph_note"]
    run = graph_run("sink", ops=ops, steps=6)
    strict = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=dataclasses.replace(run.strategy.graph, dynamic_fallback=Fallback.error)))
    with pytest.raises(ConfigError, match="strategy.graph.mode=sink"):
        simulate_run(strict)


def test_compute_dependent_op_keeps_steps_eager():
    ops = [OpSpec(name="unique", device_us=2.0, compute_dependent=True), OpSpec(name="b", device_us=1.0)]
    outcome = simulate_run(graph_run("capture", ops=ops))
    assert set(outcome.steps["mode"]) == {"eager"} and "compute-dependent" in outcome.summary["graph_note"]


def test_ops_on_host_cores_keep_steps_eager_and_on_the_cpu():
    """A graph holds device work only: with sampling on a host core (strategy.heterogeneous) a capture falls
    back to host scheduling and says so, and every step computes sampling on the CPU (the replays had run it
    as a device kernel inside the graph, the build step on the CPU, unsaid)."""
    ops = [OpSpec(name="x.a", device_us=2.0), OpSpec(name="x.sampling", flops=1e6, bytes=64_000, device_us=10.0), OpSpec(name="x.c", device_us=3.0)]
    run = graph_run("capture", ops=ops, steps=3)
    run = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, heterogeneous=["sampling"]))
    outcome = simulate_run(run)
    assert set(outcome.steps["mode"]) == {"eager"}
    assert outcome.summary["graph_note"] == ("capture falls back to host scheduling: ops run on host cores (strategy.heterogeneous)"
                                             " cannot be in a graph (x.sampling)")
    assert (outcome.steps["host.cpu_ops_busy_ms"] > 0).all()
    assert outcome.summary["ops_per_step"] == 2 and outcome.summary["launches_per_step"] == 2  # sampling is no kernel
    strict = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=dataclasses.replace(run.strategy.graph, dynamic_fallback=Fallback.error)))
    with pytest.raises(ConfigError, match=r"^strategy.graph.mode=capture: ops run on host cores"):
        simulate_run(strict)


def test_a_phase_left_out_of_the_graph_phases_runs_eagerly_and_says_so():
    """A prefill under cuda_graph launches its ops one by one (strategy.graph.phases defaults to decode);
    the summary says so instead of reporting an eager step as a graph strategy's."""
    run = ["hardware=h200", "workload=qwen25_7b_prefill", "workload.context_len=128", "workload.steps=2", "strategy=cuda_graph"]
    outcome = simulate_run(compose_run(*run))
    eager = outcome.summary
    assert eager["graph_note"] == "prefill runs eagerly: strategy.graph.phases=[decode] (add prefill to run it as a graph)"
    assert set(outcome.steps["mode"]) == {"eager"}
    graphed = simulate_run(compose_run(*run, "strategy.graph.phases=[decode,prefill]"))
    assert "graph_note" not in graphed.summary and set(graphed.steps["mode"]) == {"build", "replay"}
    assert graphed.summary["step_ms_mean"] < eager["step_ms_mean"]


def test_batches_pad_to_buckets_and_waste_is_padded_minus_real():
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "workload.batch_size=5", "workload.steps=4")
    workload, plan = prepare(run, np.full(4, 5), None)
    assert workload.batch.tolist() == [8] * 4 and workload.real_batch.tolist() == [5] * 4
    padded = device_times(workload, run.hardware)[0].sum()
    real = device_times(build_workload(run.workload), run.hardware)[0].sum()
    assert plan.info["padding_waste"] == pytest.approx((padded - real) / padded)
    outcome = simulate_run(run)
    assert outcome.summary["padding_waste"] > 0
    # Throughput counts the 5 real sequences, not the 8 slots.
    assert outcome.summary["throughput_tok_s"] == pytest.approx(5 * 3 / (outcome.summary["window_ms"] / 1e3))


def test_batch_above_the_largest_bucket_runs_eagerly_and_buckets_trim_to_the_graph_budget():
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "strategy.graph.buckets=[1,2,4]", "workload.batch_size=6",
                      "workload.steps=3")
    assert set(simulate_run(run).steps["mode"]) == {"eager"}
    assert trim_buckets([1, 2, 4, 8, 16, 24, 32], 3) == [1, 8, 32]  # evenly over the list, ends kept
    budget = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "hardware.graph.max_graphs=99", "workload.steps=2")
    workload, plan = prepare(budget, np.full(2, 1), None)
    assert plan.info["graph_buckets"] == 3  # 99 streams / (32 layers + 1) per graph
    # vLLM's 51 sizes trimmed to positions 0, 25, 50: 1, 184, 512; a batch of 1 keeps its own graph.
    assert trim_buckets(list(budget.strategy.graph.buckets), 3) == [1, 184, 512] and workload.batch.tolist() == [1, 1]


def test_a_serving_run_captures_its_buckets_at_start_up_and_only_replays():
    run = compose_run("workload=llama31_8b_decode", "strategy=acl_graph", "workload.serving.enabled=true", "workload.steps=40",
                      "workload.serving.arrival_rate_rps=100", "workload.serving.output_len_mean=16")
    outcome = simulate_run(run)
    steps = outcome.steps
    # Like vLLM: every capture size up to the engine's largest batch, before the first request.
    sizes = [b for b in sorted(run.strategy.graph.buckets) if b <= run.workload.serving.max_batch]
    assert outcome.summary["graph_captures"] == len(sizes) > 1
    assert outcome.summary["capture_ms"] == pytest.approx(len(sizes) * run.hardware.graph.capture_ms)
    assert (steps["mode"] == "build").sum() == 0 and (steps["mode"] == "replay").sum() > 0
    replayed = steps["padded_batch"][steps["mode"] == "replay"]
    assert set(replayed) <= set(sizes) and len(set(replayed)) > 1
    assert np.all(steps["padded_batch"] >= steps["batch"])
    # Each captured graph holds device memory, visited by the request stream or not.
    m = outcome.workload.memory
    assert outcome.summary["peak_mem_gb"] == pytest.approx(m.weights_gb + m.kv_cache_gb + m.graphs_gb + outcome.summary["peak_activation_gb"])
    assert m.graphs_gb == pytest.approx(len(sizes) * run.hardware.graph.graph_mem_mib * 2**20 / 1e9)


def test_acl_graph_is_several_times_faster_on_the_moe_presets():
    for preset in ("deepseek_v3", "qwen3_30b_decode"):
        eager = simulate_run(compose_run(f"workload={preset}", "strategy=eager", "workload.steps=4")).summary
        graph = simulate_run(compose_run(f"workload={preset}", "strategy=acl_graph", "workload.steps=4")).summary
        assert graph["throughput_tok_s"] > 3 * eager["throughput_tok_s"]
        assert graph["graph_captures"] == 1 and graph["bubble_ratio"] < eager["bubble_ratio"]
        assert "padding_waste" in graph and "capture_ms" in graph


def test_capture_keeps_the_communication_overlap():
    outcome = simulate_run(compose_run("workload=deepseek_v3", "strategy=acl_graph", "workload.steps=3"))
    graph, start, end = outcome.result.graph, outcome.result.start_us, outcome.result.end_us
    tasks, names = graph.tasks, graph.op_names
    device = (tasks["category"] == CATEGORY["compute"]) | (tasks["category"] == CATEGORY["comm"])

    def task_of(op_name):
        return int(np.flatnonzero(device & (tasks["op"] == names.index(op_name)) & (tasks["step"] == 2))[0])

    assert start[task_of("layers.20.shared_gate_up")] < end[task_of("layers.20.moe_dispatch")]


def test_tiling_cache_hits_with_buckets_and_cuts_tiling():
    runs = {}
    for buckets in ("false", "true"):
        runs[buckets] = simulate_run(compose_run("workload=qwen3_30b_decode", "strategy=tiling_cache", f"strategy.shape_buckets={buckets}",
                                                 "workload.steps=16")).summary
    assert runs["false"]["tiling_cache_hit_rate"] < 0.7 < 0.9 < runs["true"]["tiling_cache_hit_rate"]
    assert runs["true"]["breakdown_tiling"] < runs["false"]["breakdown_tiling"]
    eager = simulate_run(compose_run("workload=qwen3_30b_decode", "strategy=eager", "workload.steps=16")).summary
    assert runs["false"]["breakdown_tiling"] < 0.5 * eager["breakdown_tiling"]  # host tiling -50% or more (seed 001)


def test_tiling_cache_hit_costs_a_lookup():
    run = dataclasses.replace(three_op_run("eager", steps=3), strategy=StrategyConfig(tiling_cache=True))
    outcome = simulate_run(run)
    tasks, dur = outcome.result.graph.tasks, outcome.result.end_us - outcome.result.start_us
    tiling = tasks["category"] == CATEGORY["tiling"]
    # Static shapes: step 0 misses (1 µs tiling), steps 1 and 2 hit (lookup, 1 µs by default here too).
    assert outcome.summary["tiling_cache_hit_rate"] == pytest.approx(6 / 9)
    lookup = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, host=dataclasses.replace(run.hardware.host, tiling_lookup_us=0.25)))
    dur2 = simulate_run(lookup)
    t2 = dur2.result.end_us - dur2.result.start_us
    assert t2[tiling & (tasks["step"] == 0)].tolist() == [1.0] * 3 and t2[tiling & (tasks["step"] > 0)].tolist() == [0.25] * 6
    assert dur[tiling].size == 9


def test_fusion_merges_vector_runs_and_packing_cuts_launch_cost():
    ops = [OpSpec(name="mm", kind=OpKind.cube, device_us=5.0)] + [OpSpec(name=f"v{i}", device_us=1.0) for i in range(3)]
    run = three_op_run("eager", ops=ops)
    workload = build_workload(run.workload)
    fused, _ = fuse(workload, 4, np.zeros(workload.n_ops, dtype=bool))
    assert fused.op_names == ["mm", "v0+v1+v2"] and fused.n_kernels.tolist() == [1, 3]
    assert fused.device_us[0].tolist() == [5.0, 3.0]

    def launch_us(**strategy):
        outcome = simulate_run(dataclasses.replace(run, strategy=StrategyConfig(**strategy)))
        tasks = outcome.result.graph.tasks
        launches = (tasks["category"] == CATEGORY["launch"]) & (tasks["op"] >= 0)
        return (outcome.result.end_us - outcome.result.start_us)[launches].tolist(), outcome.summary

    # Realistic launch numbers (the unit host costs of the hand-computed cases write no parameters).
    host = dataclasses.replace(run.hardware.host, launch_us=12.0, kernel_params=10, param_write_us=1.0, packed_params_us=5.0)
    run = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, host=host))
    plain, s_plain = launch_us()
    assert plain == [12.0] * 4
    fused_launch, s_fused = launch_us(fusion=True)
    assert fused_launch == [12.0, 32.0]  # 2 µs call + 30 parameters written one by one
    packed, s_packed = launch_us(fusion=True, param_packing=True)
    assert packed == [7.0, 7.0]  # 2 µs call + 5 µs packed write
    assert s_fused["launches_per_step"] < s_plain["launches_per_step"]
    assert s_packed["step_ms_mean"] < s_fused["step_ms_mean"]


def test_fusion_gain_on_a_preset_exceeds_15_percent_of_scheduling():
    eager = simulate_run(compose_run("workload=qwen25_7b_decode", "strategy=eager", "workload.steps=4")).summary
    fused = simulate_run(compose_run("workload=qwen25_7b_decode", "strategy=eager", "strategy.fusion=true", "strategy.param_packing=true",
                                     "workload.steps=4")).summary
    host_ms = lambda s: s["step_ms_mean"] * sum(s[f"breakdown_{c}"] for c in HOST_CATEGORIES)  # noqa: E731
    assert host_ms(fused) < 0.85 * host_ms(eager)


def test_memory_pool_and_stream_local_pool_costs():
    base = three_op_run("eager")

    def alloc_us(**strategy):
        outcome = simulate_run(dataclasses.replace(base, strategy=StrategyConfig(**strategy)))
        tasks = outcome.result.graph.tasks
        return set((outcome.result.end_us - outcome.result.start_us)[tasks["category"] == CATEGORY["alloc"]].round(9).tolist())

    assert alloc_us() == {1.0}
    assert alloc_us(memory_pool=False) == {base.hardware.host.driver_alloc_us}
    assert alloc_us(stream_local_pool=True) == {0.8}  # seed 003: ~20 % cheaper


def test_heterogeneous_op_runs_on_a_host_core():
    run = compose_run("workload=llama31_8b_decode", "strategy=mindspore", "workload.steps=2")
    outcome = simulate_run(run)
    graph = outcome.result.graph
    cpu_lane = graph.lane_names.index("host.cpu_ops")
    on_cpu = graph.tasks["lane"] == cpu_lane
    assert on_cpu.sum() == 2 and set(graph.tasks["category"][on_cpu]) == {CATEGORY["cpu"]}
    sampling = graph.op_names.index("sampling")
    assert not np.any((graph.tasks["op"] == sampling) & (graph.tasks["category"] == CATEGORY["compute"]))
    assert np.all(graph.tasks["pool"][on_cpu] == 0)  # competes for the host cores
    with pytest.raises(ConfigError, match="strategy.heterogeneous"):
        simulate_run(compose_run("workload=llama31_8b_decode", "strategy.heterogeneous=[teleport]"))


def test_mindspore_gains_about_30_percent_when_host_bound():
    eager = simulate_run(compose_run("workload=deepseek_v3", "strategy=eager", "workload.steps=4")).summary
    ms = simulate_run(compose_run("workload=deepseek_v3", "strategy=mindspore", "workload.steps=4")).summary
    assert 1.15 < ms["throughput_tok_s"] / eager["throughput_tok_s"] < 1.6


def test_ge_sink_beats_host_scheduling_on_static_shapes():
    eager = simulate_run(compose_run("workload=qwen25_7b_decode", "strategy=eager", "strategy.shape_buckets=true", "workload.steps=16")).summary
    sink = simulate_run(compose_run("workload=qwen25_7b_decode", "strategy=ge_sink", "strategy.shape_buckets=true", "workload.steps=16")).summary
    assert sink["throughput_tok_s"] > 1.2 * eager["throughput_tok_s"]
    assert sink["host_cpu_load"] < 0.7 * eager["host_cpu_load"]  # seed 001: host CPU load -30 % or more
    assert "graph_note" not in sink


@pytest.mark.parametrize("switch", ["strategy.graph.buckets=[1,3]", "strategy.tiling_cache_entries=7", "strategy.fusion_max_ops=9",
                                    "strategy.kv_block=64", "hardware.graph.capture_ms=1"])
def test_a_disabled_switch_changes_nothing(switch):
    base = simulate_run(compose_run("workload=qwen25_7b_decode", "workload.steps=3")).summary
    other = simulate_run(compose_run("workload=qwen25_7b_decode", "workload.steps=3", switch)).summary
    assert without_wall_clock(base) == without_wall_clock(other)


def test_graph_modes_leave_prefill_eager_by_default():
    outcome = simulate_run(compose_run("workload=qwen25_7b_prefill", "strategy=acl_graph", "workload.steps=2"))
    assert set(outcome.steps["mode"]) == {"eager"} and "graph_captures" not in outcome.summary
    assert copy_time_us(0, LINK) == LINK.pcie_latency_us
    assert EAGER == 0 and BUILD == 1 and REPLAY == 2


def test_frees_on_another_thread_raise_peak_memory():
    def peak(*overrides):
        return simulate_run(compose_run("workload=qwen25_7b_decode", "workload.batch_size=8", "workload.steps=2", *overrides)).summary

    same = peak("strategy=async")
    main = peak("strategy=async", "strategy.free_on_main=true")
    # Seed 000: alloc and free on one thread keep buffers short-lived; frees handed to the main thread
    # wait a queue length, so about queue_capacity ops' outputs are live at once.
    assert main["peak_activation_gb"] > 5 * same["peak_activation_gb"] > 0
    assert main["peak_mem_gb"] - same["peak_mem_gb"] == pytest.approx(main["peak_activation_gb"] - same["peak_activation_gb"])
    eager = peak("strategy=eager")
    assert without_wall_clock(peak("strategy=eager", "strategy.free_on_main=true")) == without_wall_clock(eager)


@pytest.mark.parametrize(
    "flags, after_launch, refresh_us",
    # Before the launch: 50 µs (the A2's param_update_us) ahead of all device work. After it (vllm-ascend):
    # r waits for its own refresh, which overlaps a's 2 µs + 0.6 µs of device-side dispatch.
    [("0,0", "false", 0.0), ("1,0", "false", 50.0), ("1,1", "false", 0.0), ("0,0", "true", 0.0), ("1,0", "true", 50.0 - 2.6),
     ("1,1", "true", 0.0)],
)
def test_a_replay_refreshes_dynamic_ops_but_not_routed_ones(tmp_path, flags, after_launch, refresh_us):
    """Inside a captured graph a dynamic op's arguments are refreshed for each replay (50 µs on the A2),
    before the launch or after it; a routed (MoE) op reads its per-expert counts from device tensors and is not."""
    path = tmp_path / "ops.csv"
    path.write_text(f"name,kind,device_us,dynamic,routed\na,vector,2,0,0\nr,vector,10,{flags}\nc,vector,3,0,0\n")
    static = tmp_path / "static.csv"
    static.write_text("name,kind,device_us,dynamic,routed\na,vector,2,0,0\nr,vector,10,0,0\nc,vector,3,0,0\n")
    step = {}
    for name, csv in (("mine", path), ("static", static)):
        step[name] = simulate_run(compose_run("workload=trace", f"workload.path={csv}", "strategy=acl_graph", "workload.steps=3",
                                              f"strategy.graph.refresh_after_launch={after_launch}")).summary["step_ms_mean"]
    assert (step["mine"] - step["static"]) * 1e3 == pytest.approx(refresh_us)


def test_an_eager_kernel_pays_the_front_end_gap_a_graph_task_its_dispatch_hand_computed():
    """Eager (test_semantics' three ops, device a 2, b 10, c 3 µs; launches end at 6, 12, 18): with a 1 µs
    front-end gap per kernel, a [6,9] ends before b is launched; b [12,23]; c, queued, [23,27]: the
    step is 2 µs longer (b's and c's gaps; a's hides behind host work). A replayed graph pays its
    0.5 µs dispatch per task instead, whatever the gap."""
    eager_us = 25 + TOKEN_BACK_US + 2
    run = three_op_run("eager")
    gapped = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, device=dataclasses.replace(run.hardware.device, kernel_gap_us=1.0)))
    assert simulate_run(gapped).summary["step_ms_mean"] * 1e3 == pytest.approx(eager_us + 2.0)
    graph = graph_run("capture")
    graph_gapped = dataclasses.replace(graph, hardware=dataclasses.replace(graph.hardware, device=dataclasses.replace(graph.hardware.device, kernel_gap_us=1.0)))
    replay_us = 1 + 10 + 15 + 1.5 + TOKEN_BACK_US + 2  # test_capture_once_then_replay_hand_computed
    assert simulate_run(graph_gapped).steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([replay_us] * 3)


def test_graph_pieces_are_the_runs_of_graph_ops_between_split_ops():
    """Ops a h b s1 c s2 s3 d (h host-only; s* split): a replay launches [a, b], [c] and [d]: a host-only op
    does not split a piece (a replay skips it), consecutive split ops open one gap, and the step holds three
    pieces, which is what the summary counts."""
    from harness.sim.policies import graph_piece_of

    names = ["a", "h", "b", "s1", "c", "s2", "s3", "d"]
    ops = [OpSpec(name=n, kind=OpKind.host, host_us=1.0) if n == "h" else OpSpec(name=n, device_us=2.0) for n in names]
    run = piecewise_run(["s1", "s2", "s3"], ops=ops)
    workload = build_workload(run.workload)
    split = np.isin(names, ["s1", "s2", "s3"])
    assert graph_piece_of(workload, split).tolist() == [0, -1, 0, -1, 1, -1, -1, 2]
    assert graph_piece_of(workload, np.zeros(len(names), dtype=bool)).tolist() == [0, -1, 0, 0, 0, 0, 0, 0]
    assert simulate_run(run).summary["graph_pieces"] == 3
