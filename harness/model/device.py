"""Device cost model: how long an op runs on the accelerator and how many AI cores it holds.

Compute ops: time = fixed kernel cost + roofline max(FLOPs / achievable peak of the cores it holds,
bytes / achievable HBM bandwidth). A core's peak is the datasheet peak over the cores it is rated for
(so `ai_cores` is capacity: fewer cores, less compute); matmuls reach `matmul_efficiency` of it (INT8
matmuls of W8A8 use the INT8 peak), memory traffic `hbm_efficiency` of the bandwidth.
AI cores held = the block-split rule of seed 002, on the op's own unit (cube or vector):
FLOPs < 10 % of one core's capacity → 1 block; > 50 % → min(cores, FLOPs / (0.3 × capacity));
otherwise 4 blocks. "Capacity" is what one core computes in `block_quantum_us`. An op's compute time is
never below what a smaller op of its kind takes under the rule (`split_floor`): more work is never faster.

Copies (an imported profile's memcpy/memset on a stream) hold no AI core; without a measured time
they cost one PCIe transfer.

Collectives: fixed cost + the textbook cost on the link the group needs: the scale-up link (HCCS,
NVLink) when the group fits in one node, the inter-node network otherwise. Through a switch (NVLink) a
device sends at the whole scale-up bandwidth to any peers; on a full mesh (HCCS, Infinity Fabric) over
the direct links to the group's other members alone (`scaleup_gbps_for`). With p ranks and S bytes
per rank: ring all-reduce 2(p−1) hops of S/p; all-gather (p−1) hops of S (a ring is paced by its
slowest hop: a group that spans nodes pays the network for every hop); all-to-all sends S(p−1)/p over a
full mesh in one round, to peers in its node over the scale-up link and to the others over the network
at the same time (the slower share sets the time).
"""
from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np

from harness.config.schema import DeviceConfig, HardwareConfig, LinkConfig, OpKind, ScaleupTopology
from harness.model.ops import (
    COMM_ALL_GATHER,
    COMM_ALL_REDUCE,
    COMM_ALL_TO_ALL,
    FLAG_INT8,
    HOST_ONLY_KINDS,
    KIND_CODE,
    Workload,
)

KIND_CUBE, KIND_VECTOR, KIND_COMM, KIND_COPY = (KIND_CODE[k] for k in (OpKind.cube, OpKind.vector, OpKind.comm, OpKind.copy))

US_PER_S = 1e6


def core_peak_flop_per_us(kind: np.ndarray, device: DeviceConfig, int8: np.ndarray | bool = False) -> np.ndarray:
    """Peak FLOP/µs of one AI core for each op's unit (comm ops use the vector unit's); INT8 matmuls
    (W8A8) use the INT8 peak where the device has one."""
    per_core = 1e12 / US_PER_S / device.cores_rated
    cube = np.where(int8, device.cube_int8_tflops or device.cube_tflops, device.cube_tflops) * per_core
    return np.where(kind == KIND_CUBE, cube, device.vector_tflops * per_core)


def block_dim(flops: np.ndarray, kind: np.ndarray, device: DeviceConfig, int8: np.ndarray | bool = False) -> np.ndarray:
    """AI cores an op holds, by the seed-002 block-split rule (vectorised over any shape)."""
    per_core_capacity = core_peak_flop_per_us(kind, device, int8) * device.block_quantum_us
    ratio = flops / per_core_capacity
    large = np.clip(np.ceil(flops / (0.3 * per_core_capacity)), 1, device.ai_cores)
    medium = min(4, device.ai_cores)
    return np.where(ratio < 0.1, 1, np.where(ratio > 0.5, large, medium)).astype(np.int32)


def split_floor(flops: np.ndarray, kind: np.ndarray, device: DeviceConfig, int8: np.ndarray | bool = False) -> np.ndarray:
    """The least compute time (µs, at peak) an op of these FLOPs takes under the block-split rule: the most a
    smaller op of its kind takes. The rule's own times fall where the blocks jump (an op just past 10 % of a
    core's capacity runs on 4 blocks in a quarter of the time of one just under; past 50 %, each added block
    cuts the time again), so a batch of 4 ran faster than a batch of 2; the running maximum keeps their
    block counts and makes more work never faster: 0.1 of the quantum from 10 %, 0.3 from 60 % (where two
    blocks each take 0.3 of a core's capacity) when the device has two cores or more."""
    ratio = flops / (core_peak_flop_per_us(kind, device, int8) * device.block_quantum_us)
    floor = np.where(ratio >= 0.1, 0.1, 0.0)
    if device.ai_cores >= 2:
        floor = np.where(ratio >= 0.6, 0.3, floor)
    return floor * device.block_quantum_us


def fixed_cost_us(kind: np.ndarray, device: DeviceConfig) -> np.ndarray:
    return np.select(
        [kind == KIND_CUBE, kind == KIND_VECTOR],
        [device.matmul_fixed_us, device.vector_fixed_us],
        default=device.comm_fixed_us,
    )


@functools.lru_cache(maxsize=256)
def fewest_in_node(ranks: int, devices_per_node: int, stride: int = 1, devices: int = 0) -> int:
    """The fewest members of a group (itself included) that any member has in its own node. A group is
    `ranks` devices `stride` apart (a TP or EP group: consecutive; a DP group: every tp-th device, vLLM's
    rank layout [dp][tp]), and the groups tile the deployment's `devices`; 0: not known (an imported op
    list), consecutive groups at every alignment with the nodes, the worst counting. 8 of 16 on two nodes
    of 8; TP 4 on nodes of 6: 4 with 4 devices (one node), 2 with 8 (ranks 4-7 span two); DP 4 over TP 4
    on nodes of 8: 2 (ranks 0, 4 | 8, 12)."""
    if ranks <= 1 or devices_per_node <= 0:
        return max(ranks, 1)
    stride = max(stride, 1)
    block = ranks * stride
    # The placement repeats every lcm(block, devices_per_node) devices: no need to walk further.
    period = math.lcm(block, devices_per_node)
    span = min(devices, period) if devices > 0 else period
    fewest = ranks
    for first in range(0, span, block):
        for offset in range(stride):
            members = [m for m in range(first + offset, first + block, stride) if devices <= 0 or m < devices]
            if members:
                fewest = min(fewest, min(Counter(m // devices_per_node for m in members).values()))
    return fewest


def scaleup_gbps_for(members: np.ndarray, link: LinkConfig) -> np.ndarray:
    """What a device sends at (GB/s) to `members` - 1 peers of its node at once: the whole scale-up
    bandwidth through a switch; on a full mesh the links to those peers alone, each
    scaleup_gbps / (devices_per_node - 1) (msmodeling's comm model, tensor_cast/performance_model/
    comm_analytic.py _get_bandwidth_and_latency: a TP-4 group on an 8-NPU HCCS mesh has 3/7 of 196 GB/s)."""
    if link.scaleup_topology != ScaleupTopology.full_mesh or link.devices_per_node <= 1:
        return np.full(np.shape(members), float(link.scaleup_gbps))
    peers = np.clip(np.asarray(members, dtype=np.float64) - 1, 1, link.devices_per_node - 1)
    return link.scaleup_gbps * peers / (link.devices_per_node - 1)


def collective_us(
    comm: np.ndarray, ranks: np.ndarray, nbytes: np.ndarray, link: LinkConfig, stride: np.ndarray | int = 1, devices: int = 0,
) -> np.ndarray:
    """Transfer time of collectives (without the fixed kernel cost), broadcasting over steps. Groups are
    placed as `fewest_in_node` says (members `stride` apart among the deployment's `devices`)."""
    p = ranks.astype(np.float64)
    # A group stays inside a node only where every member has all the others there (6 a node, 8 devices,
    # TP 4: ranks 4-7 span two nodes, and the slowest group sets the pace).
    local = np.vectorize(fewest_in_node, otypes=[np.float64])(
        np.maximum(ranks, 1).astype(np.int64), link.devices_per_node, np.maximum(stride, 1), int(devices))
    in_node = local >= np.maximum(p, 1.0)
    bytes_per_us = np.where(in_node, scaleup_gbps_for(p, link), link.internode_gbps) * 1e9 / US_PER_S
    hop_us = np.where(in_node, link.scaleup_latency_us, link.internode_latency_us)
    safe_p = np.maximum(p, 1.0)
    all_reduce = 2 * (p - 1) * (hop_us + nbytes / safe_p / bytes_per_us)
    all_gather = (p - 1) * (hop_us + nbytes / bytes_per_us)
    # A full mesh sends to in-node peers and to the rest at once: the slower share sets the time (one rank
    # keeps its own data; the member with the fewest in-node peers sends the most over the network).
    scaleup_per_us = scaleup_gbps_for(local, link) * 1e9 / US_PER_S
    mesh_us = np.maximum(nbytes * (local - 1) / safe_p / scaleup_per_us, nbytes * (p - local) / safe_p / bytes_per_us)
    all_to_all = np.where(p > 1, hop_us + mesh_us, 0.0)
    return np.select(
        [comm == COMM_ALL_REDUCE, comm == COMM_ALL_GATHER, comm == COMM_ALL_TO_ALL],
        [all_reduce, all_gather, all_to_all],
        default=0.0,
    )


def device_times(workload: Workload, hardware: HardwareConfig) -> tuple[np.ndarray, np.ndarray]:
    """(duration_us, ai_cores) per step and op, each of shape (steps, n_ops). Collectives hold no AI cores."""
    device = hardware.device
    flops, nbytes = workload.flops, workload.bytes
    kind = np.broadcast_to(workload.kind[None, :], flops.shape)
    int8 = ((workload.flags & FLAG_INT8) > 0)[None, :]
    cores = block_dim(flops, kind, device, int8)
    efficiency = np.where(kind == KIND_CUBE, device.matmul_efficiency, 1.0)
    core_rate = core_peak_flop_per_us(kind, device, int8) * efficiency
    compute_us = np.maximum(flops / (core_rate * cores), split_floor(flops, kind, device, int8) / efficiency)
    memory_us = nbytes / (device.hbm_gbps * device.hbm_efficiency * 1e9 / US_PER_S)
    transfer_us = collective_us(workload.comm[None, :], workload.comm_ranks[None, :], nbytes, hardware.link,
                                workload.comm_stride[None, :], workload.devices)
    is_comm = kind == KIND_COMM
    is_copy = kind == KIND_COPY  # a DMA on a stream: the copy engine, not the AI cores
    model_us = fixed_cost_us(kind, device) + np.where(is_comm, transfer_us, np.maximum(compute_us, memory_us))
    if workload.expert_groups is not None and device.grouped_matmul_group_us:
        model_us = model_us + np.where(kind == KIND_CUBE, workload.expert_groups * device.grouped_matmul_group_us, 0.0)
    model_us = np.where(is_copy, hardware.link.pcie_latency_us + nbytes / (hardware.link.pcie_gbps * 1e9 / US_PER_S), model_us)
    duration = np.where(np.isnan(workload.device_us), model_us, workload.device_us)
    host_only = np.isin(kind, HOST_ONLY_KINDS)
    duration = np.where(host_only, 0.0, duration)
    cores = np.where(is_comm | is_copy | host_only, 0, cores).astype(np.int32)
    return duration, cores


def copy_time_us(nbytes: float, link: LinkConfig) -> float:
    """One host<->device copy over PCIe: fixed latency + bytes / bandwidth."""
    return link.pcie_latency_us + nbytes / (link.pcie_gbps * 1e9 / US_PER_S)
