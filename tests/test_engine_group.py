"""The serving engine's own host work (engine=): each mechanism checked by hand on one op.

The step: one kernel of 100 µs, host costs framework 10 µs and launch 5 µs (the step's token copy is
issued with one more launch), free copies and syncs. The engine's stages cost what the overrides
say; B sequences per step.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_run
from harness.sim.task_graph import CATEGORY, LANE_DEVICE
from harness.sim.lowering import ENGINE_SLOT, engine_cost_table
from harness.sim.simulate import simulate_run
from harness.model.workload import build_workload

B = 4
KERNEL, FRAMEWORK, LAUNCH = 100.0, 10.0, 5.0
MODEL_ALONE = LAUNCH + FRAMEWORK + LAUNCH + KERNEL  # token copy issue, then the op, then its kernel
BASE = (
    "hardware=h100", "workload.card=null", "workload.ops=[{name:k,kind:cube,device_us:100}]", f"workload.batch_size={B}",
    "workload.steps=8", "hardware.host.framework_us=10", "hardware.host.launch_us=5", "hardware.host.sync_us=0",
    "hardware.link.pcie_latency_us=0", "hardware.link.pcie_gbps=1e5", "hardware.device.kernel_gap_us=0", "tracking.enabled=false",
)


def step_us(*overrides: str) -> list[float]:
    outcome = simulate_run(compose_run(*BASE, *overrides))
    return (outcome.steps["latency_ms"] * 1e3).round(6).tolist()


def stage(name: str, per_step: float, per_request: float = 0.0) -> list[str]:
    return [f"engine.{name}.per_step_us={per_step}", f"engine.{name}.per_request_us={per_request}"]


def test_no_engine_is_the_model_alone():
    assert step_us() == [pytest.approx(MODEL_ALONE)] * 8


def test_engine_in_one_process_serialises_with_the_model():
    """vLLM 0.5: schedule, prepare before; output and API after the tokens are back, on one thread."""
    costs = [*stage("schedule", 30, 2), *stage("prepare", 20, 1), *stage("output", 10, 1), *stage("api", 40, 5)]
    engine = 30 + 2 * B + 20 + B + 10 + B + 40 + 5 * B
    assert step_us(*costs) == [pytest.approx(MODEL_ALONE + engine)] * 8


def test_multi_step_schedules_once_and_processes_outputs_once_per_block():
    """Multi-step 4: steps 0 and 4 schedule (30 µs); steps 3 and 7 process the block's outputs in one call:
    10 µs once plus 1 µs per sequence for each of the 4 steps."""
    got = step_us(*stage("schedule", 30), *stage("output", 10, 1), "engine.multi_step=4")
    block_output = 10 + 4 * B
    assert got == pytest.approx([MODEL_ALONE + 30, MODEL_ALONE, MODEL_ALONE, MODEL_ALONE + block_output] * 2)


def test_async_output_overlaps_the_next_step():
    """Output processing of step s runs on its own thread during step s + 1: hidden while it is shorter
    than the step; the first step has nothing to process."""
    short = step_us(*stage("output", 50), "engine.async_output=true")
    assert short == [pytest.approx(MODEL_ALONE)] * 8
    long = step_us(*stage("output", 500), "engine.async_output=true")
    assert long[0] == pytest.approx(MODEL_ALONE) and long[1:] == [pytest.approx(500)] * 7


def test_async_scheduling_prepares_the_next_step_during_this_ones_kernel():
    """The next step's 60 µs of scheduling runs once this step's launches are out, while its 100 µs
    kernel runs; only step 0 schedules itself first."""
    got = step_us(*stage("schedule", 60), "engine.async_scheduling=true")
    assert got[0] == pytest.approx(60 + MODEL_ALONE)
    assert got[1:] == [pytest.approx(MODEL_ALONE)] * 7
    slow = step_us(*stage("schedule", 300), "engine.async_scheduling=true")  # longer than the kernel
    assert slow[1:] == [pytest.approx(LAUNCH + FRAMEWORK + LAUNCH + 300)] * 7


def test_api_server_in_its_own_process_runs_beside_the_engine():
    inline = step_us(*stage("api", 80))
    apart = step_us(*stage("api", 80), "engine.api_process=true")
    assert inline == [pytest.approx(MODEL_ALONE + 80)] * 8
    assert apart == [pytest.approx(MODEL_ALONE)] * 8


def test_a_process_of_its_own_starts_with_the_step_and_the_output_thread_once_it_is_scheduled():
    """The API server's process streams the previous step's tokens from the moment this step begins, while
    the engine schedules (60 µs) and runs the model: 250 µs of it make a 250 µs step. The engine's own
    output thread (async output) takes the previous step's outputs once this step is scheduled: 60 + 250."""
    process = step_us(*stage("schedule", 60), *stage("api", 250), "engine.api_process=true")
    assert process[0] == pytest.approx(60 + MODEL_ALONE) and process[1:] == [pytest.approx(250)] * 7
    thread = step_us(*stage("schedule", 60), *stage("output", 250), "engine.async_output=true")
    assert thread[0] == pytest.approx(60 + MODEL_ALONE) and thread[1:] == [pytest.approx(60 + 250)] * 7
    apart = step_us(*stage("schedule", 60), *stage("output", 250), "engine.output_process=true")
    assert apart[1:] == [pytest.approx(250)] * 7
    # Both set (vLLM 0.6's async output thread under an output process): the outputs go to the process,
    # which starts with the step; the thread has nothing left to do.
    both = step_us(*stage("schedule", 60), *stage("output", 250), "engine.output_process=true", "engine.async_output=true")
    assert both == apart


def test_a_side_process_works_through_a_block_while_the_next_block_runs():
    """Multi-step 4: the API server streams a block's tokens while the engine runs the next 4 steps. 200 µs
    a block is 50 µs a step, hidden under the 120 µs step; 800 µs a block is 200 µs a step, and every step of
    the next block waits for its share (not one step for all of it)."""
    keeps_up = step_us(*stage("api", 200), "engine.api_process=true", "engine.multi_step=4")
    assert keeps_up == [pytest.approx(MODEL_ALONE)] * 8
    behind = step_us(*stage("api", 800), "engine.api_process=true", "engine.multi_step=4")
    assert behind == pytest.approx([MODEL_ALONE] * 4 + [800 / 4] * 4)


def test_an_engines_thread_shares_the_dispatching_cores_and_its_own_process_does_not():
    """hardware.host.threads is the dispatching process's cores. With one, the engine's async output thread
    (80 µs a step) shares it with the model's dispatch: the thread takes the core as the step begins, and
    each step after the first is 80 + 120 µs, serial; the API server's process (80 µs a step) runs on a
    core of its own, beside the step as with two threads."""
    thread = step_us(*stage("output", 80), "engine.async_output=true", "hardware.host.threads=1")
    assert thread == [pytest.approx(MODEL_ALONE)] + [pytest.approx(80 + MODEL_ALONE)] * 7
    assert step_us(*stage("output", 80), "engine.async_output=true", "hardware.host.threads=2") == [pytest.approx(MODEL_ALONE)] * 8
    process = step_us(*stage("api", 80), "engine.api_process=true", "hardware.host.threads=1")
    assert process == [pytest.approx(MODEL_ALONE)] * 8


def test_per_request_costs_follow_the_batch():
    table = engine_cost_table(
        build_workload(compose_run(*BASE, "workload.batch_size=16").workload),
        compose_run(*BASE, *stage("schedule", 5, 3), *stage("prepare", 0, 1)).engine,
    )
    assert table[:, ENGINE_SLOT["pre"]].tolist() == [5 + 16 * 4] * 8


def test_layer_overhead_is_eager_only():
    """The engine's own model code per layer (32 layers of Llama-3.1-8B): host time in eager mode, none in
    a graph replay."""
    card = ("hardware=h100", "workload=llama31_8b_decode", "workload.steps=4", "tracking.enabled=false")
    eager = simulate_run(compose_run(*card, "engine.layer_overhead_us=100")).summary
    plain = simulate_run(compose_run(*card)).summary
    assert eager["task_ms_per_step"] - plain["task_ms_per_step"] == pytest.approx(32 * 0.1)
    graph = simulate_run(compose_run(*card, "strategy=cuda_graph", "engine.layer_overhead_us=100")).summary
    graph_plain = simulate_run(compose_run(*card, "strategy=cuda_graph")).summary
    assert graph["step_ms_mean"] == pytest.approx(graph_plain["step_ms_mean"])


@pytest.mark.parametrize("hardware", ["h100", "h200"])
def test_graph_replay_beats_eager_at_batch_1_and_the_gain_shrinks_with_batch(hardware):
    """Issue 12's acceptance: SGLang's Llama-3-8B decode (sgl-project/sglang#1401: 1.12-1.31x at batch 1)."""
    def speedup(batch: int) -> float:
        runs = [compose_run("+experiment=h100_sglang_eager_bs1", f"hardware={hardware}", f"workload.batch_size={batch}", *s)
                for s in ((), ("strategy=cuda_graph",))]
        eager, graph = (simulate_run(r).summary["step_ms_mean"] for r in runs)
        return eager / graph

    at_1, at_64 = speedup(1), speedup(64)
    assert at_1 > 1.1 and at_64 < at_1


def test_serving_reports_vllm_benchmark_names():
    outcome = simulate_run(compose_run(
        "hardware=h100", "workload=llama31_8b_decode", "engine=vllm_v1", "strategy=cuda_graph", "workload.steps=24",
        "workload.serving.enabled=true", "workload.serving.initial_requests=40", "workload.serving.output_len_mean=8",
        "workload.serving.max_batch=16", "tracking.enabled=false",
    ))
    summary, latency = outcome.summary, outcome.steps["latency_ms"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < summary[f"median_{name}_ms"] <= summary[f"p99_{name}_ms"] and summary[f"mean_{name}_ms"] <= summary[f"p99_{name}_ms"]
    # A running request gets a token every step: each gap between two of its tokens is one step's latency,
    # so ITL and TPOT lie within the steps' range (exact values: test_cost_formulas).
    low, high = latency.min() * (1 - 1e-12), latency.max() * (1 + 1e-12)
    for key in ("mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms"):
        assert low <= summary[key] <= high, key
    # 40 requests wait at t = 0 for 16 slots: every first token comes after step 0, and 24 come later still.
    assert summary["mean_ttft_ms"] > latency[0]
    assert summary["mean_e2el_ms"] > summary["mean_ttft_ms"]
    assert "prefill" in summary["ttft_note"]


@pytest.mark.parametrize(
    "switches, expected",
    [
        # One thread: schedule + prepare (50 µs) when a block of 4 steps starts; the block's outputs
        # (10 µs once + 1 µs a sequence for each of its 4 steps = 26) and API (40) when it ends.
        ((), {"pre": [50, 0, 0, 0, 50, 0, 0, 0], "output_inline": [0, 0, 0, 26, 0, 0, 0, 26], "api_inline": [0, 0, 0, 40, 0, 0, 0, 40]}),
        # Async scheduling: step 0 schedules itself; the next block is scheduled during a block's last step.
        (("engine.async_scheduling=true",), {"pre": [50, 0, 0, 0, 0, 0, 0, 0], "ahead": [0, 0, 0, 50, 0, 0, 0, 50],
                                             "output_inline": [0, 0, 0, 26, 0, 0, 0, 26], "api_inline": [0, 0, 0, 40, 0, 0, 0, 40]}),
        # Outputs and the API server beside the engine: a block's outputs are handled while the next block
        # runs, a quarter in each of its 4 steps (26 / 4, 40 / 4); the last block's wait for a later one.
        (("engine.async_output=true", "engine.api_process=true"), {"pre": [50, 0, 0, 0, 50, 0, 0, 0], "output_side": [0, 0, 0, 0, 6.5, 6.5, 6.5, 6.5],
                                                                   "api_side": [0, 0, 0, 0, 10, 10, 10, 10]}),
        (("engine.output_process=true",), {"pre": [50, 0, 0, 0, 50, 0, 0, 0], "output_side": [0, 0, 0, 0, 6.5, 6.5, 6.5, 6.5],
                                           "api_inline": [0, 0, 0, 40, 0, 0, 0, 40]}),
    ],
)
def test_engine_cost_table_by_hand(switches, expected):
    """Multi-step 4 over 8 steps of 4 sequences; sampling (5 µs + 1 µs a sequence = 9) every step."""
    from harness.sim.lowering import ENGINE_SLOTS

    run = compose_run(*BASE, *stage("schedule", 30), *stage("prepare", 20), *stage("sample", 5, 1), *stage("output", 10, 1),
                      *stage("api", 40), "engine.multi_step=4", *switches)
    table = engine_cost_table(build_workload(run.workload), run.engine)
    for slot in ENGINE_SLOTS:
        want = [9.0] * 8 if slot == "sample" else expected.get(slot, [0] * 8)
        assert table[:, ENGINE_SLOT[slot]].tolist() == want, slot


def test_no_engine_costs_nothing():
    run = compose_run(*BASE)
    assert not run.engine.active
    assert engine_cost_table(build_workload(run.workload), run.engine).tolist() == [[0.0] * 7] * 8
    assert engine_cost_table(build_workload(run.workload), None).tolist() == [[0.0] * 7] * 8


def test_host_jitter_reaches_every_engine_stage():
    """The engine's work is host work: with host jitter on, each of its tasks (schedule ahead, sample,
    output, API) draws a multiplier like the model's host stages, and the kernel keeps its 100 µs."""
    costs = [*stage("schedule", 60), *stage("sample", 7), *stage("output", 10, 1), *stage("api", 40), "engine.async_scheduling=true"]
    plain, jittered = (simulate_run(compose_run(*BASE, *costs, f"hardware.host.jitter_cv={cv}")).result for cv in (0, 0.3))
    graph = plain.graph
    assert graph.tasks["lane"].tolist() == jittered.graph.tasks["lane"].tolist()
    d_plain, d_jittered = plain.end_us - plain.start_us, jittered.end_us - jittered.start_us
    engine = (graph.tasks["category"] == CATEGORY["engine"]) & (d_plain > 0)
    assert (graph.tasks["op"][graph.tasks["category"] == CATEGORY["engine"]] == -1).all()  # the engine's, no model op's
    assert engine.sum() == 1 + 8 * 4  # step 0 schedules itself; then schedule ahead, sample, output, API in each of the 8 steps
    assert np.all(np.abs(d_jittered[engine] / d_plain[engine] - 1) > 1e-9)
    kernels = graph.lane_kinds[graph.tasks["lane"]] == LANE_DEVICE
    assert d_jittered[kernels].tolist() == pytest.approx(d_plain[kernels].tolist())
