"""Device cost model: how long an op runs on the accelerator and how many AI cores it holds.

Time = fixed kernel cost + roofline max(FLOPs / peak of the cores it holds, bytes / HBM bandwidth).
AI cores held = the block-split rule of seed 002, on the op's own unit (cube or vector):
FLOPs < 10 % of one core's capacity → 1 block; > 50 % → min(cores, FLOPs / (0.3 × capacity));
otherwise 4 blocks. "Capacity" is what one core computes in `block_quantum_us`.
"""
from __future__ import annotations

import numpy as np

from harness.config import DeviceConfig, LinkConfig
from harness.workload import Workload

KIND_CUBE, KIND_VECTOR, KIND_COMM = 0, 1, 2

US_PER_S = 1e6


def unit_peak_flop_per_us(kind: np.ndarray, device: DeviceConfig) -> np.ndarray:
    """Peak FLOP/µs of the whole device for each op's unit (comm ops use the vector unit's peak)."""
    cube = device.cube_tflops * 1e12 / US_PER_S
    vector = device.vector_tflops * 1e12 / US_PER_S
    return np.where(kind == KIND_CUBE, cube, vector)


def block_dim(flops: np.ndarray, kind: np.ndarray, device: DeviceConfig) -> np.ndarray:
    """AI cores an op holds, by the seed-002 block-split rule (vectorised over any shape)."""
    per_core_capacity = unit_peak_flop_per_us(kind, device) / device.ai_cores * device.block_quantum_us
    ratio = flops / per_core_capacity
    large = np.clip(np.ceil(flops / (0.3 * per_core_capacity)), 1, device.ai_cores)
    medium = min(4, device.ai_cores)
    return np.where(ratio < 0.1, 1, np.where(ratio > 0.5, large, medium)).astype(np.int32)


def fixed_cost_us(kind: np.ndarray, device: DeviceConfig) -> np.ndarray:
    return np.select(
        [kind == KIND_CUBE, kind == KIND_VECTOR],
        [device.matmul_fixed_us, device.vector_fixed_us],
        default=device.comm_fixed_us,
    )


def device_times(workload: Workload, device: DeviceConfig) -> tuple[np.ndarray, np.ndarray]:
    """(duration_us, ai_cores) per step and op, each of shape (steps, n_ops)."""
    kv = workload.kv_len[:, None].astype(np.float64)
    flops = workload.flops[None, :] + workload.flops_per_kv[None, :] * kv
    nbytes = workload.bytes[None, :] + workload.bytes_per_kv[None, :] * kv
    kind = np.broadcast_to(workload.kind[None, :], flops.shape)
    cores = block_dim(flops, kind, device)
    compute_us = flops / (unit_peak_flop_per_us(kind, device) * cores / device.ai_cores)
    memory_us = nbytes / (device.hbm_gbps * 1e9 / US_PER_S)
    roofline_us = fixed_cost_us(kind, device) + np.maximum(compute_us, memory_us)
    given = ~np.isnan(workload.device_us)
    duration = np.where(given[None, :], workload.device_us[None, :], roofline_us)
    return duration, cores


def copy_time_us(nbytes: float, link: LinkConfig) -> float:
    """One host<->device copy over PCIe: fixed latency + bytes / bandwidth."""
    return link.pcie_latency_us + nbytes / (link.pcie_gbps * 1e9 / US_PER_S)
