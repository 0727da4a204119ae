"""What the preset numbers must show (issue "Foundation", Done when): the seeds' qualitative claims."""
from __future__ import annotations

import pytest

from conftest import compose_run
from harness.sim.simulate import simulate_run


def summary(*overrides: str) -> dict:
    return simulate_run(compose_run(*overrides, "workload.steps=4")).summary


def test_eager_decode_is_host_bound_with_big_bubbles():
    s = summary("workload=llama2_7b_decode", "strategy=eager")
    assert s["bound"] == "host"
    assert s["bubble_ratio"] > 0.3
    # Seed 001: LLaMA-7B under host scheduling, device compute : idle ≈ 1 : 1.
    assert 0.35 < s["device_busy"] < 0.65
    assert "host work" in s["bound_reason"]


def test_prefill_is_device_bound():
    s = summary("workload=llama2_7b_prefill", "strategy=eager")
    assert s["bound"] == "device"
    assert s["bubble_ratio"] < 0.1
    assert s["breakdown_compute"] > 0.9


@pytest.mark.parametrize("strategy", ["async", "pipeline"])
def test_async_and_pipeline_beat_eager_on_decode(strategy):
    eager = summary("workload=llama2_7b_decode", "strategy=eager")
    better = summary("workload=llama2_7b_decode", f"strategy={strategy}")
    assert better["throughput_tok_s"] > eager["throughput_tok_s"]
    assert better["bubble_ratio"] < eager["bubble_ratio"]


def test_pipeline_overlaps_more_than_async():
    assert summary("strategy=pipeline")["throughput_tok_s"] > summary("strategy=async")["throughput_tok_s"]


def test_strategies_do_not_change_prefill_much():
    # Device-bound: hiding host work buys almost nothing.
    eager = summary("workload=llama2_7b_prefill", "strategy=eager")
    pipeline = summary("workload=llama2_7b_prefill", "strategy=pipeline")
    assert pipeline["throughput_tok_s"] == pytest.approx(eager["throughput_tok_s"], rel=0.02)


def test_bigger_batch_shifts_decode_towards_the_device():
    small = summary("strategy=pipeline", "workload.batch_size=1")
    # Batch 32 at 1k context: the KV cache read (17 GB/step) now rivals the weights (13 GB/step).
    large = summary("strategy=pipeline", "workload.batch_size=32")
    assert large["throughput_tok_s"] > 10 * small["throughput_tok_s"]
    assert large["breakdown_compute"] >= small["breakdown_compute"]


def test_faster_host_link_and_hbm_move_the_numbers_the_right_way():
    base = summary("workload=llama2_7b_prefill")
    slow_hbm = summary("workload=llama2_7b_prefill", "hardware.device.hbm_gbps=400")
    assert slow_hbm["step_ms_mean"] >= base["step_ms_mean"]
    decode = summary("strategy=pipeline")
    decode_slow_hbm = summary("strategy=pipeline", "hardware.device.hbm_gbps=400")
    assert decode_slow_hbm["step_ms_mean"] > 2 * decode["step_ms_mean"]  # weights stream from HBM every step


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_the_gpu_hosts_kernel_and_module_costs_solve_the_two_measurements_they_cite(preset):
    """h100's host costs come from two measurements solved together: a 1-layer HF Llama-3.2-1B forward,
    65 kernels and its module calls in 616 µs of host time (NVIDIA/Fuser#3507), and one nn.Linear forward,
    a module call and its kernel, in 13.48 µs (NVIDIA/TransformerEngine#2053). The module calls are the
    HF Llama card's own count (before the layers, one layer, after them)."""
    import numpy as np

    from harness.model.workload import load_card

    card = load_card("llama31_8b")
    modules = card["unfused_pre_modules"] + card["unfused_layer_modules"] + card["unfused_post_modules"]
    per_kernel_us, per_module_us = np.linalg.solve([[65.0, modules], [1.0, 1.0]], [616.0, 13.48])
    host = compose_run(f"hardware={preset}").hardware.host
    assert modules == 19
    assert host.framework_us + host.launch_us == pytest.approx(per_kernel_us, abs=0.01)
    assert host.module_us == pytest.approx(per_module_us, abs=0.01)
