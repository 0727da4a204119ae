"""Laws of the knobs a what-if turns, on every hardware preset (tests/test_laws.py says why laws are tests):
a faster device is never slower (matmul and vector peaks, the share of the matmul peak reached, the
fixed cost of a kernel, the front-end gap, the host link), nor are faster collectives (their fixed cost,
the scale-up link's latency, the network between nodes), a deeper host queue never
slows an async or pipelined step, a larger tiling cache never does (an LRU cache hits at least as often
with more entries: what it holds at a smaller size it also holds at a larger one), fusing element-wise
ops never does, and a longer prompt never makes a prefill faster. A file of its own so that the suite's
workers share the laws.
"""
from __future__ import annotations

import dataclasses

import pytest

from harness.config.schema import RunConfig
from test_laws import HARDWARE, graph_strategy, step_ms
from test_laws_resources import run_with, with_device
from test_laws_sizes import non_decreasing

DENSE = "llama31_8b_decode"


def with_link(run: RunConfig, **values) -> RunConfig:
    return dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, link=dataclasses.replace(run.hardware.link, **values)))


# Each knob from slow to fast: the step may only get shorter along it.
FASTER = {
    "cube_tflops": lambda run, f: with_device(run, cube_tflops=run.hardware.device.cube_tflops * f),
    "vector_tflops": lambda run, f: with_device(run, vector_tflops=run.hardware.device.vector_tflops * f),
    "matmul_efficiency": lambda run, f: with_device(run, matmul_efficiency=min(1.0, run.hardware.device.matmul_efficiency * f)),
    "kernel fixed costs": lambda run, f: with_device(run, matmul_fixed_us=run.hardware.device.matmul_fixed_us / f,
                                                     vector_fixed_us=run.hardware.device.vector_fixed_us / f),
    "kernel_gap_us": lambda run, f: with_device(run, kernel_gap_us=run.hardware.device.kernel_gap_us / f),
    "pcie_gbps": lambda run, f: with_link(run, pcie_gbps=run.hardware.link.pcie_gbps * f),
}


@pytest.mark.parametrize("knob", sorted(FASTER))
@pytest.mark.parametrize("strategy", ["eager", "graph"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_faster_device_is_never_slower(hardware, strategy, knob):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    for batch in (1, 16):
        times = [run_with(hardware, DENSE, strategy, batch, lambda run, f=f: FASTER[knob](run, f)) for f in (0.5, 1.0, 2.0)]
        assert non_decreasing(times[::-1]), f"{knob} x0.5, x1, x2 at batch {batch}: {times}"


# The same for collectives, on a model that has them (Qwen3-30B-A3B at TP 4 with EP 4) replayed as a graph.
FASTER_COLLECTIVES = {
    "comm_fixed_us": lambda run, f: with_device(run, comm_fixed_us=run.hardware.device.comm_fixed_us / f),
    "scaleup_latency_us": lambda run, f: with_link(run, scaleup_latency_us=run.hardware.link.scaleup_latency_us / f),
    "internode_gbps (nodes of 2)": lambda run, f: with_link(run, devices_per_node=2, internode_gbps=run.hardware.link.internode_gbps * f),
}


@pytest.mark.parametrize("knob", sorted(FASTER_COLLECTIVES))
@pytest.mark.parametrize("hardware", HARDWARE)
def test_faster_collectives_are_never_slower(hardware, knob):
    times = [run_with(hardware, "qwen3_30b_decode", graph_strategy(hardware), 16, lambda run, f=f: FASTER_COLLECTIVES[knob](run, f))
             for f in (0.5, 1.0, 2.0)]
    assert non_decreasing(times[::-1]), f"{knob} x0.5, x1, x2: {times}"


@pytest.mark.parametrize("strategy", ["async", "pipeline"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_deeper_host_queue_never_slows_a_step(hardware, strategy):
    capacities = [64, 16, 4, 2, 1]
    times = [step_ms(f"hardware={hardware}", f"workload={DENSE}", f"strategy={strategy}", "workload.batch_size=8",
                     f"strategy.queue_capacity={c}") for c in capacities]
    assert non_decreasing(times), f"queue capacity {capacities}: {times}"


@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_larger_tiling_cache_never_slows_a_step(hardware):
    entries = [4096, 512, 128, 16]
    times = [step_ms(f"hardware={hardware}", f"workload={DENSE}", "strategy=tiling_cache", "workload.batch_size=8",
                     f"strategy.tiling_cache_entries={e}") for e in entries]
    assert non_decreasing(times), f"tiling cache entries {entries}: {times}"


@pytest.mark.parametrize("strategy", ["eager", "async", "pipeline"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_fusing_element_wise_ops_never_slows_a_step(hardware, strategy):
    common = (f"hardware={hardware}", f"workload={DENSE}", f"strategy={strategy}", "workload.batch_size=8")
    assert step_ms(*common, "strategy.fusion=true") <= step_ms(*common) * (1 + 1e-9)


@pytest.mark.parametrize("workload", ["llama2_7b_prefill", "qwen3_30b_prefill"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_longer_prompt_never_makes_a_prefill_faster(hardware, workload):
    prompts = [64, 128, 512, 2048]
    times = [step_ms(f"hardware={hardware}", f"workload={workload}", "strategy=eager", f"workload.context_len={n}") for n in prompts]
    assert non_decreasing(times), f"prompt tokens {prompts}: {times}"
