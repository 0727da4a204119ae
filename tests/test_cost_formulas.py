"""The cost formulas users rely on, each against numbers worked out by hand (not directions).

Collectives at two sizes and parallel degrees, in one node and across nodes; the block-split rule at its
edges; host copies; request latencies (TTFT, TPOT, ITL, end to end) of a stream where one request
queues; the KV cache that alone overflows HBM; host dispatch strategies on a host-bound step.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import compose_run
from harness.config.schema import DeviceConfig, LinkConfig, OpSpec, ScaleupTopology
from harness.model.device import KIND_COMM, KIND_CUBE, block_dim, collective_us, fewest_in_node, copy_time_us, core_peak_flop_per_us, device_times
from harness.base.errors import ConfigError
from harness.model.ops import COMM_ALL_GATHER, COMM_ALL_REDUCE, COMM_ALL_TO_ALL, COMM_NONE, check_memory
from harness.sim.simulate import simulate_run
from harness.sim.serving import Requests, ServingBatches, batch_requests, serving_summary
from harness.model.workload import build_workload
from test_semantics import TOKEN_BACK_US, three_op_run

# The default link: 196 GB/s and 0.5 µs a hop inside a node of 8 devices, 25 GB/s and 1.5 µs between nodes.
LINK = LinkConfig()
MB_196 = 1.96e6  # bytes per rank: 10 µs over the scale-up link, 78.4 µs between nodes


@pytest.mark.parametrize(
    "comm, ranks, nbytes, expected_us",
    [
        # Ring all-reduce: 2(p-1) hops of S/p.
        (COMM_ALL_REDUCE, 4, MB_196, 2 * 3 * (0.5 + 2.5)),  # 18
        (COMM_ALL_REDUCE, 8, MB_196, 2 * 7 * (0.5 + 1.25)),  # 24.5
        (COMM_ALL_REDUCE, 4, 10 * MB_196, 2 * 3 * (0.5 + 25.0)),  # 153
        (COMM_ALL_REDUCE, 16, MB_196, 2 * 15 * (1.5 + MB_196 / 16 / 25_000)),  # across nodes: 192
        # All-gather: (p-1) hops of S.
        (COMM_ALL_GATHER, 4, MB_196, 3 * (0.5 + 10.0)),  # 31.5
        (COMM_ALL_GATHER, 8, MB_196, 7 * (0.5 + 10.0)),  # 73.5
        (COMM_ALL_GATHER, 4, 10 * MB_196, 3 * (0.5 + 100.0)),  # 301.5
        # All-to-all: one round sending S(p-1)/p over the mesh.
        (COMM_ALL_TO_ALL, 4, MB_196, 0.5 + 10.0 * 3 / 4),  # 8
        (COMM_ALL_TO_ALL, 8, MB_196, 0.5 + 10.0 * 7 / 8),  # 9.25
        (COMM_ALL_TO_ALL, 4, 10 * MB_196, 0.5 + 100.0 * 3 / 4),  # 75.5
        # Across two nodes of 8, each rank sends 7/16 of S to in-node peers (4.375 µs at 196 GB/s) while 8/16
        # go over the network (39.2 µs at 25 GB/s): the slower share, not all 15/16 at the network's rate (75).
        (COMM_ALL_TO_ALL, 16, MB_196, 1.5 + MB_196 * 8 / 16 / 25_000),  # 40.7
        # Not a collective, or one rank alone: nothing to move.
        (COMM_NONE, 8, MB_196, 0.0),
        (COMM_ALL_REDUCE, 1, MB_196, 0.0),
        (COMM_ALL_GATHER, 1, MB_196, 0.0),
        (COMM_ALL_TO_ALL, 1, MB_196, 0.0),  # not even the hop's latency
    ],
)
def test_collective_transfer_times(comm, ranks, nbytes, expected_us):
    got = collective_us(np.array([comm]), np.array([ranks]), np.array([[nbytes]]), LINK)
    assert got.tolist() == [[pytest.approx(expected_us, rel=1e-12)]]


def test_an_all_to_all_across_nodes_sends_in_node_and_over_the_network_at_once():
    """The member with the fewest in-node peers sets the time. TP 4 on nodes of 6: ranks 4-7 span two
    nodes, 2 and 2, so rank 4 sends 1/4 of S in its node and 2/4 over the network: 1.5 + max(2.5, 39.2).
    12 ranks on nodes of 8: ranks 8-11 share a node with no one else of their group (4 of 12 in-node),
    sending 8/12 over the network: 1.5 + max(2.5, 52.27). On nodes of 4, 8 ranks: 4 in-node, 4/8 out."""
    def a2a(ranks, per_node):
        link = dataclasses.replace(LINK, devices_per_node=per_node)
        return collective_us(np.array([COMM_ALL_TO_ALL]), np.array([ranks]), np.array([[MB_196]]), link)[0, 0]

    assert a2a(4, 6) == pytest.approx(1.5 + MB_196 * 2 / 4 / 25_000)  # 40.7
    assert a2a(12, 8) == pytest.approx(1.5 + MB_196 * 8 / 12 / 25_000)  # 53.77
    assert a2a(8, 4) == pytest.approx(1.5 + MB_196 * 4 / 8 / 25_000)  # 40.7
    assert fewest_in_node(16, 8) == 8 and fewest_in_node(4, 6) == 2 and fewest_in_node(12, 8) == 4 and fewest_in_node(8, 8) == 8


@pytest.mark.parametrize("comm, ranks, expected_us", [
    # 196 GB/s over 7 links of an 8-device mesh, 28 GB/s each: a group of p uses its p - 1 (msmodeling).
    (COMM_ALL_REDUCE, 4, 2 * 3 * (0.5 + MB_196 / 4 / 84_000)),  # 38.0: 84 GB/s, not 196 (18.0)
    (COMM_ALL_GATHER, 2, 1 * (0.5 + MB_196 / 28_000)),  # 70.5: one link
    (COMM_ALL_TO_ALL, 4, 0.5 + MB_196 * 3 / 4 / 84_000),  # 18.0: S/4 to each of 3 peers, a link each
    (COMM_ALL_REDUCE, 8, 2 * 7 * (0.5 + MB_196 / 8 / 196_000)),  # 24.5: every link, as through a switch
    (COMM_ALL_TO_ALL, 16, 1.5 + MB_196 * 8 / 16 / 25_000),  # 40.7: the network's share sets it, as before
])
def test_a_group_on_a_full_mesh_sends_over_the_links_between_its_members(comm, ranks, expected_us):
    """On a full mesh (Ascend's HCCS, AMD's Infinity Fabric) scaleup_gbps is a device's total over its links
    to every peer: a TP-4 group was priced at all 196 GB/s where it reaches 3 of 7 links."""
    mesh = dataclasses.replace(LINK, scaleup_topology=ScaleupTopology.full_mesh)
    got = collective_us(np.array([comm]), np.array([ranks]), np.array([[MB_196]]), mesh)
    assert got.tolist() == [[pytest.approx(expected_us, rel=1e-12)]]
    assert compose_run("hardware=atlas_a2").hardware.link.scaleup_topology == ScaleupTopology.full_mesh


def test_a_group_of_one_node_stays_on_the_scale_up_link():
    """8 ranks on nodes of 8 stay inside; on nodes of 4 they cross: the inter-node numbers apply."""
    inside = collective_us(np.array([COMM_ALL_REDUCE]), np.array([8]), np.array([MB_196]), LINK)
    across = collective_us(np.array([COMM_ALL_REDUCE]), np.array([8]), np.array([MB_196]), dataclasses.replace(LINK, devices_per_node=4))
    assert inside.tolist() == [pytest.approx(24.5)]
    assert across.tolist() == [pytest.approx(2 * 7 * (1.5 + MB_196 / 8 / 25_000))]  # 150.2


@pytest.mark.parametrize(
    "ranks, devices_per_node, stride, devices, fewest",
    [
        (3, 8, 1, 3, 3),    # DP 3 over TP 1: 3 NPUs of one node (it was 1: groups counted past the deployment)
        (3, 8, 2, 6, 3),    # DP 3 over TP 2: {0, 2, 4} and {1, 3, 5}, one node
        (4, 6, 1, 4, 4),    # TP 4 on nodes of 6 with 4 devices: one node (it was 2)
        (4, 6, 1, 8, 2),    # ... with 8: ranks 4-7 span nodes 0 and 1
        (4, 6, 1, 0, 2),    # not known (an imported list): every alignment, the worst
        (4, 8, 4, 16, 2),   # DP 4 over TP 4: {0, 4 | 8, 12}, two a node (it was 4: taken as consecutive)
        (16, 8, 1, 16, 8),  # TP 16: two nodes of 8
    ],
)
def test_a_group_sits_where_the_deployment_puts_its_ranks(ranks, devices_per_node, stride, devices, fewest):
    """vLLM's ranks are laid out [dp][tp]: a TP or EP group is consecutive, a DP group every tp-th device,
    and the groups tile the deployment's tp × dp devices, no more."""
    assert fewest_in_node(ranks, devices_per_node, stride, devices) == fewest


@pytest.mark.parametrize(
    "overrides, op, expected_us",
    [
        # TP 1, DP 3, experts over all 3 (EP 3): one node, a full mesh's 2 links of 28 GB/s.
        (("workload.tp=1", "workload.dp=3", "workload.ep=0"), "moe_dispatch", 10 + 0.5 + 524_288 * (2 / 3) / 56_000),
        # TP 4, DP 4 without EP: the DP gather's group {0, 4, 8, 12} spans two nodes: a ring over RoCE.
        (("workload.tp=4", "workload.dp=4", "workload.ep=1"), "moe_dispatch", 10 + 3 * (1.5 + 69_632 / 25_000)),
        (("workload.tp=4", "workload.dp=4", "workload.ep=1"), "moe_combine", 10 + 3 * (1.5 + 65_536 / 25_000)),
        # TP 2, DP 3 without EP: {0, 2, 4} in one node, 2 links.
        (("workload.tp=2", "workload.dp=3", "workload.ep=1"), "moe_dispatch", 10 + 2 * (0.5 + 69_632 / 56_000)),
        # TP 4 on nodes of 6, 4 devices: one node, 3 of 5 links of 39.2 GB/s (196 / 5).
        (("workload.tp=4", "hardware.link.devices_per_node=6"), "tp_all_reduce", 10 + 6 * (0.5 + 65_536 / 4 / 117_600)),
    ],
)
def test_a_cards_collectives_are_priced_where_their_groups_sit(overrides, op, expected_us):
    """Qwen3-30B-A3B decode on the Atlas A2 (batch 16; dispatch and combine bytes: tokens × (hidden + the
    router's logits) or × hidden, 2 bytes each; 16 tokens × 2,048 × 2 = 65,536 B a TP all-reduce): every
    group sits where vLLM puts its ranks. The DP gather of experts without EP was priced as consecutive
    ranks in one node, and a group inside the deployment as crossing nodes past its end."""
    run = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.steps=1", *overrides)
    workload = build_workload(run.workload)
    durations, _ = device_times(workload, run.hardware)
    j = workload.op_names.index(f"layers.0.{op}")
    assert durations[0, j] == pytest.approx(expected_us, rel=1e-9)


def test_tensor_parallel_all_reduce_of_a_card():
    """Llama-2-7B prefill at TP 8 on the Atlas A2: after the embedding, and after attention and after the
    MLP of each of the 32 layers, each rank all-reduces its 1024 tokens × 4096 hidden × 2 bytes = 8,388,608
    bytes over HCCS: 10 µs fixed + 14 hops of (0.5 µs + 1,048,576 B / 196,000 B/µs) = 91.898 µs."""
    run = compose_run("workload=llama2_7b_prefill", "workload.tp=8", "workload.context_len=1024", "workload.steps=1")
    workload = build_workload(run.workload)
    durations, cores = device_times(workload, run.hardware)
    reduces = [j for j, name in enumerate(workload.op_names) if name.endswith("tp_all_reduce")]
    assert len(reduces) == 65 and reduces[0] == 1 and workload.bytes[0, reduces].tolist() == [1024 * 4096 * 2] * 65
    assert durations[0, reduces].tolist() == [pytest.approx(10 + 14 * (0.5 + 1_048_576 / 196_000))] * 65
    assert cores[0, reduces].tolist() == [0] * 65  # collectives hold no AI core


# ---------------------------------------------------------------- the block-split rule (seed 002)

# 24 cores rated at 24 TFLOPS: 1e6 FLOP/µs a core, 1e7 FLOP of capacity in the 10 µs quantum.
DEVICE = DeviceConfig(ai_cores=24, rated_cores=24, cube_tflops=24.0, vector_tflops=24.0, block_quantum_us=10.0)


@pytest.mark.parametrize(
    "flops, cores",
    [
        (0.999e6, 1),  # below 10 % of one core's capacity: one block
        (1e6, 4),  # exactly 10 %: not below, four blocks
        (5e6, 4),  # exactly 50 %: not above, four blocks
        (5.01e6, 2),  # above 50 %: FLOPs / 30 % of a core, rounded up = 2 (fewer than four: the rule as seed 002 gives it)
        (3e7, 10),  # 10 × 30 %
        (3.0001e7, 11),
        (7.2e7, 24),  # every core
        (1e9, 24),  # never more than the device has
    ],
)
def test_block_dim_at_the_rules_edges(flops, cores):
    assert block_dim(np.array([flops]), np.array([KIND_CUBE]), DEVICE).tolist() == [cores]


def test_block_dim_on_a_small_device_holds_at_most_its_cores():
    small = dataclasses.replace(DEVICE, ai_cores=2, rated_cores=2, cube_tflops=2.0)  # the same 1e6 FLOP/µs a core
    assert block_dim(np.array([1e6, 5e6, 1e9]), np.array([KIND_CUBE] * 3), small).tolist() == [2, 2, 2]


def test_device_time_is_the_roofline_of_the_cores_it_holds():
    """A matmul of 3e7 FLOP holds 10 cores (above): 3e7 / (10 × 1e6 FLOP/µs) = 3 µs of compute; 1.6 MB at
    1.6 TB/s is 1 µs: compute-bound, plus the 5 µs fixed cost. 16 MB (10 µs) makes it memory-bound."""
    run = compose_run("workload.card=null", "workload.ops=[{name:mm,kind:cube,flops:3e7,bytes:1.6e6},{name:big,kind:cube,flops:3e7,bytes:1.6e7}]")
    hardware = dataclasses.replace(run.hardware, device=dataclasses.replace(
        DEVICE, hbm_gbps=1600.0, matmul_fixed_us=5.0, matmul_efficiency=1.0, hbm_efficiency=1.0))
    durations, cores = device_times(build_workload(run.workload), hardware)
    assert durations[0].tolist() == pytest.approx([5 + 3.0, 5 + 10.0])
    assert cores[0].tolist() == [10, 10]


def test_block_dim_takes_the_bf16_peak_unless_told_the_op_is_int8():
    """With an INT8 peak twice the BF16 one, a core's capacity doubles for INT8 ops only: 1e6 FLOP is 10 %
    of a BF16 core's 1e7 (four blocks) but 5 % of an INT8 core's 2e7 (one block)."""
    device = dataclasses.replace(DEVICE, cube_int8_tflops=48.0)
    cube = np.array([KIND_CUBE])
    assert block_dim(np.array([1e6]), cube, device).tolist() == [4]
    assert block_dim(np.array([1e6]), cube, device, int8=np.array([True])).tolist() == [1]
    assert core_peak_flop_per_us(cube, device).tolist() == [1e6]
    assert core_peak_flop_per_us(cube, device, np.array([True])).tolist() == [2e6]


def test_a_vector_op_runs_at_the_full_vector_peak():
    """matmul_efficiency derates matmuls only: a compute-bound vector op of 3e7 FLOP on 10 cores of
    1e6 FLOP/µs takes 3 µs (+ 2 µs fixed) at any matmul efficiency."""
    run = compose_run("workload.card=null", "workload.ops=[{name:v,kind:vector,flops:3e7,bytes:0}]")
    hardware = dataclasses.replace(run.hardware, device=dataclasses.replace(DEVICE, matmul_efficiency=0.5, vector_fixed_us=2.0))
    durations, _ = device_times(build_workload(run.workload), hardware)
    assert durations[0].tolist() == [pytest.approx(2 + 3.0)]


def test_a_host_copy_costs_its_latency_plus_bytes_over_pcie():
    link = LinkConfig(pcie_gbps=32.0, pcie_latency_us=2.0)
    assert copy_time_us(1e6, link) == pytest.approx(2 + 1e6 / 32_000)  # 33.25 µs
    assert copy_time_us(0, link) == 2.0


def test_copy_ops_on_a_stream_cost_one_pcie_transfer_and_hold_no_core():
    """An imported profile's memcpy without a measured time: 2 µs + 1 MB at 32 GB/s on the A2; host
    work and syncs have no device time at all."""
    ops = "[{name:cp,kind:copy,bytes:1e6},{name:py,kind:host,host_us:7},{name:wait,kind:sync},{name:mm,kind:cube,flops:1e9,device_us:4}]"
    run = compose_run("workload.card=null", f"workload.ops={ops}")
    durations, cores = device_times(build_workload(run.workload), run.hardware)
    assert durations[0].tolist() == [pytest.approx(2 + 1e6 / 32_000), 0.0, 0.0, 4.0]
    assert cores[0, :3].tolist() == [0, 0, 0] and cores[0, 3] > 0  # a given time keeps the block-split rule's cores


def test_comm_ops_of_an_op_list_cost_their_fixed_time():
    """An explicit comm op names no collective: only the fixed kernel cost, and no AI core."""
    run = compose_run("workload.card=null", "workload.ops=[{name:ar,kind:comm,bytes:1e9}]")
    durations, cores = device_times(build_workload(run.workload), run.hardware)
    assert durations[0].tolist() == [run.hardware.device.comm_fixed_us] and cores[0].tolist() == [0]
    assert build_workload(run.workload).kind.tolist() == [KIND_COMM]


# ---------------------------------------------------------------- request latencies


def test_request_latencies_of_a_hand_made_plan():
    """Two requests: r0 arrives at 0, is admitted at once, produces 3 tokens at 10, 20 (gap 10) and 30 ms;
    r1 arrives at 5, waits until 30, produces 2 tokens at 40 and 60 ms. Every figure by hand (ms);
    percentiles interpolate linearly between the two requests (p99 = low + 0.99 × (high - low))."""
    plan = ServingBatches(
        batch=np.array([1, 1, 1, 1, 1, 1]), kv_len=np.zeros(6), release_us=np.zeros(6), step_us=np.full(6, 10_000.0),
        requests=Requests(arrival_us=np.array([0.0, 5_000.0]), prompt_len=np.array([100, 100]), output_len=np.array([3, 2])),
        admitted_us=np.array([0.0, 30_000.0]), finished_us=np.array([30_000.0, 60_000.0]),
        first_token_us=np.array([10_000.0, 40_000.0]), itl_us=np.array([10_000.0, 10_000.0, 20_000.0]),
    )
    summary = serving_summary(plan)
    expected = {
        "requests_completed": 2, "batch_mean": 1.0, "batch_max": 1,
        # arrival to last token: 30 and 55
        "request_latency_ms_p50": 42.5, "request_latency_ms_p99": 30 + 0.99 * 25, "mean_e2el_ms": 42.5, "median_e2el_ms": 42.5,
        "p99_e2el_ms": 30 + 0.99 * 25,
        "queue_ms_mean": (0 + 25) / 2,
        # vLLM's: arrival to first token 10 and 35; first to last token over the tokens after the first, 20 / 2 and 20 / 1
        "mean_ttft_ms": 22.5, "median_ttft_ms": 22.5, "p99_ttft_ms": 10 + 0.99 * 25,
        "mean_tpot_ms": 15.0, "median_tpot_ms": 15.0, "p99_tpot_ms": 10 + 0.99 * 10,
        # every gap between two tokens: 10, 10, 20
        "mean_itl_ms": 40 / 3, "median_itl_ms": 10.0, "p99_itl_ms": 10 + 0.98 * 10,
    }
    assert {k: v for k, v in summary.items() if not k.endswith("note")} == pytest.approx(expected)
    assert "2 completed request(s) (TTFT on 2 first tokens), fewer than 20" in summary["serving_note"]


def test_request_latencies_leave_the_warm_up_out_as_throughput_does():
    """Five 10 ms steps, the first two warm-up: tokens come at 10, 20, ... 50 ms and the window takes those
    after 20 ms. TTFT: r1 (arrived 15, first token 30) and r2 (20, 40); r0 and r3 had theirs in the warm-up.
    Latency and TPOT: r0 (done at 30) and r1 (40); r3 finished at 20. ITL: the gaps ending at 30 and 40 ms,
    not the two ending at 20. The figures counted the warm-up's beside a throughput that did not; counting
    only requests that arrived after the warm-up left a saturated run none (they queue past its end)."""
    plan = ServingBatches(
        batch=np.array([1, 2, 2, 3, 2]), kv_len=np.zeros(5), release_us=np.arange(5) * 10_000.0, step_us=np.full(5, 10_000.0),
        requests=Requests(arrival_us=np.array([0.0, 15_000.0, 20_000.0, 0.0]), prompt_len=np.full(4, 100),
                          output_len=np.array([3, 2, 9, 5])),
        admitted_us=np.array([0.0, 20_000.0, 30_000.0, 0.0]), finished_us=np.array([30_000.0, 40_000.0, np.nan, 20_000.0]),
        first_token_us=np.array([10_000.0, 30_000.0, 40_000.0, 10_000.0]),
        itl_us=np.array([25_000.0, 10_000.0, 10_000.0, 40_000.0]), itl_end_us=np.array([20_000.0, 30_000.0, 40_000.0, 20_000.0]),
    )
    summary = serving_summary(plan, warmup_steps=2)
    assert summary["requests_completed"] == 2 and summary["batch_mean"] == pytest.approx(7 / 3) and summary["batch_max"] == 3
    assert summary["mean_e2el_ms"] == pytest.approx((30 + 25) / 2)
    # Queueing, over the requests TTFT counts (r1 arrived 15, admitted 20; r2 20 and 30), part of each one's TTFT:
    # over the finished ones (r0, r1: 2.5 ms) it was beside a TTFT of other requests.
    assert summary["queue_ms_mean"] == pytest.approx((5 + 10) / 2)
    assert summary["mean_ttft_ms"] == pytest.approx((15 + 20) / 2)
    assert summary["mean_tpot_ms"] == pytest.approx((20 / 2 + 10 / 1) / 2)  # r3's (20 - 10) / 4 left out
    assert summary["mean_itl_ms"] == pytest.approx(10.0)  # not (25 + 10 + 10 + 40) / 4
    assert summary["serving_note"].startswith("latency figures and the batch over the measured window: the tokens after the 2 warm-up")
    every = serving_summary(plan)
    assert every["requests_completed"] == 3 and every["batch_mean"] == 2.0 and every["mean_itl_ms"] == pytest.approx(85 / 4)
    assert every["mean_ttft_ms"] == pytest.approx((10 + 15 + 20 + 10) / 4) and "measured window" not in every["serving_note"]


def finished_plan(requests: int, output_len: int = 2) -> ServingBatches:
    """`requests` requests arriving at 0, each admitted at once and done after `output_len` 10 ms steps."""
    n = requests
    return ServingBatches(
        batch=np.full(output_len, n), kv_len=np.zeros(output_len), release_us=np.zeros(output_len), step_us=np.full(output_len, 1e4),
        requests=Requests(arrival_us=np.zeros(n), prompt_len=np.full(n, 10), output_len=np.full(n, output_len)),
        admitted_us=np.zeros(n), finished_us=np.full(n, output_len * 1e4), first_token_us=np.full(n, 1e4),
        itl_us=np.full(n * (output_len - 1), 1e4),
    )


def test_requests_that_arrived_and_got_no_first_token_say_the_server_is_saturated():
    """One slot, three 10 ms steps starting at 0, 10 and 20 ms: r0 (arrived at 0) takes the slot for all three;
    r1 (5 ms) and r2 (15 ms) arrived before the last step began and never got a token; r3 (25 ms) arrived
    during it, too late for any step. TTFT is r0's alone (10 ms): 2 of the 3 that could have been served
    were not, and the note says so. The same plan with r1 and r2 served says nothing of it."""
    nan = np.nan
    plan = ServingBatches(
        batch=np.array([1, 1, 1]), kv_len=np.zeros(3), release_us=np.array([0.0, 10_000.0, 20_000.0]), step_us=np.full(3, 10_000.0),
        requests=Requests(arrival_us=np.array([0.0, 5_000.0, 15_000.0, 25_000.0]), prompt_len=np.full(4, 100), output_len=np.array([3, 2, 2, 2])),
        admitted_us=np.array([0.0, nan, nan, nan]), finished_us=np.array([30_000.0, nan, nan, nan]),
        first_token_us=np.array([10_000.0, nan, nan, nan]), itl_us=np.array([10_000.0, 10_000.0]),
        unplaced=np.array([0, 1, 2]),  # left waiting for the one slot after each step's admission: r1, then r1 and r2
    )
    summary = serving_summary(plan)
    assert summary["mean_ttft_ms"] == pytest.approx(10.0)
    assert summary["serving_note"].startswith("saturated: 2 of 3 requests that arrived before the last step got no first token")
    served = dataclasses.replace(plan, first_token_us=np.array([10_000.0, 20_000.0, 30_000.0, nan]), unplaced=np.zeros(3, dtype=np.int64))
    assert "saturated" not in serving_summary(served).get("serving_note", "")


def test_a_server_mostly_waiting_for_requests_says_its_load_is_light():
    """Three 10 ms steps released at 0, 30 and 60 ms: the server waited 20 ms before each of the last two,
    40 of the 70 ms window (57 %), and says so. Measured from the second step (one warm-up step), the window
    is 30 to 70 ms and the wait in it 20 ms: 50 %, still said; busy back to back it is not."""
    plan = ServingBatches(
        batch=np.ones(3, dtype=np.int64), kv_len=np.zeros(3), release_us=np.array([0.0, 30_000.0, 60_000.0]), step_us=np.full(3, 10_000.0),
        requests=Requests(arrival_us=np.array([0.0, 30_000.0, 60_000.0]), prompt_len=np.full(3, 100), output_len=np.ones(3, dtype=np.int64)),
        admitted_us=np.array([0.0, 30_000.0, 60_000.0]), finished_us=np.array([10_000.0, 40_000.0, 70_000.0]),
        first_token_us=np.array([10_000.0, 40_000.0, 70_000.0]), itl_us=np.zeros(0), idle_us=np.array([0.0, 20_000.0, 20_000.0]),
        itl_end_us=np.zeros(0),
    )
    assert "light load: the server waited for requests 57% of the window" in serving_summary(plan)["serving_note"]
    assert "light load: the server waited for requests 50% of the window" in serving_summary(plan, warmup_steps=1)["serving_note"]
    busy = dataclasses.replace(plan, release_us=np.array([0.0, 10_000.0, 20_000.0]), idle_us=np.zeros(3))
    assert "light load" not in serving_summary(busy).get("serving_note", "")


@pytest.mark.parametrize("completed, thin", [(19, True), (20, False), (21, False)])
def test_latency_figures_are_flagged_below_20_completed_requests(completed, thin):
    assert ("serving_note" in serving_summary(finished_plan(completed))) == thin


def test_a_one_token_request_has_no_time_per_output_token():
    """vLLM's TPOT leaves out requests of one token (no token after the first), and the summary has no
    other figure named TPOT that would count them."""
    plan = finished_plan(2)
    plan.requests.output_len = np.array([2, 1])
    plan.finished_us = np.array([2e4, 1e4])
    plan.itl_us = np.array([1e4])
    summary = serving_summary(plan)
    assert summary["mean_tpot_ms"] == 10.0 and summary["p99_tpot_ms"] == 10.0
    assert not [k for k in summary if "tpot" in k and not k.endswith("_tpot_ms")]
    assert summary["mean_e2el_ms"] == 15.0 and summary["mean_ttft_ms"] == 10.0


QUEUED = (
    "workload.serving.enabled=true", "workload.steps=6", "workload.serving.initial_requests=2", "workload.serving.arrival_rate_rps=1e-6",
    "workload.serving.max_batch=1", "workload.serving.len_cv=0", "workload.serving.output_len_mean=3",
    "workload.serving.prompt_len_mean=512", "+workload.card_overrides.num_hidden_layers=1", "tracking.enabled=false",
)


def test_two_requests_where_one_queues():
    """Two requests wait at t = 0 for a server that runs one sequence at a time; each wants 3 tokens. With
    host-bound steps of a fixed length S (a one-layer Llama-2: the KV length does not show), r0 runs
    steps 0-2 and r1 steps 3-5: r0's tokens at S, 2S, 3S; r1 is admitted at 3S, its tokens at 4S, 5S, 6S.
    TTFT 1 S and 4 S (mean 2.5 S), TPOT S for both, every inter-token gap S, latency 3 S and 6 S."""
    run = compose_run(*QUEUED)
    plan = batch_requests(run)
    s_us = plan.step_us[0]
    assert plan.step_us.tolist() == pytest.approx([s_us] * 6, rel=1e-12)
    assert plan.batch.tolist() == [1] * 6
    assert plan.admitted_us[:2].tolist() == pytest.approx([0, 3 * s_us])
    assert plan.first_token_us[:2].tolist() == pytest.approx([s_us, 4 * s_us])
    assert plan.finished_us[:2].tolist() == pytest.approx([3 * s_us, 6 * s_us])
    assert np.isnan(plan.admitted_us[2:]).all()  # at 1e-6 requests/s the next one comes long after the run
    # The KV length: the prompt, the tokens generated so far, and the one being generated.
    assert plan.kv_len.tolist() == [513, 514, 515, 513, 514, 515]
    S = s_us / 1e3
    summary = simulate_run(run).summary
    assert summary["step_ms_mean"] == pytest.approx(S)
    assert summary["mean_ttft_ms"] == pytest.approx(2.5 * S) and summary["p99_ttft_ms"] == pytest.approx(S + 0.99 * 3 * S)
    assert summary["mean_tpot_ms"] == pytest.approx(S)
    assert summary["mean_itl_ms"] == pytest.approx(S) and summary["p99_itl_ms"] == pytest.approx(S)
    assert summary["mean_e2el_ms"] == pytest.approx(4.5 * S) and summary["queue_ms_mean"] == pytest.approx(1.5 * S)
    assert summary["requests_completed"] == 2 and summary["batch_max"] == 1


# ---------------------------------------------------------------- memory


def test_a_kv_cache_that_alone_overflows_hbm_is_refused_with_its_size():
    """Llama-3.1-8B, 64 sequences of 32k tokens: 128 KiB a token (32 layers × 8 KV heads × 128 × K and V
    × 2 bytes) × 64 × (32768 + 32) tokens at the last of 32 steps = 275.1 GB; the weights (16 GB) fit."""
    base = ("workload=llama31_8b_decode", "workload.steps=32", "workload.batch_size=64", "workload.context_len=32768")
    run = compose_run(*base)
    workload = build_workload(run.workload)
    assert workload.memory.kv_cache_gb == pytest.approx(131_072 * 64 * 32_800 / 1e9, rel=1e-12)
    assert workload.memory.weights_gb < run.hardware.device.hbm_gb < workload.memory.kv_cache_gb
    with pytest.raises(ConfigError, match=r"KV cache 275\.1\d GB") as refused:
        check_memory(workload, run.hardware.device.hbm_gb)
    assert str(refused.value).startswith("hardware.device.hbm_gb=68.72: llama31_8b_decode does not fit on one rank: weights 16.06 GB")
    with pytest.raises(ConfigError, match=r"KV cache 275\.1\d GB"):
        simulate_run(compose_run(*base))


# ---------------------------------------------------------------- host dispatch on a host-bound step


@pytest.mark.parametrize(
    "dispatch, last_kernel_end_us",
    [
        # One thread, 8 µs an op (Tiling 3): op k launches at 8 + 8k; the 4th kernel ends at 32.1.
        ("eager", 32.1),
        # Main thread 5 µs an op (framework, InferShape, Tiling 3), launch thread 3: the main thread paces
        # it, op k launches at 8 + 5k.
        ("async", 23.1),
        # Threads of 2, 3 and 3 µs an op: Tiling paces the pipeline, op k launches at 8 + 3k.
        ("pipeline", 17.1),
    ],
)
def test_dispatch_strategies_on_a_tiling_bound_step(dispatch, last_kernel_end_us):
    ops = [OpSpec(name=f"op{i}", device_us=0.1) for i in range(4)]
    outcome = simulate_run(three_op_run(dispatch, ops=ops, tiling_us=3.0))
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(last_kernel_end_us + TOKEN_BACK_US + 2, abs=1e-9)


@pytest.mark.parametrize(
    "overrides",
    [
        ("strategy=eager",),
        ("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "engine=vllm_v1"),  # engine work, graph calls
        ("strategy=eager", "hardware.host.jitter_cv=0.2"),  # jitter and speed multiply
    ],
)
def test_a_host_twice_as_fast_halves_every_host_task_and_nothing_else(overrides):
    """hardware.host.speed divides the duration of every task on a host thread or an engine's own process,
    whatever its kind, and leaves device and copy tasks as they were (same graph, task for task)."""
    from harness.sim.task_graph import LANE_HOST

    graph = simulate_run(compose_run(*overrides, "workload.steps=3")).result.graph
    base = graph.tasks
    fast = simulate_run(compose_run(*overrides, "workload.steps=3", "hardware.host.speed=2")).result.graph.tasks
    on_host = np.asarray(graph.lane_kinds)[base["lane"]] == LANE_HOST
    assert on_host.sum() > 100 and (~on_host).sum() > 100
    assert np.array_equal(fast["lane"], base["lane"]) and np.array_equal(fast["category"], base["category"])
    assert np.allclose(fast["duration_us"][on_host], base["duration_us"][on_host] / 2, rtol=1e-12, atol=0)
    assert np.array_equal(fast["duration_us"][~on_host], base["duration_us"][~on_host])


@pytest.mark.parametrize(
    "batch, moe_pad, picks, rows, active",
    [
        # 12 tokens x 8 experts (TP 4, no EP: each rank sees every pick); 128 (1 - (15/16)^12) = 68.998 hit
        (12, False, 96, 96, 68.998197),
        (12, True, 96, 128, 68.998197),  # shape buckets: rows padded up to a power of two, no more experts hit
        (16, True, 128, 128, 82.422511),  # the batch padded to a 16-graph: its 4 padding tokens route too
        (1, False, 8, 8, 8.0),  # one token hits exactly its 8 experts
    ],
)
def test_routed_experts_read_are_set_by_the_tokens_that_route_not_by_padded_rows(batch, moe_pad, picks, rows, active):
    """Qwen3-30B-A3B (128 experts, 8 a token) on TP 4 without EP: every rank holds a quarter of each of the
    128 experts (vLLM's FusedMoE splits them like a dense MLP) and multiplies every token's picks with it.
    A token's 8 picks are 8 distinct experts, so an expert is missed by one token with probability
    1 - 8/128 = 15/16 and T tokens hit 128 (1 - (15/16)^T) of them, whose quarters are read once:
    (15/16)^12 = 0.460951, 128 x 0.539049 = 68.998; (15/16)^16 = 0.356074, 128 x 0.643926 = 82.423; one
    token exactly 8. (Picks drawn independently with replacement had given 128 (1 - (127/128)^(8T)): 67.71,
    81.10 and 7.78, fewer than the 8 experts one token always hits.) Padding the rows of the experts
    already hit (shape buckets) adds multiplications, not weights; padding the batch adds tokens, which
    route (vllm-ascend#16049: 12 -> 16 costs +11.4 % a step)."""
    from harness.model.workload import Shapes, _combine, _dispatch, _grouped, _moe, _moe_finalize_tp

    card = {"n_routed_experts": 128, "num_experts_per_tok": 8, "dtype_bytes": 2, "hidden_size": 2048}
    shapes = Shapes(card, np.array([float(batch)]), np.array([float(batch)]), np.array([100.0]), 100, True, 4, 1, 1, False,
                    extra={"moe_pad": moe_pad})
    m = _moe(shapes)
    assert active == pytest.approx(128 * (1 - (15 / 16) ** batch), abs=1e-6)
    # nothing is sent (no dispatch without EP): every rank takes every token
    assert (m["local"], m["shard"], m["sent"].tolist(), m["received"].tolist()) == (128, 4, [batch], [rows])
    if not moe_pad:
        assert m["received"].tolist() == [picks]
    assert m["active"].tolist() == [pytest.approx(active, rel=1e-7)]
    cost = _grouped(shapes, 2048, 768)
    # a column slice (gate_up's): each row's whole 2,048-wide input in, its quarter of the 768 outputs out
    assert cost.bytes.tolist() == [pytest.approx(active * 2048 * 768 * 2 / 4 + rows * (2048 + 768 / 4) * 2, rel=1e-7)]
    assert cost.flops.tolist() == [pytest.approx(2.0 * rows * 2048 * 768 / 4, rel=1e-12)]
    assert cost.params == 128 * 2048 * 768 / 4 and cost.full_params == 128 * 2048 * 768
    # DP 1: nothing to gather from other DP groups nor to scatter back to them. The quarters' partial sums
    # of every token are added across the 4 TP ranks: one all-reduce of the batch.
    assert _dispatch(shapes) is None and _combine(shapes) is None
    finalize = _moe_finalize_tp(shapes)
    assert (finalize.comm, finalize.ranks, finalize.bytes.tolist()) == (COMM_ALL_REDUCE, 4, [batch * 2048 * 2])


def test_experts_spread_over_every_device_are_whole_and_exchanged_all_to_all():
    """EP over all 4 devices (ep = tp x dp): 32 whole experts a rank; 12 tokens split 3 a TP rank, each
    sends its 3 x 8 picks (24 rows of 2048 x 2 B) all-to-all, and on average receives as many. The 4 ranks'
    12 tokens hit 32 (1 - (1 - 8/128)^12) = 32 x 0.539049 = 17.250 of its 32 experts. After the combine
    each rank holds its 3 tokens' outputs: all-gathered over the TP group (3 x 2048 x 2 B = 12,288 B a
    rank), as vllm-ascend's all-to-all / MC2 finalize does, so that the next layer has all 12."""
    from harness.model.workload import Shapes, _combine, _grouped, _moe, _moe_finalize_tp

    card = {"n_routed_experts": 128, "num_experts_per_tok": 8, "dtype_bytes": 2, "hidden_size": 2048}
    shapes = Shapes(card, np.array([12.0]), np.array([12.0]), np.array([100.0]), 100, True, 4, 1, 4, False)
    m = _moe(shapes)
    assert (m["local"], m["shard"], m["sent"].tolist(), m["received"].tolist()) == (32, 1, [3], [24])
    assert m["active"].tolist() == [pytest.approx(17.249549, rel=1e-7)]
    cost = _grouped(shapes, 2048, 768)
    assert cost.flops.tolist() == [pytest.approx(2.0 * 24 * 2048 * 768, rel=1e-12)]
    assert cost.params == 32 * 2048 * 768
    combine = _combine(shapes)
    assert (combine.comm, combine.ranks, combine.bytes.tolist()) == (COMM_ALL_TO_ALL, 4, [24 * 2048 * 2])
    finalize = _moe_finalize_tp(shapes)
    assert (finalize.comm, finalize.ranks, finalize.bytes.tolist()) == (COMM_ALL_GATHER, 4, [12_288])


@pytest.mark.parametrize("tp, kv_heads_a_rank", [(4, 1), (8, 1)])
def test_a_kv_head_is_replicated_in_the_projection_weights_as_in_the_cache(tp, kv_heads_a_rank):
    """Qwen3-30B-A3B: 32 query heads, 4 KV heads of 128, hidden 2048. At TP 4 each rank holds one KV
    head; at TP 8 two ranks share each, both holding it whole (vLLM replicates KV heads when there are
    fewer than TP ranks), so the fused QKV weights a rank reads are 2048 x (32 / tp + 2 x 1) x 128 x 2 B
    (TP 8: 3,145,728 B, not the 2,621,440 of half a KV head), like the KV cache's one head a rank."""
    run = compose_run("workload=qwen3_30b_decode", f"workload.tp={tp}", f"workload.ep={tp}", "workload.steps=2")
    workload = build_workload(run.workload)
    qkv = workload.op_names.index("layers.0.qkv_proj")
    weights = 2048 * (32 / tp + 2 * kv_heads_a_rank) * 128 * 2
    tokens = run.workload.batch_size
    activations = tokens * (2048 + (32 / tp + 2 * kv_heads_a_rank) * 128) * 2  # column-parallel: the whole input, its slice of the output
    assert workload.bytes[0, qkv] == pytest.approx(weights + activations, rel=1e-12)
    assert workload.flops[0, qkv] == pytest.approx(2.0 * tokens * weights / 2, rel=1e-12)


def test_mla_prefill_attends_over_expanded_heads_and_decode_over_the_latent():
    """DeepSeek-V3 on TP 4 (32 of 128 heads a rank). Prefill of 4,096 tokens expands the latent into each
    head's 192-wide keys and 128-wide values (vLLM's and vllm-ascend's prefill path): 2 x 32 x (192 + 128)
    x 4,096 x 4,097 / 2 causal pairs = 171.8 GFLOP, reading Q, K, V and writing O (32 x (2 x 192 + 2 x 128) x 2 B
    a token). Decode attends over the 576-wide latent with absorbed weights: 2 x 32 x (576 + 512) FLOPs a
    cached token, 3.4x a prefill pair's 2 x 32 x 320."""
    prefill = build_workload(compose_run("workload=deepseek_v3_prefill").workload)
    j = prefill.op_names.index("layers.0.mla_attention")
    assert prefill.flops[0, j] == 2 * 32 * (192 + 128) * 4096 * 4097 / 2
    assert prefill.bytes[0, j] == 4096 * 32 * (2 * 192 + 2 * 128) * 2
    run = compose_run("workload=deepseek_v3", "workload.steps=2")
    decode = build_workload(run.workload)
    j = decode.op_names.index("layers.0.mla_attention")
    kv_tokens = run.workload.batch_size * (run.workload.context_len + 1)
    assert decode.flops[0, j] == pytest.approx(2 * 32 * (576 + 512) * kv_tokens, rel=1e-12)


@pytest.mark.parametrize("devices_per_node, link", [(8, "scale-up"), (6, "inter-node"), (4, "scale-up"), (2, "inter-node")])
def test_a_tp_group_that_would_straddle_two_nodes_takes_the_inter_node_link(devices_per_node, link):
    """Groups are consecutive ranks: TP groups of 4 stay inside 8- or 4-device nodes, but with 6 devices a
    node ranks 4-7 span two, and a group of 4 cannot fit a 2-device node. An all-reduce of 8,192 B over 4
    ranks: 6 hops of (0.5 µs + 2,048 B / the group's HCCS links) on HCCS, a full mesh whose 196,000 B/µs are
    a device's over its devices_per_node - 1 links (3 of 7 in a node of 8, all 3 in a node of 4), of (1.5 µs
    + 2,048 B / 25,000 B/µs) on RoCE (atlas_a2), before the fixed cost."""
    hardware = compose_run("hardware=atlas_a2", f"hardware.link.devices_per_node={devices_per_node}", "workload.steps=1").hardware
    us = collective_us(np.array([COMM_ALL_REDUCE]), np.array([4]), np.array([8192.0]), hardware.link)
    hop_us, bytes_per_us = (0.5, 196_000 * 3 / (devices_per_node - 1)) if link == "scale-up" else (1.5, 25_000)
    assert us.tolist() == [pytest.approx(6 * (hop_us + 2048 / bytes_per_us))]


def test_causal_prefill_attention_counts_each_token_with_itself():
    """A one-token prompt still attends to itself: L (L + 1) / 2 = 1 pair a sequence. Llama-2-7B (32 heads
    of 128): 2 x 32 x (128 + 128) x 1 = 16,384 FLOPs a layer (L^2 / 2 had counted half a pair); at 16
    tokens, 136 pairs."""
    for context_len, pairs in ((1, 1), (16, 136)):
        workload = build_workload(compose_run("workload=llama2_7b_prefill", f"workload.context_len={context_len}", "workload.steps=1").workload)
        j = workload.op_names.index("layers.0.attention")
        assert workload.flops[0, j] == 2 * 32 * (128 + 128) * pairs
