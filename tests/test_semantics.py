"""Hand-computed timelines and the mechanisms of the dispatch strategies."""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher, cpu_target

import harness.sim.kernel as kernel
from conftest import compose_run
from harness.base.errors import HarnessError
from harness.config.schema import Dispatch, HardwareConfig, HostConfig, LinkConfig, OpKind, OpSpec, RunConfig, StrategyConfig, WorkloadConfig
from harness.model.device import copy_time_us
from harness.sim.task_graph import CATEGORY, LANE_HOST
from harness.sim.outcome import without_wall_clock
from harness.sim.simulate import simulate_run
from test_engine import make_graph

# Three ops with known device times; every host stage costs 1 µs, a sync 2 µs.
UNIT_HOST = HostConfig(threads=4, framework_us=1, infer_shape_us=1, tiling_us=1, alloc_us=1, launch_us=1, free_us=1, sync_us=2, kernel_params=0)
LINK = LinkConfig(pcie_gbps=32, pcie_latency_us=1)
THREE_OPS = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", device_us=10.0), OpSpec(name="c", device_us=3.0)]


def three_op_run(dispatch: str, ops=THREE_OPS, steps: int = 1, **host) -> RunConfig:
    return RunConfig(
        hardware=HardwareConfig(host=dataclasses.replace(UNIT_HOST, **host), link=LINK),
        workload=WorkloadConfig(card=None, ops=list(ops), steps=steps, batch_size=1),
        strategy=StrategyConfig(dispatch=Dispatch[dispatch]),
    )


# The sampled token (4 bytes) comes back over PCIe before the host's sync.
TOKEN_BACK_US = copy_time_us(4, LINK)


def test_eager_three_ops_hand_computed():
    # Host: h2d issue [0,1]; op a host [1,7] (launch ends 6); b host [7,13] (launch ends 12); c host [13,19]
    # (launch ends 18). Device: a [6,8], b [12,22], c waits for the stream [22,25]. Then D2H and a 2 µs sync.
    outcome = simulate_run(three_op_run("eager"))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2, abs=1e-9)
    s = outcome.summary
    total = 28 + (TOKEN_BACK_US - 1)
    assert s["breakdown_compute"] == pytest.approx(13 / total)  # b and c; a is hidden behind host work
    assert s["breakdown_launch"] == pytest.approx(3 / total)  # h2d issue + launches of a and b
    assert s["breakdown_alloc"] == pytest.approx(3 / total)  # alloc a, free a, alloc b
    assert s["breakdown_sync"] == pytest.approx(2 / total)
    assert s["bubble_ratio"] == pytest.approx(1 - 15 / total) and s["bubble_front_end"] == 0.0  # no kernel gap here
    # The host thread works 21 µs of the step: the copy's issue, 3 × 6 µs of stages, the 2 µs sync.
    assert s["host_busy_max"] == pytest.approx(21 / total) and s["host_cpu_load"] == pytest.approx(21 / total)
    assert "capture_ms" not in s and s["launches_per_step"] == 3 and s["task_ms_per_step"] * 1e3 == pytest.approx(21 + 15 + 1.00025 + TOKEN_BACK_US)
    (row,) = outcome.steps.to_dict("records")
    assert row == {
        "step": 0, "measured": True, "mode": "eager", "start_ms": 0.0, "end_ms": pytest.approx(total / 1e3), "latency_ms": pytest.approx(total / 1e3),
        "kv_len": 1025.0, "padded_kv_len": 1025.0, "batch": 1, "padded_batch": 1, "tokens": 1, "device_busy_ms": pytest.approx(0.015),
        "front_end_idle_ms": 0.0, "bubble_ratio": pytest.approx(1 - 15 / total), "host.main_busy_ms": pytest.approx(0.021), "launches": 3,
    }


def test_async_three_ops_hand_computed():
    # Main thread: fw/is/tiling 3 µs per op; launch thread: alloc/launch/free. a launched at 6, b at 9,
    # c at 12 but the stream is busy with b until 19: c runs [19,22].
    outcome = simulate_run(three_op_run("async"))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(22 + TOKEN_BACK_US + 2, abs=1e-9)


def test_pipeline_three_ops_hand_computed():
    # infer thread fw+is 2 µs/op, tiling thread 1 µs/op, launch thread 3 µs/op: a launched at 6
    # (issue 1, fw/is 1-3, tiling 3-4, alloc 4-5, launch 5-6), b at 9, c at 12 → device as in async.
    outcome = simulate_run(three_op_run("pipeline"))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(22 + TOKEN_BACK_US + 2, abs=1e-9)


def test_steps_are_serialised_by_the_sampled_token():
    one = simulate_run(three_op_run("eager", steps=1)).summary["step_ms_mean"]
    many = simulate_run(three_op_run("eager", steps=5))
    assert many.steps["latency_ms"].to_numpy() == pytest.approx([one] * 5)
    assert many.summary["window_ms"] == pytest.approx(5 * one)


def test_too_few_host_cores_slow_the_pipeline():
    ops = [OpSpec(name=f"op{i}", device_us=0.5) for i in range(50)]
    roomy = simulate_run(three_op_run("pipeline", ops=ops, threads=3)).summary
    starved = simulate_run(three_op_run("pipeline", ops=ops, threads=1)).summary
    eager = simulate_run(three_op_run("eager", ops=ops, threads=1)).summary
    assert starved["step_ms_mean"] > 1.5 * roomy["step_ms_mean"]
    # One core for three threads is no better than one thread doing everything.
    assert starved["step_ms_mean"] == pytest.approx(eager["step_ms_mean"], rel=0.05)


def test_value_dependent_op_waits_for_producer_output():
    ops = [OpSpec(name="producer", device_us=50.0), OpSpec(name="reshape", device_us=1.0, value_dependent=True)]
    plain = simulate_run(three_op_run("pipeline", ops=[ops[0], dataclasses.replace(ops[1], value_dependent=False)]))
    dependent = simulate_run(three_op_run("pipeline", ops=ops))
    # Without the dependency the host issues the reshape while the producer runs; with it, InferShape
    # waits for the producer's end + a D2H copy + a 2 µs sync, then 5 µs of host work up to the launch.
    extra = dependent.summary["step_ms_mean"] - plain.summary["step_ms_mean"]
    assert extra * 1e3 == pytest.approx(copy_time_us(64, LINK) + 2 + 5, abs=1e-6)
    assert dependent.summary["breakdown_sync"] > plain.summary["breakdown_sync"]


def test_compute_dependent_op_drains_the_pipeline():
    ops = [OpSpec(name=f"op{i}", device_us=20.0) for i in range(20)]
    unique = dataclasses.replace(ops[10], compute_dependent=True)
    free_flowing = simulate_run(three_op_run("pipeline", ops=ops)).summary
    drained = simulate_run(three_op_run("pipeline", ops=ops[:10] + [unique] + ops[11:])).summary
    # Device-bound without the drain; with it the device idles while the host refills the pipeline.
    assert drained["step_ms_mean"] > free_flowing["step_ms_mean"]
    assert drained["bubble_ratio"] > free_flowing["bubble_ratio"]


def test_bounded_queue_throttles_the_producer():
    # A slow launch thread: with a queue of 1 the main thread cannot run ahead of it.
    ops = [OpSpec(name=f"op{i}", device_us=0.1) for i in range(30)]
    run = three_op_run("async", ops=ops, alloc_us=5.0)
    deep = simulate_run(run)
    shallow = simulate_run(dataclasses.replace(run, strategy=StrategyConfig(dispatch=Dispatch["async"], queue_capacity=1)))

    def last_tiling_start(outcome):
        tasks = outcome.result.graph.tasks
        return outcome.result.start_us[tasks["category"] == CATEGORY["tiling"]].max()

    # Deep queue: the main thread tiles op 29 at 3 µs/op, ~90 µs in; shallow: paced by the 7 µs launch thread.
    assert last_tiling_start(deep) == pytest.approx(1 + 29 * 3 + 2)
    assert last_tiling_start(shallow) > last_tiling_start(deep) + 50


def test_host_jitter_is_seeded():
    base = compose_run("hardware.host.jitter_cv=0.2", "workload.steps=4")
    a = simulate_run(base).summary
    b = simulate_run(base).summary
    c = simulate_run(dataclasses.replace(base, seed=1)).summary
    assert without_wall_clock(a) == without_wall_clock(b)
    assert a["step_ms_mean"] != c["step_ms_mean"]
    assert a["step_ms_p99"] > a["step_ms_p50"]  # jitter spreads the steps


def test_decode_attention_grows_with_kv_length():
    run = compose_run("workload=llama2_7b_decode", "strategy=pipeline", "workload.steps=8")
    short = simulate_run(run)
    long = simulate_run(compose_run("workload=llama2_7b_decode", "strategy=pipeline", "workload.steps=8", "workload.context_len=32768"))
    attention = short.result.graph.op_names.index("layers.0.attention")

    def attention_us(outcome, step):
        tasks = outcome.result.graph.tasks
        mine = (tasks["op"] == attention) & (tasks["step"] == step) & (tasks["category"] == CATEGORY["compute"])
        return float((outcome.result.end_us - outcome.result.start_us)[mine][0])

    assert attention_us(short, 7) > attention_us(short, 0)  # the KV cache grew by 7 tokens
    assert attention_us(long, 0) > 10 * attention_us(short, 0)
    assert long.summary["step_ms_mean"] > short.summary["step_ms_mean"]
    assert np.all(np.diff(short.steps["kv_len"]) == 1)


# Outputs of 300, 200 and 100 bytes (half of each op's 600, 400 and 200 bytes of traffic).
SIZED_OPS = [OpSpec(name="a", device_us=2.0, bytes=600), OpSpec(name="b", device_us=10.0, bytes=400), OpSpec(name="c", device_us=3.0, bytes=200)]


@pytest.mark.parametrize("free_on_main, peak_bytes", [(False, 300), (True, 500)])
def test_frees_handed_to_the_main_thread_keep_outputs_alive_longer(free_on_main, peak_bytes):
    """Async dispatch, Tiling 2 µs and free 2 µs (other stages 1 µs), a queue of 2. The launch thread
    frees each op's outputs right after its launch: a's 300 bytes are gone (free 7-9) before b allocates
    (9-10), so at most 300 bytes live. Handed to the main thread (seed 000's anti-pattern), a's free runs
    there after b's Tiling, 9-11, while b allocates 9-10: 500 bytes live at 10. The kernels: a 7-9, b 11-21,
    c waits for b, 21-24, either way."""
    run = three_op_run("async", ops=SIZED_OPS, tiling_us=2.0, free_us=2.0)
    strategy = StrategyConfig(dispatch=Dispatch["async"], queue_capacity=2, free_on_main=free_on_main)
    outcome = simulate_run(dataclasses.replace(run, strategy=strategy))
    assert outcome.summary["peak_activation_gb"] * 1e9 == pytest.approx(peak_bytes)
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(24 + TOKEN_BACK_US + 2)
    tasks = outcome.result.graph.tasks
    frees = (tasks["stage"] == 6) & (tasks["op"] >= 0)
    lanes = outcome.result.graph.lane_names
    expected_ends = [11, 17, 19] if free_on_main else [9, 13, 17]
    assert outcome.result.end_us[frees].tolist() == pytest.approx(expected_ends)
    assert {lanes[k] for k in tasks["lane"][frees]} == {"host.main" if free_on_main else "host.launch"}


def test_host_jitter_has_mean_one_and_the_configured_spread():
    from harness.sim.lowering import _jitter

    draws = _jitter(3, np.arange(200), 0.2, 500)
    assert draws.shape == (200, 500)
    assert draws.mean() == pytest.approx(1.0, abs=0.005) and draws.std() == pytest.approx(0.2, rel=0.03)
    assert np.array_equal(_jitter(3, np.array([7]), 0.2, 500), draws[7:8])  # a step's draws do not depend on the others
    assert np.array_equal(_jitter(3, np.arange(4), 0.0, 5), np.ones((4, 5)))


def test_an_op_run_on_the_cpu_hand_computed():
    """Heterogeneous execution of op b (1e6 FLOP, 64 kB of traffic) on a 50 GFLOP/s host core: after its
    dispatch (framework 7-8, InferShape 8-9) and a's kernel (6-8), half its traffic comes back by D2H
    (1 µs + 32 kB at 32 GB/s: 8-10), it computes 1e6 / 5e4 FLOP/µs = 20 µs (10-30), its result goes back
    by H2D (30-32), and c's kernel, launched at 14, starts when it arrives: 32-35."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", flops=1e6, bytes=64_000, device_us=10.0), OpSpec(name="c", device_us=3.0)]
    run = dataclasses.replace(three_op_run("eager", ops=ops, cpu_gflops=50.0), strategy=StrategyConfig(heterogeneous=["b"]))
    outcome = simulate_run(run)
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(35 + TOKEN_BACK_US + 2)
    graph, start, end = outcome.result.graph, outcome.result.start_us, outcome.result.end_us
    b = (graph.tasks["op"] == 1)
    lanes = [graph.lane_names[k] for k in graph.tasks["lane"][b]]
    spans = [(lane, s, e) for lane, s, e in zip(lanes, start[b].tolist(), end[b].tolist())]
    assert spans == [("host.main", 7, 8), ("host.main", 8, 9), ("copy.d2h", 8, 10), ("host.cpu_ops", 10, 30), ("copy.h2d", 30, 32)]
    assert outcome.summary["launches_per_step"] == 2  # b is dispatched, not launched
    # Host threads: the main one 17 µs (issue 1, a 6, b 2, c 6, sync 2), the CPU-op one 20 µs.
    window = 35 + TOKEN_BACK_US + 2
    assert outcome.summary["host_busy_max"] == pytest.approx(20 / window) and outcome.summary["host_cpu_load"] == pytest.approx(37 / window)
    assert outcome.steps["host.cpu_ops_busy_ms"].tolist() == [pytest.approx(0.020)]


def test_a_cpu_op_with_no_producer_fetches_its_input_in_its_own_step():
    """A first op on the CPU (1e6 FLOP, 6.4 MB on a 50 GFLOP/s core) fetches the step's input, so its D2H
    starts after the step's input H2D (0-2.00025) like a device op would: fetch 1 + 3.2e6 B / 32,000 B/µs =
    101 µs (to 103.00025), compute 20 (123.00025), result back 101 (224.00025), b's 3 µs kernel (227.00025),
    the token back and the sync: 230.000375 µs, every step. Its fetch had no edge to the step's start and
    ran in the step before (228.000125 then 226.000125)."""
    ops = [OpSpec(name="x.sampling", flops=1e6, bytes=6.4e6, device_us=10.0), OpSpec(name="b", device_us=3.0)]
    run = dataclasses.replace(three_op_run("eager", ops=ops, steps=2, cpu_gflops=50.0), strategy=StrategyConfig(heterogeneous=["sampling"]))
    steps = simulate_run(run).steps
    assert (steps["latency_ms"] * 1e3).tolist() == [pytest.approx(2.00025 + 101 + 20 + 101 + 3 + TOKEN_BACK_US + 2, rel=1e-12)] * 2


@pytest.mark.parametrize(
    "switches, n_kernels, expected",
    [
        # The A2 preset: framework 10, InferShape 5, Tiling 10, alloc 4, launch 12 (a 2 µs call + 10 parameters
        # written at 1 µs each), free 4.
        ({}, 1, dict(framework=10, infer_shape=5, tiling=10, alloc=4, launch=12, free=4)),
        ({}, 3, dict(launch=2 + 30)),  # a fused kernel of 3 writes 30 parameters
        ({"param_packing": True}, 3, dict(launch=2 + 5)),  # written at once
        ({"memory_pool": False}, 1, dict(alloc=50, free=50)),  # every alloc and free through the driver
        ({"stream_local_pool": True}, 1, dict(alloc=3.2, free=3.2)),  # 20 % cheaper
        ({"memory_pool": False, "stream_local_pool": True}, 1, dict(alloc=40, free=40)),
    ],
)
def test_host_stage_costs_by_hand(switches, n_kernels, expected):
    from harness.sim.lowering import host_stage_costs
    from harness.model.workload import build_workload

    run = compose_run("workload.steps=1")
    workload = build_workload(run.workload)
    workload.n_kernels = np.full(workload.n_ops, n_kernels)
    costs = host_stage_costs(workload, run.hardware, StrategyConfig(**switches))
    for stage, us in expected.items():
        assert costs[stage].tolist() == pytest.approx([us] * workload.n_ops), stage


def test_the_first_kernel_waits_for_the_steps_input_tokens():
    """Over a 1 MB/s link the step's input (one token id and one position, 8 bytes) takes 1 + 8 µs to
    copy (1-10): a, launched at 6, starts at 10; b and c follow (10 µs, 3 µs) to 25; the sampled token
    (4 bytes) comes back in 1 + 4 µs, then the 2 µs sync: 32 µs."""
    slow = dataclasses.replace(LINK, pcie_gbps=0.001)
    run = three_op_run("eager")
    run = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, link=slow))
    outcome = simulate_run(run)
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(32.0)
    graph = outcome.result.graph
    copies = {graph.lane_names[lane]: (s, e) for lane, s, e in zip(graph.tasks["lane"], outcome.result.start_us, outcome.result.end_us)
              if graph.lane_names[lane].startswith("copy.")}
    assert copies == {"copy.h2d": pytest.approx((1.0, 10.0)), "copy.d2h": pytest.approx((25.0, 30.0))}


def test_a_compute_dependent_op_holds_the_host_until_its_shape_is_back():
    """b's output shape is known only once it ran: after its kernel (12-22) the shape comes back (64 bytes:
    1.002 µs) and the host syncs (2 µs) before it issues c: c's host work 25.002-31.002, its kernel from
    30.002 to 33.002; without the dependency c's kernel waits for b on the stream, 22-25."""
    plain = simulate_run(three_op_run("eager")).summary
    ops = [THREE_OPS[0], dataclasses.replace(THREE_OPS[1], compute_dependent=True), THREE_OPS[2]]
    drained = simulate_run(three_op_run("eager", ops=ops)).summary
    assert plain["step_ms_mean"] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2)
    # b's kernel ends at 22; shape back and sync; c's five stages up to its launch; c's kernel; then the token.
    assert drained["step_ms_mean"] * 1e3 == pytest.approx(22 + copy_time_us(64, LINK) + 2 + 5 + 3 + TOKEN_BACK_US + 2)


def test_host_jitter_touches_host_work_only():
    run = three_op_run("eager", steps=3, jitter_cv=0.5)
    outcome = simulate_run(run)
    graph, durations = outcome.result.graph, outcome.result.end_us - outcome.result.start_us
    device = graph.lane_kinds[graph.tasks["lane"]] == 1
    host = graph.tasks["pool"] == 0
    assert sorted(set(np.round(durations[device], 9))) == [2.0, 3.0, 10.0]  # the kernels as given
    assert len(set(np.round(durations[host], 9))) > 30  # every host task drew its own multiplier
    # Every task on a host thread is host work, the blocking syncs included: each drew a multiplier.
    plain = simulate_run(three_op_run("eager", steps=3)).result
    plain_us = plain.end_us - plain.start_us
    on_host = (graph.lane_kinds[graph.tasks["lane"]] == LANE_HOST) & (plain_us > 0)
    assert on_host.sum() > 30 and np.all(np.abs(durations[on_host] / plain_us[on_host] - 1) > 1e-9)
    assert np.all(graph.tasks["pool"][on_host] == 0)  # and each holds a host core while it runs


@pytest.mark.parametrize("graph", [False, True])
def test_an_op_after_host_work_waits_for_every_input_the_host_work_passes_on(graph):
    """a (1 µs); ar, a 30 µs all-reduce after a on the comm stream; b (2 µs) after a on the compute
    stream; h, front-end work with no kernel, after ar and b; d (1 µs) after h. h hands on both inputs:
    d starts when ar ends, not when b (the later-numbered input) does, eagerly and in a replayed graph
    (h skipped). It ran at 25 µs, 17 µs before the all-reduce it reads had ended."""
    from harness.config.schema import GraphMode, GraphStrategyConfig

    ops = [OpSpec(name="a", device_us=1.0), OpSpec(name="ar", kind=OpKind.comm, device_us=30.0, after=[0]),
           OpSpec(name="b", device_us=2.0, after=[0]), OpSpec(name="h", kind=OpKind.host, host_us=1.0, after=[1, 2]),
           OpSpec(name="d", device_us=1.0, after=[3])]
    run = three_op_run("eager", ops=ops, steps=3)
    if graph:
        run = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=GraphStrategyConfig(mode=GraphMode.capture, buckets=[1])))
    outcome = simulate_run(run)
    g, start, end = outcome.result.graph, outcome.result.start_us, outcome.result.end_us
    device = np.array([g.lane_kinds[lane] != LANE_HOST for lane in g.tasks["lane"]])
    for step in range(3):
        mine = device & (g.tasks["step"] == step)
        of = {g.op_names[g.tasks["op"][i]]: i for i in np.flatnonzero(mine) if g.tasks["op"][i] >= 0}
        assert start[of["d"]] >= end[of["ar"]] > end[of["b"]] + 5.0
        if step == 0 and not graph:
            assert (start[of["ar"]], end[of["ar"]], start[of["d"]]) == pytest.approx((12.0, 42.0, 42.0))


def test_the_next_step_waits_for_a_collective_still_running():
    """a [6,11] on the compute stream; b, a 50 µs collective after a, runs [12,62] on the comm stream;
    c [18,23]. The token comes back after c and the sync returns long before b ends: the step still ends
    with b at 62 µs, and the next step's first host work starts then (steps end in a barrier)."""
    ops = [OpSpec(name="a", kind=OpKind.cube, device_us=5.0), OpSpec(name="b", kind=OpKind.comm, device_us=50.0, after=[0]),
           OpSpec(name="c", kind=OpKind.cube, device_us=5.0, after=[0])]
    outcome = simulate_run(three_op_run("eager", ops=ops, steps=3))
    assert (outcome.steps["latency_ms"] * 1e3).tolist() == pytest.approx([62.0] * 3)
    tasks, start = outcome.result.graph.tasks, outcome.result.start_us
    assert [start[tasks["step"] == s].min() for s in (1, 2)] == pytest.approx([62.0, 124.0])


def test_a_steps_critical_path_starts_from_its_own_last_task_when_another_step_ends_later():
    """A graph handed to `simulate` need not serialise its steps. Three lanes, no dependencies, all ready at
    0: step 0 is task 0 (framework, [0, 10]) and task 1 (launch, [0, 2]); step 1 is task 2 (compute, [0, 1]),
    done before either of step 0's. Step 0's path is its last task, task 0: 10 µs of framework. Step 1's is
    task 2: 1 µs of compute, its latency (not an empty row, as if the last task of the step were task 0 or 1).
    All tasks' work: step 0 10 µs framework + 2 µs launch, step 1 1 µs compute."""
    graph = make_graph(lanes=[0, 1, 2], pools=[-1, -1, -1], units=[0, 0, 0], durations=[10.0, 2.0, 1.0], deps=[[], [], []], capacity=[1])
    graph.tasks["step"] = [0, 0, 1]
    graph.tasks["category"] = [CATEGORY["framework"], CATEGORY["launch"], CATEGORY["compute"]]
    result = kernel.simulate(graph)
    assert result.end_us.tolist() == [10.0, 2.0, 1.0]
    on_path, all_tasks = result.step_category_us()
    framework, launch, compute = CATEGORY["framework"], CATEGORY["launch"], CATEGORY["compute"]
    assert on_path[:, [framework, launch, compute]].tolist() == [[10.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    assert on_path.sum(axis=1).tolist() == [10.0, 1.0]
    assert all_tasks[:, [framework, launch, compute]].tolist() == [[10.0, 2.0, 0.0], [0.0, 0.0, 1.0]]
    assert all_tasks.sum(axis=1).tolist() == [12.0, 1.0]


def _load_numba_target_afresh(monkeypatch) -> list:
    """Run `load_numba_target` as in a new process whose Numba target is not loaded yet: the module that
    marks it loaded is hidden for the call, and the target's loading (refresh) only records what
    `scipy.linalg` is in sys.modules while it runs (a real refresh would import SciPy's probe)."""
    seen = []
    monkeypatch.delitem(sys.modules, "numba.np.arraymath", raising=False)
    monkeypatch.setattr(cpu_target.target_context, "refresh", lambda: seen.append(sys.modules.get("scipy.linalg", "absent")))
    kernel.load_numba_target()
    return seen


def test_loading_the_numba_target_answers_no_scipy_then_lifts_its_block(monkeypatch):
    """While Numba's target loads, `import scipy.linalg` is blocked (sys.modules holds None: Numba skips
    its BLAS probe); after, the block is gone and SciPy imports as usual."""
    monkeypatch.delitem(sys.modules, "scipy.linalg", raising=False)
    assert _load_numba_target_afresh(monkeypatch) == [None]
    assert "scipy.linalg" not in sys.modules


def test_loading_the_numba_target_leaves_a_scipy_block_it_did_not_put_there(monkeypatch):
    """A process that blocked `scipy.linalg` itself (sys.modules holds None before the call) keeps its
    block: the loader lifts only the one it put in place."""
    monkeypatch.setitem(sys.modules, "scipy.linalg", None)
    assert _load_numba_target_afresh(monkeypatch) == [None]
    assert "scipy.linalg" in sys.modules and sys.modules["scipy.linalg"] is None


def test_the_kernels_release_the_gil_and_are_cached_on_disk():
    """Every kernel of the engine runs without the GIL (a long run lowers and measures one chunk in a
    thread while the kernel simulates another) and is cached on disk (a run loads it, compiles nothing)."""
    kernels = {name: f for name, f in vars(kernel).items() if isinstance(f, CPUDispatcher)}
    assert sorted(kernels) == ["_check_graph", "_critical_path", "_heap_pop", "_heap_push", "_integer_columns", "_links", "_lru_hits",
                               "_simulate", "_step_category_us"]
    assert {name: f.targetoptions.get("nogil") for name, f in kernels.items()} == dict.fromkeys(kernels, True)
    assert {name: isinstance(f._cache, FunctionCache) for name, f in kernels.items()} == dict.fromkeys(kernels, True)


def test_a_graph_that_never_completes_is_reported_by_the_kernels_status(monkeypatch):
    """The kernel never raises: a task that can never become ready leaves it with tasks not ended, and it
    returns status 1, which the wrapper reports. Task 0 waits for task 1, which follows task 0 on their
    lane: neither ever becomes ready. (`validate_graph` refuses such a dependency before the kernel runs;
    it is bypassed here to reach the kernel's own guard.)"""
    graph = make_graph(lanes=[0, 0], pools=[-1, -1], units=[0, 0], durations=[1.0, 1.0], deps=[[1], []], capacity=[1])
    monkeypatch.setattr(kernel, "validate_graph", lambda graph: None)
    with pytest.raises(HarnessError, match=r"did not complete \(status 1\)"):
        kernel.simulate(graph)


def test_a_result_of_no_tasks_spans_no_time():
    """`makespan_us` is the last end, and 0 µs when the result holds no task at all."""
    graph = make_graph(lanes=[0], pools=[-1], units=[0], durations=[1.0], deps=[[]], capacity=[1])
    graph.tasks, graph.dep_ptr = graph.tasks[:0], np.zeros(1, dtype=np.int64)
    empty = np.zeros(0)
    assert kernel.SimulationResult(graph, empty, empty, np.zeros(0, dtype=np.int64)).makespan_us == 0.0


def test_a_one_unit_pool_serves_five_lanes_in_the_order_their_tasks_become_ready():
    """Five lanes, one task each, all needing the one unit of a pool for 10 µs, held by their release times
    1, 3, 4, 2, 5 µs (tasks 0 .. 4). Strict FIFO in the order they became ready: task 0 at 1 runs [1, 11],
    then task 3 (ready at 2) [11, 21], task 1 (3) [21, 31], task 2 (4) [31, 41], task 4 (5) [41, 51]; each
    waiting task is let in by the one before it. (The releases are pushed onto the event heap in id order,
    not time order: a heap that sifts a new event up past the wrong parent hands out the unit out of turn.)"""
    graph = make_graph(lanes=[0, 1, 2, 3, 4], pools=[0] * 5, units=[1] * 5, durations=[10.0] * 5, deps=[[]] * 5, capacity=[1],
                       releases=[1.0, 3.0, 4.0, 2.0, 5.0])
    result = kernel.simulate(graph)
    assert result.start_us.tolist() == [1.0, 21.0, 31.0, 11.0, 41.0]
    assert result.end_us.tolist() == [11.0, 31.0, 41.0, 21.0, 51.0]
    assert result.decider.tolist() == [-1, 3, 1, 0, 2]
