"""The device model's achievable peaks: AI cores as capacity, efficiencies, the INT8 matmul peak (by hand)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_run
from harness.model.device import device_times
from harness.model.ops import FLAG_INT8
from harness.model.workload import build_workload

TFLOP = 1e12


def one_op(*overrides: str, flops: float = 0.0, nbytes: float = 0.0, kind: str = "cube"):
    run = compose_run("hardware=atlas_a2", "workload.card=null", f"workload.ops=[{{name:x,kind:{kind},flops:{flops},bytes:{nbytes}}}]", *overrides)
    workload = build_workload(run.workload)
    return workload, run.hardware


def test_fewer_ai_cores_compute_less():
    """A 35.39 TFLOP matmul holds every core: 24 cores at 353.9 TFLOPS x 0.89 take 112.36 ms; 6 of them, 4x that."""
    for cores, expected_ms in ((24, 35.39 / 353.9 / 0.89 * 1e3), (6, 4 * 35.39 / 353.9 / 0.89 * 1e3)):
        workload, hardware = one_op(f"hardware.device.ai_cores={cores}", flops=35.39 * TFLOP)
        us, held = device_times(workload, hardware)
        assert held[0, 0] == cores
        assert us[0, 0] == pytest.approx(hardware.device.matmul_fixed_us + expected_ms * 1e3)


def test_hbm_efficiency_scales_memory_bound_time():
    """1.6 GB through 1.6 TB/s at 50 % efficiency: 2 ms (plus the vector kernel's fixed cost)."""
    workload, hardware = one_op("hardware.device.hbm_efficiency=0.5", nbytes=1.6e9, kind="vector")
    us, _ = device_times(workload, hardware)
    assert us[0, 0] == pytest.approx(hardware.device.vector_fixed_us + 2000.0)


def test_w8a8_linears_use_the_int8_peak():
    bf16 = build_workload(compose_run("workload=llama2_7b_prefill", "workload.steps=1").workload)
    int8 = build_workload(compose_run("workload=llama2_7b_prefill", "workload.steps=1", "workload.quant=w8a8").workload)
    hardware = compose_run().hardware
    q = bf16.op_names.index("layers.0.q_proj")
    assert not bf16.flags[q] & FLAG_INT8 and int8.flags[q] & FLAG_INT8
    assert not int8.flags[int8.op_names.index("layers.0.attention")] & FLAG_INT8  # attention stays bf16
    fixed = hardware.device.matmul_fixed_us
    bf16_us, int8_us = device_times(bf16, hardware)[0][0, q] - fixed, device_times(int8, hardware)[0][0, int8.op_names.index("layers.0.q_proj")] - fixed
    assert bf16_us / int8_us == pytest.approx(752.0 / 353.9, rel=0.02)  # compute-bound prefill: the peaks' ratio


def test_rated_cores_default_to_ai_cores():
    run = compose_run("hardware.device.rated_cores=0", "hardware.device.ai_cores=12")
    assert run.hardware.device.cores_rated == 12
    assert np.isfinite(run.hardware.device.cube_tflops)


@pytest.mark.parametrize("share, cores, compute_quanta", [
    (0.099, 1, 0.099),        # under 10 % of a core's capacity: one block, its own time
    (0.1, 4, 0.1),            # 4 blocks (the rule), not 0.025: never faster than the one-block op just under
    (0.4, 4, 0.1),            # 0.4 / 4 blocks = 0.1: the floor and the rule meet
    (0.48, 4, 0.12),          # above them, the rule's own time
    (0.55, 2, 0.275),         # over 50 %: ceil(0.55 / 0.3) = 2 blocks
    (0.61, 3, 0.3),           # 3 blocks (0.203) held to the 0.3 two blocks take at 0.6
    (9.0, 24, 0.375),         # past 0.3 x 24 cores: every core, 9 / 24 of the quantum
])
def test_the_block_split_rule_never_makes_more_work_faster(share, cores, compute_quanta):
    """A vector op of `share` of one AI core's capacity (22 TFLOPS / 24 cores x 10 us a quantum on atlas_a2):
    the blocks it holds are the seed-002 rule's; its compute time is the rule's, or the most a smaller op
    takes where the rule's blocks jump (a batch of 4 ran faster than a batch of 2)."""
    workload, hardware = one_op(kind="vector", flops=share * 22 * TFLOP / 24 * 10e-6)
    us, held = device_times(workload, hardware)
    assert held[0, 0] == cores
    assert us[0, 0] == pytest.approx(hardware.device.vector_fixed_us + compute_quanta * hardware.device.block_quantum_us)


def test_a_grouped_matmul_pays_the_devices_cost_for_each_expert_it_multiplies():
    """Qwen3-30B-A3B at TP 4 without EP, a batch of 12 on the Atlas A2: each of the 12 tokens picks 8 distinct
    of the 128 experts, so a layer's experts hit are 128 (1 - (120/128)^12) = 69.00 under uniform routing, and
    each rank multiplies its slice of every one. At 1.115 us a group (atlas_a2's fit) each grouped matmul takes
    69.00 x 1.115 = 76.93 us longer than at 0; a batch of 16 (a graph padded 12 -> 16) hits 82.42 experts,
    91.90 us. No other op moves."""
    hit = {12: 128 * (1 - (120 / 128) ** 12), 16: 128 * (1 - (120 / 128) ** 16)}
    assert hit[12] == pytest.approx(69.00, abs=0.01) and hit[16] == pytest.approx(82.42, abs=0.01)
    for batch in (12, 16):
        common = ("hardware=atlas_a2", "workload=qwen3_30b_decode", f"workload.batch_size={batch}", "workload.tp=4", "workload.ep=1", "workload.steps=1")
        run = compose_run(*common)
        free = compose_run(*common, "hardware.device.grouped_matmul_group_us=0")
        assert run.hardware.device.grouped_matmul_group_us == 1.115
        workload = build_workload(run.workload)
        grouped = np.array(["grouped_" in name for name in workload.op_names])
        assert grouped.sum() == 2 * 48
        assert workload.expert_groups[0, grouped] == pytest.approx(np.full(96, hit[batch]))
        assert (workload.expert_groups[0, ~grouped] == 0).all()
        added = device_times(workload, run.hardware)[0][0] - device_times(workload, free.hardware)[0][0]
        assert added[grouped] == pytest.approx(np.full(96, hit[batch] * 1.115))
        assert (added[~grouped] == 0).all()


def test_a_dense_model_has_no_expert_groups_and_a_gpu_preset_no_cost_for_them():
    """Llama-2-7B has no grouped matmul (no expert groups to price); the H100 preset leaves the cost per
    group at 0 (not measured for CUDA's fused MoE kernel): Qwen3-30B-A3B's grouped matmuls there cost their
    bytes and FLOPs alone."""
    assert build_workload(compose_run("workload=llama2_7b_decode", "workload.steps=1").workload).expert_groups is None
    run = compose_run("hardware=h100", "workload=qwen3_30b_decode", "workload.steps=1")
    assert run.hardware.device.grouped_matmul_group_us == 0.0
    workload = build_workload(run.workload)
    free = compose_run("hardware=h100", "workload=qwen3_30b_decode", "workload.steps=1", "hardware.device.grouped_matmul_group_us=1")
    assert (device_times(workload, free.hardware)[0] > device_times(workload, run.hardware)[0]).any()
