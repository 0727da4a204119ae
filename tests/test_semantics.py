"""Hand-computed timelines and the mechanisms of the dispatch strategies."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import compose_run
from harness.config import Dispatch, HardwareConfig, HostConfig, LinkConfig, OpSpec, RunConfig, StrategyConfig, WorkloadConfig
from harness.device import copy_time_us
from harness.graph import CATEGORY
from harness.result import without_wall_clock
from harness.run import simulate_run

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
    assert s["bubble_ratio"] == pytest.approx(1 - 15 / total)


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
